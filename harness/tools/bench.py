"""Benchmarks that print numbers (``swafuzz bench``); nothing here asserts a speed.

- ``executor``: 43 layers x batch 64 and 64 layers x batch 256, 20 decode forwards, eager
  and as graph replays. Layer checks per second through the harness, and the harness's
  cost as a ratio to calling the subject alone on the same lifecycle in the same run and
  in microseconds per checked answer above the subject's own call; the forward-keyed
  cache (``step-keyed``, stale under graphs) next to its correct twin
  (``step-keyed-capture``).
- ``fuzz``: seconds to the first divergence for every diverging built-in subject, median
  and max over several seeds on one CPU thread, the same including shrinking, and the
  largest shrunk scenario (forwards, layers, requests); examples per second for
  ``step-keyed-capture``.
- ``cold``: ``swafuzz fuzz --json`` in a fresh process per seed for every diverging
  built-in: the process's wall time, ``elapsed_s`` (search and shrinking, as the report
  states it) and ``first_divergence_s``, median and max.
- ``peer``: swafuzz beside a hand-written Hypothesis state machine on the same subject,
  interleaved: layer checks per second and time to the seed-000 bug, and their ratios,
  with the bound on the throughput ratio that the subject's own calls set
  (:mod:`swafuzz.tools.peer`), on ``uncached`` and ``step-keyed-capture``.
- ``scaling``: ``swafuzz fuzz --workers`` against one process, per subject and profile,
  under the nightly settings, the same seed and budget, in the order one, N, N, one:
  examples and checks per second, the efficiency (N workers' rate over N times one
  process's, the workers' start-up included), and how far each run went past its budget.
- ``mutants``: ``swafuzz mutate`` over the correct built-in designs and the bound SGLang
  functions of two releases' targets (0.5.23's translated-location getter and HIP unified
  ring rows, 0.5.12.post1's pool cache): mutants made, killed (per profile), survived,
  equivalent, never read and not runnable, the kill rate over the mutants that count, and
  the time to kill (median, p90, max), per subject and over all.
- ``device``: per-layer cost of the uncached translation against the cached designs, for
  batch sizes 1 to 256, on a GPU (or ``--device cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..reference import EngineState, ForwardPlan, Scenario, replay_events
from ..strategies.features import FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, scenario_size

from ..search.campaign import Campaign
from ..run.executor import run_scenario
from ..search.fuzz import fuzz
from ..subjects.registry import BUILTIN_SUBJECTS, DIVERGES, resolve_subject
from ..search.workers import start_server
from .workloads import decode_scenario, subject_alone


# Lowest accepted value of each ratio ``--json-out`` writes (a prefix names a family); a
# ratio under its floor is a speed regression (tests/test_bench_floors.py, marked slow).
# The seed-000 floor is the goal itself (the state machine takes at least twice as long);
# the others sit at or below half the worst value measured on a loaded two-core machine
# (fuzzing checks/s 2.8-3.7x the state machine's with runs of up to 128 forwards in most
# scenarios; the harness 5.6-7.8x the subject alone at the executor sizes), short of the
# goals: fuzzing checks/s 5x the state machine's, 1.5 us per answer above the subject.
# Scaling: the goal, N workers at 0.8 of N times one process's rate, held on an idle moment
# of the two-core machine (2 workers: 0.94 on a 20 s budget, of which each worker's start-up
# takes 3 s). Beside other load, workers get no more cores than one process does: on the
# loaded machine the efficiency measured 0.27-0.43, against 0.02 when threads outnumbered cores.
RATIO_FLOORS = {
    "peer/checks_per_s/": 1.4,
    "peer/time_to_failure/": 2.0,
    "executor/": 0.06,
    "scaling/examples_per_s/": 0.12,
    "scaling/checks_per_s/": 0.12,
    "scaling/budget_over_elapsed/": 0.9,
}


def ratios_below_floors(ratios: dict[str, float]) -> list[str]:
    """One line per ratio under its floor."""
    return [
        f"{name} = {value:.3g} is below its floor {floor:g}"
        for name, value in sorted(ratios.items())
        for prefix, floor in RATIO_FLOORS.items()
        if name.startswith(prefix) and value < floor
    ]


def _plan(scenario: Scenario) -> tuple[list[ForwardPlan], EngineState]:
    """Run the engine model alone: the harness's own share of any lifecycle."""
    state = EngineState(scenario.config)
    return list(replay_events(state, scenario.events)), state


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


EXECUTOR_SIZES = ((43, 64), (64, 256))  # (layers, batch)
EXECUTOR_FORWARDS = 20


def bench_executor(subjects=("uncached", "step-keyed", "step-keyed-capture"), sizes=EXECUTOR_SIZES,
                   repeats: int = 7, out=print) -> dict[str, float]:
    """``overhead`` is harness time over subject-alone time; ``us/answer`` is what the
    harness adds to each checked answer above the subject's own call (engine model,
    reference, comparison, lifecycle), ``us/forward`` the same per forward. ``checking``
    leaves out the engine model, a cost any driver of the lifecycle pays; the run without
    forwards is the fixed cost of a scenario, which small fuzzed scenarios mostly pay. The
    graph rows time the harness's lifecycle (one capture with its warm-ups, then replays)
    and say whether the subject passes it.
    Returns, per size and subject, subject-alone time over harness time (higher is better)."""
    ratios: dict[str, float] = {}
    for layers, batch in sizes:
        scenario = decode_scenario(layers=layers, batch=batch, forwards=EXECUTOR_FORWARDS)
        engine = _best_of(lambda: _plan(scenario), repeats)
        admitted = decode_scenario(layers=layers, batch=batch, forwards=0)
        setup = _best_of(lambda: run_scenario(resolve_subject(subjects[0]).subject, admitted), repeats)
        out(f"executor: {layers}-layer stage, batch {batch}, {EXECUTOR_FORWARDS} decode forwards, CPU")
        out(f"engine model alone: {engine:.4f} s; a run without forwards (setup, admission): {setup * 1e6:.0f} us")
        out(f"{'subject':20s} {'checks/s':>9s} {'harness s':>10s} {'alone s':>8s} {'overhead':>9s} "
            f"{'checking':>9s} {'us/answer':>10s} {'us/forward':>11s}")
        for name in subjects:
            subject = resolve_subject(name).subject
            checks = run_scenario(subject, scenario).checks
            harness = _best_of(lambda: run_scenario(subject, scenario), repeats)
            alone = _best_of(subject_alone(subject, scenario), repeats)
            ratios[f"executor/{layers}x{batch}/{name}/alone_over_harness"] = alone / harness
            out(f"{name:20s} {checks / harness:9.0f} {harness:10.4f} {alone:8.4f} {harness / alone:8.2f}x "
                f"{(harness - engine) / alone:8.2f}x {(harness - alone) / checks * 1e6:10.2f} "
                f"{(harness - alone) / EXECUTOR_FORWARDS * 1e6:11.1f}")
        graphs = decode_scenario(layers=layers, batch=batch, graph=True)
        out("the same forwards as graph replays (capture with its warm-ups, then 20 replays)")
        out(f"{'subject':20s} {'checks':>7s} {'checks/s':>9s} {'harness s':>10s} {'verdict':>10s}")
        for name in subjects:
            subject = resolve_subject(name).subject
            result = run_scenario(subject, graphs)
            harness = _best_of(lambda: run_scenario(subject, graphs), repeats)
            verdict = "passes" if result.passed else "diverges"
            out(f"{name:20s} {result.checks:7d} {result.checks / harness:9.0f} {harness:10.4f} {verdict:>10s}")
    return ratios


def bench_device(device: str = "cuda", batch_sizes=(1, 4, 16, 64, 256), repeats: int = 5,
                 subjects=("uncached", "pool-start-layer", "swa-out-shape-guard", "step-keyed",
                           "step-keyed-capture"),
                 out=print) -> None:
    """Per-layer cost of producing the write location (43 layers, 20 decode forwards),
    subjects called directly, wall time including launches, device synchronized at the end."""
    out(f"device: per-layer cost in microseconds on {device} (43 layers, 20 decode forwards)")
    out(f"{'batch':>5s} " + " ".join(f"{name:>20s}" for name in subjects))
    for batch in batch_sizes:
        scenario = decode_scenario(batch=batch)
        calls = 20 * len(scenario.config.swa_layers)
        costs = []
        for name in subjects:
            run = subject_alone(resolve_subject(name).subject, scenario, device)
            run()  # warm-up: allocator, kernels
            costs.append(_best_of(run, repeats) / calls * 1e6)
        baseline = costs[0]
        out(f"{batch:5d} " + " ".join(f"{cost:9.2f} ({cost / baseline:5.2f}x)" for cost in costs))


def _search(info, profile: str, seed: int) -> tuple[object, float | None]:
    """The shrunk result and the seconds until the divergence was first seen."""
    first_seen: list[float] = []
    result = fuzz(info, profile=profile, settings="ci", seed=seed, max_examples=2000,
                  on_divergence=lambda found: first_seen.append(found.elapsed_s))
    return result, (first_seen[0] if first_seen else None)


def bench_fuzz(seeds: int = 10, out=print) -> None:
    """Per diverging built-in: seconds until the first divergence is seen, seconds including
    shrinking, and the largest shrunk scenario over the seeds (forwards/layers/requests).
    The realistic profile is searched first; a seed it misses is searched adversarially."""
    torch.set_num_threads(1)
    out(f"fuzz: seconds to first divergence over {seeds} seeds (one CPU thread, ci settings)")
    out(f"{'subject':28s} {'profiles':22s} {'found':>6s} {'median s':>9s} {'max s':>6s} "
        f"{'+shrink med':>11s} {'max':>6s} {'shrunk max f/l/r':>17s}")
    for info in BUILTIN_SUBJECTS:
        if info.expected != DIVERGES:
            continue
        if info.subject.requires:
            out(f"{info.name:28s} not checkable on the CPU (needs {', '.join(sorted(info.subject.requires))})")
            continue
        first, total, sizes, profiles = [], [], [], Counter()
        for seed in range(seeds):
            result, seen = _search(info, "realistic", seed)
            if result.divergence is None:
                result, seen = _search(info, "adversarial", seed)
            total.append(result.elapsed_s)
            first.append(result.elapsed_s if seen is None else seen)
            if result.divergence is not None:
                profiles[result.profile] += 1
                sizes.append(scenario_size(result.scenario))
        found = sum(profiles.values())
        largest = "/".join(str(max(size[i] for size in sizes)) for i in range(3)) if sizes else "-"
        used = ", ".join(f"{name} {count}" for name, count in profiles.most_common())
        out(f"{info.name:28s} {used:22s} {found:3d}/{seeds:<2d} {statistics.median(first):9.2f} {max(first):6.2f} "
            f"{statistics.median(total):11.2f} {max(total):6.2f} {largest:>17s}")
    for profile in ("realistic", "adversarial"):
        result = fuzz(resolve_subject("step-keyed-capture"), profile=profile, settings="ci", max_examples=300)
        out(f"step-keyed-capture {profile}: {result.examples / result.elapsed_s:.0f} examples/s")


def _fuzz_in_fresh_process(name: str, profile: str, seed: int, report_dir: str) -> tuple[float, dict]:
    """(wall seconds, the JSON report) of ``swafuzz fuzz`` run as a user runs it."""
    command = [sys.executable, "-m", "swafuzz", "fuzz", "--subject", name, "--profile", profile,
               "--seed", str(seed), "--settings", "ci", "--max-examples", "2000", "--json",
               "--report-dir", report_dir]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - started
    try:
        return wall, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode} without a JSON report:\n"
                           f"{done.stderr[-2000:]}") from None


def bench_cold(seeds: int = 10, subjects: tuple[str, ...] | None = None, out=print) -> None:
    """Per diverging built-in, over ``seeds`` fresh processes: wall time of the process,
    ``elapsed_s`` of its report (the search with its shrinking, one-time imports before it)
    and ``first_divergence_s``. The realistic profile is searched first; a seed it misses
    is searched adversarially, as :func:`bench_fuzz` does."""
    chosen = [info for info in BUILTIN_SUBJECTS if info.expected == DIVERGES and not info.subject.requires
              and (subjects is None or info.name in subjects)]
    out(f"cold: swafuzz fuzz --json in a fresh process, {seeds} seeds (ci settings, one thread), seconds")
    out(f"{'subject':28s} {'found':>6s} {'first med':>9s} {'max':>6s} {'elapsed med':>11s} {'max':>6s} "
        f"{'wall med':>8s} {'max':>6s}")
    with tempfile.TemporaryDirectory(prefix="swafuzz-cold-") as report_dir:
        for info in chosen:
            walls, elapsed, first, found = [], [], [], 0
            for seed in range(seeds):
                for profile in ("realistic", "adversarial"):
                    wall, report = _fuzz_in_fresh_process(info.name, profile, seed, report_dir)
                    if report["verdict"] == "divergence":
                        break
                walls.append(wall)
                elapsed.append(report["elapsed_s"])
                if report["verdict"] == "divergence":
                    found += 1
                    first.append(report["first_divergence_s"])
            seen = f"{statistics.median(first):9.2f} {max(first):6.2f}" if first else f"{'-':>9s} {'-':>6s}"
            out(f"{info.name:28s} {found:3d}/{seeds:<2d} {seen} {statistics.median(elapsed):11.2f} "
                f"{max(elapsed):6.2f} {statistics.median(walls):8.2f} {max(walls):6.2f}")


SCALING_SUBJECTS = ("uncached", "uncached-ring")  # the cheapest calls, and per-layer ring expansion
SCALING_BUDGET_S = 20.0
SCALING_SEED = 77


def _scaling_run(name: str, profile: str, workers: int, budget_s: float, seed: int, report_dir: str):
    campaign = Campaign.open("fuzz", name, device="cpu", report_dir=Path(report_dir) / f"{name}-{profile}-{workers}",
                             as_json=True)
    job = campaign.job(profile=profile, settings="nightly", seed=seed, budget_s=budget_s)
    return campaign.fuzz(job, workers=workers)


def bench_scaling(subjects: tuple[str, ...] = SCALING_SUBJECTS, profiles=("realistic", "adversarial"),
                  workers: int = 2, budget_s: float = SCALING_BUDGET_S, seed: int = SCALING_SEED,
                  out=print) -> dict[str, float]:
    """Per subject and profile, campaigns in this process and over ``workers`` processes, as
    ``swafuzz fuzz --settings nightly --seed SEED --budget B`` runs them, in the order one,
    N, N, one: a machine whose speed drifts over the minute (a shared one does, by 10-20%
    from one run to the next) then slows both sides alike. Rates are over the runs' summed
    ``elapsed_s``, the workers' start-up included (from the fork server, which the command
    line starts as it begins, as here); ``over s`` is how far the runs went past their
    budget, at most (a subject call, plus the workers' shutdown). A subject that diverges
    ends its campaign at the divergence, which makes no rate to compare: its row says so.
    Returns the efficiencies and each side's budget over its longest elapsed time (higher
    is better)."""
    ratios: dict[str, float] = {}
    out(f"scaling: {workers} workers against one process, nightly settings, seed {seed}, "
        f"{budget_s:g} s budget, runs in the order 1, {workers}, {workers}, 1, CPU")
    out(f"{'subject':24s} {'profile':11s} {'examples/s':>15s} {'checks/s':>17s} {'efficiency':>10s} "
        f"{'over s':>11s} {'per worker':>12s}")
    start_server()
    with tempfile.TemporaryDirectory(prefix="swafuzz-scaling-") as report_dir:
        for name in subjects:
            for profile in profiles:
                runs: dict[int, list] = {1: [], workers: []}
                for count in (1, workers, workers, 1):
                    finished = _scaling_run(name, profile, count, budget_s, seed, f"{report_dir}/{len(runs[1])}"
                                            f"-{len(runs[workers])}")
                    runs[count].append(finished)
                    if finished.report.divergence is not None:
                        break
                if finished.report.divergence is not None:
                    out(f"{name:24s} {profile:11s} diverged: the campaign ends at the first divergence")
                    continue
                (examples_1, checks_1), (examples_n, checks_n) = (
                    (sum(f.report.examples for f in side) / sum(f.report.elapsed_s for f in side),
                     sum(f.result.checks for f in side) / sum(f.report.elapsed_s for f in side))
                    for side in (runs[1], runs[workers]))
                key = f"{name}/{profile}"
                ratios[f"scaling/examples_per_s/{key}"] = examples_n / (workers * examples_1)
                ratios[f"scaling/checks_per_s/{key}"] = checks_n / (workers * checks_1)
                longest = {count: max(f.report.elapsed_s for f in side) for count, side in runs.items()}
                for count, elapsed_s in longest.items():
                    ratios[f"scaling/budget_over_elapsed/{key}/{count}"] = budget_s / elapsed_s
                overs = "/".join(f"{longest[count] - budget_s:.2f}" for count in (1, workers))
                per_worker = [sum(column) for column in zip(*(f.report.examples_per_worker or () for f in runs[workers]))]
                counts = "+".join(str(count) for count in per_worker)
                out(f"{name:24s} {profile:11s} {examples_1:6.1f} {examples_n:8.1f} {checks_1:8.0f} {checks_n:8.0f} "
                    f"{ratios[f'scaling/examples_per_s/{key}']:10.2f} {overs:>11s} {counts:>12s}")
    return ratios


MUTATED_SUBJECTS = ("uncached", "uncached-ring", "step-keyed-capture", "step-keyed-capture-ring", "compressed-metadata",
                    "page-table")


@dataclass(frozen=True)
class MutatedTarget:
    """An SGLang release's target the mutants suite mutates, searched where that release is
    right: the realistic profile only (the adversarial one draws orders no engine produces,
    and every bound target diverges there), never drawing the features ``excluded`` names,
    each with the question of :mod:`swafuzz.subjects.sglang.reachability` whose routes show that the
    release never takes it (a test holds each to a "not reached" verdict)."""

    subject: str  # sglang:<target>@<version>
    excluded: tuple[tuple[str, str], ...] = ()  # (feature, reachability question)

    @property
    def version(self) -> str:
        return self.subject.partition("@")[2]

    @property
    def target(self) -> str:
        return self.subject.partition("@")[0].removeprefix("sglang:")

    def reasons(self) -> list[str]:
        from ..subjects.sglang.reachability import question

        lines = []
        for feature, key in self.excluded:
            verdict, routes = question(key).verdict(self.version, self.target)
            lines.append(f"{feature}: {key} is {verdict} in {self.version}"
                         + (f" ({routes[0].why})" if routes else ""))
        return lines


# 0.5.23's translated-location getter and HIP ring rows (the newest release), and the pool's
# inline cache of 0.5.12.post1 (the last release with it, SGLANG_OPT_CACHE_SWA_TRANSLATION on
# by default)
MUTATED_TARGETS = (
    MutatedTarget("sglang:cuda-swa-out-cache-loc@0.5.23"),
    MutatedTarget("sglang:hip-unified-swa-loc@0.5.23"),
    MutatedTarget("sglang:pool-fused-store@0.5.12.post1", (
        (FIRST_SWA_LAYER_NOT_START, "pool-cache-first-swa-layer"),
        (MICRO_BATCHES, "pool-cache-two-batch-overlap"),
    )),
)


def bench_mutants(subjects: tuple[str, ...] = MUTATED_SUBJECTS, targets: tuple[MutatedTarget, ...] = MUTATED_TARGETS,
                  budget_s: float = SCALING_BUDGET_S, max_examples: int | None = None, out=print) -> dict:
    """Mutation figures of each correct built-in design and of each SGLang target's bound
    functions, each in one ``mutate`` run (its own worker process), then over all of them;
    ``max_examples`` bounds each mutant's search as ``mutate``'s does.
    Returns them as ``--json-out`` writes them."""
    from .mutate import ADVERSARIAL, REALISTIC, mutate, nearest_rank, search_bound

    out(f"mutants: swafuzz mutate, {search_bound(budget_s, max_examples)} per mutant (built-ins: realistic, "
        f"then adversarial; SGLang targets: realistic), seed 0, CPU")
    out(f"{'subject':38s} {'unmutated':>9s} {'made':>4s} {'killed':>6s} {'real':>4s} {'adv':>4s} {'surv':>4s} "
        f"{'equiv':>5s} {'never':>5s} {'n/r':>3s} {'rate':>6s} {'ttk med':>7s} {'p90':>6s} {'max':>6s} {'run s':>6s}")
    runs = [(name, {}) for name in subjects] + [
        (item.subject, {"profiles": (REALISTIC,), "exclude": frozenset(f for f, _ in item.excluded)})
        for item in targets]
    reports = []
    for name, scope in runs:
        report = mutate(name, budget_s=budget_s, max_examples=max_examples, seed=0, **scope)
        reports.append(report)
        times = {name: "-" if value is None else f"{value:.2f}" for name, value in report.time_to_kill().items()}
        rate = "-" if report.kill_rate is None else f"{report.kill_rate:.1%}"
        out(f"{report.subject:38s} {report.baseline.status:>9s} {len(report.outcomes):4d} "
            f"{report.count('killed'):6d} {report.killed_by_profile[REALISTIC]:4d} "
            f"{report.killed_by_profile[ADVERSARIAL]:4d} {len(report.survivors):4d} {report.count('equivalent'):5d} "
            f"{report.count('never read'):5d} {report.count('not runnable'):3d} {rate:>6s} {times['median_s']:>7s} {times['p90_s']:>6s} "
            f"{times['max_s']:>6s} {report.elapsed_s:6.1f}")
    killed = sum(report.count("killed") for report in reports)
    counted = sum(report.counted for report in reports)
    by_operator: dict[str, dict[str, int]] = {}
    for report in reports:
        for operator, figures in report.diagnosis()["by_operator"].items():
            total = by_operator.setdefault(operator, {"named": 0, "killed": 0})
            total["named"] += figures["named"]
            total["killed"] += figures["killed"]
    named = sum(figures["named"] for figures in by_operator.values())
    times = sorted(t for report in reports for t in report.times_to_kill)
    overall = {
        "kill_rate": killed / counted if counted else None, "killed": killed, "counted": counted,
        "made": sum(len(report.outcomes) for report in reports),
        "survived": sum(len(report.survivors) for report in reports),
        "equivalent": sum(report.count("equivalent") for report in reports),
        "never_read": sum(report.count("never read") for report in reports),
        "not_runnable": sum(report.count("not runnable") for report in reports),
        "unmutated_divergences": sum(report.baseline.status != "passes" for report in reports),
        "elapsed_s": sum(report.elapsed_s for report in reports),
        "time_to_kill": {"median_s": statistics.median(times) if times else None,
                         "p90_s": nearest_rank(times, 0.9), "max_s": times[-1] if times else None},
        "diagnosis": {"named": named, "killed": killed, "share": named / killed if killed else None,
                      "by_operator": by_operator},
    }
    shown = {name: "-" if value is None else f"{value:.2f} s" for name, value in overall["time_to_kill"].items()}
    rate = "-" if overall["kill_rate"] is None else f"{overall['kill_rate']:.1%}"
    out(f"all: {killed} of {counted} killed ({rate}), {overall['survived']} survived, {overall['equivalent']} "
        f"equivalent, {overall['never_read']} never read, {overall['not_runnable']} not runnable, of {overall['made']} made; time to kill median "
        f"{shown['median_s']}, p90 {shown['p90_s']}, max {shown['max_s']}; divergences of the unmutated "
        f"subjects: {overall['unmutated_divergences']}; {overall['elapsed_s']:.0f} s")
    share = "-" if not killed else f"{named / killed:.0%}"
    out(f"diagnosis: names the cause of {named} of {killed} kills ({share}); per operator: "
        + ", ".join(f"{op} {f['named']}/{f['killed']}" for op, f in sorted(by_operator.items())))
    for item in targets:
        for reason in item.reasons():
            out(f"scope: {item.subject}: never drawing {reason}")
    for report in reports:
        for mutant in report.diagnosis()["catch_all"]:
            out(f"catch-all diagnosis: {report.subject}: {mutant}")
        for outcome in report.survivors:
            out(f"survived: {report.subject}: {outcome.mutant.id}: {outcome.mutant.description}")
        for outcome in report.outcomes:
            if outcome.equivalent_reason:
                out(f"equivalent: {report.subject}: {outcome.mutant.id}: {outcome.equivalent_reason}")
            elif outcome.status in ("not runnable", "never read"):
                out(f"{outcome.status}: {report.subject}: {outcome.mutant.id}: {outcome.sentence}")
    return {"overall": overall, "subjects": {report.subject: report.to_dict() for report in reports}}


FIGURES_START = "<!-- figures written by: "
FIGURES_END = "<!-- end of figures -->"


def _seconds_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def mutants_table(figures: dict) -> list[str]:
    """The mutants suite's figures (as :func:`bench_mutants` returns them) as a Markdown table:
    a row per subject, then one over all."""
    def times(t: dict) -> str:
        return f"{_seconds_or_dash(t['median_s'])} / {_seconds_or_dash(t['p90_s'])} / {_seconds_or_dash(t['max_s'])} s"

    lines = ["| subject | made | killed | equivalent | never read | not runnable | survived "
             "| time to kill median / p90 / max |", "|---|---|---|---|---|---|---|---|"]
    for name, report in figures["subjects"].items():
        adversarial = report["killed_by_profile"].get("adversarial", 0)
        killed = f"{report['killed']}" + (f" ({adversarial} adversarial)" if adversarial else "")
        lines.append(f"| `{name}` | {report['made']} | {killed} | {report['equivalent']} | {report['never_read']} "
                     f"| {report['not_runnable']} | {report['survived']} | {times(report['time_to_kill'])} |")
    overall = figures["overall"]
    rate = "-" if overall["kill_rate"] is None else f"{overall['kill_rate']:.1%}"
    lines.append(f"| all | {overall['made']} | {overall['killed']} of {overall['counted']} ({rate}) "
                 f"| {overall['equivalent']} | {overall['never_read']} | {overall['not_runnable']} "
                 f"| {overall['survived']} | {times(overall['time_to_kill'])} |")
    return lines


def write_figures(page: Path, command: str, lines: list[str]) -> None:
    """Put ``lines`` in ``page`` in place of the figures the same ``command`` wrote there
    before, between ``<!-- figures written by: COMMAND -->`` and ``<!-- end of figures -->``,
    so measured figures reach the page that shows them without being copied by hand."""
    start = f"{FIGURES_START}{command} -->"
    text = page.read_text(encoding="utf-8")
    if start not in text or FIGURES_END not in text.split(start, 1)[1]:
        raise SystemExit(f"swafuzz bench: {page} has no place for these figures: put the lines {start!r} "
                         f"and {FIGURES_END!r} where they belong")
    before, rest = text.split(start, 1)
    after = rest.split(FIGURES_END, 1)[1]
    page.write_text(before + start + "\n" + "\n".join(lines) + "\n" + FIGURES_END + after, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swafuzz bench", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("executor", "fuzz", "peer", "cold", "scaling", "mutants", "device",
                                            "all"),
                        default="all",
                        help="all = executor, fuzz and peer; cold (a process per seed), scaling (worker "
                             "processes against one), mutants (swafuzz mutate over the correct built-ins "
                             "and two SGLang releases' targets) "
                             "and device run on their own")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per subject for the fuzz and peer suites")
    parser.add_argument("--device", default="cuda", help="device for the device suite (default cuda)")
    parser.add_argument("--workers", type=int, default=max(2, len(os.sched_getaffinity(0))),
                        help="worker processes for the scaling suite (default: this machine's CPUs, at least 2)")
    parser.add_argument("--budget", type=float, default=SCALING_BUDGET_S,
                        help=f"seconds per campaign for the scaling suite, per mutant for the mutants suite "
                             f"(default {SCALING_BUDGET_S:g})")
    parser.add_argument("--subjects", default=",".join(SCALING_SUBJECTS),
                        help="comma-separated subjects for the scaling suite, or 'all' for every built-in "
                             f"that runs on the CPU (default {','.join(SCALING_SUBJECTS)})")
    parser.add_argument("--json-out", metavar="PATH",
                        help="write the ratios measured (higher is better for each) to this JSON file")
    parser.add_argument("--write-figures", metavar="PAGE", type=Path,
                        help="write the mutants suite's table into PAGE (e.g. docs/benchmarks.md), in place of "
                             "the one this command wrote there before")
    args = parser.parse_args(argv)
    if args.write_figures and args.suite != "mutants":
        parser.error("--write-figures writes the mutants suite's table: add --suite mutants")
    ratios: dict[str, float] = {}
    mutants = None
    if args.suite in ("executor", "all"):
        ratios.update(bench_executor())
    if args.suite in ("fuzz", "all"):
        bench_fuzz(args.seeds)
    if args.suite in ("peer", "all"):
        from .peer import bench_peer

        ratios.update({f"peer/{name}": ratio for name, ratio in bench_peer(seeds=args.seeds).items()})
    if args.suite == "cold":
        bench_cold(args.seeds)
    if args.suite == "scaling":
        subjects = (tuple(info.name for info in BUILTIN_SUBJECTS if not info.subject.requires)
                    if args.subjects == "all" else tuple(args.subjects.split(",")))
        ratios.update(bench_scaling(subjects, workers=args.workers, budget_s=args.budget))
    if args.suite == "mutants":
        mutants = bench_mutants(budget_s=args.budget)
        if args.write_figures:
            write_figures(args.write_figures, f"swafuzz bench --suite mutants --budget {args.budget:g}",
                          mutants_table(mutants))
        ratios.update({f"mutants/kill_rate/{name}": report["kill_rate"]
                       for name, report in mutants["subjects"].items() if report["kill_rate"] is not None})
        if mutants["overall"]["diagnosis"]["share"] is not None:
            ratios["mutants/diagnosis_named"] = mutants["overall"]["diagnosis"]["share"]
    if args.suite == "device":
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print("swafuzz bench: no GPU is visible to torch; use --device cpu for host numbers")
            return 2
        bench_device(args.device)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            figures = {} if mutants is None else {"mutants": mutants}
            json.dump({"suite": args.suite, "ratios": ratios, **figures}, handle, indent=2, sort_keys=True)
            handle.write("\n")
    return 0
