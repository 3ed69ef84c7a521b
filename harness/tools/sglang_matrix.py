"""The SGLang version matrix: every target of every release, fuzzed under each profile.

``python -m swafuzz.tools.sglang_matrix`` (what ``tox -e sglang-matrix`` runs) downloads the
wheels, binds each target in source mode, runs the hand-written examples and the fuzzer
under the ``realistic`` and ``adversarial`` profiles, checks each release's producers of
the rows on generated batches, writes a replay file per divergence and a Markdown report
that says, for each divergence and for each historical problem, whether SGLang's real
lifecycle can reach it.

Each release runs with its engine switches at their defaults unless ``--switch NAME=0|1``
sets one (:mod:`.switches`); the realistic profile of a target then draws only the
lifecycle features its release takes under those settings (:mod:`.reachability`,
``MODELLED_PATHS``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..reference import Event, Scenario
from ..strategies.examples import EXAMPLES
from ..strategies.features import (
    DRAFT_EXTEND,
    DRAFT_MODEL,
    DSPARK_DRAFT,
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
    restriction_terms_of,
)
from ..strategies.scenarios import PROFILES, REALISTIC, adversarial_reasons, weakest_profile

from .. import __version__
from ..run.diagnosis import (
    EARLIER_FORWARD,
    EARLIER_STEP,
    GRAPH_CAPTURE,
    OLD_MAPPING,
    OTHER_MICRO_BATCH,
    UNIFORM_REPEAT,
    Divergence,
)
from ..run.executor import UnmodelledPath, run_scenario
from ..search.fuzz import fuzz
from ..subjects.registry import SubjectInfo
from ..results.replay import Replay, write_replay
from ..results.reports import write_atomically
from ..subjects.sglang import locate, provenance, runner_steps, switch_overrides
from ..subjects.sglang.binding import BindError
from ..subjects.sglang.configure import configured
from ..subjects.sglang.tree_checks import (
    BATCH_KINDS,
    GAP,
    RIGHT,
    WRONG,
    TreeCheck,
    check_compressed_values,
    check_producers,
    check_readers,
    check_tables,
    producer_batches,
)
from ..subjects.sglang.reachability import (
    COMPRESSED_QUESTIONS,
    DRIVER_SWITCHES,
    EVERY_SCENARIO,
    MODE_QUESTIONS,
    MODELLED_PATHS,
    PROBLEMS,
    Question,
    Route,
    excluded_paths,
    needed_settings,
    question,
)
from ..subjects.sglang.switches import SwitchSettings, defaults_table, settings_for, switch
from ..subjects.sglang.targets import TARGETS, Target

EXAMPLES_COLUMN = "examples"
# the realistic profile again, with each switch that concerns the target set the other way
SWITCHED_COLUMN = "realistic, switch flipped"

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
    DSPARK_DRAFT: ("§6", "branches add draft variants: a DSpark draft flag read by the getter"),
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
    replay: Path | None  # None where the run writes no replay file (the fast verdicts)
    example: str | None = None
    switches: SwitchSettings | None = None  # the run's engine switches (None: the release's defaults)


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
    overrides: dict[str, bool] = field(default_factory=dict)  # --switch NAME=0|1
    producers: dict[str, list[TreeCheck]] = field(default_factory=dict)  # version -> producer checks
    runner_steps: dict[str, list[runner_steps.Verdict]] = field(default_factory=dict)  # version -> steps
    kernels: dict[str, list[TreeCheck]] = field(default_factory=dict)  # version -> compressed-KV kernel checks
    tables: dict[str, list[TreeCheck]] = field(default_factory=dict)  # version -> index-table builder checks
    readers: dict[str, list[TreeCheck]] = field(default_factory=dict)  # version -> compressed-KV reader checks


def run_matrix(
    versions: list[str], *, settings: str = "ci", max_examples: int | None = None, seed: int = 0,
    cache: str | None = None, replay_dir: Path | None = Path("reports/sglang-matrix"),
    overrides: dict[str, bool] | None = None, log=lambda line: None, searches: bool = True,
) -> Matrix:
    """Every release of ``versions``: its tree checks, and for every target it binds the
    hand-written examples, then (``searches``) the fuzzer under each profile and with each
    switch that concerns it flipped. Without ``replay_dir`` no replay file is written."""
    started = time.monotonic()
    revision = provenance.revision()
    overrides = dict(overrides or {})
    cells: list[Cell] = []
    unavailable: dict[str, str] = {}
    sources: dict[str, str] = {}
    producers: dict[str, list[TreeCheck]] = {}
    steps: dict[str, list[runner_steps.Verdict]] = {}
    kernels: dict[str, list[TreeCheck]] = {}
    tables: dict[str, list[TreeCheck]] = {}
    readers: dict[str, list[TreeCheck]] = {}
    for version in versions:
        try:
            tree = locate.wheel(version, cache)
        except locate.SglangUnavailable as exc:
            unavailable[version] = str(exc)
            log(f"{version}: {exc}")
            continue
        sources[version] = provenance.sglang_digest(tree)
        switches = settings_for(version, overrides)
        producers[version] = check_producers(tree, seed)
        steps[version] = runner_steps.verdicts(tree)
        kernels[version] = check_compressed_values(tree)
        tables[version] = check_tables(tree)
        readers[version] = check_readers(tree)
        for target in TARGETS:
            try:
                info = configured(target.info(tree, "source", name=f"{target.subject_name}@{version}"),
                                  target, tree, switches)
            except BindError as exc:
                cells.append(Cell(version, target, bound=False, message=str(exc)))
                continue
            cell = Cell(version, target, bound=True)
            _run_examples(cell, info, switches, replay_dir)
            if not searches:
                cells.append(cell)
                continue
            for profile in PROFILES:
                cell.runs[profile] = _run_fuzz(cell, info, profile, switches, settings, max_examples, seed,
                                               replay_dir, profile, _run_name(f"seed{seed}", switches))
            cell.runs[SWITCHED_COLUMN] = _run_switched(cell, tree, switches, settings, max_examples, seed, replay_dir)
            log(f"{version} {target.name}: " + ", ".join(f"{k} {v}" for k, v in cell.runs.items()))
            cells.append(cell)
    return Matrix(list(versions), cells, unavailable, settings, max_examples, seed, time.monotonic() - started,
                  sources, revision, overrides, producers, steps, kernels, tables, readers)


def concerning(target: Target, switches: SwitchSettings) -> dict[str, bool]:
    """The run's switches that decide what ``target`` is fed or how its driver runs: what a
    replay file of the target records."""
    names = {p.switch for p in MODELLED_PATHS if target.name in p.targets}
    names |= {d.switch for d in DRIVER_SWITCHES if target.name in d.targets}
    return {name: value for name, value in switches.values if name in names}


def _replay(info: SubjectInfo, profile: str, scenario: Scenario, divergence: Divergence, target: Target,
            switches: SwitchSettings, replay_dir: Path, run: str, **fields) -> Path:
    recorded = concerning(target, switches)
    replay = Replay(info.name, profile, scenario, divergence, engine_switches=recorded or None, **fields)
    return write_replay(replay, replay_dir, run)


def _run_name(run: str, switches: SwitchSettings) -> str:
    # a run with a switch set against its default keeps its own file beside the default run's
    off_default = "-".join(switches.off_default())
    return f"{run}-{off_default}" if off_default else run


def _run_examples(cell: Cell, info: SubjectInfo, switches: SwitchSettings, replay_dir: Path) -> None:
    diverged, gaps = [], []
    for name, scenario in EXAMPLES.items():
        try:
            divergence = run_scenario(info.subject, scenario).divergence
        except UnmodelledPath as gap:
            gaps.append(f"{name}: {gap}")
            continue
        if divergence is None:
            continue
        diverged.append(name)
        # the example's name stands in for the settings, so each gets its own file
        path = replay_dir and _replay(info, weakest_profile(scenario), scenario, divergence, cell.target, switches,
                                      replay_dir, _run_name(f"example {name}", switches), settings=f"example {name}")
        cell.findings.append(Finding(cell.version, cell.target, EXAMPLES_COLUMN, divergence, scenario, path, name,
                                     switches))
    cell.runs[EXAMPLES_COLUMN] = f"{len(diverged)}/{len(EXAMPLES)} diverge" + "".join(
        f"; harness gap in {gap}" for gap in gaps)


def _run_fuzz(cell: Cell, info: SubjectInfo, profile: str, switches: SwitchSettings, settings: str,
              max_examples: int | None, seed: int, replay_dir: Path, column: str, run: str) -> str:
    """Fuzzes ``info`` under ``profile`` (the realistic one restricted to what ``switches``
    let the release do), files a divergence under ``column``, and says how it went."""
    # the adversarial profile draws what no engine configuration does anyway
    excluded = excluded_paths(cell.target.name, switches) if profile == REALISTIC else ()
    whole = [p for p in excluded if EVERY_SCENARIO in p.features]
    if whole:
        return f"not run: {whole[0].why}"
    try:
        result = fuzz(info, profile=profile, settings=settings, max_examples=max_examples, seed=seed,
                      exclude=frozenset(f for p in excluded for f in p.features))
    except UnmodelledPath as gap:
        return f"harness gap: {gap}"
    unused = f"; no {', '.join(sorted({f for p in excluded for f in p.features}))}" if excluded else ""
    if result.divergence is None:
        return f"no divergence ({result.examples} scenarios{unused})"
    path = _replay(info, profile, result.scenario, result.divergence, cell.target, switches, replay_dir, run,
                   seed=result.seed, settings=result.settings)
    cell.findings.append(Finding(cell.version, cell.target, column, result.divergence, result.scenario, path,
                                 switches=switches))
    return f"divergence after {result.examples} scenarios{unused}"


def _run_switched(cell: Cell, tree: locate.SourceTree, switches: SwitchSettings, settings: str,
                  max_examples: int | None, seed: int, replay_dir: Path) -> str:
    """The realistic profile once more for each switch of the release that concerns the
    target, set the other way: what only that setting lets the release do."""
    outcomes = []
    for name in concerning(cell.target, switches):
        value = not switches.get(name)
        flipped = settings_for(cell.version, {**switches.to_dict(), name: value})
        info = configured(cell.target.info(tree, "source", name=f"{cell.target.subject_name}@{cell.version}"),
                          cell.target, tree, flipped)
        setting = switch(name).setting(value)
        outcome = _run_fuzz(cell, info, REALISTIC, flipped, settings, max_examples, seed, replay_dir,
                            SWITCHED_COLUMN, f"seed{seed}-{setting}")
        outcomes.append(f"{setting}: {outcome}")
    return "; ".join(outcomes) or "no switch concerns it"


# ---- judging reachability ------------------------------------------------------------------


def reachability(finding: Finding) -> tuple[str, str]:
    """A verdict (reachable, reachable off-default, not reached, unconfirmed, adversarial
    only) and why. (A run that reaches what the stand-ins do not model ends there,
    noted in its column as a harness gap: it never makes a divergence.)

    SGLang's own code decides first, through the call paths read per release
    (:mod:`.reachability`): a divergence whose problem the release's path never reaches,
    or that needs a path the release does not have (its driver's modelled path), is not
    reached whatever profile or setting found it. Then the profile (the realistic profile
    draws only what the domain brief says the engine does). Only a cited call path makes a
    divergence reachable; it is reachable off-default when that path, the lifecycle that
    reached it, or the run's driver needs a switch set against the release's default.
    """
    target, version = finding.target, finding.version
    event, upto = _up_to_divergence(finding)
    features = features_of(upto)
    facts = [f"{DOMAIN_FACTS[f][1]} (DOMAIN.md {DOMAIN_FACTS[f][0]})" for f in sorted(features) if f in DOMAIN_FACTS]
    cause = question_key(finding, features)
    keys = [k for k in (_mode_question(target, event.mode), cause) if k is not None]
    readings = [(key, question(key).routes_for(version, target.name)) for key in keys]
    readings = [(key, routes) for key, routes in readings if routes]
    for key, routes in readings:
        if not any(route.reached for route in routes):
            return "not reached", _cite(key, routes[0])
    lifecycle_settings, absent = needed_settings(target.name, version, restriction_terms_of(upto))
    if absent:
        return "not reached", "; ".join(
            f"the release never takes the path this target's {_said(p.features)} models: {p.why} "
            f"(read in the releases with {p.switch}: {p.cited()})" for p in absent)
    reasons = adversarial_reasons(finding.scenario)
    if reasons:
        return "adversarial only", "outside the realistic profile: " + "; ".join(reasons)
    run_settings = _driver_settings(finding)
    if cause is None or cause not in dict(readings):
        needs = sorted({*lifecycle_settings, *run_settings})
        return "unconfirmed", (
            "realistic for the domain brief (" + ("; ".join(facts) or "a plain decode lifecycle")
            + (f", with {', '.join(needs)}" if needs else "")
            + "), but no SGLang call path to it has been read for this release"
        )
    needed = [(key, next(r for r in routes if r.reached)) for key, routes in readings]
    settings = sorted({*(route.setting for _, route in needed if route.setting), *lifecycle_settings, *run_settings})
    if not settings:
        return "reachable", "; ".join(_cite(key, route) for key, route in needed)
    return "reachable off-default", f"only with {', '.join(settings)}: " + "; ".join(
        _cite(key, route) for key, route in needed)


def _up_to_divergence(finding: Finding) -> tuple[Event, Scenario]:
    """The diverging forward, and the scenario up to it."""
    events = finding.scenario.events
    event = finding.divergence.event
    upto = event if event is not None and event >= 0 else len(events) - 1
    return events[upto], Scenario(finding.scenario.config, events[: upto + 1])


def _said(terms: tuple[str, ...]) -> str:
    return " and ".join(term.replace("_", " ").replace("@", " of ") + " forwards" if "@" in term
                        else term.replace("_", " ") for term in terms)


def problem_of(finding: Finding) -> str | None:
    """The historical problem (a key of :data:`reachability.PROBLEMS`) a divergence is an
    instance of, if any."""
    return question_key(finding, features_of(_up_to_divergence(finding)[1]))


def _driver_settings(finding: Finding) -> list[str]:
    """The run's switches set against the release's default that the target's driver follows:
    every scenario of the run needed them."""
    if finding.switches is None:
        return []
    followed = {d.switch for d in DRIVER_SWITCHES if finding.target.name in d.targets}
    default = settings_for(finding.version)
    return [switch(name).setting(value) for name, value in finding.switches.values
            if name in followed and value != default.get(name)]


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
    candidates = []  # most specific first; the first this target's code has is the answer
    if cause == OTHER_MICRO_BATCH:
        candidates.append("pool-cache-two-batch-overlap")
    if cause == GRAPH_CAPTURE:
        candidates.append("assign-listed-ring-rows")
    if cause == EARLIER_STEP:
        candidates.append("multi-step-draft-ring-rows")
    if cause == UNIFORM_REPEAT:
        candidates.append("uniform-repeat-interleave")
    if cause == OLD_MAPPING and REGISTER_MAPPING in features:
        candidates.append("pool-register-mapping-keeps-cache")
    # a pool cache no layer of the forward refreshes hands out the previous forward's rows,
    # or under a graph the rows the capture recorded
    if cause in (EARLIER_FORWARD, GRAPH_CAPTURE) and FIRST_SWA_LAYER_NOT_START in features:
        candidates.append("pool-cache-first-swa-layer")
    if SKIP_METADATA_INIT in features and _skipped_on_idle(finding):
        candidates.append("skipped-metadata-init-idle")
    return next((key for key in candidates if finding.target.name in question(key).targets), None)


def _skipped_on_idle(finding: Finding) -> bool:
    """Whether an idle forward skipped metadata init before the divergence (a skip on any
    other forward is no engine's, and no instance of the idle problem)."""
    events = finding.scenario.events
    upto = finding.divergence.event if finding.divergence.event is not None else len(events) - 1
    return any(e.op == "forward" and e.skip_init and e.mode == "idle" for e in events[: upto + 1])


def _cite(key: str, route: Route) -> str:
    return f"{route.why} (call path read in {_span(route.releases)}: {route.cited()}) [{key}]"


def _span(versions: tuple[str, ...]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"


# ---- the report ----------------------------------------------------------------------------


def render(matrix: Matrix, report_path: Path) -> str:
    bound = [c for c in matrix.cells if c.bound]
    columns = [EXAMPLES_COLUMN, *PROFILES, SWITCHED_COLUMN]
    groups: dict[tuple, list[Finding]] = defaultdict(list)
    for finding in (f for c in bound for f in c.findings):
        verdict, why = reachability(finding)
        key = (finding.target.name, _run_label(finding), finding.example or "", finding.divergence.sentence, verdict,
               why)
        groups[key].append(finding)
    numbered = list(enumerate(sorted(groups.items()), 1))
    lines = [
        "# SGLang version matrix",
        "",
        f"Generated by `tox -e sglang-matrix` (`python -m swafuzz.tools.sglang_matrix`) on "
        f"{datetime.date.today().isoformat()} with swafuzz {__version__}: released wheels read in "
        f"source mode, fuzzing settings `{matrix.settings}` (seed {matrix.seed}"
        + (f", at most {matrix.max_examples} scenarios" if matrix.max_examples else "")
        + f" per run), {matrix.elapsed_s:.0f} s in all.",
        "",
        "- engine switches: " + (
            "each release's defaults" if not matrix.overrides else
            "each release's defaults, except " + ", ".join(
                switch(name).setting(value) for name, value in sorted(matrix.overrides.items()))
            + " wherever a release has the switch") + " (see *Engine switches by release*).",
        f"- harness sources: `{provenance.harness_digest()}` (revision `{matrix.revision}`); "
        "the SGLang sources read, per release, are under *Provenance*. "
        "`tests/test_sglang_matrix_report.py` fails when either changes: regenerate with "
        "`tox -e sglang-matrix`.",
        "",
        "Each bound version x target pair runs the hand-written examples "
        "(`strategies/examples.py`, one per bug class) and the fuzzer under the `realistic` and "
        "`adversarial` profiles, the realistic one restricted to what the release does under its "
        "switch settings, then once more for each switch that concerns the target set the other "
        "way (*realistic, switch flipped*); the fuzzer stops at its first divergence and shrinks it. Every "
        "divergence is judged: **reachable** (a realistic scenario on a call path read in that "
        "release with its default settings, cited hop by hop), **reachable off-default** (the "
        "cited path exists only under a non-default setting, named), **not reached** (the "
        "release's code, cited, never takes that path, whatever profile found it), "
        "**unconfirmed** (realistic for the domain brief, but no call path has been read), "
        "or **adversarial only** (outside the realistic profile, with the reasons). A run that "
        "reaches something the stand-ins do not model stops there and its column says *harness "
        "gap*: a gap of swafuzz is never a divergence.",
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
    for number, (target, run, example, sentence, verdict, _), members in reachable:
        label = f"example `{example}`" if example else f"{run} fuzzing"
        lines.append(f"- #{number} `sglang:{target}` {', '.join(f.version for f in members)} ({label}, "
                     f"{verdict}): {sentence}")
    if not reachable:
        lines.append("No divergence that SGLang's real lifecycle can reach.")
    evidence: dict[tuple[str, str], list[int]] = defaultdict(list)  # (problem, version) -> divergences
    for number, (_, members) in numbered:
        for finding in members:
            problem = problem_of(finding)
            if problem is not None and number not in evidence[(problem, finding.version)]:
                evidence[(problem, finding.version)].append(number)
    marks: dict[Route, str] = {}
    lines += ["", "## Historical problems by release", "",
              "For each release, whether each historical problem is reachable, read from the call paths "
              "in that release's source (`harness/subjects/sglang/reachability.py`, every hop pinned against the "
              "wheels by `tests/test_sglang_reachability.py`): **reachable** (the path exists with the "
              "release's defaults), **reachable off-default** (only with the switch setting named), "
              "**not reached** (the release's path never gets there). Each cell cites its call paths "
              "(*P*, listed below) and the divergences of this run that are instances of the problem "
              "(*#*, under *Divergences*).", "",
              *_question_table(PROBLEMS, matrix.versions, marks, evidence),
              "", "Where SGLang's model reads the ring getter at all (a condition of the ring problems):", "",
              *_question_table(tuple(question(key) for key in MODE_QUESTIONS), matrix.versions, marks, evidence),
              "", "Call paths:", "", *_call_paths(marks, 0)]
    swa_paths = len(marks)
    lines += ["", "## Compressed-KV history by release", "",
              "The same reading for the public history of the compressed-KV values a DeepSeek-V4 layer "
              "reads (`COMPRESSED_QUESTIONS`): write plans, compressed write locations, the page table and "
              "HIP's fp4 write metadata. No target binds these values (SGLang's own kernels run under "
              "*Compressed-KV values by release* and *Index tables by release*), so no divergence is "
              "counted here; *not read* marks a release whose call path has not been read.", "",
              *(f"- `{item.key}`: {item.title}" for item in COMPRESSED_QUESTIONS), "",
              *_question_table(COMPRESSED_QUESTIONS, matrix.versions, marks, {}),
              "", "Call paths:", "", *_call_paths(marks, swa_paths)]
    lines += ["", "## Producers of the rows by release", "",
              f"SGLang's own producers of the per-token rows the unified-KV stores read "
              f"(`harness/subjects/sglang/producers.py`), run on {len(producer_batches(matrix.seed))} generated batches "
              f"({', '.join(BATCH_KINDS)}) and compared with `reference/truth.py`: **right**, **wrong** "
              "(the first wrong row and its batch), **absent** (why the release lacks it) or **not checked** "
              "(what the release's code reads that swafuzz cannot run on CPU).", "",
              *_producers_table(matrix)]
    lines += ["", "## Graph runner steps by release", "",
              "SGLang's own steps that carry freshly built metadata into a captured graph's objects "
              "(`harness/subjects/sglang/runner_steps.py`: breakable-graph refresh, the metadata classes' `copy_`, "
              "`replay_cuda_graph_metadata_from`, the early target-verify install), run on CPU tensors: "
              "**kept** when every SWA store row ends at the captured address with the new rows (or the "
              "recorded graph refills it), **stale** naming the field the graph would read old rows from, "
              "or **absent**. Each step is judged on its own: whether a release's runner takes it on a "
              "path that reaches a store is the problem table's question (a stale `UnifiedKvMetadata.copy_` "
              "is the `assign-listed-ring-rows` problem, whose cited paths decide). "
              "`python -m swafuzz.subjects.sglang.runner_steps VERSION` prints each step's fields.", "",
              *_runner_steps_table(matrix)]
    if matrix.kernels:
        lines += ["", "## Compressed-KV values by release", "",
                  "SGLang's own compressed-KV metadata kernels (`harness/subjects/sglang/compressed.py`: "
                  "`init_compression_metadata` on CUDA and HIP, the V4.1 low-ratio kernels), run under "
                  "Triton's interpreter on generated batches and compared value by value with "
                  "`reference/compressed.py`; **not checked** where triton is not installed.", "",
                  "| release | compressed-KV values |", "| --- | --- |",
                  *(f"| {version} | " + "; ".join(
                      f"{'**wrong**' if c.outcome == WRONG else c.outcome}: {_generic(c.detail, version)}"
                      .replace("|", "\\|") for c in checks) + " |" for version, checks in matrix.kernels.items())]
    if matrix.tables:
        lines += ["", "## Index tables by release", "",
                  "SGLang's own builders of the per-step index tables (`harness/subjects/sglang/tables.py`: "
                  "page table, SWA read indices and lengths, the C4 top-k table, compress-state ring rows), "
                  "one column per SGLang function, run on CPU (the Triton ones under Triton's interpreter) on "
                  "generated batches and compared row by row with `reference/compressed.py`; **absent** where "
                  "the release builds the table elsewhere or not at all.", "",
                  *_checks_table(matrix.tables)]
    if matrix.readers:
        lines += ["", "## Readers of the compressed values by release", "",
                  "SGLang's own readers of the compressed-KV values (`harness/subjects/sglang/readers.py`: the "
                  "compressor's `_get_out_loc` and store path, each draft step's slots and compressed locations), "
                  "run on metadata the release's own `init_compression_metadata` made and compared row by row "
                  "with `reference/`; a wrong value no layer of the release reads says `never read` and why.", "",
                  *_checks_table(matrix.readers)]
    lines += ["", "## Engine switches by release", "",
              "Defaults read from each release (`harness/subjects/sglang/switches.py`); a route that needs a "
              "switch set against its default makes a divergence *reachable off-default*.", "",
              *defaults_table(tuple(matrix.versions)), "",
              "What the realistic profile draws for a target depends on the settings: a lifecycle feature "
              "its driver models through a path a release takes only under one setting is not drawn under "
              "the others (`MODELLED_PATHS`), and a driver follows some switches itself (`DRIVER_SWITCHES`):", "",
              *(f"- {', '.join(f'`{f}`' for f in p.features)} of {', '.join(f'`sglang:{t}`' for t in p.targets)} only "
                + ("" if p.setting().startswith("without ") else "with ") + p.setting()
                + ("" if not p.without_switch else " or in releases without the switch")
                + f": {p.why} ({p.cited()})." for p in MODELLED_PATHS),
              *(f"- {', '.join(f'`sglang:{t}`' for t in d.targets)} follow `{d.switch}` "
                f"({d.attribute or 'read from the run settings'}: "
                f"{' -> '.join(f'`{hop}`' for hop in d.hops)})." for d in DRIVER_SWITCHES)]
    if matrix.overrides:
        lines += ["", "Settings of this run:", "", "| release | engine switches |", "| --- | --- |"]
        lines += [f"| {v} | {settings_for(v, matrix.overrides).label()} |" for v in matrix.versions
                  if v not in matrix.unavailable]
    lines += ["", "## Which releases have which target", "",
              "| target | code | releases |", "| --- | --- | --- |"]
    for target in TARGETS:
        lines.append(f"| `{target.subject_name}` | {'; '.join(_code_names(target))} | {target.releases()} |")
    for column in columns:
        lines += ["", f"## Verdicts: {column}", "", _table(matrix, column)]
    lines += ["", "## Divergences", "",
              "Grouped by target, column and diagnosis; each names its replay files "
              "(`swafuzz replay FILE`).", ""]
    for number, ((target, run, example, sentence, verdict, why), members) in numbered:
        label = f"example `{example}`" if example else f"{run} fuzzing"
        lines.append(f"{number}. <a id=\"d{number}\"></a>**sglang:{target}**, {label}, "
                     f"{', '.join(f.version for f in members)}: {sentence}")
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


def _run_label(finding: Finding) -> str:
    """The column of a finding, naming the flipped switch of a switched run."""
    if finding.column != SWITCHED_COLUMN or finding.switches is None:
        return finding.column
    return f"{REALISTIC} with {', '.join(finding.switches.off_default()) or finding.switches.label()}"


def _scope(route: Route) -> str:
    return f"({', '.join(f'`{t}`' for t in route.targets)} only) " if route.targets else ""


def _call_paths(marks: dict[Route, str], skip: int) -> list[str]:
    """The numbered call paths of ``marks``, from the ``skip``-th on (a later table lists
    only the paths it added)."""
    return [f"- <a id=\"{mark.lower()}\"></a>{mark}: {_scope(route)}{route.why}: {route.cited()}"
            for route, mark in list(marks.items())[skip:]]


def _question_table(items: tuple[Question, ...], versions: list[str], marks: dict[Route, str],
                    evidence: dict[tuple[str, str], list[int]]) -> list[str]:
    """Release x question: the verdict of the release's call paths, each cell citing them
    (numbered in ``marks``, shared across tables) and the divergences found of it."""
    rows = ["| release | " + " | ".join(f"`{item.key}`" for item in items) + " |",
            "| --- |" + " --- |" * len(items)]
    for version in versions:
        cells = []
        for item in items:
            verdict, routes = item.verdict(version)
            cited = [f"[{marks.setdefault(route, f'P{len(marks) + 1}')}](#{marks[route].lower()})" for route in routes]
            if verdict == "reachable off-default":
                switched = [r for r in routes if r.setting]
                text = (f"**reachable off-default** with {', '.join(sorted({r.setting for r in switched}))} "
                        f"({', '.join(cited[:len(switched)])}); by default not reached ({cited[-1]})")
            elif verdict == "reachable":
                text = f"**reachable** ({', '.join(cited)})"
            else:
                text = f"{verdict}" + (f" ({', '.join(cited)})" if cited else "")
            found = evidence.get((item.key, version))
            if found:
                text += "; divergences " + ", ".join(f"[#{n}](#d{n})" for n in found)
            cells.append(text)
        rows.append(f"| {version} | " + " | ".join(cells) + " |")
    return rows


def _runner_steps_table(matrix: Matrix) -> list[str]:
    """Release x runner step, in the order :func:`runner_steps.verdicts` checks them."""
    names: list[str] = []
    for verdicts in matrix.runner_steps.values():
        names += [v.step for v in verdicts if v.step not in names]
    rows = ["| release | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- |" + " --- |" * len(names)]
    for version, verdicts in matrix.runner_steps.items():
        by_step = {v.step: v for v in verdicts}
        cells = []
        for name in names:
            item = by_step.get(name)
            cells.append("absent" if item is None or item.absent else
                         "**stale**: " + "; ".join(item.findings) if item.findings else "kept")
        rows.append(f"| {version} | " + " | ".join(cells) + " |")
    return rows


def _producers_table(matrix: Matrix) -> list[str]:
    """Release x producer (in the order the releases name them), with a column that sums up
    the release."""
    names: list[str] = []
    for checks in matrix.producers.values():
        names += [c.name for c in checks if c.name not in names]
    rows = ["| release | producers | " + " | ".join(f"`{m}`" for m in names) + " |",
            "| --- | --- |" + " --- |" * len(names)]
    for version, checks in matrix.producers.items():
        by_name = {c.name: c for c in checks}
        ran = [c for c in checks if c.outcome in (RIGHT, WRONG)]
        wrong = [c for c in ran if c.outcome == WRONG]
        summary = ("**wrong**: " + ", ".join(f"`{c.name}`" for c in wrong) if wrong else
                   f"all right ({len(ran)} of {len(names)} run)" if ran else "none run")
        cells = []
        for name in names:
            item = by_name.get(name)
            detail = "" if item is None else _generic(item.detail, version).replace("|", "\\|")
            if item is None:
                cells.append("not named")
            elif item.outcome == WRONG:
                cells.append(f"**wrong** (`{item.owner}`): {detail}")
            elif item.outcome == RIGHT:
                cells.append(f"right on {item.batches} batches (`{item.owner}`)")
            else:
                cells.append(f"{item.outcome}: {detail}")
        rows.append(f"| {version} | {summary} | " + " | ".join(cells) + " |")
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


def _checks_table(by_version: dict[str, list[TreeCheck]]) -> list[str]:
    """Release x check, one column per SGLang function checked."""
    names = list(dict.fromkeys(c.name for checks in by_version.values() for c in checks))
    rows = ["| release | " + " | ".join(f"`{name}`" for name in names) + " |",
            "| --- |" + " --- |" * len(names)]
    for version, checks in by_version.items():
        by_name = {c.name: c for c in checks}
        rows.append(f"| {version} | " + " | ".join(_table_cell(by_name.get(name), version) for name in names) + " |")
    return rows


def _table_cell(check: TreeCheck | None, version: str) -> str:
    if check is None:
        return "n/a"
    if check.outcome == WRONG:
        return f"**wrong**: {_generic(check.detail, version)}".replace("|", "\\|")
    if check.outcome == GAP:
        return f"not checked: {_generic(check.detail, version)}".replace("|", "\\|")
    return check.outcome


def _generic(message: str, version: str) -> str:
    # the same reason reads the same in every version, on one line (a table cell ends at a newline)
    return " ".join(message.replace(f"sglang {version} wheel (source mode): ", "").replace(
        f"sglang {version} wheel (source mode)", "the release").split())


def _relative(path: Path, report_path: Path) -> str:
    try:
        return str(path.resolve().relative_to(report_path.resolve().parent))
    except ValueError:
        return str(path)


def stale_replays(replay_dir: Path, report: str) -> list[Path]:
    """The replay files of ``replay_dir`` (the matrix's own folder) that ``report`` does not
    name: an earlier run's findings, which would otherwise outlive the verdicts they backed."""
    return sorted(path for path in replay_dir.glob("*.json") if path.name not in report)


VERDICTS_REPORT = "reports/sglang-verdicts.md"
VERDICTS_COMMAND = "python -m swafuzz.tools.sglang_matrix --verdicts --out reports/sglang-verdicts.md"


def verdict_row(matrix: Matrix, version: str) -> str:
    """One release's fast verdicts: each target's hand-written examples (which diverge), and
    the summaries of its producers, runner steps and compressed-KV kernels."""
    by_target = {cell.target.name: cell for cell in matrix.cells if cell.version == version}
    cells = []
    for target in TARGETS:
        cell = by_target.get(target.name)
        if cell is None or not cell.bound:
            cells.append("n/a")
            continue
        diverged = [f.example for f in cell.findings if f.column == EXAMPLES_COLUMN]
        cells.append(cell.runs[EXAMPLES_COLUMN] + (f": {', '.join(diverged)}" if diverged else ""))
    producers = matrix.producers.get(version, [])
    ran = [c for c in producers if c.outcome in (RIGHT, WRONG)]
    wrong = [c.name for c in ran if c.outcome == WRONG]
    cells.append(f"wrong: {', '.join(wrong)}" if wrong else f"all right ({len(ran)} run)")
    steps = [v for v in matrix.runner_steps.get(version, []) if not v.absent]
    stale = [v.step for v in steps if v.findings]
    cells.append(f"stale: {', '.join(stale)}" if stale else f"all kept ({len(steps)} run)")
    cells.append("; ".join(c.outcome for c in matrix.kernels.get(version, [])) or "-")
    cells.append(_outcomes(matrix.tables.get(version, [])))
    cells.append(_outcomes(matrix.readers.get(version, [])))
    return f"| {version} | " + " | ".join(cells) + " |"


def _outcomes(checks: list[TreeCheck]) -> str:
    """What a release's checks of one kind found: the wrong ones named, the rest counted."""
    wrong = [c.name for c in checks if c.outcome == WRONG]
    counts = {outcome: sum(c.outcome == outcome for c in checks) for outcome in (RIGHT, GAP)}
    said = [f"{counts[RIGHT]} right"] + ([f"{counts[GAP]} not checked"] if counts[GAP] else [])
    return (f"wrong: {', '.join(wrong)}; " if wrong else "") + ", ".join(said)


def verdicts_table(matrix: Matrix) -> str:
    header = ["release", *(t.name for t in TARGETS), "producers", "runner steps", "compressed-KV values",
              "index tables", "compressed-KV readers"]
    return "\n".join([
        "# SGLang verdicts by release", "",
        f"The fast part of [sglang-matrix.md](sglang-matrix.md), in seconds a release: each target's "
        f"hand-written examples (`strategies/examples.py`: how many diverge, and which), and each release's "
        f"producers of the rows, graph-runner steps, compressed-KV kernels, index-table builders and the readers of the compressed values. Written by `{VERDICTS_COMMAND}`; "
        f"`tests/test_sglang_verdicts.py` makes the rows of the releases the suite reads again and "
        f"compares them, so this table is what the code says now. The full report's searches are rebuilt "
        f"with `tox -e sglang-matrix`, and its examples and producers columns must agree with this table.", "",
        "| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
        *(verdict_row(matrix, version) for version in matrix.versions if version not in matrix.unavailable),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swafuzz.tools.sglang_matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(locate.RELEASES),
                        help="comma-separated SGLang releases (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("reports/sglang-matrix.md"))
    parser.add_argument("--replay-dir", type=Path, default=Path("reports/sglang-matrix"))
    parser.add_argument("--settings", default="ci", help="fuzzing settings profile (default: ci)")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help=f"wheel cache (default: ${locate.CACHE_ENV} or "
                        f"{locate.DEFAULT_CACHE_DIR})")
    parser.add_argument("--verdicts", action="store_true",
                        help=f"write only the fast verdicts (the examples and the tree checks) as the table "
                             f"{VERDICTS_REPORT} holds; no search runs and no replay file is written")
    parser.add_argument("--switch", action="append", default=[], metavar="NAME=0|1",
                        help="set an engine switch in every release that has it (repeatable; a server "
                        "argument without its dashes, e.g. enable-encoder-swa-bounded-replay=1); default: "
                        "each release's own defaults")
    args = parser.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    try:
        overrides = switch_overrides(",".join(args.switch))
    except BindError as exc:
        parser.error(str(exc))  # exits 2
    matrix = run_matrix(
        versions, settings=args.settings, max_examples=args.max_examples, seed=args.seed,
        cache=args.cache, replay_dir=None if args.verdicts else args.replay_dir, overrides=overrides,
        log=lambda line: print(line, file=sys.stderr, flush=True), searches=not args.verdicts,
    )
    text = verdicts_table(matrix) if args.verdicts else render(matrix, args.out)
    write_atomically(args.out, text)
    if not args.verdicts:
        for path in stale_replays(args.replay_dir, text):
            path.unlink()
            print(f"removed {path}: the report no longer names it", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if len(matrix.unavailable) < len(versions) else 1


if __name__ == "__main__":
    sys.exit(main())
