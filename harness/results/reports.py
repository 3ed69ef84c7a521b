"""Run reports: Markdown for a pull-request comment, JSON, JUnit XML and an HTML page.

Every format renders the same :class:`Report`. The HTML page draws the failing scenario as a
grid of forwards (rows, split by draft step and micro-batch) against layers (columns), each
cell coloured by what that store returned, so a stale-cache pattern is visible at a glance.
All files are written atomically: a reader sees the old file or the new one, never half.
"""

from __future__ import annotations

import html
import json
import os
import shlex
import re
import socket
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..reference import EngineState, Scenario, ScenarioError, replay_events
from ..strategies.features import ALL_FEATURES

from .. import __version__
from ..run import diagnosis as dx
from ..run.diagnosis import Divergence
from ..run.executor import StoreOutcome, run_scenario
from ..subjects.registry import resolve_subject

REPORT_FILES = {
    "markdown": "summary.md",
    "json": "report.json",
    "junit": "junit.xml",
    "html": "report.html",
}

DIVERGENCE = "divergence"
NO_DIVERGENCE = "no divergence"


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp makes it private; reports are for sharing
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@dataclass
class Report:
    """What one run found, in the terms every report format uses."""

    command: str  # fuzz, gate, exhaustive or replay
    subject: str  # the subject spec as given: a built-in name or module:attr
    subject_info: dict[str, Any]
    profile: str
    examples: int
    elapsed_s: float
    device: str = "cpu"
    settings: str | None = None
    seed: int | None = None
    budget_s: float | None = None
    workers: int = 1
    examples_per_worker: list[int] | None = None  # a run over workers: what each ran, adding up to examples
    coverage: dict[str, int] = field(default_factory=dict)
    divergence: Divergence | None = None
    scenario: Scenario | None = None
    weakest_profile: str | None = None
    replay_file: str | None = None
    complete: bool = True
    interrupted_by: str | None = None  # the signal's name when a run was cut short
    replays: bool = True  # False: the shrunk scenario did not diverge in every replay before the report
    replays_run: int = 0  # replays of the shrunk scenario before the report
    replays_diverged: int = 0  # how many of them diverged
    shrink_complete: bool = True  # False: the budget ran out while the scenario was shrinking
    scope: dict[str, Any] | None = None  # a clean exhaustive run: what its scope covers and leaves out
    shard: str | None = None  # "I/N" for one machine's part of a sharded campaign
    examples_to_divergence: int | None = None  # 1: a failure saved in the database came back first
    first_divergence_s: float | None = None  # seconds until it was first seen; elapsed_s adds shrinking
    finished_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def verdict(self) -> str:
        return DIVERGENCE if self.divergence is not None else NO_DIVERGENCE

    @property
    def flaky(self) -> bool:
        """A divergence seen in the search that its shrunk scenario did not repeat in every
        replay (a threaded one is judged by its interleaving's replay instead)."""
        return self.divergence is not None and self.replays_run > 1 and not self.replays

    @property
    def features_covered(self) -> list[str]:
        return sorted(name for name, count in self.coverage.items() if count)

    @property
    def replay_command(self) -> str | None:
        if not self.replay_file:
            return None
        # a replay file never loads user code by itself: the command names it
        user_code = ":" in self.subject and not self.subject.startswith("sglang:")
        chosen = f" --subject {shlex.quote(self.subject)}" if user_code else ""
        return f"swafuzz replay {shlex.quote(self.replay_file)}{chosen}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "complete": self.complete,
            "interrupted_by": self.interrupted_by,
            "command": self.command,
            "subject": self.subject,
            "subject_info": self.subject_info,
            "profile": self.profile,
            "settings": self.settings,
            "seed": self.seed,
            "device": self.device,
            "examples": self.examples,
            "elapsed_s": round(self.elapsed_s, 3),
            "budget_s": self.budget_s,
            "workers": self.workers,
            **({"examples_per_worker": self.examples_per_worker} if self.examples_per_worker is not None else {}),
            "shard": self.shard,
            "features_covered": self.features_covered,
            "coverage": dict(sorted(self.coverage.items())),
            "harness_version": __version__,
            "finished_at": self.finished_at,
        }
        if self.scope is not None:
            out["scope"] = self.scope
        if self.divergence is not None:
            out["diagnosis"] = self.divergence.to_dict()
            out["weakest_profile"] = self.weakest_profile
            out["replay_file"] = self.replay_file
            out["replay_command"] = self.replay_command
            out["replays"] = self.replays
            out["replays_run"] = self.replays_run
            out["replays_diverged"] = self.replays_diverged
            out["flaky"] = self.flaky
            out["shrink_complete"] = self.shrink_complete
            out["examples_to_divergence"] = self.examples_to_divergence
            out["first_divergence_s"] = (
                round(self.first_divergence_s, 3) if self.first_divergence_s is not None else None
            )
            out["scenario"] = self.scenario.to_dict() if self.scenario is not None else None
        return out


def write_reports(report: Report, directory: str | os.PathLike) -> dict[str, Path]:
    """Write every format into ``directory``; returns the path of each, by format."""
    directory = Path(directory)
    rendered = {
        "markdown": render_markdown(report),
        "json": json.dumps(report.to_dict(), indent=2) + "\n",
        "junit": render_junit(report),
        "html": render_html(report, cells_from_rerun(report)),
    }
    return {fmt: write_atomically(directory / REPORT_FILES[fmt], text) for fmt, text in rendered.items()}


# ---- Markdown ------------------------------------------------------------------------------


def run_line(report: Report) -> str:
    rate = report.examples / report.elapsed_s if report.elapsed_s > 0 else 0.0
    return f"{report.examples} examples in {report.elapsed_s:.1f} s ({rate:.1f}/s)"


_NO_REPLAY_NOTE = ("Found with threads; replaying its recorded interleaving without threads did not "
                   "reproduce it, so the replay file may pass while the bug is there.")


def _flaky_note(report: Report) -> str:
    return (f"**Flaky:** the shrunk scenario diverged in {report.replays_diverged} of {report.replays_run} "
            "replays: the subject does not answer the same scenario the same way every time, so the "
            "replay file may pass while the bug is there.")


_SHRINK_CUT_NOTE = ("The time budget ran out while shrinking: the scenario below is the smallest found "
                    "so far, not a minimal one.")


def _incomplete_note(report: Report) -> str:
    by = f" by {report.interrupted_by}" if report.interrupted_by else ""
    return f"Incomplete: the run was interrupted{by} after {report.examples} examples."


def render_markdown(report: Report) -> str:
    icon = "❌" if report.divergence is not None else ("⚠️" if not report.complete else "✅")
    lines = [f"### swafuzz {report.command}: {icon} {report.verdict} in `{report.subject}`", ""]
    if not report.complete:
        lines += [f"> **{_incomplete_note(report)}**", ""]
    if report.divergence is not None:
        lines += [f"> {report.divergence.sentence}", ""]
        if report.flaky:
            lines += [f"> {_flaky_note(report)}", ""]
        elif not report.replays:
            lines += [f"> {_NO_REPLAY_NOTE}", ""]
        if not report.shrink_complete:
            lines += [f"> {_SHRINK_CUT_NOTE}", ""]
    info = report.subject_info
    settings = f", settings {report.settings}" if report.settings else ""
    seed = f", seed {report.seed}" if report.seed is not None else ""
    seed += f", shard {report.shard}" if report.shard else ""
    rows = [
        ("subject", f"`{report.subject}` ({info.get('kind', '?')}, truth {info.get('truth', '?')})"),
        ("profile", f"{report.profile}{settings}{seed}"),
        ("run", run_line(report) + (f", {report.workers} workers" if report.workers > 1 else "")),
        ("features covered", f"{len(report.features_covered)} of {len(ALL_FEATURES)}"),
        ("device", report.device),
    ]
    for key in ("reached", "statements"):
        if key in info:
            rows.append((key, info[key]["sentence"].replace("|", "\\|")))
    lines += ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows), ""]
    divergence = report.divergence
    if divergence is not None:
        if report.replay_command:
            lines += [f"**Reproduce:** `{report.replay_command}`", ""]
        if report.weakest_profile:
            lines += [f"Weakest profile that reproduces it: `{report.weakest_profile}`.", ""]
        if divergence.expected is not None or divergence.actual is not None:
            lines += ["| rows | values |", "|---|---|",
                      f"| expected | `{divergence.expected}` |", f"| actual | `{divergence.actual}` |", ""]
        if report.scenario is not None:
            lines += ["<details><summary>Shrunk scenario</summary>", "", "```json",
                      json.dumps(report.scenario.to_dict(), indent=2), "```", "", "</details>", ""]
        if divergence.detail:
            lines += ["<details><summary>Detail</summary>", "", "```", divergence.detail.rstrip(), "```",
                      "", "</details>", ""]
    return "\n".join(lines)


# ---- JUnit XML -----------------------------------------------------------------------------

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def render_junit(report: Report) -> str:
    return junit_document([report])


def junit_document(reports: list[Report]) -> str:
    """A JUnit file with one test suite per report."""
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    suites = ET.Element("testsuites", {"name": "swafuzz"})
    for report in reports:
        for name, value in _junit_suite(suites, report).items():
            totals[name] += value
    suites.attrib.update({name: str(value) for name, value in totals.items()})
    suites.set("errors", "0")
    suites.set("time", f"{sum(report.elapsed_s for report in reports):.3f}")
    ET.indent(suites)
    text = ET.tostring(suites, encoding="unicode")
    # ElementTree escapes markup but passes control characters (a subject's ANSI colours)
    # that no XML parser accepts
    return '<?xml version="1.0" encoding="utf-8"?>\n' + _NOT_XML.sub("\ufffd", text) + "\n"


def _junit_suite(suites: ET.Element, report: Report) -> dict[str, int]:
    failures = 1 if report.divergence is not None else 0
    skipped = 1 if not failures and not report.complete else 0
    totals = {"tests": 1, "failures": failures, "skipped": skipped}
    suite = ET.SubElement(suites, "testsuite", {
        "name": f"swafuzz.{report.command}", **{name: str(value) for name, value in totals.items()},
        "errors": "0", "time": f"{report.elapsed_s:.3f}",
        "timestamp": report.finished_at, "hostname": socket.gethostname(),
    })
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("subject", report.subject), ("profile", report.profile), ("settings", report.settings),
        ("seed", report.seed), ("shard", report.shard), ("device", report.device),
        ("examples", report.examples), ("complete", str(report.complete).lower()),
        ("harness_version", __version__),
    ):
        if value is not None:
            ET.SubElement(properties, "property", {"name": name, "value": str(value)})
    case = ET.SubElement(suite, "testcase", {
        "classname": f"swafuzz.{report.profile}", "name": report.subject, "time": f"{report.elapsed_s:.3f}",
    })
    if report.divergence is not None:
        failure = ET.SubElement(case, "failure", {"type": report.divergence.kind, "message": report.divergence.sentence})
        failure.text = render_markdown(report)
    elif not report.complete:
        ET.SubElement(case, "skipped", {"message": _incomplete_note(report)})
    system_out = ET.SubElement(case, "system-out")
    system_out.text = run_line(report) + (f"\nreproduce: {report.replay_command}" if report.replay_command else "")
    return totals


# ---- the outcome grid ------------------------------------------------------------------------

OK = "ok"
STALE_FORWARD = "stale_forward"
STALE_STEP = "stale_step"
STALE_CAPTURE = "stale_capture"
OTHER_MICRO_BATCH = "other_micro_batch"
OLD_MAPPING = "old_mapping"
DUMMY = "dummy"
WRONG = "wrong"
ERROR = "error"
NOT_RUN = "not_run"

# outcome: (legend label, colour)
OUTCOME_STYLE = {
    OK: ("ok", "#3a9d5d"),
    STALE_FORWARD: ("stale: rows of forward k (Fk)", "#d7301f"),
    STALE_STEP: ("stale: rows of draft step k (Sk)", "#f16913"),
    STALE_CAPTURE: ("stale: rows recorded at the graph capture in forward k (Gk)", "#a50f15"),
    OTHER_MICRO_BATCH: ("micro-batch k's rows (MBk)", "#7a3db8"),
    OLD_MAPPING: ("translated with an old mapping (M)", "#e6a400"),
    DUMMY: ("the dummy slot (0)", "#3b3b3b"),
    WRONG: ("other wrong rows: fallback, padding, unexplained (×)", "#c51b7d"),
    ERROR: ("error: raised, hung or returned a bad tensor (!)", "#67000d"),
    NOT_RUN: ("not run (after the divergence)", "#e4e4e4"),
}

# outcome: (what the cell shows, the source field whose number follows it)
_MARKS = {
    STALE_FORWARD: ("F", "forward"),
    STALE_STEP: ("S", "draft_step"),
    STALE_CAPTURE: ("G", "forward"),
    OTHER_MICRO_BATCH: ("MB", "micro_batch"),
    OLD_MAPPING: ("M", None),
    DUMMY: ("0", None),
    WRONG: ("×", None),
    ERROR: ("!", None),
}

_SOURCE_OUTCOME = {
    dx.EARLIER_FORWARD: STALE_FORWARD,
    dx.OTHER_MODEL: STALE_FORWARD,  # the other model's forward is a row of the grid too
    dx.EARLIER_STEP: STALE_STEP,
    dx.GRAPH_CAPTURE: STALE_CAPTURE,
    dx.OTHER_MICRO_BATCH: OTHER_MICRO_BATCH,
    dx.OLD_MAPPING: OLD_MAPPING,
    dx.DUMMY: DUMMY,
}
_VALUE_KINDS = (dx.WRONG_ROWS, dx.PADDING, dx.WRONG_LENGTH)


@dataclass(frozen=True)
class Cell:
    """One store of the scenario: forward (1-based), draft step, micro-batch and layer."""

    forward: int
    draft_step: int
    micro_batch: int
    layer_id: int | None  # None: the call before the layers (metadata init, capture)
    outcome: str
    mark: str = ""  # the text drawn in the cell
    note: str = ""
    is_source: bool = False  # a store of the forward, step and micro-batch whose rows came back


@dataclass(frozen=True)
class ForwardRow:
    forward: int
    mode: str
    model: str
    draft_steps: int
    micro_batches: int


def outcome_of(divergence: Divergence) -> tuple[str, str, str]:
    """The grid outcome of the diverging store, its mark ("F1") and a note for its tooltip."""
    source = divergence.source or {}
    if divergence.kind not in _VALUE_KINDS:
        return ERROR, _MARKS[ERROR][0], divergence.kind
    outcome = _SOURCE_OUTCOME.get(source.get("kind"), WRONG)
    prefix, numbered_by = _MARKS[outcome]
    number = source.get(numbered_by) if numbered_by else None
    mark = f"{prefix}{number}" if number is not None else prefix
    return outcome, mark, source.get("phrase", divergence.kind)


def _schedule(scenario: Scenario) -> tuple[list[ForwardRow], list[tuple[int, int, int, int]]]:
    """Every forward and every store (forward, draft step, micro-batch, layer) in run order.

    The engine model fixes the schedule before a forward's first layer, so planning the
    events again gives exactly the stores the executor made.
    """
    rows: list[ForwardRow] = []
    stores: list[tuple[int, int, int, int]] = []
    try:
        for plan in replay_events(EngineState(scenario.config), scenario.events):
            forward = len(rows) + 1
            rows.append(ForwardRow(forward, plan.event.mode, plan.model, len(plan.steps), plan.num_micro_batches))
            for step in range(len(plan.steps)):
                stores.extend((forward, step, mb, layer) for mb, layer in plan.calls)
    except ScenarioError:
        pass  # the run stopped at this event as well; draw what came before
    return rows, stores


def cells_from_divergence(scenario: Scenario, divergence: Divergence) -> tuple[list[ForwardRow], list[Cell]]:
    """The grid known from the divergence alone: stores before it passed, it failed as
    diagnosed, stores after it never ran.

    A divergence outside any layer (set-up, metadata init, graph capture) becomes a cell with
    ``layer_id=None`` in front of its forward's row, and that whole forward did not run.
    """
    rows, stores = _schedule(scenario)
    outcome, mark, note = outcome_of(divergence)
    failing = (divergence.forward or 0, divergence.draft_step or 0, divergence.micro_batch or 0,
               divergence.layer_id)
    source = divergence.source or {}
    source_row = (source.get("forward"), source.get("draft_step"), source.get("micro_batch"))
    cells: list[Cell] = []
    if divergence.layer_id is None:
        cells.append(Cell(*failing, outcome=outcome, mark=mark, note=note))
    reached = True
    for store in stores:
        if store == failing:
            cells.append(Cell(*store, outcome=outcome, mark=mark, note=note))
            reached = False
            continue
        if divergence.layer_id is None and store[0] >= failing[0]:
            reached = False
        cells.append(Cell(*store, outcome=OK if reached else NOT_RUN,
                          is_source=reached and store[:3] == source_row))
    return rows, cells


def cells_from_rerun(report: Report) -> tuple[list[ForwardRow], list[Cell]] | None:
    """Every store of the shrunk scenario, from a run that goes on past wrong values, so a
    stale pattern across forwards shows whole. None (the picture then comes from the
    divergence alone) when there is nothing to draw, the failure is outside the layers, or
    the subject cannot be run again here."""
    divergence = report.divergence
    if divergence is None or report.scenario is None or divergence.layer_id is None:
        return None
    outcomes: list[StoreOutcome] = []
    try:
        subject = resolve_subject(report.subject).subject
        run_scenario(subject, report.scenario, device=report.device, on_store=outcomes.append, keep_going=True)
    except Exception:  # noqa: BLE001 - the report must still be written
        return None
    rows, stores = _schedule(report.scenario)
    first = next((o.divergence for o in outcomes if o.divergence is not None), divergence)
    source = first.source or {}
    source_row = (source.get("forward"), source.get("draft_step"), source.get("micro_batch"))
    cells = []
    for outcome in outcomes:
        store = (outcome.forward, outcome.draft_step, outcome.micro_batch, outcome.layer_id)
        if outcome.divergence is None:
            cells.append(Cell(*store, outcome=OK, is_source=store[:3] == source_row))
        else:
            cells.append(Cell(*store, *outcome_of(outcome.divergence)))
    cells += [Cell(*store, outcome=NOT_RUN) for store in stores[len(outcomes):]]
    return rows, cells


# ---- HTML ----------------------------------------------------------------------------------

REPORT_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #1b1b1b; max-width: 72em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.verdict { padding: .6em .9em; border-radius: 6px; background: #eef6f0; }
.verdict.bad { background: #fbeaea; } .verdict.partial { background: #fff6da; }
table.facts td { padding: .1em .8em .1em 0; vertical-align: top; }
table.grid { border-collapse: separate; border-spacing: 2px; }
table.grid th { font-weight: normal; color: #555; padding: 0 .4em; white-space: nowrap; }
table.grid th.row { text-align: right; }
table.grid td { width: 2.2em; height: 1.8em; text-align: center; color: #fff; font-weight: 600;
  font-size: 12px; border-radius: 3px; border: 2px solid transparent; }
table.grid td.none { background: #fafafa; border: 1px dashed #ddd; }
table.grid td.source { border: 2px dashed #111; }
table.grid td.failing { outline: 3px solid #111; }
tr.forward-start th, tr.forward-start td { border-top-width: 6px; }
.legend span.swatch { display: inline-block; width: 1.1em; height: 1.1em; border-radius: 3px;
  vertical-align: -.2em; margin: 0 .35em 0 1em; }
pre { background: #f5f5f5; padding: .8em; overflow-x: auto; }
"""


def escaped(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _row_label(row: ForwardRow, step: int, mb: int) -> str:
    parts = [f"forward {row.forward} · {row.mode}"]
    if row.model != "target":
        parts.append(row.model)
    if row.micro_batches > 1:
        parts.append(f"mb {mb}")
    if row.draft_steps > 1:
        parts.append(f"step {step}")
    return " · ".join(parts)


def _cell_html(cell: Cell | None) -> str:
    if cell is None:
        return '<td class="none" title="no SWA store at this layer"></td>'
    label, colour = OUTCOME_STYLE[cell.outcome]
    failing = cell.outcome not in (OK, NOT_RUN)
    classes = [c for c, on in (("failing", failing), ("source", cell.is_source)) if on]
    title = label + (f": {cell.note}" if cell.note else "") + (" (source of the stale rows)" if cell.is_source else "")
    text_colour = "#555" if cell.outcome == NOT_RUN else "#fff"
    return (f'<td class="{" ".join(classes)}" style="background:{colour};color:{text_colour}" '
            f'title="{escaped(title)}">{escaped(cell.mark)}</td>')


def render_grid(scenario: Scenario, rows: list[ForwardRow], cells: list[Cell]) -> str:
    """The forwards x layers table; micro-batches and draft steps get their own rows."""
    layers = list(scenario.config.stage_layers)
    by_store = {(c.forward, c.draft_step, c.micro_batch, c.layer_id): c for c in cells}
    # a column in front of the layers, only for a failure before the first layer
    before_layers = any(c.layer_id is None for c in cells)
    header = ("<th>init</th>" if before_layers else "") + "".join(f"<th>{layer}</th>" for layer in layers)
    out = [f'<table class="grid"><tr><th class="row">layer →</th>{header}</tr>']
    for row in rows:
        for step in range(row.draft_steps):
            for mb in range(row.micro_batches):
                start = ' class="forward-start"' if step == mb == 0 else ""
                tds = []
                if before_layers:
                    before = by_store.get((row.forward, step, mb, None))
                    tds.append(_cell_html(before) if before else '<td class="none"></td>')
                for layer in layers:
                    key = (row.forward, step, mb, layer)
                    tds.append(_cell_html(by_store.get(key)))
                out.append(f'<tr{start}><th class="row">{escaped(_row_label(row, step, mb))}</th>{"".join(tds)}</tr>')
    out.append("</table>")
    legend = "".join(
        f'<span class="swatch" style="background:{colour}"></span>{escaped(label)}'
        for label, colour in OUTCOME_STYLE.values()
    )
    out.append(f'<p class="legend">{legend}<span class="swatch" style="border:2px dashed #111"></span>'
               "where the stale rows came from</p>")
    return "\n".join(out)


def _facts_html(report: Report) -> str:
    facts = [
        ("subject", f"{report.subject} ({report.subject_info.get('kind', '?')}, truth "
                    f"{report.subject_info.get('truth', '?')})"),
        ("profile", report.profile + (f", settings {report.settings}" if report.settings else "")),
        ("seed", report.seed), ("device", report.device), ("run", run_line(report)),
        ("workers", report.workers), ("reproduce", report.replay_command),
        ("weakest profile", report.weakest_profile),
        ("reached", report.subject_info.get("reached", {}).get("sentence")),
        ("statements", report.subject_info.get("statements", {}).get("sentence")),
        ("finished", report.finished_at), ("harness", __version__),
    ]
    rows = "".join(f"<tr><td>{escaped(k)}</td><td>{escaped(v)}</td></tr>" for k, v in facts if v is not None)
    return f'<table class="facts">{rows}</table>'


def _coverage_html(report: Report) -> str:
    rows = "".join(
        f"<tr><td>{escaped(name)}</td><td>{report.coverage.get(name, 0)}</td></tr>" for name in ALL_FEATURES
    )
    return f'<table class="facts"><tr><th>feature</th><th>examples</th></tr>{rows}</table>'


def render_html(report: Report, cells: tuple[list[ForwardRow], list[Cell]] | None = None) -> str:
    """A self-contained page (inline style, no scripts or external resources)."""
    divergence = report.divergence
    tone = "bad" if divergence is not None else ("partial" if not report.complete else "")
    body = [f"<h1>swafuzz {escaped(report.command)}: {escaped(report.subject)}</h1>",
            f'<p class="verdict {tone}"><strong>{escaped(report.verdict)}</strong>'
            + (f" — {escaped(divergence.sentence)}" if divergence is not None else "") + "</p>"]
    if not report.complete:
        body.append(f'<p class="verdict partial">{escaped(_incomplete_note(report))}</p>')
    if divergence is not None and not report.replays:
        note = _flaky_note(report).replace("**", "") if report.flaky else _NO_REPLAY_NOTE
        body.append(f'<p class="verdict partial">{escaped(note)}</p>')
    body.append(_facts_html(report))
    if divergence is not None and report.scenario is not None:
        rows, grid_cells = cells or cells_from_divergence(report.scenario, divergence)
        body += ["<h2>Stores of the shrunk scenario</h2>", render_grid(report.scenario, rows, grid_cells)]
    if divergence is not None:
        if divergence.expected is not None or divergence.actual is not None:
            body.append(f"<h2>Rows</h2><pre>expected {escaped(divergence.expected)}\nactual   {escaped(divergence.actual)}</pre>")
        if report.scenario is not None:
            body.append(f"<h2>Scenario</h2><pre>{escaped(json.dumps(report.scenario.to_dict(), indent=2))}</pre>")
        if divergence.detail:
            body.append(f"<h2>Detail</h2><pre>{escaped(divergence.detail)}</pre>")
    body += ["<h2>Features covered</h2>", _coverage_html(report)]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>swafuzz: {escaped(report.verdict)} in {escaped(report.subject)}</title>"
        f"<style>{REPORT_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
