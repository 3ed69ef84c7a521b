"""The fuzzer finds every diverging built-in subject by running it, and shrinks well.

Nothing here reads a subject's declared verdict to decide an outcome: the declared
``expected`` value only says which assertion applies, and the fuzzer must earn it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest
import torch

from swafuzz import Subject, Truth, run_scenario
from swafuzz.search import fuzz as fuzz_engine
from swafuzz.subjects.builtin import Uncached
from swafuzz.run.executor import NotCheckable
from swafuzz.search.fuzz import exhaustive, fuzz, pin_schedules
from swafuzz.subjects.registry import BUILTIN_SUBJECTS, DIVERGES, EQUIVALENT, SubjectInfo, resolve_subject
from swafuzz.search.shard import WHOLE, seed_lane
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.exhaustive import enumerate_scenarios
from swafuzz.strategies.features import ALL_FEATURES, DSPARK_DRAFT, scenario_size
from swafuzz.strategies.scenarios import ADVERSARIAL, PROFILES, REALISTIC

CHECKABLE_ON_CPU = [info for info in BUILTIN_SUBJECTS if not info.subject.requires]
DIVERGING = [info for info in CHECKABLE_ON_CPU if info.expected == DIVERGES]
EQUIVALENTS = [info for info in BUILTIN_SUBJECTS if info.expected == EQUIVALENT]


def _most_forwards(info) -> int:
    """The forwards a shrunk failure may keep: two, or for a subject answering compressed
    values five, since such a value differs from the dummy only at a token completing a
    group of 4, and the plain decodes that bring a request there belong to the failure, as
    may an idle graph replay whose capture the failing replay reuses (decode and idle
    share a graph), which the shrinker does not always drop."""
    return 5 if info.subject.answers else 2


def _most_requests(info) -> int:
    """The requests a shrunk failure may keep: two, or for a subject answering compressed
    values six. Its scenarios are drawn with long multi-request extends, and Hypothesis's
    shrinker can stop at an extend of several short requests that it cannot drop one by one
    without losing the group the failure needs (seen with every test module loaded)."""
    return 6 if info.subject.answers else 2


def _find(info, seed=0):
    """Search the realistic profile first; fall back to the adversarial one."""
    for profile in PROFILES:
        result = fuzz(info, profile=profile, settings="ci", seed=seed, max_examples=1500)
        if result.divergence is not None:
            return result
    return result


@pytest.mark.parametrize("info", DIVERGING, ids=lambda i: i.name)
def test_fuzzer_finds_and_shrinks_each_diverging_builtin(info):
    result = _find(info)
    assert result.divergence is not None, f"{info.name}: no divergence in {result.examples} examples"
    assert result.weakest_profile in (REALISTIC, ADVERSARIAL)
    if result.profile == ADVERSARIAL:
        assert result.weakest_profile == ADVERSARIAL
    forwards, layers, requests = scenario_size(result.scenario)
    assert forwards <= _most_forwards(info) and layers <= 3 and requests <= _most_requests(info), result.scenario.to_dict()
    replay = run_scenario(info.subject, result.scenario)
    assert replay.divergence == result.divergence
    # when it was first seen, before shrinking took the rest of the run
    assert 0 < result.first_divergence_s <= result.elapsed_s


def test_a_search_reports_its_examples_time_in_the_executor_apart_from_drawing_them():
    drawn = fuzz(resolve_subject("uncached"), settings="ci", seed=0, max_examples=60)
    enumerated = exhaustive(resolve_subject("uncached"), max_forwards=1, max_layers=2)
    for result in (drawn, enumerated):
        assert result.examples > 0 and result.divergence is None
        assert 0 < result.executor_s < result.elapsed_s


@pytest.mark.parametrize("seed", [2, 4])
def test_shrinking_admits_only_the_requests_the_failure_needs(seed):
    # seeds whose first failure admitted requests in two steps, or more than it ran
    result = fuzz(resolve_subject("pool-start-layer"), settings="ci", seed=seed, max_examples=1500)
    forwards, layers, requests = scenario_size(result.scenario)
    used = {rid for e in result.scenario.events if e.op == "forward" for rid in e.requests}
    assert requests == max(len(used), 1) <= 2, result.scenario.to_dict()


@pytest.mark.parametrize("info", DIVERGING, ids=lambda i: i.name)
def test_adversarial_profile_finds_and_shrinks_each_diverging_builtin_as_well(info):
    result = fuzz(info, profile=ADVERSARIAL, settings="ci", seed=0, max_examples=1500)
    assert result.divergence is not None, f"{info.name}: no divergence in {result.examples} examples"
    forwards, layers, requests = scenario_size(result.scenario)
    assert forwards <= _most_forwards(info) and layers <= 3 and requests <= _most_requests(info), result.scenario.to_dict()


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("info", EQUIVALENTS, ids=lambda i: i.name)
def test_equivalent_builtins_survive_hundreds_of_examples(info, profile):
    result = fuzz(info, profile=profile, settings="ci", max_examples=250)
    assert result.divergence is None, result.divergence.sentence
    assert result.examples == 250


def test_subject_that_needs_gpu_streams_is_not_checkable_on_cpu_rather_than_passing():
    with pytest.raises(NotCheckable, match="not checkable"):
        fuzz(resolve_subject("stream-unsynced"), settings="ci", max_examples=10)


def test_ci_settings_are_deterministic():
    info = resolve_subject("pool-start-layer")
    first = fuzz(info, settings="ci", max_examples=500)
    second = fuzz(info, settings="ci", max_examples=500)
    assert first.scenario == second.scenario
    assert first.divergence == second.divergence


def test_adversarial_run_covers_every_feature_and_counts_them():
    result = fuzz(resolve_subject("step-keyed-capture"), profile=ADVERSARIAL, settings="ci", max_examples=300)
    # DSpark draft models are drawn only for a subject whose engine drafts in blocks
    assert set(result.coverage) == set(ALL_FEATURES) - {DSPARK_DRAFT}
    assert all(count > 0 for count in result.coverage.values())


def test_a_subject_that_drafts_in_blocks_is_searched_on_dspark_draft_models_too():
    info = resolve_subject("uncached")
    blocks = dataclasses.replace(info, subject=type("DraftsInBlocks", (info.subject,), {"drafts_in_blocks": True}))
    result = fuzz(blocks, settings="ci", max_examples=200)
    assert result.divergence is None and result.coverage.get(DSPARK_DRAFT, 0) > 0


def test_nightly_database_keeps_the_failure_for_the_next_run(tmp_path):
    info = resolve_subject("pool-layer0")
    found = fuzz(info, settings="nightly", max_examples=2000, database_dir=str(tmp_path))
    assert found.divergence is not None
    assert any(path.is_file() for path in tmp_path.rglob("*"))
    again = fuzz(info, settings="repro", max_examples=1, database_dir=str(tmp_path))
    assert again.scenario == found.scenario


class HarnessClock:
    """The clock every part of a search reads its budget from, made to jump an hour ahead at
    a chosen moment: a test of what the budget stops then says where it runs out, whatever
    the machine's speed, and the budget it passes is one no run comes near on its own."""

    HOUR_S = 3600.0
    BUDGET_S = 600.0

    def __init__(self):
        self.late = False

    def __call__(self) -> float:
        return time.monotonic() + (self.HOUR_S if self.late else 0.0)

    def jump(self, *_) -> None:
        self.late = True


@pytest.fixture
def harness_clock(monkeypatch):
    from types import SimpleNamespace

    from swafuzz.run import executor, progress, store_calls

    clock = HarnessClock()
    monkeypatch.setattr(fuzz_engine, "time", SimpleNamespace(monotonic=clock))
    for module in (executor, progress, store_calls):  # every module of a run that reads the clock
        monkeypatch.setattr(module, "monotonic", clock)
    return clock


class UncachedCounted(Uncached):
    """Right; counts its calls, and passes the budget in the call ``budget_passes_at``
    (on the class: the fuzzer makes a new instance per scenario)."""

    calls = 0
    budget_passes_at = 0
    clock: HarnessClock | None = None

    def swa_write_location(self, batch, layer_id):
        UncachedCounted.calls += 1
        if UncachedCounted.calls == UncachedCounted.budget_passes_at:
            UncachedCounted.clock.jump()
        return super().swa_write_location(batch, layer_id)


@pytest.fixture
def budget_passes_at_call(harness_clock, monkeypatch):
    monkeypatch.setattr(UncachedCounted, "calls", 0)
    monkeypatch.setattr(UncachedCounted, "clock", harness_clock)

    def at(call: int) -> SubjectInfo:
        monkeypatch.setattr(UncachedCounted, "budget_passes_at", call)
        return SubjectInfo("uncached-counted", UncachedCounted, expected="equivalent")

    return at


def test_budget_stops_a_clean_run(budget_passes_at_call):
    result = fuzz(budget_passes_at_call(200), settings="ci", budget_s=HarnessClock.BUDGET_S, max_examples=10**6)
    assert result.divergence is None
    assert 0 < result.examples < 10**6


def test_budget_is_honoured_within_an_example_not_a_chunk_of_examples(budget_passes_at_call):
    result = fuzz(budget_passes_at_call(200), settings="ci", budget_s=HarnessClock.BUDGET_S)
    assert result.divergence is None
    # the call that passed the budget was the last, and the example it was in is cut short
    assert UncachedCounted.calls == 200 and result.examples < fuzz_engine.CHUNK


class WrongAfterLayer0(Uncached):
    """Wrong in every layer but layer 0, so all but the simplest scenario diverge."""

    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        return rows if layer_id == 0 else rows + 1


def test_budget_cuts_shrinking_short_and_says_so(harness_clock):
    info = SubjectInfo("wrong-after-layer-0", WrongAfterLayer0, expected="diverges")
    # the budget passes as the divergence is first seen: shrinking has not begun
    jumped_at_first_sight = []

    def on_divergence(found):
        if not jumped_at_first_sight:
            jumped_at_first_sight.append(found.examples)
            harness_clock.jump()

    result = fuzz(info, settings="ci", budget_s=HarnessClock.BUDGET_S, on_divergence=on_divergence)
    assert result.divergence is not None and jumped_at_first_sight
    assert not result.shrink_complete
    assert run_scenario(info.subject, result.scenario).divergence == result.divergence


def test_exhaustive_run_states_how_many_scenarios_were_checked():
    clean = exhaustive(resolve_subject("step-keyed-capture"), max_forwards=1, max_layers=2)
    assert clean.divergence is None
    assert clean.examples == len(list(enumerate_scenarios(max_forwards=1, max_layers=2)))
    broken = exhaustive(resolve_subject("pool-start-layer"), max_forwards=2, max_layers=2)
    assert broken.divergence is not None
    # shortest scenarios come first: the warm-up decode and one forward under test
    assert sum(e.op == "forward" for e in broken.scenario.events) == 2


class StepTableOnThePoolClass(Subject):
    """Numbers the forwards each pool sees and caches each step's rows under that number,
    but keeps the table on the class: one pool per process is right, yet the draft model's
    pool reads the target pool's rows of the step with the same number."""

    truth = Truth.POOL
    rows_by_step: dict = {}

    def __init__(self, spec):
        super().__init__(spec)
        self.steps = 0
        self.last_forward_id = None
        type(self).rows_by_step.clear()

    def swa_write_location(self, batch, layer_id):
        if batch.forward_id != self.last_forward_id:
            self.steps += 1
            self.last_forward_id = batch.forward_id
        key = (self.steps, batch.draft_step, batch.in_graph)  # a capture must miss the warm-ups' entry
        if key not in self.rows_by_step:
            self.rows_by_step[key] = self.mapping[batch.out_cache_loc].to(torch.int32)
        return self.rows_by_step[key]


def test_exhaustive_scope_has_a_draft_model_beside_the_target():
    info = SubjectInfo("step-table-on-the-pool-class", StepTableOnThePoolClass, expected="diverges")
    found = exhaustive(info, profile=REALISTIC)
    assert found.divergence is not None
    assert found.scenario.config.draft_model
    alone = Scenario(dataclasses.replace(found.scenario.config, draft_model=False), found.scenario.events)
    assert run_scenario(info.subject, alone).passed  # the target's pool alone is right


def test_a_clean_exhaustive_run_states_what_its_scope_covers_and_leaves_out():
    clean = exhaustive(resolve_subject("step-keyed-capture"), max_forwards=1, max_layers=2, profile=REALISTIC)
    assert clean.divergence is None
    scope = clean.scope
    assert scope.scenarios == clean.examples
    assert {"draft_model", "paged_pools", "graph_replay", "micro_batches", "pipeline_stage"} <= set(scope.covered)
    assert set(scope.covered) == set(clean.coverage)
    left_out = "\n".join(scope.left_out)
    for adversarial_only in ("permuted_layers", "mapping_change_in_forward", "register_mapping"):
        assert adversarial_only in left_out and adversarial_only not in scope.covered
    assert "more than 1 forwards under test" in left_out and "long horizons" in left_out


class RefreshWhenLayersRestart(Subject):
    """A pool cache refreshed whenever the layer id does not increase: right for any one
    micro-batch's layer sequence, wrong once two micro-batches interleave."""

    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        self.last_layer = None
        self.rows = None

    def swa_write_location(self, batch, layer_id):
        if self.last_layer is None or layer_id <= self.last_layer:
            self.rows = self.mapping[batch.out_cache_loc].to(torch.int32)
        self.last_layer = layer_id
        return self.rows


def test_thread_stress_finds_a_cache_shared_by_micro_batches_and_replays_it():
    info = SubjectInfo("refresh-when-layers-restart", RefreshWhenLayersRestart, expected="diverges")
    result = fuzz(info, settings="ci", threads=True, max_examples=500)
    assert result.divergence is not None
    assert result.divergence.source["kind"] == "other_micro_batch"
    assert result.replays
    assert run_scenario(RefreshWhenLayersRestart, result.scenario).divergence == result.divergence


def test_a_threaded_interleaving_is_pinned_into_the_scenario_and_replays_without_threads():
    scenario = Scenario.from_dict({
        "config": {"start_layer": 0, "end_layer": 4},
        "events": [{"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1], "micro_batches": 2}],
    })
    for _ in range(200):  # interleavings are up to the threads; most of them diverge
        threaded = run_scenario(RefreshWhenLayersRestart, scenario, threads=True)
        if threaded.divergence is not None:
            break
    assert threaded.divergence is not None
    pinned = pin_schedules(scenario, threaded.schedules)
    assert pinned.events[1].order == threaded.schedules[1]
    assert run_scenario(RefreshWhenLayersRestart, pinned).divergence == threaded.divergence


class StepTableWrappingAt256(Subject):
    """Keeps each step's rows in a table indexed by the step number modulo 256 (an 8-bit
    step counter): right for 255 forwards, stale from the 256th on."""

    truth = Truth.POOL

    def swa_write_location(self, batch, layer_id):
        table = batch.backend.__dict__.setdefault("rows_by_step", {})
        key = (batch.forward_id % 256, batch.draft_step, batch.in_graph)  # a capture misses the warm-ups' entry
        if key not in table:
            table[key] = self.mapping[batch.out_cache_loc].to(torch.int32)
        return table[key]


def test_nightly_long_settings_find_a_counter_that_wraps_and_shrink_the_run_to_the_wrap():
    info = SubjectInfo("step-table-wrapping-at-256", StepTableWrappingAt256, expected="diverges")
    short = fuzz(info, settings="ci", max_examples=200)
    assert short.divergence is None  # default scenarios end long before a counter wraps
    found = fuzz(info, settings="nightly-long", seed=1, max_examples=400)
    assert found.divergence is not None
    forwards, layers, requests = scenario_size(found.scenario)
    # the wrap needs 256 forward ids; a few more at most, never the hundreds drawn
    assert 256 <= forwards <= 264 and layers == 1 and requests <= 2, (forwards, layers, requests)
    assert run_scenario(info.subject, found.scenario).divergence == found.divergence


def test_seeded_parallel_workers_do_not_repeat_each_other(monkeypatch):
    # with one seed per worker and chunk counted up (seed + index), worker i's second chunk
    # was worker i+1's first: half the scenarios of a seeded parallel run were repeats
    drawn: dict[int, set[str]] = {0: set(), 1: set()}
    worker = [0]
    real_run = fuzz_engine.run_scenario

    def run_and_note(subject, scenario, **options):
        drawn[worker[0]].add(json.dumps(scenario.to_dict(), sort_keys=True))
        return real_run(subject, scenario, **options)

    monkeypatch.setattr(fuzz_engine, "run_scenario", run_and_note)
    monkeypatch.setattr(fuzz_engine, "CHUNK", 25)
    for worker[0] in (0, 1):
        lane = seed_lane(WHOLE, worker[0], 2)
        fuzz_engine.fuzz(resolve_subject("uncached"), settings="ci", seed=5 + lane.offset,
                         seed_stride=lane.stride, max_examples=2 * fuzz_engine.CHUNK)
    shared = drawn[0] & drawn[1]
    # each Hypothesis run tries the simplest scenarios first: those few may coincide
    assert len(shared) <= 2, f"{len(shared)} of {len(drawn[0])} scenarios drawn by both workers"


_CLOCK_PROBE = """
import sys, time
import swafuzz.search.fuzz as fuzz_module
from swafuzz.subjects.registry import resolve_subject

class Clock:
    def __getattr__(self, name):
        return getattr(time, name)

    def monotonic(self):
        first_reads.append("torch._dynamo" in sys.modules)
        return time.monotonic()

first_reads = []
fuzz_module.time = Clock()
fuzz_module.fuzz(resolve_subject("uncached"), settings="ci", max_examples=1)
print("imported before the clock started" if first_reads[0] else "imported inside the timed region")
"""


def test_the_one_time_import_of_the_first_graph_capture_happens_before_the_clock_starts():
    probe = subprocess.run([sys.executable, "-c", _CLOCK_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "imported before the clock started"


_GC_PROBE = """
import gc, time
import swafuzz.search.fuzz as fuzz_module
from swafuzz.subjects.registry import resolve_subject

class Clock:
    started = False

    def __getattr__(self, name):
        return getattr(time, name)

    def monotonic(self):
        Clock.started = True
        return time.monotonic()

real_collect = gc.collect
unfrozen = []

def collect(*args):
    if Clock.started:
        unfrozen.append(gc.get_freeze_count() == 0)
    return real_collect(*args)

gc.collect = collect
fuzz_module.time = Clock()
fuzz_module.fuzz(resolve_subject("uncached"), settings="ci", max_examples=1)
print("full collections in the timed region:", len(unfrozen), "over an unfrozen heap:", sum(unfrozen))
"""


def test_hypothesis_first_full_collection_scans_no_object_that_existed_before_the_search():
    # Hypothesis collects once at the first test of a process; over torch's heap that cost
    # more than most searches take to find a bug
    probe = subprocess.run([sys.executable, "-c", _GC_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "full collections in the timed region: 1 over an unfrozen heap: 0"


class WrongEveryThirdRun(Uncached):
    """Right, except in every third scenario run, where every answer is one row off."""

    runs = 0

    def __init__(self, spec):
        super().__init__(spec)
        type(self).runs += 1

    def swa_write_location(self, batch, layer_id):
        right = super().swa_write_location(batch, layer_id)
        return right + 1 if type(self).runs % 3 == 0 else right


def test_a_divergence_its_shrunk_scenario_does_not_repeat_every_time_is_reported_flaky():
    info = SubjectInfo("wrong-every-third-run", WrongEveryThirdRun, DIVERGES, kind="user")
    found = fuzz(info, settings="ci", max_examples=200)
    assert found.divergence is not None
    # three replays in a row: exactly one falls on a third run
    assert (found.replays_run, found.replays_diverged, found.replays) == (3, 1, False)
    assert found.weakest_profile is None


def test_a_deterministic_divergence_repeats_in_every_replay_before_it_is_reported():
    found = fuzz(resolve_subject("pool-start-layer"), settings="ci", max_examples=500)
    assert (found.replays_run, found.replays_diverged, found.replays) == (3, 3, True)
    assert found.weakest_profile is not None
