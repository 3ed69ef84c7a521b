"""The fuzzer finds every diverging built-in subject by running it, and shrinks well.

Nothing here reads a subject's declared verdict to decide an outcome: the declared
``expected`` value only says which assertion applies, and the fuzzer must earn it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness import Subject, Truth, run_scenario
from harness.executor import NotCheckable
from harness.fuzz import exhaustive, fuzz, pin_schedules
from harness.registry import BUILTIN_SUBJECTS, DIVERGES, EQUIVALENT, SubjectInfo, resolve_subject
from reference import Scenario
from strategies.exhaustive import enumerate_scenarios
from strategies.features import ALL_FEATURES
from strategies.scenarios import ADVERSARIAL, PROFILES, REALISTIC

CHECKABLE_ON_CPU = [info for info in BUILTIN_SUBJECTS if not info.subject.requires]
DIVERGING = [info for info in CHECKABLE_ON_CPU if info.expected == DIVERGES]
EQUIVALENTS = [info for info in BUILTIN_SUBJECTS if info.expected == EQUIVALENT]


def _find(info, seed=0):
    """Search the realistic profile first; fall back to the adversarial one."""
    for profile in PROFILES:
        result = fuzz(info, profile=profile, settings="ci", seed=seed, max_examples=1500)
        if result.divergence is not None:
            return result
    return result


def _bounds(scenario):
    forwards = [e for e in scenario.events if e.op == "forward"]
    admitted = sum(e.count for e in scenario.events if e.op == "admit")
    layers = scenario.config.end_layer - scenario.config.start_layer
    return len(forwards), layers, admitted


@pytest.mark.parametrize("info", DIVERGING, ids=lambda i: i.name)
def test_fuzzer_finds_and_shrinks_each_diverging_builtin(info):
    result = _find(info)
    assert result.divergence is not None, f"{info.name}: no divergence in {result.examples} examples"
    assert result.weakest_profile in (REALISTIC, ADVERSARIAL)
    if result.profile == ADVERSARIAL:
        assert result.weakest_profile == ADVERSARIAL
    forwards, layers, requests = _bounds(result.scenario)
    assert forwards <= 2 and layers <= 3 and requests <= 2, result.scenario.to_dict()
    replay = run_scenario(info.subject, result.scenario)
    assert replay.divergence == result.divergence


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
    assert set(result.coverage) == set(ALL_FEATURES)
    assert all(count > 0 for count in result.coverage.values())


def test_nightly_database_keeps_the_failure_for_the_next_run(tmp_path):
    info = resolve_subject("pool-layer0")
    found = fuzz(info, settings="nightly", max_examples=2000, database_dir=str(tmp_path))
    assert found.divergence is not None
    assert any(path.is_file() for path in tmp_path.rglob("*"))
    again = fuzz(info, settings="repro", max_examples=1, database_dir=str(tmp_path))
    assert again.scenario == found.scenario


def test_budget_stops_a_clean_run():
    result = fuzz(resolve_subject("uncached"), settings="ci", budget_s=0.5, max_examples=10**6)
    assert result.divergence is None
    assert 0 < result.examples < 10**6


def test_exhaustive_run_states_how_many_scenarios_were_checked():
    clean = exhaustive(resolve_subject("step-keyed-capture"), max_forwards=1, max_layers=2)
    assert clean.divergence is None
    assert clean.examples == len(list(enumerate_scenarios(max_forwards=1, max_layers=2)))
    broken = exhaustive(resolve_subject("pool-start-layer"), max_forwards=2, max_layers=2)
    assert broken.divergence is not None
    # shortest scenarios come first: the warm-up decode and one forward under test
    assert sum(e.op == "forward" for e in broken.scenario.events) == 2


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


_CLOCK_PROBE = """
import sys, time
import harness.fuzz as fuzz_module
from harness.registry import resolve_subject

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
