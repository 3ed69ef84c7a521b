"""The peer benchmark: swafuzz beside the state machine an engineer would write by hand.

:class:`PoolCacheMachine` is a plain Hypothesis ``RuleBasedStateMachine`` over one pool
cache subject: a stage of 1 to 43 layers, up to 64 requests decoding together, 20 steps per
example, one ``torch.equal`` per layer. It keeps its own mapping and allocator, drives the
subject eagerly, and is told the trigger of the seed-000 bug: the stage's first layer may
store no SWA keys. swafuzz and the machine run interleaved on the same subject with torch on
one thread, so their ratio holds on a loaded machine even where their absolute numbers do not.
Beside them runs what every checker pays per check, the subject's call and one comparison
(:func:`bound_checks_per_s`): over the machine's rate, it is the ratio a harness that cost
nothing else would show, the ceiling of swafuzz's ratio on that subject.
swafuzz is measured with its default scenarios (runs of up to 128 plain decode forwards beside
the interesting ones) and with long horizons (runs of up to 512, as the nightly-long settings
draw them).
"""

from __future__ import annotations

import random
import statistics
import time
from functools import partial
from types import SimpleNamespace
from typing import Callable

import hypothesis
import torch
from hypothesis import HealthCheck, Verbosity
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from ..reference import DUMMY_SLOT, EngineConfig

from ..api import ForwardBatch, ForwardMode, ModelSpec, Subject
from ..search.fuzz import FuzzResult, fuzz
from ..run.graphs import load_capture_machinery
from ..subjects.registry import SubjectInfo, resolve_subject
from .workloads import decode_scenario, subject_alone

MAX_LAYERS = 43
MAX_BATCH = 64
STEPS = 20
SEED_000_BUG = "pool-start-layer"


class PoolCacheMachine(RuleBasedStateMachine):
    """Admit, finish and decode; every decode checks each SWA layer's answer."""

    subject_cls: type[Subject]
    checks = 0  # over every instance: examples make a fresh machine each

    @initialize(layers=st.integers(1, MAX_LAYERS), batch=st.integers(1, MAX_BATCH),
                first_layer_full_attention=st.booleans())
    def build(self, layers: int, batch: int, first_layer_full_attention: bool) -> None:
        pool = batch * (STEPS + 1) + 1
        config = EngineConfig(
            end_layer=layers, non_swa_layers=(0,) if first_layer_full_attention and layers > 1 else (),
            sliding_window=128, num_req_slots=batch + 1, full_pool_size=pool, swa_pool_size=pool,
        )
        self.layers = config.swa_layers
        self.mapping = torch.zeros(pool, dtype=torch.int64)
        self.free_full = list(range(pool - 1, 0, -1))
        self.free_swa = list(range(pool - 1, 0, -1))
        self.free_slots = list(range(batch, 0, -1))
        self.tokens: dict[int, list[int]] = {}  # request slot -> its full-pool slots
        self.subject = type(self).subject_cls(ModelSpec.of(config, "target", torch.device("cpu")))
        self.subject.register_mapping(self.mapping)
        self.backend = SimpleNamespace()
        self.forward_id = 0

    @precondition(lambda self: self.free_slots)
    @rule(count=st.integers(1, MAX_BATCH))
    def admit(self, count: int) -> None:
        for _ in range(min(count, len(self.free_slots))):
            self.tokens[self.free_slots.pop()] = []

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def finish(self, data) -> None:
        slot = data.draw(st.sampled_from(sorted(self.tokens)))
        for full in self.tokens.pop(slot):
            self.free_swa.append(int(self.mapping[full]))
            self.mapping[full] = DUMMY_SLOT
            self.free_full.append(full)
        self.free_slots.append(slot)

    @precondition(lambda self: self.tokens)
    @rule()
    def decode(self) -> None:
        slots = sorted(self.tokens)
        lengths = [len(self.tokens[slot]) for slot in slots]
        locs = []
        for slot in slots:
            full = self.free_full.pop()
            self.mapping[full] = self.free_swa.pop()
            self.tokens[slot].append(full)
            locs.append(full)
        out_cache_loc = torch.tensor(locs)
        seq_lens = torch.tensor(lengths) + 1
        batch = ForwardBatch(
            self.forward_id, ForwardMode.DECODE, 0, self.backend, torch.tensor(slots),
            torch.ones(len(slots), dtype=torch.int64), torch.tensor(lengths), out_cache_loc, len(slots),
            seq_lens=seq_lens, seq_lens_cpu=seq_lens, extend_prefix_lens=torch.tensor(lengths),
        )
        self.forward_id += 1
        expected = self.mapping[out_cache_loc].to(torch.int32)
        self.subject.init_forward_metadata(batch)
        for layer in self.layers:
            assert torch.equal(self.subject.swa_write_location(batch, layer), expected), f"layer {layer}"
            PoolCacheMachine.checks += 1


def _machine_for(subject: type[Subject], seed: int) -> type[PoolCacheMachine]:
    machine = type(f"{subject.__name__}Machine", (PoolCacheMachine,), {"subject_cls": subject})
    return hypothesis.seed(seed)(machine)


def _machine_settings(max_examples: int) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=max_examples, stateful_step_count=STEPS, deadline=None, database=None,
        print_blob=False, verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck),
    )


def machine_checks_per_s(subject: type[Subject], budget_s: float, seed: int = 0) -> tuple[int, float]:
    """(checks, seconds) of the machine on a subject it cannot fail, runs of 100 examples
    until the budget is spent."""
    PoolCacheMachine.checks = 0
    started = time.perf_counter()
    while time.perf_counter() - started < budget_s:
        run_state_machine_as_test(_machine_for(subject, seed), settings=_machine_settings(100))
        seed += 1
    return PoolCacheMachine.checks, time.perf_counter() - started


def machine_time_to_failure(subject: type[Subject], seed: int, max_examples: int = 2000) -> float | None:
    """Seconds until the machine has found and shrunk a failure (None: it found none)."""
    started = time.perf_counter()
    try:
        run_state_machine_as_test(_machine_for(subject, seed), settings=_machine_settings(max_examples))
    except AssertionError:
        return time.perf_counter() - started
    return None


def bound_checks_per_s(subject: type[Subject], budget_s: float, seed: int = 0) -> tuple[int, float]:
    """(checks, seconds) of the subject's own calls, each answer compared to the reference's
    rows with one ``torch.equal``, inputs and rows prepared beforehand, over decode runs of
    the machine's sizes (1 to 43 layers, 1 to 64 requests, 20 forwards) until the budget is
    spent: the checks per second no checker of this subject can pass on these sizes."""
    sizes = random.Random(seed)
    checks, seconds = 0, 0.0
    while seconds < budget_s:
        scenario = decode_scenario(layers=sizes.randint(1, MAX_LAYERS), batch=sizes.randint(1, MAX_BATCH),
                                   forwards=STEPS)
        run = subject_alone(subject, scenario, compare=True)
        started = time.perf_counter()
        checks += run()
        seconds += time.perf_counter() - started
    return checks, seconds


def fuzz_checks_per_s(info: SubjectInfo, profile: str, budget_s: float, seed: int = 0,
                      long_horizon: bool = False) -> tuple[int, float, float]:
    """(checks, seconds, seconds in the executor) of swafuzz searching until the budget is
    spent. A subject it finds diverging counts up to the moment of finding (shrinking is not
    search); the search then goes on from the next seed."""
    checks, seconds, executor_s = 0, 0.0, 0.0
    while seconds < budget_s:
        first: list[FuzzResult] = []
        result = fuzz(info, profile=profile, settings="ci", seed=seed, budget_s=budget_s - seconds,
                      long_horizon=long_horizon,
                      on_divergence=lambda found: first.append(found) if not first else None)
        found = first[0] if first else result
        checks += found.checks
        seconds += found.elapsed_s
        executor_s += found.executor_s
        seed += 1000
    return checks, seconds, executor_s


def bench_peer(subjects=("uncached", "step-keyed-capture"), profiles=("realistic", "adversarial"),
               rounds: int = 4, round_s: float = 2.0, seeds: int = 10,
               out: Callable[[str], None] = print) -> dict[str, float]:
    """Print both tools' layer checks per second and time to the seed-000 bug, and return
    the ratios (swafuzz over the machine for throughput, machine over swafuzz for time).
    Each throughput row also prints the bound (:func:`bound_checks_per_s` over the machine's
    rate), measured in the same rounds: the ratio the row's would be if swafuzz's search,
    engine model and lifecycle cost nothing; it is returned beside the row's ratio
    (``bound/<subject>/<profile>/<scenarios>``), and ``of bound`` is the one over the other.
    ``drawing`` is the share of swafuzz's time spent outside the executor, drawing examples
    (Hypothesis's engine and the strategies): what no cheaper engine model or check can win
    back. ``of bound`` is about the share the subject's own calls take (at the bound's
    sizes), so the harness's executor takes roughly the rest.
    The subjects are correct designs (the forward-keyed cache with its capture state), so
    no search stops early at a divergence.

    The machine's speed drifts by a fifth and more within seconds, so the three measurements
    of a round run in one order and those of the next in the reverse one: a drift that
    favours whichever runs first cancels over each pair of rounds. Each tool runs once
    before the first row, so that one-time costs of the process (strategies built, caches
    filled, the constants of new modules read by Hypothesis at its first draw) fall in no
    row."""
    torch.set_num_threads(1)
    load_capture_machinery()
    warm_up = resolve_subject(subjects[0])
    fuzz_checks_per_s(warm_up, profiles[0], 0.2)
    machine_checks_per_s(warm_up.subject, 0.2)
    bound_checks_per_s(warm_up.subject, 0.1)
    ratios: dict[str, float] = {}
    out(f"peer: swafuzz against a hand-written RuleBasedStateMachine ({MAX_LAYERS} layers max, "
        f"batch {MAX_BATCH} max, {STEPS} steps), interleaved, one torch thread")
    out(f"{'subject':18s} {'profile':12s} {'scenarios':13s} {'swafuzz checks/s':>17s} {'machine checks/s':>17s} "
        f"{'ratio':>7s} {'bound':>7s} {'of bound':>8s} {'drawing':>8s}")
    for name in subjects:
        info = resolve_subject(name)
        for profile in profiles:
            for long_horizon in (False, True):
                ours, theirs, least = [0, 0.0, 0.0], [0, 0.0], [0, 0.0]
                for round_no in range(rounds):
                    measurements = [
                        (ours, partial(fuzz_checks_per_s, info, profile, round_s, seed=round_no,
                                       long_horizon=long_horizon)),
                        (theirs, partial(machine_checks_per_s, info.subject, round_s, seed=round_no)),
                        # half a round: prepared calls vary little, and the bench stays short
                        (least, partial(bound_checks_per_s, info.subject, round_s / 2, seed=round_no)),
                    ]
                    for total, measure in measurements[::-1] if round_no % 2 else measurements:
                        for at, value in enumerate(measure()):
                            total[at] += value
                fuzz_rate, machine_rate, bound_rate = ours[0] / ours[1], theirs[0] / theirs[1], least[0] / least[1]
                kind = "long-horizon" if long_horizon else "default"
                ratios[f"checks_per_s/{name}/{profile}/{kind}"] = fuzz_rate / machine_rate
                ratios[f"bound/{name}/{profile}/{kind}"] = bound_rate / machine_rate
                out(f"{name:18s} {profile:12s} {kind:13s} {fuzz_rate:17.0f} {machine_rate:17.0f} "
                    f"{fuzz_rate / machine_rate:6.2f}x {bound_rate / machine_rate:6.2f}x "
                    f"{fuzz_rate / bound_rate:8.2f} {1 - ours[2] / ours[1]:8.0%}")
    info = resolve_subject(SEED_000_BUG)
    ours_s, theirs_s = [], []
    for seed in range(seeds):
        ours_s.append(fuzz(info, profile="realistic", settings="ci", seed=seed, max_examples=2000).elapsed_s)
        found = machine_time_to_failure(info.subject, seed)
        theirs_s.append(found if found is not None else float("inf"))
    ours_median, theirs_median = statistics.median(ours_s), statistics.median(theirs_s)
    ratios[f"time_to_failure/{SEED_000_BUG}"] = theirs_median / ours_median
    out(f"time to the seed-000 bug ({SEED_000_BUG}), found and shrunk, {seeds} seeds:")
    out(f"  swafuzz median {ours_median:.2f} s max {max(ours_s):.2f} s; machine median {theirs_median:.2f} s "
        f"max {max(theirs_s):.2f} s; machine/swafuzz {theirs_median / ours_median:.2f}x")
    return ratios
