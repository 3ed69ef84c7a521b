"""The pull-request gate: every check swafuzz has of SGLang code, on a tree and on its base.

``swafuzz gate --sglang-source HEAD --sglang-base BASE`` runs, on HEAD and on BASE (a
release, ``0.5.23``, or another tree), with the same seed and budget:

- the merge gate (``swafuzz gate``, each run supervised in its own process) for every
  target HEAD's code has;
- the tree's producers of the rows and its graph runner's merge steps
  (:mod:`swafuzz.subjects.sglang.tree_checks`, one process per tree).

Each target, producer and runner step gets one verdict (for a producer or step,
*diverges* means a row differs from the truth):

- *diverges only in HEAD*: the pull request brings the divergence; this fails the gate;
- *diverges in BASE too*: there before the pull request; reported, it does not fail;
- *fixed in HEAD*: BASE diverges, HEAD does not;
- *clean*: neither diverges within the budget;
- *not in HEAD*: HEAD's code lacks the target's entry methods (nothing to gate);
- *not checked*: swafuzz cannot run HEAD's code for it (the message says what to supply);
  the gate then exits 2, as it cannot vouch for the code;
- *not checked in either tree*: a producer or step swafuzz cannot run in BASE either; the
  pull request changes nothing swafuzz could have checked there, so it is reported only.

Below the table, the statements of each target's entry method that no scenario ran are
listed per tree, with those of them a producer's check ran (a check's function is marked as
a target's is, and named alike), so that what nothing ran stands out.

The table goes to stdout and ``pr-gate.md``, a JUnit file to ``pr-gate.xml``, both in the
report directory; each run keeps its own reports below it.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from ..names import EXIT_DIVERGENCE, EXIT_OK, EXIT_USAGE
from ..results.reports import write_atomically
from ..process.channel import CHANNEL_ENV
from ..process.signals import Signals
from ..subjects.sglang import BindError, SOURCE_ENV, SWITCHES_ENV, TARGETS, Target, bind_target, locate
from ..subjects.sglang.binding import ClassCode
from ..subjects.sglang.tree_checks import BATCH_KINDS, TreeCheck, producer_batches
from ..subjects.sglang import tree_checks

PR_GATE_BUDGET_S = 20.0  # per target and tree
DIVERGES, CLEAN, ABSENT, GAP = "diverges", "clean", "absent", "not checked"
FAILS, UNCHECKED, UNCHECKED_IN_BOTH = "diverges only in HEAD", "not checked", "not checked in either tree"
VERDICTS = (FAILS, "diverges in BASE too", "fixed in HEAD", "clean", "not in HEAD", UNCHECKED, UNCHECKED_IN_BOTH)
TARGET = "target"
# beyond its budget a run still shrinks, replays its finding and writes its reports
RUN_GRACE_S = 300.0


@dataclass(frozen=True)
class Tree:
    """One side of the gate: a checkout (``path``) or a release (``version``)."""

    label: str
    path: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, text: str, label: str) -> "Tree":
        if re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", text):
            return cls(f"{label} (sglang {text})", version=text)
        try:
            locate.checkout(text)
        except locate.SglangUnavailable as exc:
            raise BindError(f"{label} {text!r}: {exc}; give a checkout or a release such as 0.5.23") from None
        return cls(f"{label} ({text})", path=str(Path(text).expanduser().resolve()))

    def source(self) -> locate.SourceTree:
        return locate.wheel(self.version) if self.version else locate.checkout(self.path)

    def subject(self, item: Target) -> str:
        return f"{item.subject_name}@{self.version}" if self.version else item.subject_name

    def options(self) -> list[str]:
        return [] if self.version else ["--sglang-source", self.path]

    def named(self) -> list[str]:
        """The options that name this tree to a command that needs one."""
        return ["--release", self.version] if self.version else ["--sglang-source", self.path]


@dataclass(frozen=True)
class Side:
    outcome: str  # DIVERGES, CLEAN, ABSENT or GAP
    detail: str = ""  # the divergence's sentence, or why it was not run
    reproduce: str | None = None
    reached: str | None = None  # where the tree calls the target (the run's subject_info.reached)
    # of a target's run, what it ran of the target's entry method (the report's
    # subject_info.statements); of a producer, the lines of its function its batches ran
    statements: dict | None = None


def has_target(item: Target, tree: locate.SourceTree) -> bool:
    """Whether ``tree``'s code defines the entry methods of ``item``, taking the parameters
    the target relies on (read, not bound)."""
    for code in item.code:
        if not isinstance(code, ClassCode) or not code.required:
            continue
        text = tree.read(code.path)
        if text is None:
            return False
        found = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == code.name), None)
        if found is None:
            return False
        defined = {n.name: n for n in found.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if not set(code.methods) <= set(defined):
            return False
        for method, parameter in code.parameters.items():
            arguments = defined[method].args
            if parameter not in {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}:
                return False  # another function under the old name (0.5.13 moved the translation out)
    return True


def _bind_gap(item: Target, tree: Tree) -> str | None:
    try:
        bind_target(item, tree.source(), "source")
    except BindError as exc:
        return str(exc)
    return None


def run_side(item: Target, tree: Tree, budget_s: float, seed: int, report_dir: Path,
             max_examples: int | None = None) -> Side:
    """The merge gate for ``item`` on ``tree``, in a process of its own."""
    source = tree.source()
    if not has_target(item, source):
        return Side(ABSENT, f"{source.label} has no {item.subject_name}")
    gap = _bind_gap(item, tree)
    if gap is not None:
        return Side(GAP, gap)
    command = [sys.executable, "-m", "swafuzz", "gate", "--subject", tree.subject(item), *tree.options(),
               "--sglang-mode", "source", "--budget", f"{budget_s:g}", "--seed", str(seed),
               "--report-dir", str(report_dir), "--json",
               *(["--max-examples", str(max_examples)] if max_examples else [])]
    # the tree is given on the command line; each run is supervised by its own supervisor
    environment = {k: v for k, v in os.environ.items() if k not in (SOURCE_ENV, CHANNEL_ENV)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=budget_s + RUN_GRACE_S,
                              env=environment)
    except subprocess.TimeoutExpired:
        return Side(GAP, f"the gate's run did not end within {budget_s + RUN_GRACE_S:g} s")
    if done.returncode in (EXIT_OK, EXIT_DIVERGENCE):
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            return Side(GAP, f"the gate's run printed no report: {done.stderr.strip()[-400:]}")
        info = report.get("subject_info", {})
        reached = info.get("reached", {}).get("sentence")
        statements = info.get("statements")
        if done.returncode == EXIT_OK:
            return Side(CLEAN, f"{report['examples']} scenarios", reached=reached, statements=statements)
        return Side(DIVERGES, report["diagnosis"]["sentence"], report.get("replay_command"), reached, statements)
    message = " ".join(done.stderr.split()) or f"exit {done.returncode}"
    return Side(GAP, message[-600:])


CHECKS_TIMEOUT_S = 300.0
_SIDE_OF_CHECK = {tree_checks.RIGHT: CLEAN, tree_checks.WRONG: DIVERGES, tree_checks.ABSENT: ABSENT,
                  tree_checks.GAP: GAP}
ALL_CHECKS = ("checks", "the producers and graph-runner steps")  # the row of a tree whose checks did not run


def run_checks(tree: Tree, seed: int) -> dict[tuple[str, str], Side]:
    """The tree's producers and runner steps, keyed by (kind, name), from a process of their own."""
    command = [sys.executable, "-m", "swafuzz.subjects.sglang.tree_checks", *tree.named(), "--seed", str(seed)]
    environment = {k: v for k, v in os.environ.items() if k not in (SOURCE_ENV, CHANNEL_ENV)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHECKS_TIMEOUT_S, env=environment)
        checks = [TreeCheck(**c) for c in json.loads(done.stdout)] if done.returncode == EXIT_OK else None
    except subprocess.TimeoutExpired:
        return {ALL_CHECKS: Side(GAP, f"the checks did not end within {CHECKS_TIMEOUT_S:g} s")}
    except (json.JSONDecodeError, TypeError):
        checks = None
    if checks is None:
        said = " ".join(done.stderr.split())[-600:] or f"exit {done.returncode}"
        return {ALL_CHECKS: Side(GAP, said)}
    return {(c.kind, c.name): Side(_SIDE_OF_CHECK[c.outcome], c.detail, statements=c.statements) for c in checks}


def verdict(head: Side, base: Side, kind: str = TARGET) -> str:
    if head.outcome == ABSENT:
        return "not in HEAD"
    if head.outcome == GAP:
        # a target is vouched for by its fuzzing alone; a producer or step swafuzz could not
        # run before the pull request either is reported without holding the gate
        return UNCHECKED_IN_BOTH if kind != TARGET and base.outcome == GAP else UNCHECKED
    if head.outcome == DIVERGES:
        return "diverges in BASE too" if base.outcome == DIVERGES else FAILS
    return "fixed in HEAD" if base.outcome == DIVERGES else "clean"


@dataclass(frozen=True)
class Row:
    name: str  # a target's subject name, or the SGLang function a producer or step is
    kind: str  # TARGET, a producer or runner step (tree_checks), or "checks" when a tree's checks did not run
    head: Side
    base: Side

    @property
    def verdict(self) -> str:
        return verdict(self.head, self.base, self.kind)


def check_rows(head: dict[tuple[str, str], Side], base: dict[tuple[str, str], Side]) -> list[Row]:
    """One row per producer or step either tree names, HEAD's order first."""
    missing = Side(ABSENT, "this tree's checks do not name it")
    keys = [*head, *(key for key in base if key not in head)]
    return [Row(name, kind, head.get((kind, name), missing), base.get((kind, name), missing)) for kind, name in keys]


def run_pr_gate(head: Tree, base: Tree, report_dir: Path, budget_s: float = PR_GATE_BUDGET_S,
                seed: int = 0, max_examples: int | None = None) -> list[Row]:
    """Every target on both trees, and each tree's checks, two runs at a time, each run's
    outcome said on stderr as it ends."""
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for side, tree in (("head", head), ("base", base)):
            jobs["producers and runner steps", side] = pool.submit(run_checks, tree, seed)
        for item in TARGETS:
            for side, tree in (("head", head), ("base", base)):
                jobs[item.name, side] = pool.submit(run_side, item, tree, budget_s, seed,
                                                    report_dir / side / item.name, max_examples)
        named = {future: key for key, future in jobs.items()}
        for done, future in enumerate(concurrent.futures.as_completed(named), 1):
            (name, side), outcome = named[future], future.result()
            print(f"swafuzz gate: [{done}/{len(jobs)}] {name} on {side.upper()}: {_said(outcome)}", file=sys.stderr)
    rows = [Row(item.subject_name, TARGET, jobs[item.name, "head"].result(), jobs[item.name, "base"].result())
            for item in TARGETS]
    checks = "producers and runner steps"
    return rows + check_rows(jobs[checks, "head"].result(), jobs[checks, "base"].result())


def _said(outcome: Side | dict[tuple[str, str], Side]) -> str:
    if isinstance(outcome, dict):
        counts: dict[str, int] = {}
        for side in outcome.values():
            counts[side.outcome] = counts.get(side.outcome, 0) + 1
        words = {DIVERGES: "wrong", CLEAN: "right", ABSENT: "absent", GAP: "not checked"}
        return ", ".join(f"{counts[o]} {words[o]}" for o in (DIVERGES, CLEAN, GAP, ABSENT) if o in counts)
    said = "not in this tree" if outcome.outcome == ABSENT else outcome.outcome
    return said + (f" ({outcome.detail})" if outcome.outcome == CLEAN else "")


def _cell(side: Side, kind: str) -> str:
    if kind == TARGET:
        text = {DIVERGES: "diverges", CLEAN: "clean", ABSENT: "-", GAP: "not checked"}[side.outcome]
    else:
        text = {DIVERGES: "wrong", CLEAN: "right", ABSENT: "-", GAP: "not checked"}[side.outcome]
    if side.outcome == DIVERGES and side.reproduce:
        text += f" (`{side.reproduce}`)"
    return text


def _table(rows: list[Row], first: str) -> list[str]:
    return [f"| {first} | verdict | HEAD | BASE |", "|---|---|---|---|",
            *(f"| `{row.name}` | {'**' + row.verdict + '**' if row.verdict == FAILS else row.verdict} "
              f"| {_cell(row.head, row.kind)} | {_cell(row.base, row.kind)} |" for row in rows)]


def markdown(rows: list[Row], head: Tree, base: Tree, budget_s: float, seed: int) -> str:
    targets = [row for row in rows if row.kind == TARGET]
    checks = [row for row in rows if row.kind != TARGET]
    switches = os.environ.get(SWITCHES_ENV, "").strip()
    lines = [f"# swafuzz pull-request gate: {head.label} against {base.label}", "",
             f"Each target on each tree: the `ci` settings, seed {seed}, a budget of {budget_s:g} s, "
             + (f"engine switches `{switches}`" if switches else "each tree's default engine switches")
             + "; a clean side names the scenarios it ran, and the statements of a target's code that no "
             "scenario ran are listed below.", "", *_table(targets, "target")]
    if checks:
        lines += ["", "## Producers of the rows and graph-runner steps", "",
                  f"Each tree's own code on {len(producer_batches(seed))} generated batches "
                  f"({', '.join(BATCH_KINDS)}; seed {seed}), compared row by row with the truth; the runner's "
                  "merge steps on captured and fresh metadata.", "", *_table(checks, "producer or step")]
    reported = [row for row in rows if row.verdict not in ("clean", "not in HEAD", UNCHECKED_IN_BOTH)]
    notes = [(row, side, name) for row in reported for side, name in ((row.head, "HEAD"), (row.base, "BASE"))
             if side.outcome in (DIVERGES, GAP)]
    if notes:
        lines += ["", "## What each run found", ""]
        lines += [f"- `{row.name}` in {name}: {' '.join(side.detail.split())}" for row, side, name in notes]
    in_both = [f"- `{row.name}`: {' '.join(row.head.detail.split())}" for row in rows if row.verdict == UNCHECKED_IN_BOTH]
    if in_both:
        lines += ["", "<details><summary>What swafuzz cannot run in either tree</summary>", "", *in_both, "",
                  "</details>"]
    ran_by = {side: _lines_checks_ran(checks, side) for side in ("HEAD", "BASE")}
    unrun = [f"- `{row.name}` in {name}: {said}" for row in targets
             for side, name in ((row.head, "HEAD"), (row.base, "BASE"))
             if (said := _unrun(side.statements, ran_by[name])) is not None]
    if unrun:
        lines += ["", "## Statements of the targets' code that no scenario ran", "",
                  "A verdict speaks only of what ran: these statements of each tree's entry method no scenario "
                  "reached, under the run's switches; where a producer's check ran one, it is named.", "", *unrun]
    changed, same = [], []
    for row in targets:
        if row.head.reached and _without_lines(row.head.reached) != _without_lines(row.base.reached or ""):
            changed += [f"- `{row.name}` in {name}: {side.reached}"
                        for side, name in ((row.head, "HEAD"), (row.base, "BASE")) if side.reached]
        elif row.head.reached:
            same.append(f"- `{row.name}` in HEAD: {row.head.reached}")
    if changed:
        lines += ["", "## Where HEAD calls the targets differently from BASE", "", *changed]
    if same:
        lines += ["", "<details><summary>Where HEAD calls the other targets, as BASE does "
                  "(line numbers aside)</summary>", "", *same, "", "</details>"]
    return "\n".join(lines) + "\n"


def _lines_checks_ran(checks: list[Row], side: str) -> dict[str, dict[int, list[str]]]:
    """Per SGLang function (named and placed as a target's entry method is), the lines of
    its statements that ``side``'s producer checks ran, each with the checks that ran it."""
    ran: dict[str, dict[int, list[str]]] = {}
    for row in checks:
        statements = (row.head if side == "HEAD" else row.base).statements
        if statements:
            for line in statements["lines"]:
                ran.setdefault(statements["name"], {}).setdefault(line, []).append(row.name)
    return ran


def _unrun(statements: dict | None, ran_by: dict[str, dict[int, list[str]]]) -> str | None:
    """What a target's run left unrun of its entry method, and which of those statements the
    tree's producer checks ran; None where the run ran them all (or said nothing)."""
    if not statements or not statements.get("never_ran"):
        return None
    checked = ran_by.get(statements.get("name", ""), {})
    covered = [entry["line"] for entry in statements["never_ran"] if entry["line"] in checked]
    if not covered:
        return statements["sentence"]
    left = [f"line {e['line']} `{e['text']}`" for e in statements["never_ran"] if e["line"] not in checked]
    by = sorted({name for line in covered for name in checked[line]})
    lines = "line" + "s" * (len(covered) > 1)
    return (statements["sentence"] + f"; of these, the producer checks {', '.join(f'`{n}`' for n in by)} ran "
            + f"{lines} {', '.join(map(str, covered))}"
            + (f", and nothing ran {', '.join(left)}" if left else ", so each statement ran somewhere"))


def _without_lines(sentence: str) -> str:
    return re.sub(r":\d+\b", "", sentence)


def junit(rows: list[Row]) -> str:
    suite = ElementTree.Element("testsuite", name="swafuzz pull-request gate", tests=str(len(rows)),
                                failures=str(sum(r.verdict == FAILS for r in rows)),
                                errors=str(sum(r.verdict == UNCHECKED for r in rows)),
                                skipped=str(sum(r.verdict in ("not in HEAD", UNCHECKED_IN_BOTH) for r in rows)))
    for row in rows:
        case = ElementTree.SubElement(suite, "testcase", classname=f"swafuzz.tools.pr_gate.{row.kind.replace(' ', '_')}",
                                      name=row.name)
        if row.verdict == FAILS:
            ElementTree.SubElement(case, "failure", message=row.head.detail).text = row.head.reproduce or ""
        elif row.verdict == UNCHECKED:
            ElementTree.SubElement(case, "error", message=row.head.detail)
        elif row.verdict in ("not in HEAD", UNCHECKED_IN_BOTH):
            ElementTree.SubElement(case, "skipped", message=row.head.detail)
        else:
            ElementTree.SubElement(case, "system-out").text = row.verdict
    return ElementTree.tostring(suite, encoding="unicode") + "\n"


def exit_code(rows: list[Row]) -> int:
    verdicts = {row.verdict for row in rows}
    if FAILS in verdicts:
        return EXIT_DIVERGENCE
    if UNCHECKED in verdicts or all(row.verdict == "not in HEAD" for row in rows if row.kind == TARGET):
        return EXIT_USAGE  # the gate cannot vouch for code it did not run
    return EXIT_OK


def read_both(head: Tree, base: Tree) -> None:
    """Reach both trees before any search, fetching a release's wheel once (and saying so),
    so that a base or tree that cannot be read ends the gate in seconds with one line."""
    for tree in (head, base):
        if tree.version and locate.cached_wheel(tree.version) is None and os.environ.get(locate.OFFLINE_ENV) != "1":
            print(f"swafuzz gate: fetching the sglang {tree.version} wheel into {locate.cache_dir()} (once)",
                  file=sys.stderr)
        try:
            tree.source()
        except locate.SglangUnavailable as exc:
            raise BindError(f"{tree.label}: {exc}") from None


def main(head_text: str, base_text: str, report_dir: Path, budget_s: float | None, seed: int | None,
         max_examples: int | None = None) -> int:
    head, base = Tree.parse(head_text, "HEAD"), Tree.parse(base_text, "BASE")
    read_both(head, base)
    budget_s, seed = budget_s or PR_GATE_BUDGET_S, 0 if seed is None else seed
    print(f"swafuzz gate: {len(TARGETS)} targets on {head.label} and {base.label}, {budget_s:g} s each, "
          f"and each tree's producers and graph-runner steps, two runs at a time", file=sys.stderr)
    try:
        rows = run_pr_gate(head, base, report_dir, budget_s, seed, max_examples)
    except KeyboardInterrupt:
        return _interrupted(report_dir)
    table = markdown(rows, head, base, budget_s, seed)
    report_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(report_dir / "pr-gate.md", table)
    write_atomically(report_dir / "pr-gate.xml", junit(rows))
    print(table, end="")
    print(f"\nreports: {report_dir / 'pr-gate.md'}, {report_dir / 'pr-gate.xml'}")
    code = exit_code(rows)
    if code == EXIT_USAGE:
        checked_nothing = all(row.verdict == "not in HEAD" for row in rows if row.kind == TARGET)
        print("swafuzz gate: " + ("HEAD has none of the SGLang targets: nothing was gated" if checked_nothing
                                  else "HEAD has code swafuzz could not run (see above): the gate cannot pass"),
              file=sys.stderr)
    return code


def _interrupted(report_dir: Path) -> int:
    """An interrupted gate gives no verdict, but the runs that ended wrote their reports:
    say which, rather than that nothing was written."""
    signum = Signals.first or signal.SIGINT
    written = sorted(str(path.parent) for path in report_dir.glob("*/*/report.json"))
    print(f"swafuzz gate: interrupted by {signal.Signals(signum).name} with no verdict; "
          + (f"the runs that ended wrote their reports in {', '.join(written)}" if written else "no run had ended"),
          file=sys.stderr)
    return 128 + signum
