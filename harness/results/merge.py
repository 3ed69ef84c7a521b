"""One report for a campaign spread over machines: the ``report.json`` of every shard (or
any set of runs) combined into one Markdown summary, JUnit file, HTML page and JSON file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..reference import Scenario, ScenarioError
from ..strategies.features import ALL_FEATURES

from .reports import (
    DIVERGENCE,
    NO_DIVERGENCE,
    REPORT_FILES,
    Report,
    REPORT_CSS,
    escaped,
    run_line,
    cells_from_divergence,
    junit_document,
    render_grid,
    render_markdown,
    write_atomically,
)
from ..run.boundary import InputError, describe_path, parse_json, read_regular_file
from .replay import ReplayError, divergence_from
from ..errors import ReportError

MERGED_FORMAT = "swafuzz-merged-report"
_REPORT_JSON = REPORT_FILES["json"]


@dataclass
class Run:
    """One merged run: its report and where it came from."""

    source: Path  # the report.json read
    report: Report

    @property
    def label(self) -> str:
        shard = f" shard {self.report.shard}" if self.report.shard else ""
        return f"{self.source.parent}{shard}"


@dataclass
class MergedReport:
    runs: list[Run]
    written: dict[str, Path]

    @property
    def diverged(self) -> bool:
        return any(run.report.divergence is not None for run in self.runs)

    def headline(self) -> str:
        return _headline(self.runs)


# ---- reading -------------------------------------------------------------------------------

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "verdict": str, "complete": bool, "command": str, "subject": str, "subject_info": dict,
    "profile": str, "examples": int, "elapsed_s": (int, float), "coverage": dict,
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "interrupted_by": str, "settings": str, "seed": int, "device": str, "budget_s": (int, float),
    "workers": int, "shard": str, "finished_at": str, "weakest_profile": str, "replay_file": str,
    "replays": bool, "replays_run": int, "replays_diverged": int, "examples_to_divergence": int,
    "first_divergence_s": (int, float), "examples_per_worker": list,
}


def load_report(path: str | os.PathLike) -> tuple[Path, Report]:
    """The report in ``path`` (a report directory or its ``report.json``), read within the
    limits of any file from elsewhere (:mod:`swafuzz.run.boundary`): other machines wrote it."""
    path = Path(path)
    source = path / _REPORT_JSON if path.is_dir() else path
    name = describe_path(source)
    try:
        data = parse_json(read_regular_file(source, "report"), name)
    except InputError as exc:
        raise ReportError(str(exc)) from None
    try:
        return source, report_from_dict(data)
    except ReportError as exc:
        raise ReportError(f"{name}: {exc}") from None


def report_from_dict(data: Any) -> Report:
    """The :class:`Report` a ``report.json`` was written from (the inverse of ``to_dict``)."""
    if not isinstance(data, dict):
        raise ReportError(f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") == MERGED_FORMAT:
        raise ReportError("this is a merged report already: merge the reports it was made from")
    for name, kinds in _REQUIRED.items():
        if not _has_type(data.get(name), kinds):
            raise ReportError(f"field '{name}' is missing or has the wrong type: {data.get(name)!r}")
    for name, kinds in _OPTIONAL.items():
        if data.get(name) is not None and not _has_type(data[name], kinds):
            raise ReportError(f"field '{name}' has the wrong type: {data[name]!r}")
    if data["verdict"] not in (DIVERGENCE, NO_DIVERGENCE):
        raise ReportError(f"field 'verdict' is {data['verdict']!r}, expected {DIVERGENCE!r} or {NO_DIVERGENCE!r}")
    if not all(isinstance(k, str) and _has_type(v, int) for k, v in data["coverage"].items()):
        raise ReportError("field 'coverage' must map feature names to counts")
    if not all(_has_type(count, int) for count in data.get("examples_per_worker") or ()):
        raise ReportError("field 'examples_per_worker' must list counts")
    divergence = scenario = None
    if data["verdict"] == DIVERGENCE:
        try:
            divergence = divergence_from(data.get("diagnosis"))
            scenario = Scenario.from_dict(data["scenario"]) if data.get("scenario") is not None else None
        except (ReplayError, ScenarioError) as exc:
            raise ReportError(str(exc)) from None
    known = {f.name for f in fields(Report)}
    return Report(
        **{name: data[name] for name in (*_REQUIRED, *_OPTIONAL) if name in known and data.get(name) is not None
           and name != "verdict"},
        divergence=divergence, scenario=scenario,
    )


def _has_type(value: Any, kinds: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON's true is no count of anything
        return kinds is bool
    return isinstance(value, kinds)


# ---- writing -------------------------------------------------------------------------------


def merge_reports(paths: list[str | os.PathLike], directory: str | os.PathLike) -> MergedReport:
    """Read every report first (one bad report writes nothing), then write the merged
    ``summary.md``, ``junit.xml``, ``report.html`` and ``report.json`` into ``directory``."""
    runs = [Run(*load_report(path)) for path in paths]
    directory = Path(directory)
    rendered = {
        "markdown": render_merged_markdown(runs),
        "json": json.dumps(merged_dict(runs), indent=2) + "\n",
        "junit": junit_document([run.report for run in runs]),
        "html": render_merged_html(runs, directory),
    }
    written = {fmt: write_atomically(directory / REPORT_FILES[fmt], text) for fmt, text in rendered.items()}
    return MergedReport(runs, written)


def _diverged(runs: list[Run]) -> list[Run]:
    return [run for run in runs if run.report.divergence is not None]


def _headline(runs: list[Run]) -> str:
    diverged = _diverged(runs)
    incomplete = sum(not run.report.complete for run in runs)
    if diverged:
        verdict = f"divergence in {len(diverged)} of {len(runs)} runs"
    else:
        verdict = f"no divergence in {len(runs)} runs"
    examples = sum(run.report.examples for run in runs)
    note = f"; {incomplete} incomplete" if incomplete else ""
    return f"swafuzz merge-reports: {verdict} ({examples} examples{note})"


def _features(runs: list[Run]) -> set[str]:
    return {feature for run in runs for feature in run.report.features_covered}


def merged_dict(runs: list[Run]) -> dict[str, Any]:
    return {
        "format": MERGED_FORMAT,
        "verdict": DIVERGENCE if _diverged(runs) else NO_DIVERGENCE,
        "complete": all(run.report.complete for run in runs),
        "examples": sum(run.report.examples for run in runs),
        "features_covered": sorted(_features(runs)),
        "runs": [{"source": str(run.source), **run.report.to_dict()} for run in runs],
    }


def _table_rows(runs: list[Run]) -> list[tuple[str, ...]]:
    return [
        (run.label, run.report.subject, run.report.profile, run.report.settings or "-",
         "-" if run.report.seed is None else str(run.report.seed), run_line(run.report),
         run.report.verdict + ("" if run.report.complete else " (incomplete)"))
        for run in runs
    ]


_COLUMNS = ("run", "subject", "profile", "settings", "seed", "examples", "verdict")


def render_merged_markdown(runs: list[Run]) -> str:
    diverged = _diverged(runs)
    icon = "❌" if diverged else ("⚠️" if not all(run.report.complete for run in runs) else "✅")
    lines = [f"## {icon} {_headline(runs).removeprefix('swafuzz merge-reports: ')}", "",
             f"Features covered by all runs together: {len(_features(runs))} of {len(ALL_FEATURES)}.", "",
             "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in _table_rows(runs)]
    lines.append("")
    for run in diverged:
        lines += [f"#### {run.label}", "", render_markdown(run.report)]
    return "\n".join(lines)


def render_merged_html(runs: list[Run], directory: Path) -> str:
    diverged = _diverged(runs)
    tone = "bad" if diverged else ""
    header = "".join(f"<th>{escaped(column)}</th>" for column in _COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{escaped(cell)}</td>" for cell in row) + "</tr>" for row in _table_rows(runs))
    body = [f"<h1>{escaped(_headline(runs))}</h1>",
            f'<p class="verdict {tone}">features covered by all runs together: '
            f"{len(_features(runs))} of {len(ALL_FEATURES)}</p>",
            f'<table class="facts"><tr>{header}</tr>{rows}</table>']
    for run in diverged:
        report = run.report
        page = Path(os.path.relpath(run.source.parent / REPORT_FILES["html"], directory))
        body += [f"<h2>{escaped(run.label)}: {escaped(report.subject)}</h2>",
                 f'<p class="verdict bad">{escaped(report.divergence.sentence)}</p>',
                 f"<p>reproduce: <code>{escaped(report.replay_command)}</code>; its own page: "
                 f'<a href="{escaped(page.as_posix())}">{escaped(page.as_posix())}</a></p>']
        if report.scenario is not None:
            body.append(render_grid(report.scenario, *cells_from_divergence(report.scenario, report.divergence)))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escaped(_headline(runs))}</title><style>{REPORT_CSS}</style></head><body>\n"
        + "\n".join(body) + "\n</body></html>\n"
    )
