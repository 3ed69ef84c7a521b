"""The SGLang version matrix: every target of every release, fuzzed under each profile.

``python -m harness.sglang.matrix`` (what ``tox -e sglang-matrix`` runs) downloads the
wheels, binds each target in source mode, runs the hand-written examples and the fuzzer
under the ``realistic`` and ``adversarial`` profiles, writes a replay file per divergence
and a Markdown report that says, for each divergence, whether SGLang's real lifecycle can
reach it.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from reference import Scenario
from strategies.examples import EXAMPLES
from strategies.features import (
    DRAFT_EXTEND,
    DRAFT_MODEL,
    DRAFT_MULTISTEP,
    FIRST_SWA_LAYER_NOT_START,
    GRAPH_REPLAY,
    IDLE,
    IN_PLACE_MAPPING_CHANGE,
    MICRO_BATCHES,
    PAGED_POOLS,
    PIPELINE_STAGE,
    RAGGED_EXTEND,
    REGISTER_MAPPING,
    SKIP_METADATA_INIT,
    TARGET_VERIFY,
    features_of,
)
from strategies.scenarios import PROFILES, adversarial_reasons, weakest_profile

from .. import __version__
from ..diagnosis import (
    EARLIER_FORWARD,
    EARLIER_STEP,
    GRAPH_CAPTURE,
    OLD_MAPPING,
    OTHER_MICRO_BATCH,
    RAISED,
    UNIFORM_REPEAT,
    Divergence,
)
from ..executor import run_scenario
from ..fuzz import fuzz
from ..registry import SubjectInfo
from ..replay import Replay, write_replay
from ..reports import write_atomically
from . import locate, provenance
from .binding import BindError
from .reachability import QUESTIONS, Route, question
from .switches import defaults_table
from .targets import TARGETS, Target

EXAMPLES_COLUMN = "examples"

# The domain brief's facts behind each lifecycle feature a realistic scenario may use.
DOMAIN_FACTS = {
    PIPELINE_STAGE: ("§3", "under pipeline parallelism start_layer > 0"),
    FIRST_SWA_LAYER_NOT_START: ("§3", "hybrid models interleave SWA and full-attention layers, so the "
                                "first SWA-storing layer of a stage need not be start_layer (in "
                                "DeepSeek-V4 itself every layer stores SWA keys)"),
    MICRO_BATCHES: ("§3", "two-batch overlap splits a batch into two micro-batches that share the "
                    "pool but have their own backend and metadata; their layers interleave"),
    IN_PLACE_MAPPING_CHANGE: ("§3", "the mapping is mutated in place: allocation, free and eviction "
                              "of out-of-window tokens"),
    DRAFT_MULTISTEP: ("§3", "multi-step draft decode runs several steps per forward, positions "
                      "advancing, metadata built once"),
    RAGGED_EXTEND: ("§3", "extend/prefill has ragged token counts per request"),
    TARGET_VERIFY: ("§3", "target-verify runs num_draft_tokens per request"),
    DRAFT_EXTEND: ("§3", "draft-extend is a forward mode of the draft model"),
    IDLE: ("§3", "a data-parallel rank with no requests runs idle forwards; padded rows must write "
           "to the dummy slot"),
    SKIP_METADATA_INIT: ("§3", "with speculative decoding on, idle forwards skip metadata init and "
                         "the previous forward's metadata stays in place"),
    GRAPH_REPLAY: ("§2", "decode runs as captured graphs; before each replay fresh metadata is "
                   "merged into the captured object, and captured kernels read by address"),
    DRAFT_MODEL: ("§3", "a draft model and the target model run in one process with separate pools"),
    PAGED_POOLS: ("§1", "tokens take slots in paged full and SWA pools linked by the mapping"),
}


@dataclass
class Finding:
    """One divergence of one target in one version under one profile (or example)."""

    version: str
    target: Target
    column: str  # a profile, or "examples"
    divergence: Divergence
    scenario: Scenario
    replay: Path
    example: str | None = None


@dataclass
class Cell:
    version: str
    target: Target
    bound: bool
    message: str = ""  # why it does not bind
    runs: dict[str, str] = field(default_factory=dict)  # column -> verdict text
    findings: list[Finding] = field(default_factory=list)


@dataclass
class Matrix:
    versions: list[str]
    cells: list[Cell]
    unavailable: dict[str, str]  # version -> why no wheel
    settings: str
    max_examples: int | None
    seed: int
    elapsed_s: float
    sources: dict[str, str] = field(default_factory=dict)  # version -> digest of the SGLang files read
    # the checkout as the run found it: the run's own replay files would make it look changed
    revision: str = ""


def run_matrix(
    versions: list[str], *, settings: str = "ci", max_examples: int | None = None, seed: int = 0,
    cache: str | None = None, replay_dir: Path = Path("reports/sglang-matrix"),
    log=lambda line: None,
) -> Matrix:
    started = time.monotonic()
    revision = provenance.revision()
    cells: list[Cell] = []
    unavailable: dict[str, str] = {}
    sources: dict[str, str] = {}
    for version in versions:
        try:
            tree = locate.wheel(version, cache)
        except locate.SglangUnavailable as exc:
            unavailable[version] = str(exc)
            log(f"{version}: {exc}")
            continue
        sources[version] = provenance.sglang_digest(tree)
        for target in TARGETS:
            try:
                info = target.info(tree, "source", name=f"{target.subject_name}@{version}")
            except BindError as exc:
                cells.append(Cell(version, target, bound=False, message=str(exc)))
                continue
            cell = Cell(version, target, bound=True)
            _run_examples(cell, info, replay_dir)
            for profile in PROFILES:
                _run_fuzz(cell, info, profile, settings, max_examples, seed, replay_dir)
            log(f"{version} {target.name}: " + ", ".join(f"{k} {v}" for k, v in cell.runs.items()))
            cells.append(cell)
    return Matrix(list(versions), cells, unavailable, settings, max_examples, seed, time.monotonic() - started,
                  sources, revision)


def _run_examples(cell: Cell, info: SubjectInfo, replay_dir: Path) -> None:
    diverged = []
    for name, scenario in EXAMPLES.items():
        divergence = run_scenario(info.subject, scenario).divergence
        if divergence is None:
            continue
        diverged.append(name)
        # the example's name stands in for the settings, so each gets its own file
        replay = Replay(info.name, weakest_profile(scenario), scenario, divergence, settings=f"example {name}")
        path = write_replay(replay, replay_dir)
        cell.findings.append(Finding(cell.version, cell.target, EXAMPLES_COLUMN, divergence, scenario, path, name))
    cell.runs[EXAMPLES_COLUMN] = f"{len(diverged)}/{len(EXAMPLES)} diverge"


def _run_fuzz(cell: Cell, info: SubjectInfo, profile: str, settings: str, max_examples: int | None,
              seed: int, replay_dir: Path) -> None:
    result = fuzz(info, profile=profile, settings=settings, max_examples=max_examples, seed=seed)
    if result.divergence is None:
        cell.runs[profile] = f"no divergence ({result.examples} scenarios)"
        return
    replay = Replay(info.name, profile, result.scenario, result.divergence, seed=result.seed,
                    settings=result.settings)
    path = write_replay(replay, replay_dir)
    cell.findings.append(Finding(cell.version, cell.target, profile, result.divergence, result.scenario, path))
    cell.runs[profile] = f"divergence after {result.examples} scenarios"


# ---- judging reachability ------------------------------------------------------------------


def harness_gap(divergence: Divergence) -> bool:
    """The bound code read something the stand-ins do not model: not a finding."""
    return divergence.kind == RAISED and "StandInGap" in divergence.detail


def reachability(finding: Finding) -> tuple[str, str]:
    """A verdict (reachable, reachable off-default, not reached, unconfirmed, adversarial
    only, harness gap) and why.

    The profile decides first (the realistic profile draws only what the domain brief says
    the engine does); then SGLang's own code, through the call paths read per release
    (:mod:`.reachability`): whether the model reads the target in the diverging forward's
    mode, and whether the problem the divergence is an instance of is reached. Only a
    cited call path makes a divergence reachable.
    """
    divergence, target = finding.divergence, finding.target
    if harness_gap(divergence):
        return "harness gap", "the stand-ins lack what the code read: " + divergence.sentence
    reasons = adversarial_reasons(finding.scenario)
    if reasons:
        return "adversarial only", "outside the realistic profile: " + "; ".join(reasons)
    events = finding.scenario.events
    upto = divergence.event if divergence.event is not None and divergence.event >= 0 else len(events) - 1
    event = events[upto]
    features = features_of(Scenario(finding.scenario.config, events[: upto + 1]))
    facts = [f"{DOMAIN_FACTS[f][1]} (DOMAIN.md {DOMAIN_FACTS[f][0]})" for f in sorted(features) if f in DOMAIN_FACTS]
    cause = question_key(finding, features)
    keys = [k for k in (_mode_question(target, event.mode), cause) if k is not None]
    readings = [(key, question(key).routes_for(finding.version)) for key in keys]
    readings = [(key, routes) for key, routes in readings if routes]
    for key, routes in readings:
        if not any(route.reached for route in routes):
            return "not reached", _cite(key, routes[0])
    if cause is None or cause not in dict(readings):
        return "unconfirmed", (
            "realistic for the domain brief (" + ("; ".join(facts) or "a plain decode lifecycle")
            + "), but no SGLang call path to it has been read for this release"
        )
    defaults = [(key, routes[0]) for key, routes in readings if routes[0].setting is None and routes[0].reached]
    if len(defaults) == len(readings):
        return "reachable", "; ".join(_cite(key, route) for key, route in defaults)
    needed = [(key, next(r for r in routes if r.reached)) for key, routes in readings]
    settings = sorted({route.setting for _, route in needed if route.setting})
    return "reachable off-default", f"only with {', '.join(settings)}: " + "; ".join(
        _cite(key, route) for key, route in needed)


def _mode_question(target: Target, mode: str) -> str | None:
    """Whether SGLang's model reads this target's code in ``mode`` at all (ring getters only)."""
    if target.name not in question("ring-getter-in-verify").targets:
        return None
    if mode == "verify":
        return "ring-getter-in-verify"
    if mode in ("extend", "draft_extend"):
        return "ring-getter-in-extend"
    return None


def question_key(finding: Finding, features: set[str]) -> str | None:
    """The historical problem (a key of :data:`reachability.QUESTIONS`) a divergence is an
    instance of, from where its wrong rows came from and what the scenario exercised; None
    when it is none of them, or when no route was read for this target's code."""
    cause = (finding.divergence.source or {}).get("kind")
    key = None
    if cause == OTHER_MICRO_BATCH:
        key = "pool-cache-two-batch-overlap"
    elif cause == GRAPH_CAPTURE:
        key = "assign-listed-ring-rows"
    elif cause == EARLIER_STEP:
        key = "multi-step-draft-ring-rows"
    elif cause == UNIFORM_REPEAT:
        key = "uniform-repeat-interleave"
    elif cause == OLD_MAPPING and REGISTER_MAPPING in features:
        key = "pool-register-mapping-keeps-cache"
    elif cause == EARLIER_FORWARD and FIRST_SWA_LAYER_NOT_START in features:
        key = "pool-cache-first-swa-layer"
    elif SKIP_METADATA_INIT in features:
        key = "skipped-metadata-init-idle"
    if key is None or finding.target.name not in question(key).targets:
        return None
    return key


def _cite(key: str, route: Route) -> str:
    return f"{route.why} (call path read in {_span(route.releases)}: {route.cited()}) [{key}]"


def _span(versions: tuple[str, ...]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"


# ---- the report ----------------------------------------------------------------------------


def render(matrix: Matrix, report_path: Path) -> str:
    bound = [c for c in matrix.cells if c.bound]
    columns = [EXAMPLES_COLUMN, *PROFILES]
    groups: dict[tuple, list[Finding]] = defaultdict(list)
    for finding in (f for c in bound for f in c.findings):
        verdict, why = reachability(finding)
        key = (finding.target.name, finding.column, finding.example or "", finding.divergence.sentence, verdict, why)
        groups[key].append(finding)
    numbered = list(enumerate(sorted(groups.items()), 1))
    lines = [
        "# SGLang version matrix",
        "",
        f"Generated by `tox -e sglang-matrix` (`python -m harness.sglang.matrix`) on "
        f"{datetime.date.today().isoformat()} with swafuzz {__version__}: released wheels read in "
        f"source mode, fuzzing settings `{matrix.settings}` (seed {matrix.seed}"
        + (f", at most {matrix.max_examples} scenarios" if matrix.max_examples else "")
        + f" per run), {matrix.elapsed_s:.0f} s in all.",
        "",
        f"- harness sources: `{provenance.harness_digest()}` (revision `{matrix.revision}`); "
        "the SGLang sources read, per release, are under *Provenance*. "
        "`tests/test_sglang_matrix_report.py` fails when either changes: regenerate with "
        "`tox -e sglang-matrix`.",
        "",
        "Each bound version x target pair runs the hand-written examples "
        "(`strategies/examples.py`, one per bug class) and the fuzzer under the `realistic` and "
        "`adversarial` profiles; the fuzzer stops at its first divergence and shrinks it. Every "
        "divergence is judged: **reachable** (a realistic scenario on a call path read in that "
        "release with its default settings, cited hop by hop), **reachable off-default** (the "
        "cited path exists only under a non-default setting, named), **not reached** (the "
        "release's code, cited, never takes that path, whatever profile found it), "
        "**unconfirmed** (realistic for the domain brief, but no call path has been read), "
        "**adversarial only** (outside the realistic profile, with the reasons), or **harness "
        "gap** (the stand-ins lack something the code read).",
        "",
        "## Summary",
        "",
        f"- versions: {len(matrix.versions)} ({', '.join(matrix.versions)})"
        + (f"; no wheel for {', '.join(matrix.unavailable)}" if matrix.unavailable else ""),
        f"- bound version x target pairs: {len(bound)} of {len(matrix.cells)} "
        f"({len(TARGETS)} targets)",
    ]
    for column in columns:
        diverged = sum(1 for c in bound if any(f.column == column for f in c.findings))
        lines.append(f"- {column}: {diverged} of {len(bound)} pairs diverge")
    verdicts: dict[str, list[int]] = defaultdict(list)
    for number, (key, _) in numbered:
        verdicts[key[4]].append(number)
    lines.append("- diagnoses by verdict: " + (", ".join(
        f"{verdict} {len(numbers)} ({', '.join(f'#{n}' for n in numbers)})"
        for verdict, numbers in sorted(verdicts.items())) or "no divergence"))
    lines += ["", "## Reachable in SGLang", ""]
    reachable = [(n, key, members) for n, (key, members) in numbered if key[4].startswith("reachable")]
    for number, (target, column, example, sentence, verdict, _), members in reachable:
        label = f"example `{example}`" if example else f"{column} fuzzing"
        lines.append(f"- #{number} `sglang:{target}` {', '.join(f.version for f in members)} ({label}, "
                     f"{verdict}): {sentence}")
    if not reachable:
        lines.append("No divergence that SGLang's real lifecycle can reach.")
    lines += ["", "## Historical problems by release", "",
              "What the call paths read in each release say (`harness/sglang/reachability.py`, pinned "
              "against the wheels by `tests/test_sglang_reachability.py`).", "", *_problems_table(matrix.versions)]
    lines += ["", "## Engine switches by release", "",
              "Defaults read from each release (`harness/sglang/switches.py`); a route that needs a "
              "switch set against its default makes a divergence *reachable off-default*.", "",
              *defaults_table(tuple(matrix.versions))]
    lines += ["", "## Which releases have which target", "",
              "| target | code | releases |", "| --- | --- | --- |"]
    for target in TARGETS:
        lines.append(f"| `{target.subject_name}` | {'; '.join(_code_names(target))} | {target.releases()} |")
    for column in columns:
        lines += ["", f"## Verdicts: {column}", "", _table(matrix, column)]
    lines += ["", "## Divergences", "",
              "Grouped by target, column and diagnosis; each names its replay files "
              "(`swafuzz replay FILE`).", ""]
    for number, ((target, column, example, sentence, verdict, why), members) in numbered:
        label = f"example `{example}`" if example else f"{column} profile"
        lines.append(f"{number}. **sglang:{target}**, {label}, {', '.join(f.version for f in members)}: {sentence}")
        lines.append(f"   - **{verdict}**: {why}.")
        files = ", ".join(f"[{f.version}]({_relative(f.replay, report_path)})" for f in members)
        lines.append(f"   - replay: {files}")
    if not numbered:
        lines.append("No divergence.")
    lines += ["", "## Why a target does not bind", ""]
    reasons = defaultdict(list)
    for cell in matrix.cells:
        if not cell.bound:
            reasons[(cell.target.name, _generic(cell.message, cell.version))].append(cell.version)
    for (target, message), versions in sorted(reasons.items()):
        lines.append(f"- `sglang:{target}` in {', '.join(versions)}: {message}")
    for version, message in matrix.unavailable.items():
        lines.append(f"- {version}: {message}")
    lines += ["", "## Provenance", "",
              "Digest of the SGLang files each release's verdicts rest on: "
              + ", ".join(f"`{path}`" for path in provenance.sglang_paths()) + ".", "",
              "| release | SGLang sources |", "| --- | --- |"]
    lines += [f"| {version} | `{digest}` |" for version, digest in matrix.sources.items()]
    return "\n".join(lines) + "\n"


def _problems_table(versions: list[str]) -> list[str]:
    """Release x historical problem: reached or not, each cell naming the call path read."""
    marks: dict[Route, str] = {}
    rows = ["| release | " + " | ".join(f"`{item.key}`" for item in QUESTIONS) + " |",
            "| --- |" + " --- |" * len(QUESTIONS)]
    for version in versions:
        cells = []
        for item in QUESTIONS:
            parts = []
            for route in item.routes_for(version):
                mark = marks.setdefault(route, f"P{len(marks) + 1}")
                state = "reached" if route.reached else "not reached"
                parts.append(f"{state}{f' with {route.setting}' if route.setting else ''} ({mark})")
            cells.append("; ".join(parts) or "not read")
        rows.append(f"| {version} | " + " | ".join(cells) + " |")
    rows += ["", "Call paths:", ""]
    rows += [f"- {mark}: {route.why}: {route.cited()}" for route, mark in marks.items()]
    return rows


def _code_names(target: Target) -> list[str]:
    names = []
    for code in target.code:
        methods = getattr(code, "methods", None)
        if methods is None:
            names.append(f"`{code.name}()`")
        else:
            names.extend(f"`{code.name}.{m}`" for m in methods)
    return names


def _table(matrix: Matrix, column: str) -> str:
    rows = ["| version | " + " | ".join(t.name for t in TARGETS) + " |",
            "| --- |" + " --- |" * len(TARGETS)]
    by_key = {(c.version, c.target.name): c for c in matrix.cells}
    for version in matrix.versions:
        if version in matrix.unavailable:
            continue
        cells = []
        for target in TARGETS:
            cell = by_key.get((version, target.name))
            cells.append("n/a" if cell is None or not cell.bound else cell.runs.get(column, ""))
        rows.append(f"| {version} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _generic(message: str, version: str) -> str:
    # the same reason reads the same in every version
    return message.replace(f"sglang {version} wheel (source mode): ", "").replace(
        f"sglang {version} wheel (source mode)", "the release")


def _relative(path: Path, report_path: Path) -> str:
    try:
        return str(path.resolve().relative_to(report_path.resolve().parent))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.sglang.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(locate.RELEASES),
                        help="comma-separated SGLang releases (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("reports/sglang-matrix.md"))
    parser.add_argument("--replay-dir", type=Path, default=Path("reports/sglang-matrix"))
    parser.add_argument("--settings", default="ci", help="fuzzing settings profile (default: ci)")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help=f"wheel cache (default: ${locate.CACHE_ENV} or "
                        f"{locate.DEFAULT_CACHE_DIR})")
    args = parser.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    matrix = run_matrix(
        versions, settings=args.settings, max_examples=args.max_examples, seed=args.seed,
        cache=args.cache, replay_dir=args.replay_dir, log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    write_atomically(args.out, render(matrix, args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if len(matrix.unavailable) < len(versions) else 1


if __name__ == "__main__":
    sys.exit(main())
