"""The fuzzing engine: Hypothesis drives scenarios from :mod:`strategies` through the
executor, shrinks the first divergence, and reports coverage."""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given
from hypothesis.errors import HypothesisWarning

from ..reference import Scenario
from ..strategies.exhaustive import ScopeStatement, enumerate_scenarios, scope_statement
from ..strategies.features import features_of
from ..strategies.restrictions import scenarios_without
from ..strategies.scenarios import PROFILES, REALISTIC, weakest_profile

from .database import open_database
from ..run.diagnosis import Divergence
from ..run.devices import timeline_for
from ..run.executor import DEFAULT_TIMEOUT_S, DeadlinePassed, RunResult, UnmodelledPath, check_device, run_scenario
from ..run.graphs import load_capture_machinery
from ..names import LONG_HORIZON_SETTINGS, PROFILE_PREFIX, SETTINGS_NAMES
from ..subjects.registry import SubjectInfo
from ..errors import Diverged

SETTINGS_ENV = "SWAFUZZ_SETTINGS"
DATABASE_ENV = "SWAFUZZ_DATABASE"
DEFAULT_DATABASE = Path(".hypothesis") / "swafuzz"

# Examples per Hypothesis run; each run draws from its own seed, so a long budget keeps
# exploring instead of repeating itself. The budget itself is checked before every example.
CHUNK = 100
# replays of a shrunk divergence before it is reported: one that does not diverge in all of
# them is reported as flaky, with how often it did
REPLAYS_BEFORE_REPORT = 3
NO_EXAMPLE_LIMIT = 10**9
PROGRESS_EVERY_S = 0.25




def _register_settings_profiles() -> tuple[str, ...]:
    """Registers swafuzz's search settings as Hypothesis settings profiles.

    They are namespaced (``swafuzz-dev``, ...) because the pytest plugin is active wherever
    swafuzz is installed: a bare ``ci`` would replace a project's own ``ci`` profile, or be
    replaced by it. The CLI's ``--settings ci`` loads ``swafuzz-ci``; pytest takes
    ``--hypothesis-profile swafuzz-ci``; a script calls ``settings.load_profile``.

    - ``dev``: a few hundred examples, failures kept in the example database.
    - ``ci``: deterministic (``derandomize``) and fast, no database.
    - ``nightly``: as long as a time budget allows, failures kept in a persistent database
      that machines can share (``--database``). It sets no example limit of its own, so it
      suits the CLI's ``--budget`` and HypoFuzz, not a pytest run.
    - ``repro``: replays the database's saved failures first, verbosely.
    - ``nightly-long``: ``nightly`` with long-horizon scenarios (runs of hundreds of plain
      decode forwards between the interesting ones; see :mod:`swafuzz.strategies.scenarios`). Its
      examples take up to a few seconds each, so it suits a budget of tens of minutes.

    Examples take a subject's time, not a unit test's: no deadline, and the health checks
    about slow or large data do not apply. The explain phase is left out: the diagnosis
    sentence says what went wrong.
    """
    base = hypothesis.settings(
        hypothesis.settings.get_profile("default"),
        deadline=None, print_blob=False, suppress_health_check=list(HealthCheck),
        phases=[phase for phase in Phase if phase is not Phase.explain],
    )
    differences = {
        "dev": {"max_examples": 300},
        "ci": {"max_examples": 200, "derandomize": True, "database": None},
        "nightly": {"max_examples": NO_EXAMPLE_LIMIT},
        "repro": {"max_examples": 100, "verbosity": Verbosity.verbose},
        "nightly-long": {"max_examples": NO_EXAMPLE_LIMIT},
    }
    for name in SETTINGS_NAMES:  # named in swafuzz.names, for the command line
        hypothesis.settings.register_profile(PROFILE_PREFIX + name, hypothesis.settings(base, **differences[name]))
    return SETTINGS_NAMES


@dataclass(frozen=True)
class SettingsProfile:
    """A swafuzz settings profile: a view of the Hypothesis profile registered for it, plus
    the one thing Hypothesis has no notion of, whether scenarios have long horizons."""

    name: str

    @property
    def hypothesis_name(self) -> str:
        return PROFILE_PREFIX + self.name

    @property
    def settings(self) -> hypothesis.settings:
        return hypothesis.settings.get_profile(self.hypothesis_name)

    @property
    def max_examples(self) -> int:
        return self.settings.max_examples

    @property
    def deterministic(self) -> bool:
        return self.settings.derandomize

    @property
    def uses_database(self) -> bool:
        return self.settings.database is not None

    @property
    def verbose(self) -> bool:
        return self.settings.verbosity >= Verbosity.verbose

    @property
    def long_horizon(self) -> bool:
        return self.name in LONG_HORIZON_SETTINGS


SETTINGS_PROFILES = {name: SettingsProfile(name) for name in _register_settings_profiles()}


@dataclass
class Progress:
    examples: int
    elapsed_s: float
    budget_s: float | None
    features_covered: int
    divergences: int


@dataclass
class FuzzResult:
    subject: str
    profile: str  # the scenario profile asked for
    settings: str  # the settings profile used
    examples: int
    elapsed_s: float
    divergence: Divergence | None = None
    checks: int = 0  # store-location answers compared, over every example run
    # of elapsed_s, the seconds examples (shrinking's included) spent in the executor; the rest
    # is drawing them (Hypothesis's engine and the strategies, or the enumeration) and the
    # search's bookkeeping
    executor_s: float = 0.0
    scenario: Scenario | None = None  # shrunk scenario of the divergence
    weakest_profile: str | None = None  # weakest scenario profile that reproduces it
    seed: int | None = None
    coverage: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    # False when the shrunk scenario did not diverge in every replay of it before the report
    # (a threaded divergence: its recorded interleaving, replayed once without threads)
    replays: bool = True
    replays_run: int = 0  # replays of the shrunk scenario made before the report
    replays_diverged: int = 0  # how many of them diverged
    # False when the budget ran out while shrinking: the scenario is the smallest found so far
    shrink_complete: bool = True
    # a clean exhaustive run: the scope its equivalence holds on, covered and left out
    scope: ScopeStatement | None = None
    # examples run up to the first divergence (1: the database's saved failure came back first)
    examples_to_divergence: int | None = None
    # seconds from the start of the search until the divergence was first seen (elapsed_s
    # adds the shrinking)
    first_divergence_s: float | None = None

    @property
    def verdict(self) -> str:
        return "divergence" if self.divergence is not None else "no divergence"


def settings_profile(name: str | None) -> SettingsProfile:
    """The named profile (``ci`` or ``swafuzz-ci``), else ``$SWAFUZZ_SETTINGS``, else the
    loaded Hypothesis profile where it is one of swafuzz's, else ``dev``."""
    chosen = name or os.environ.get(SETTINGS_ENV) or loaded_settings_profile() or "dev"
    chosen = chosen.removeprefix(PROFILE_PREFIX)
    if chosen not in SETTINGS_PROFILES:
        raise ValueError(f"unknown settings profile {chosen!r}; choose one of {', '.join(SETTINGS_PROFILES)}")
    return SETTINGS_PROFILES[chosen]


def loaded_settings_profile() -> str | None:
    """The swafuzz name of the loaded Hypothesis profile; None when another one is loaded."""
    current = hypothesis.settings.default
    return next((name for name, profile in SETTINGS_PROFILES.items() if profile.settings is current), None)


def database_path(database_dir: str | os.PathLike | None) -> str:
    """A database directory or Redis URL: the one given, else ``$SWAFUZZ_DATABASE``, else
    ``.hypothesis/swafuzz``."""
    return str(database_dir or os.environ.get(DATABASE_ENV) or DEFAULT_DATABASE)


def scenario_test(
    info: SubjectInfo,
    profile: str = "realistic",
    *,
    device: str = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: bool = False,
    stream_delay_cycles: int = 0,
    long_horizon: bool = False,
    exclude: frozenset[str] = frozenset(),
    deadline: float | None = None,
    on_example: Callable[[Scenario, list[str], RunResult], None] | None = None,
) -> Callable[[], None]:
    """A Hypothesis test of ``info``'s subject on scenarios of ``profile``: a plain ``@given``
    function that raises :class:`Diverged` on the first divergence of an example.

    It carries no settings of its own, so whatever applies (a loaded profile, ``@settings``,
    pytest's ``--hypothesis-*`` options) decides how long it searches. Each example's
    features are Hypothesis events. The database key depends only on the subject's name and
    the profile, so every runner of one subject (the CLI, pytest, HypoFuzz) replays the
    failures the others saved. ``on_example(scenario, features, outcome)`` sees every
    example; a diverging scenario has its threaded call orders pinned (see
    :func:`pin_schedules`). Past ``deadline`` (a
    ``time.monotonic()`` reading) an example does not start, or stops after the subject call
    that passed it, raising :class:`~swafuzz.run.executor.DeadlinePassed`. ``long_horizon``
    draws long runs of plain decode forwards. ``exclude`` names lifecycle features never
    drawn (an engine configuration without them); under the realistic profile, neither are
    those the subject's ``realistic_exclusions`` names (the features its engine release does
    not take).
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    exclude = frozenset(exclude)
    if profile == REALISTIC:
        exclude |= unreached_by(info)

    def check(scenario: Scenario) -> None:
        features = features_of(scenario)
        for feature in features:
            hypothesis.event(feature)
        try:
            outcome = run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s, threads=threads,
                                   stream_delay_cycles=stream_delay_cycles, deadline=deadline)
        except UnmodelledPath as gap:
            raise _PastHypothesis(gap) from None
        if not outcome.passed:
            scenario = pin_schedules(scenario, outcome.schedules)
        if on_example is not None:
            on_example(scenario, features, outcome)
        if not outcome.passed:
            raise Diverged(scenario, outcome.divergence)

    # the database keys failures by strategy: a long-horizon choice sequence means another scenario
    # a subject that answers per-step values is searched on models with compressed layers,
    # one whose engine drafts in blocks on DSpark draft models too
    compressed = bool(getattr(info.subject, "answers", ()))
    draft_blocks = bool(getattr(info.subject, "drafts_in_blocks", False))
    horizon = ":long-horizon" if long_horizon else ""
    without = f":without-{'-'.join(sorted(exclude))}" if exclude else ""
    blocks = ":draft-blocks" if draft_blocks else ""
    check._hypothesis_internal_add_digest = f"swafuzz:{info.name}:{profile}{horizon}{without}{blocks}".encode()  # noqa: SLF001
    return given(scenarios_without(profile, exclude, long_horizon, compressed, draft_blocks))(check)


def unreached_by(info: SubjectInfo) -> frozenset[str]:
    """The restriction terms the subject's engine never takes (its ``realistic_exclusions``):
    its realistic profile draws none, and a divergence that needs one is not realistic."""
    return frozenset(getattr(info.subject, "realistic_exclusions", frozenset()))


class _PastHypothesis(BaseException):
    """Carries an :class:`UnmodelledPath` out of Hypothesis, which would otherwise take it
    for a failure of the example and shrink it: a gap of swafuzz ends the search at once."""

    def __init__(self, gap: UnmodelledPath):
        super().__init__(str(gap))
        self.gap = gap


def fuzz(
    info: SubjectInfo,
    *,
    profile: str = "realistic",
    settings: str | None = None,
    max_examples: int | None = None,
    budget_s: float | None = None,
    started_at: float | None = None,
    seed: int | None = None,
    seed_stride: int = 1,
    device: str = "cpu",
    database_dir: str | None = None,
    local_database_dir: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: bool = False,
    stream_delay_cycles: int = 0,
    long_horizon: bool | None = None,
    exclude: frozenset[str] = frozenset(),
    on_progress: Callable[[Progress], None] | None = None,
    on_divergence: Callable[[FuzzResult], None] | None = None,
) -> FuzzResult:
    """Search for a divergence of ``info``'s subject; shrink and return the first found.

    Stops at the first divergence, after ``max_examples`` examples, or once ``budget_s``
    seconds have passed: the budget is checked before every example and after every call of
    the subject (graph warm-ups and captures included), shrinking included, so a run
    overruns it by at most one call (an example may hold thousands). A divergence whose shrinking the budget cut
    short is returned as shrunk so far, with ``shrink_complete`` false. With a budget and no
    ``max_examples``, the settings profile's example count does not apply. ``on_divergence``
    is called when a divergence is first seen and again once it has been shrunk.

    ``started_at`` is when the budget started, a ``time.monotonic()`` reading (default:
    now, once the one-time loading below is done); the clock is the machine's, so a worker
    process can count its campaign's budget from the moment its parent started the campaign.
    ``elapsed_s`` and ``first_divergence_s`` count from it too.

    ``long_horizon`` draws scenarios with long runs of plain decode forwards (default: as the
    settings profile says; ``nightly-long`` does). ``exclude`` names lifecycle features
    never drawn (see :func:`swafuzz.strategies.restrictions.scenarios_without`).

    A seeded run's k-th chunk of examples draws from seed ``seed + k * seed_stride``, so
    runs whose seeds are ``0..stride-1`` apart never draw the same chunk (see
    :mod:`swafuzz.search.shard`). A seeded run repeats exactly: it never replays the database,
    but where its settings profile has one, it saves the failures it finds there.
    ``database_dir`` is a directory or a Redis URL; a Redis database keeps a local copy in
    ``local_database_dir`` (see :mod:`swafuzz.search.database`).

    ``threads`` is the stress mode: micro-batches call the subject from real threads. Thread
    interleavings do not repeat, so nothing is shrunk or stored in the database; instead the
    interleaving that diverged is pinned into the scenario (``Event.order``) and re-run
    without threads, and ``replays`` says whether that reproduced it.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    check_device(info.subject, torch.device(device))
    timeline_for(torch.device(device), stream_delay_cycles)  # refuses a delay off the GPU now
    chosen = settings_profile(settings)
    if long_horizon is None:
        long_horizon = chosen.long_horizon
    # a time budget alone means "search until the budget is spent"
    limit = max_examples if max_examples is not None else (
        NO_EXAMPLE_LIMIT if budget_s is not None else chosen.max_examples
    )
    if seed is None and chosen.deterministic:
        seed = 0
    database = None
    if chosen.uses_database and not threads:
        database = open_database(database_path(database_dir), local_database_dir or DEFAULT_DATABASE)
    load_capture_machinery()
    freeze_the_heap_so_far()
    started = time.monotonic() if started_at is None else started_at
    result = FuzzResult(info.name, profile, chosen.name, examples=0, elapsed_s=0.0, seed=seed)
    unreached = unreached_by(info)
    coverage: Counter[str] = Counter()
    failures: list[tuple[Scenario, Divergence]] = []
    last_progress = [0.0]

    def elapsed() -> float:
        return time.monotonic() - started

    def report_progress(force: bool = False) -> None:
        if on_progress is None or (not force and elapsed() - last_progress[0] < PROGRESS_EVERY_S):
            return
        last_progress[0] = elapsed()
        on_progress(Progress(result.examples, elapsed(), budget_s, len(coverage), 1 if failures else 0))

    deadline = started + budget_s if budget_s is not None else None

    def on_example(scenario: Scenario, features: list[str], outcome: RunResult) -> None:
        result.examples += 1
        coverage.update(features)
        result.checks += outcome.checks
        result.executor_s += outcome.elapsed_s
        report_progress()
        if not outcome.passed:
            # recorded before anyone is told: an interrupt while the news is written down
            # (a replay file) must not lose the finding
            failures.append((scenario, outcome.divergence))
            if len(failures) == 1:
                result.examples_to_divergence = result.examples
                result.first_divergence_s = elapsed()
                if on_divergence is not None:
                    on_divergence(_found(result, scenario, outcome.divergence, elapsed(), coverage, unreached))

    def finish_divergence(shrink_complete: bool) -> FuzzResult:
        scenario, divergence = failures[-1]
        final = _found(result, scenario, divergence, elapsed(), coverage, unreached)
        final.shrink_complete = shrink_complete
        # a subject wrong now and then looks deterministic once shrunk: replaying says which
        replays = [run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s,
                                stream_delay_cycles=0 if threads else stream_delay_cycles)
                   for _ in range(1 if threads else REPLAYS_BEFORE_REPORT)]
        final.replays_run = len(replays)
        final.replays_diverged = sum(not replay.passed for replay in replays)
        final.replays = final.replays_diverged == final.replays_run
        if threads:
            final.divergence = replays[0].divergence or divergence
        if not final.replays:
            final.weakest_profile = None  # no profile reproduces it reliably
        if on_divergence is not None:
            on_divergence(final)
        report_progress(force=True)
        return final

    phases = [phase for phase in chosen.settings.phases if phase is not Phase.reuse or seed is None]
    if threads:
        phases = [Phase.generate]
    run = 0
    while result.examples < limit and (budget_s is None or elapsed() < budget_s):
        test = scenario_test(info, profile, device=device, timeout_s=timeout_s, threads=threads,
                             stream_delay_cycles=stream_delay_cycles, long_horizon=long_horizon, exclude=exclude,
                             on_example=on_example,
                             deadline=deadline)
        if seed is not None:
            test = hypothesis.seed(seed + run * seed_stride)(test)
        # applied after the seed, which would otherwise turn the database off
        test = hypothesis.settings(
            chosen.settings,
            max_examples=min(CHUNK, limit - result.examples),
            database=database,
            derandomize=False,
            report_multiple_bugs=False,
            verbosity=Verbosity.verbose if chosen.verbose else Verbosity.quiet,
            phases=phases,
        )(test)
        run += 1
        try:
            with warnings.catch_warnings():
                # a long-horizon failure's repr is large; nothing here prints it
                warnings.filterwarnings("ignore", "Generating overly large repr", HypothesisWarning)
                test()
        except DeadlinePassed as cut:
            result.checks += cut.checks  # compared, though the example was cut short
            break
        except _PastHypothesis as escaped:
            raise escaped.gap from None
        except KeyboardInterrupt:
            # what was found and counted so far is the result, marked as cut short
            result.elapsed_s, result.coverage, result.interrupted = elapsed(), dict(coverage), True
            if failures:
                found = _found(result, *failures[-1], elapsed(), coverage, unreached)
                return dataclasses.replace(found, interrupted=True)
            return result
        except (Diverged, hypothesis.errors.FlakyFailure):
            return finish_divergence(shrink_complete=True)
    if failures:  # the budget ran out while shrinking
        return finish_divergence(shrink_complete=False)
    result.elapsed_s = elapsed()
    result.coverage = dict(coverage)
    report_progress(force=True)
    return result


@functools.cache  # once per process: what a later search adds stays collectable
def freeze_the_heap_so_far() -> None:
    """Collects once, then leaves what survives (torch, the imports) out of every later
    collection. Hypothesis runs a full collection at the first test of a process (to check
    a PRNG it registers): over torch's heap that took longer than most searches take to
    find a bug, and the collector's own later passes scan less too."""
    gc.collect()
    gc.freeze()


def pin_schedules(scenario: Scenario, schedules: dict[int, tuple[int, ...]]) -> Scenario:
    """The scenario with each threaded forward's recorded call order made explicit."""
    if not schedules:
        return scenario
    events = list(scenario.events)
    for index, order in schedules.items():
        events[index] = dataclasses.replace(events[index], order=tuple(order))
    return Scenario(scenario.config, tuple(events))


def _found(result: FuzzResult, scenario: Scenario, divergence: Divergence, elapsed_s: float,
           coverage: Counter[str], unreached: frozenset[str]) -> FuzzResult:
    return FuzzResult(
        subject=result.subject, profile=result.profile, settings=result.settings,
        examples=result.examples, elapsed_s=elapsed_s, divergence=divergence, checks=result.checks,
        executor_s=result.executor_s, scenario=scenario,
        weakest_profile=weakest_profile(scenario, unreached), seed=result.seed, coverage=dict(coverage),
        examples_to_divergence=result.examples_to_divergence, first_divergence_s=result.first_divergence_s,
    )


def exhaustive(
    info: SubjectInfo,
    *,
    max_forwards: int = 2,
    max_layers: int = 3,
    max_micro_batches: int = 2,
    profile: str = "adversarial",
    device: str = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_progress: Callable[[Progress], None] | None = None,
) -> FuzzResult:
    """Run every scenario within the bounds (see :mod:`swafuzz.strategies.exhaustive`).

    With no divergence, ``examples`` is the number of scenarios checked: the subject is
    equivalent to the reference on that whole scope, and ``scope`` states which features the
    scope covers and what it leaves out. Otherwise the first divergence in the enumeration
    order is returned; the enumeration lists short scenarios first.
    """
    check_device(info.subject, torch.device(device))
    load_capture_machinery()
    started = time.monotonic()
    result = FuzzResult(info.name, profile, "exhaustive", examples=0, elapsed_s=0.0)
    coverage: Counter[str] = Counter()
    # a subject that answers per-step values is run on models with compressed layers, one
    # whose engine drafts in blocks on DSpark draft models too
    compressed = bool(getattr(info.subject, "answers", ()))
    draft_blocks = bool(getattr(info.subject, "drafts_in_blocks", False))
    for scenario in enumerate_scenarios(max_forwards, max_layers, max_micro_batches, profile, compressed,
                                        draft_blocks):
        result.examples += 1
        coverage.update(features_of(scenario))
        outcome = run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s)
        result.checks += outcome.checks
        result.executor_s += outcome.elapsed_s
        if on_progress is not None and result.examples % 500 == 0:
            on_progress(Progress(result.examples, time.monotonic() - started, None, len(coverage), 0))
        if not outcome.passed:
            return _found(result, scenario, outcome.divergence, time.monotonic() - started, coverage,
                          unreached_by(info))
    result.elapsed_s = time.monotonic() - started
    result.coverage = dict(coverage)
    result.scope = scope_statement(result.examples, set(coverage), max_forwards, max_layers,
                                   max_micro_batches, profile, compressed, draft_blocks)
    return result
