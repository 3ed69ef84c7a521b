"""The fuzzing engine: Hypothesis drives scenarios from :mod:`strategies` through the
executor, shrinks the first divergence, and reports coverage."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given
from hypothesis.database import DirectoryBasedExampleDatabase

from reference import Scenario
from strategies.exhaustive import enumerate_scenarios
from strategies.features import features_of
from strategies.scenarios import PROFILES, scenarios, weakest_profile

from .diagnosis import Divergence
from .devices import timeline_for
from .executor import DEFAULT_TIMEOUT_S, check_device, run_scenario
from .graphs import load_capture_machinery
from .registry import SubjectInfo

SETTINGS_ENV = "SWAFUZZ_SETTINGS"
DATABASE_ENV = "SWAFUZZ_DATABASE"
DEFAULT_DATABASE = Path(".hypothesis") / "swafuzz"

# Examples per Hypothesis run; a wall-clock budget is honoured between runs, each of which
# draws from its own seed, so a long budget keeps exploring instead of repeating itself.
CHUNK = 100
NO_EXAMPLE_LIMIT = 10**9
PROGRESS_EVERY_S = 0.25


@dataclass(frozen=True)
class SettingsProfile:
    """How long to search and where failures are remembered.

    - ``dev``: a few hundred examples, failures kept in ``.hypothesis/swafuzz``.
    - ``ci``: deterministic (seed 0 unless given) and fast, no database.
    - ``nightly``: long (use a budget), failures kept in a persistent database directory
      (``--database``/``$SWAFUZZ_DATABASE``) that machines can share.
    - ``repro``: replays the database's saved failures first, verbosely.
    """

    name: str
    max_examples: int
    deterministic: bool
    uses_database: bool
    verbose: bool = False


SETTINGS_PROFILES = {
    "dev": SettingsProfile("dev", 300, deterministic=False, uses_database=True),
    "ci": SettingsProfile("ci", 200, deterministic=True, uses_database=False),
    "nightly": SettingsProfile("nightly", NO_EXAMPLE_LIMIT, deterministic=False, uses_database=True),
    "repro": SettingsProfile("repro", 100, deterministic=False, uses_database=True, verbose=True),
}


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
    scenario: Scenario | None = None  # shrunk scenario of the divergence
    weakest_profile: str | None = None  # weakest scenario profile that reproduces it
    seed: int | None = None
    coverage: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    # False when a threaded divergence did not reproduce with its recorded interleaving
    replays: bool = True

    @property
    def verdict(self) -> str:
        return "divergence" if self.divergence is not None else "no divergence"


def settings_profile(name: str | None) -> SettingsProfile:
    """The named profile, else ``$SWAFUZZ_SETTINGS``, else ``dev``."""
    chosen = name or os.environ.get(SETTINGS_ENV) or "dev"
    if chosen not in SETTINGS_PROFILES:
        raise ValueError(f"unknown settings profile {chosen!r}; choose one of {', '.join(SETTINGS_PROFILES)}")
    return SETTINGS_PROFILES[chosen]


def database_path(database_dir: str | None) -> Path:
    return Path(database_dir or os.environ.get(DATABASE_ENV) or DEFAULT_DATABASE)


class _Diverged(Exception):
    pass


def fuzz(
    info: SubjectInfo,
    *,
    profile: str = "realistic",
    settings: str | None = None,
    max_examples: int | None = None,
    budget_s: float | None = None,
    seed: int | None = None,
    device: str = "cpu",
    database_dir: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: bool = False,
    stream_delay_cycles: int = 0,
    on_progress: Callable[[Progress], None] | None = None,
    on_divergence: Callable[[FuzzResult], None] | None = None,
) -> FuzzResult:
    """Search for a divergence of ``info``'s subject; shrink and return the first found.

    Stops at the first divergence, after ``max_examples`` examples, or once ``budget_s``
    seconds have passed (checked between runs of :data:`CHUNK` examples). With a budget and
    no ``max_examples``, the settings profile's example count does not apply. ``on_divergence``
    is called when a divergence is first seen and again once it has been shrunk.

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
    # a time budget alone means "search until the budget is spent"
    limit = max_examples if max_examples is not None else (
        NO_EXAMPLE_LIMIT if budget_s is not None else chosen.max_examples
    )
    # Hypothesis neither reads nor writes its database for seeded runs, so a run is either
    # reproducible from its seed (ci, or --seed) or remembered in the database (the rest)
    if seed is None and chosen.deterministic:
        seed = 0
    database = None
    if seed is None and chosen.uses_database and not threads:
        database = DirectoryBasedExampleDatabase(str(database_path(database_dir)))
    load_capture_machinery()
    started = time.monotonic()
    result = FuzzResult(info.name, profile, chosen.name, examples=0, elapsed_s=0.0, seed=seed)
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

    def check(scenario: Scenario) -> None:
        result.examples += 1
        for feature in features_of(scenario):
            hypothesis.event(feature)
            coverage[feature] += 1
        outcome = run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s, threads=threads,
                               stream_delay_cycles=stream_delay_cycles)
        result.checks += outcome.checks
        report_progress()
        if not outcome.passed:
            scenario = pin_schedules(scenario, outcome.schedules)
            if not failures and on_divergence is not None:
                on_divergence(_found(result, scenario, outcome.divergence, elapsed(), coverage))
            failures.append((scenario, outcome.divergence))
            raise _Diverged(outcome.divergence.sentence)

    check._hypothesis_internal_add_digest = f"swafuzz:{info.name}:{profile}".encode()  # noqa: SLF001
    run = 0
    while result.examples < limit and (budget_s is None or elapsed() < budget_s):
        hypothesis_settings = hypothesis.settings(
            max_examples=min(CHUNK, limit - result.examples),
            deadline=None,
            database=database,
            derandomize=False,
            print_blob=False,
            report_multiple_bugs=False,
            verbosity=Verbosity.verbose if chosen.verbose else Verbosity.quiet,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate] if threads else [
                Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink,
            ],
        )
        test = hypothesis_settings(given(scenarios(profile))(check))
        if seed is not None:
            test = hypothesis.seed(seed + run)(test)
        run += 1
        try:
            test()
        except KeyboardInterrupt:
            # what was found and counted so far is the result, marked as cut short
            result.elapsed_s, result.coverage, result.interrupted = elapsed(), dict(coverage), True
            if failures:
                return dataclasses.replace(_found(result, *failures[-1], elapsed(), coverage), interrupted=True)
            return result
        except (_Diverged, hypothesis.errors.FlakyFailure):
            scenario, divergence = failures[-1]
            final = _found(result, scenario, divergence, elapsed(), coverage)
            if threads:
                replay = run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s)
                final.replays = not replay.passed
                final.divergence = replay.divergence or divergence
            if on_divergence is not None:
                on_divergence(final)
            report_progress(force=True)
            return final
    result.elapsed_s = elapsed()
    result.coverage = dict(coverage)
    report_progress(force=True)
    return result


def pin_schedules(scenario: Scenario, schedules: dict[int, tuple[int, ...]]) -> Scenario:
    """The scenario with each threaded forward's recorded call order made explicit."""
    if not schedules:
        return scenario
    events = list(scenario.events)
    for index, order in schedules.items():
        events[index] = dataclasses.replace(events[index], order=tuple(order))
    return Scenario(scenario.config, tuple(events))


def _found(result: FuzzResult, scenario: Scenario, divergence: Divergence, elapsed_s: float,
           coverage: Counter[str]) -> FuzzResult:
    return FuzzResult(
        subject=result.subject, profile=result.profile, settings=result.settings,
        examples=result.examples, elapsed_s=elapsed_s, divergence=divergence, checks=result.checks,
        scenario=scenario,
        weakest_profile=weakest_profile(scenario), seed=result.seed, coverage=dict(coverage),
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
    """Run every scenario within the bounds (see :mod:`strategies.exhaustive`).

    With no divergence, ``examples`` is the number of scenarios checked: the subject is
    equivalent to the reference on that whole scope. Otherwise the first divergence in the
    enumeration order is returned; the enumeration lists short scenarios first.
    """
    check_device(info.subject, torch.device(device))
    load_capture_machinery()
    started = time.monotonic()
    result = FuzzResult(info.name, profile, "exhaustive", examples=0, elapsed_s=0.0)
    coverage: Counter[str] = Counter()
    for scenario in enumerate_scenarios(max_forwards, max_layers, max_micro_batches, profile):
        result.examples += 1
        coverage.update(features_of(scenario))
        outcome = run_scenario(info.subject, scenario, device=device, timeout_s=timeout_s)
        result.checks += outcome.checks
        if on_progress is not None and result.examples % 500 == 0:
            on_progress(Progress(result.examples, time.monotonic() - started, None, len(coverage), 0))
        if not outcome.passed:
            return _found(result, scenario, outcome.divergence, time.monotonic() - started, coverage)
    result.elapsed_s = time.monotonic() - started
    result.coverage = dict(coverage)
    return result
