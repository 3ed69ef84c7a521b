"""Specification of the engine lifecycle around graphs and memory (reference/LIFECYCLE.md).

Graph capture warms up like SGLang's graph runners; graph inputs are slices of static
buffers shared by every captured size; every tensor a subject is handed has an address
fixed by the scenario, so an address-keyed cache gets one verdict in fuzzing, in a replay
in a fresh process and in an emitted test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swafuzz import Subject, Truth, run_scenario
from swafuzz.run.arena import Arena
from swafuzz.subjects.builtin import StepKeyed, StepKeyedCapture, StepKeyedCaptureRing, StepKeyedRing, Uncached
from swafuzz.search.fuzz import fuzz
from swafuzz.subjects.registry import DIVERGES, SubjectInfo
from swafuzz.results.replay import Replay, emit_pytest, load_replay, run_replay, write_replay
from swafuzz.reference import Scenario, ScenarioError
from swafuzz.strategies.examples import EXAMPLES

TESTS = Path(__file__).resolve().parent


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


def _with_warmups(scenario: Scenario, warmups: int) -> Scenario:
    data = scenario.to_dict()
    data["config"]["graph_warmups"] = warmups
    return Scenario.from_dict(data)


# Two graph sizes, each replayed twice, then one eager forward.
TWO_SIZES = _scenario(
    {"start_layer": 0, "end_layer": 2, "graph_batch_sizes": [2, 4]},
    [{"op": "admit", "count": 3},
     {"op": "forward", "requests": [0], "graph": True},
     {"op": "forward", "requests": [0, 1, 2], "graph": True},
     {"op": "forward", "requests": [0], "graph": True},
     {"op": "forward", "requests": [0, 1, 2], "graph": True},
     {"op": "forward", "requests": [0, 1]}],
)


class _Recorder(Uncached):
    """Correct answers; logs every lifecycle call with whether it was being captured and
    the addresses of the inputs it saw."""

    log: list = []

    def _note(self, hook: str, batch, layer_id=None) -> None:
        self.log.append((hook, layer_id, batch.in_graph, batch.num_tokens, {
            name: getattr(batch, name).data_ptr()
            for name in ("req_pool_indices", "extend_seq_lens", "positions", "out_cache_loc")
        }))

    def init_forward_metadata(self, batch):
        self._note("init_forward_metadata", batch)

    def init_capture_metadata(self, batch):
        self._note("init_capture_metadata", batch)

    def init_graph_metadata(self, batch):
        self._note("init_graph_metadata", batch)

    def init_replay_metadata(self, batch):
        self._note("init_replay_metadata", batch)

    def swa_write_location(self, batch, layer_id):
        self._note("swa_write_location", batch, layer_id)
        return super().swa_write_location(batch, layer_id)


def _recorded(scenario: Scenario) -> list:
    _Recorder.log = []
    result = run_scenario(_Recorder, scenario)
    assert result.passed, result.divergence.sentence
    return list(_Recorder.log)


# ---- warm-up before capture ------------------------------------------------------------------


def _capture_protocol(warmups: int) -> list[tuple[str, int | None, bool]]:
    run = [("init_graph_metadata", None)] + [("swa_write_location", layer) for layer in (0, 1)]
    return (
        [("init_capture_metadata", None, False)]
        + [(hook, layer, False) for _ in range(warmups) for hook, layer in run]
        + [(hook, layer, True) for hook, layer in run]
        + [("init_replay_metadata", None, False)]
    )


@pytest.mark.parametrize("warmups", [0, 1, 2])
def test_capture_runs_capture_metadata_once_then_the_warmups_eagerly_then_the_captured_run(warmups):
    log = _recorded(_with_warmups(TWO_SIZES, warmups))
    first_size = [(hook, layer, in_graph) for hook, layer, in_graph, tokens, _ in log[:len(_capture_protocol(warmups))]]
    assert first_size == _capture_protocol(warmups)


def test_the_default_is_the_two_warmups_every_release_runs():
    assert TWO_SIZES.config.graph_warmups == 2
    log = _recorded(TWO_SIZES)
    assert sum(1 for hook, _, in_graph, _, _ in log if hook == "init_graph_metadata" and not in_graph) == 2 * 2


@pytest.mark.parametrize("warmups", [-1, 9, True, "2"])
def test_a_warmup_count_out_of_range_is_refused_naming_the_field(warmups):
    data = TWO_SIZES.to_dict()
    data["config"]["graph_warmups"] = warmups
    with pytest.raises(ScenarioError, match=r"config\.graph_warmups"):
        Scenario.from_dict(data)


def test_the_warmup_count_round_trips_through_json():
    scenario = _with_warmups(TWO_SIZES, 1)
    assert Scenario.from_dict(scenario.to_dict()) == scenario
    assert scenario.to_dict()["config"]["graph_warmups"] == 1


@pytest.mark.parametrize("subject", [StepKeyed, StepKeyedRing], ids=["pool", "ring"])
def test_a_forward_keyed_cache_replays_the_warmup_rows_only_because_of_the_warmups(subject):
    """The cache is filled by the warm-up and hit by the capture, so the graph never
    recomputes; without warm-ups the capture itself fills it."""
    assert run_scenario(subject, _with_warmups(EXAMPLES["graph-replay"], 0)).passed
    divergence = run_scenario(subject, EXAMPLES["graph-replay"]).divergence
    assert divergence is not None and divergence.kind == "wrong_rows"


@pytest.mark.parametrize("subject", [StepKeyedCapture, StepKeyedCaptureRing], ids=["pool", "ring"])
@pytest.mark.parametrize("warmups", [0, 2])
def test_a_cache_keyed_also_on_capture_is_right_with_and_without_warmups(subject, warmups):
    assert run_scenario(subject, _with_warmups(EXAMPLES["graph-replay"], warmups)).passed
    assert run_scenario(subject, _with_warmups(TWO_SIZES, warmups)).passed


# ---- target-verify and DSpark draft-block graphs ------------------------------------------------

# Verify graphs of two sizes beside a decode graph of one of them: each has its own capture.
VERIFY_GRAPHS = _scenario(
    {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 3, "graph_batch_sizes": [2, 4]},
    [{"op": "admit", "count": 3},
     {"op": "forward", "mode": "extend", "requests": [0, 1, 2], "tokens": [2, 1, 3]},
     {"op": "forward", "mode": "verify", "requests": [0], "graph": True},
     {"op": "forward", "mode": "decode", "requests": [0, 1], "graph": True},
     {"op": "forward", "mode": "verify", "requests": [1, 2], "graph": True},
     {"op": "forward", "mode": "verify", "requests": [0, 1, 2], "graph": True}],
)


def test_a_verify_graph_is_captured_per_batch_size_with_each_request_rows_draft_tokens_long():
    captures = [(tokens, ptrs) for hook, _, _, tokens, ptrs in _recorded(VERIFY_GRAPHS)
                if hook == "init_capture_metadata"]
    # verify at 2 requests (6 rows), decode at 2 (2 rows, a graph of its own), verify at 4 (12 rows)
    assert [tokens for tokens, _ in captures] == [6, 2, 12]


def test_a_verify_graph_pads_its_requests_with_whole_requests_of_dummy_rows():
    seen = []

    class Padding(Uncached):
        def init_replay_metadata(self, batch):
            seen.append((batch.mode.value, batch.req_pool_indices.tolist(), batch.extend_seq_lens.tolist(),
                         batch.out_cache_loc[batch.num_live_tokens:].tolist(), batch.graph_key))

    assert run_scenario(Padding, VERIFY_GRAPHS).passed
    mode, slots, counts, padding, key = seen[-1]  # three requests in the graph of four
    assert mode == "verify" and slots[3] == 0 and counts == [3, 3, 3, 3] and padding == [0, 0, 0]
    assert key == ("target_verify", 4)
    assert seen[1][4] == ("decode", 2) and seen[0][4] == ("target_verify", 2)


@pytest.mark.parametrize("subject", [StepKeyed, StepKeyedRing], ids=["pool", "ring"])
def test_a_forward_keyed_cache_is_found_stale_in_a_verify_graph_replay(subject):
    scenario = _scenario(VERIFY_GRAPHS.config.to_dict(), [e.to_dict() for e in VERIFY_GRAPHS.events[:3]])
    divergence = run_scenario(subject, scenario).divergence
    assert divergence is not None and divergence.sentence.startswith("Stale cache: at forward 2 (verify)")
    assert all(run_scenario(right, VERIFY_GRAPHS).passed for right in (Uncached, StepKeyedCapture, StepKeyedCaptureRing))


# ---- static buffers ----------------------------------------------------------------------------


def test_every_captured_size_and_every_replay_sees_the_graph_inputs_at_the_same_addresses():
    log = _recorded(TWO_SIZES)
    eager_from = next(i for i, entry in enumerate(log) if entry[0] == "init_forward_metadata")
    graph_calls = log[:eager_from]  # the eager forward comes last
    sizes = {tokens for _, _, _, tokens, _ in graph_calls}
    assert sizes == {2, 4}
    addresses = {tuple(sorted(ptrs.items())) for *_, ptrs in graph_calls}
    assert len(addresses) == 1, addresses
    replays = [entry for entry in log if entry[0] == "init_replay_metadata"]
    assert len(replays) == 4 and {tuple(sorted(e[4].items())) for e in replays} == addresses


def test_graph_inputs_are_slices_of_one_buffer_per_input_sized_for_the_largest_graph():
    seen = []

    class Slices(Uncached):
        def init_replay_metadata(self, batch):
            seen.append({name: (t._base.shape[0], t.shape[0]) for name in ("positions", "out_cache_loc")
                         if (t := getattr(batch, name))._base is not None})

    assert run_scenario(Slices, TWO_SIZES).passed
    assert seen[0] == {"positions": (4, 2), "out_cache_loc": (4, 2)}
    assert seen[1] == {"positions": (4, 4), "out_cache_loc": (4, 4)}


def test_eager_inputs_never_share_the_graph_buffers():
    log = _recorded(TWO_SIZES)
    graph = {ptr for hook, _, _, _, ptrs in log if hook == "init_replay_metadata" for ptr in ptrs.values()}
    eager = {ptr for hook, _, _, _, ptrs in log if hook == "init_forward_metadata" for ptr in ptrs.values()}
    assert eager and not graph & eager


# ---- addresses determined by the scenario --------------------------------------------------------


ALTERNATING = _scenario(
    {"start_layer": 0, "end_layer": 2},
    [{"op": "admit", "count": 2}] + [{"op": "forward", "requests": [0, 1]}] * 4
    + [{"op": "register_mapping", "shuffle": 1}, {"op": "forward", "requests": [0, 1]}],
)


def _address_classes(log: list) -> list:
    """Each address replaced by the order of its first appearance: equal addresses map to
    equal labels, whatever the process's allocator did."""
    labels: dict[int, int] = {}
    return [(hook, layer, tuple((name, labels.setdefault(ptr, len(labels))) for name, ptr in sorted(ptrs.items())))
            for hook, layer, _, _, ptrs in log]


def test_address_equalities_are_the_same_in_every_run_whatever_else_the_process_allocated():
    first = _address_classes(_recorded(ALTERNATING))
    hoard = [torch.empty(n, dtype=torch.int64) for n in range(1, 300)]  # disturbs the allocator
    second = _address_classes(_recorded(ALTERNATING))
    del hoard
    assert first == second


def test_eager_forwards_alternate_between_two_slots():
    log = [entry for entry in _recorded(ALTERNATING) if entry[0] == "init_forward_metadata"]
    locations = [entry[4]["out_cache_loc"] for entry in log]
    assert locations[0] == locations[2] == locations[4]
    assert locations[1] == locations[3]
    assert locations[0] != locations[1]


def test_a_new_mapping_gets_an_address_other_than_the_registered_one():
    mappings = []

    class Registers(Uncached):
        def register_mapping(self, mapping):
            mappings.append(mapping.data_ptr())
            super().register_mapping(mapping)

    assert run_scenario(Registers, ALTERNATING).passed
    assert len(mappings) == 2 and mappings[0] != mappings[1]


def test_a_block_that_grows_keeps_the_old_one_so_no_live_view_shares_an_address_with_a_new_one():
    arena = Arena(torch.device("cpu"))
    small = arena.place("slot", [torch.arange(4)])
    large = arena.place("slot", [torch.arange(1000)])
    small_range = range(small.data_ptr(), small.data_ptr() + 4 * small.element_size())
    large_range = range(large.data_ptr(), large.data_ptr() + 1000 * large.element_size())
    assert not set(small_range) & set(large_range)
    assert small.tolist() == [0, 1, 2, 3] and large.tolist() == list(range(1000))
    again = arena.place("slot", [torch.arange(3)])
    assert again.data_ptr() == large.data_ptr()


class AddressKeyed(Subject):
    """A translation cache keyed on the address and length of ``out_cache_loc``: a
    realistic mistake, since the engine hands out the same memory again."""

    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        self.rows: dict[tuple[int, int], torch.Tensor] = {}

    def swa_write_location(self, batch, layer_id):
        key = (batch.out_cache_loc.data_ptr(), batch.out_cache_loc.shape[0])
        if key not in self.rows:
            self.rows[key] = self.mapping[batch.out_cache_loc].to(torch.int32)
        return self.rows[key]


def _env() -> dict:
    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def test_an_address_keyed_cache_is_found_and_its_replay_file_diverges_alike_in_a_fresh_process(
        tmp_path, run_pytest_in_subprocess):
    info = SubjectInfo("test_lifecycle:AddressKeyed", AddressKeyed, DIVERGES, kind="user")
    found = fuzz(info, settings="ci", seed=0, max_examples=300)
    assert found.divergence is not None and found.divergence.kind == "wrong_rows"
    replay = Replay(subject=info.name, profile="realistic", scenario=found.scenario,
                    divergence=found.divergence, seed=0, settings="ci")
    path = write_replay(replay, tmp_path)
    # a replay file never imports code: the person names the user subject
    assert run_replay(load_replay(path), subject=info.name).divergence == found.divergence

    fresh = subprocess.run([sys.executable, "-m", "swafuzz", "replay", str(path), "--subject", info.name],
                           capture_output=True, text=True, env=_env(), timeout=120)
    assert fresh.returncode == 1, fresh.stdout + fresh.stderr
    assert found.divergence.sentence in fresh.stdout

    emitted = emit_pytest(replay, tmp_path / "emitted" / "test_emitted.py", source=str(path))
    outcome, outcomes = run_pytest_in_subprocess(emitted, extra_path=TESTS)
    assert outcome.returncode == 1 and list(outcomes.values()) == ["failed"], outcome.stdout + outcome.stderr
