"""Specification of the differential executor (``harness.run_scenario``).

Whatever a subject does, the run comes back as a RunResult: a divergence of its own kind,
with a sentence that says where and what, never a harness crash or a hang.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from swafuzz import SUBJECT_API_VERSION, RunResult, Subject, SubjectError, Truth, run_scenario
from swafuzz.api import CodeNames
from swafuzz.subjects.builtin import PoolStartLayer, Uncached, UncachedRing
from swafuzz.run.diagnosis import Divergence
from swafuzz.run import executor, mappings, progress, store_calls
from swafuzz.run.devices import HostTimeline
from swafuzz.run.executor import check_subject
from swafuzz.errors import CodeFault
from swafuzz.subjects.registry import resolve_subject
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

QUICK = 0.5  # seconds a hanging subject is given


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


_TWO = {"op": "admit", "count": 2}
TWO_FORWARDS = _scenario(
    {"start_layer": 0, "end_layer": 2},
    [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]}],
)
IDLE_PADDING = _scenario(
    {"start_layer": 0, "end_layer": 2},
    [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "mode": "idle", "pad": 2}],
)
GRAPH_PADDING = _scenario(
    {"start_layer": 0, "end_layer": 2, "graph_batch_sizes": [4]},
    [{"op": "admit", "count": 3}, {"op": "forward", "requests": [0, 1, 2], "graph": True}],
)


def _diverges(subject, scenario=TWO_FORWARDS, **kwargs) -> Divergence:
    result = run_scenario(subject, scenario, **kwargs)
    assert isinstance(result, RunResult)
    assert not result.passed
    assert result.divergence is not None
    return result.divergence


class _Correct(Uncached):
    """A correct pool subject the failing subjects below start from."""

    def right(self, batch):
        return super().swa_write_location(batch, 0)


# ---- the subject raises ------------------------------------------------------------------


class _RaisesAtSecondForwardLayer1(_Correct):
    def swa_write_location(self, batch, layer_id):
        if batch.forward_id == 2 and layer_id == 1:
            raise ValueError("boom 42")
        return self.right(batch)


class _FaultAtSecondForwardLayer1(_Correct):
    def swa_write_location(self, batch, layer_id):
        if batch.forward_id == 2 and layer_id == 1:
            raise CodeFault("Pool.store", "pool.py:12", "handed the key store the location None")
        return self.right(batch)


def test_a_code_fault_is_told_as_the_faulty_code_not_as_swa_write_location():
    d = _diverges(_FaultAtSecondForwardLayer1)
    assert d.kind == "raised"
    assert d.sentence == "At forward 2 (decode), layer 1, Pool.store (pool.py:12) handed the key store the location None."


class _NamedStaleCache(PoolStartLayer):
    answered_by = "Pool.store (pool.py:10) handed the key store"


def test_a_subject_that_names_its_code_gets_sentences_about_that_code():
    d = run_scenario(_NamedStaleCache, EXAMPLES["first-swa-layer-not-start"]).divergence
    assert d.sentence == (
        "Stale cache: at forward 2 (decode), layer 1, all live rows that Pool.store (pool.py:10) handed the key store "
        "hold the rows of forward 1 (decode): a cached value was not refreshed for this forward.")


def test_a_raising_subject_is_a_raised_divergence_naming_the_exception():
    d = _diverges(_RaisesAtSecondForwardLayer1)
    assert d.kind == "raised"
    assert d.sentence == "At forward 2 (decode), layer 1, swa_write_location raised ValueError: boom 42."
    assert (d.forward, d.layer_id, d.event, d.mode) == (2, 1, 2, "decode")
    assert "Traceback" in d.detail and "boom 42" in d.detail


class _RaisesInInit(_Correct):
    def __init__(self, spec):
        raise RuntimeError("no pool")


class _RaisesInRegister(_Correct):
    def register_mapping(self, mapping):
        raise KeyError("mapping")


class _RaisesInDraftSetup(_Correct):
    def __init__(self, spec):
        super().__init__(spec)
        if spec.model == "draft":
            raise RuntimeError("no draft pool")


class _RaisesInMetadata(_Correct):
    def init_forward_metadata(self, batch):
        raise IndexError("metadata")


class _RaisesOnReRegister(_Correct):
    def register_mapping(self, mapping):
        if self.mapping is not None:
            raise RuntimeError("registered twice")
        super().register_mapping(mapping)


def test_a_subject_raising_in_init_is_a_divergence_at_setup():
    d = _diverges(_RaisesInInit)
    assert d.kind == "raised"
    assert (d.forward, d.mode, d.model, d.layer_id) == (0, "setup", "target", None)
    assert d.sentence == "At setup of the target model, _RaisesInInit(spec) raised RuntimeError: no pool."


def test_a_subject_raising_in_register_mapping_is_a_divergence_at_setup():
    d = _diverges(_RaisesInRegister)
    assert d.kind == "raised"
    assert d.mode == "setup"
    assert "register_mapping raised KeyError" in d.sentence


def test_a_subject_raising_only_for_the_draft_model_names_the_draft_model():
    scenario = _scenario({"draft_model": True, "speculative": True, "num_draft_tokens": 2}, [_TWO])
    d = _diverges(_RaisesInDraftSetup, scenario)
    assert d.kind == "raised" and d.model == "draft"
    assert d.sentence.startswith("At setup of the draft model,")


def test_a_subject_raising_in_init_forward_metadata_is_a_divergence():
    d = _diverges(_RaisesInMetadata)
    assert d.kind == "raised"
    assert (d.forward, d.layer_id) == (1, None)
    assert "init_forward_metadata raised IndexError" in d.sentence


def test_a_subject_raising_when_a_new_mapping_is_registered_is_a_divergence():
    scenario = _scenario({}, [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "register_mapping", "shuffle": 1}])
    d = _diverges(_RaisesOnReRegister, scenario)
    assert d.kind == "raised"
    assert "register_mapping raised RuntimeError: registered twice" in d.sentence


def test_a_subject_without_swa_write_location_override_is_a_raised_divergence():
    class Bare(Subject):
        truth = Truth.POOL

    d = _diverges(Bare)
    assert d.kind == "raised"
    assert "NotImplementedError" in d.sentence


# ---- the subject hangs -------------------------------------------------------------------


class _Sleeps(_Correct):
    def swa_write_location(self, batch, layer_id):
        time.sleep(30)
        return self.right(batch)


class _Spins(_Correct):
    def swa_write_location(self, batch, layer_id):
        end = time.monotonic() + 30  # bounded, so a broken guard cannot hang the suite
        while time.monotonic() < end:
            pass
        return self.right(batch)


class _SwallowsExceptions(_Correct):
    def swa_write_location(self, batch, layer_id):
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001 - a subject that hides every error
                pass
        return self.right(batch)


class _SleepsInInit(_Correct):
    def __init__(self, spec):
        time.sleep(30)
        super().__init__(spec)


class _SleepsInMetadata(_Correct):
    def init_forward_metadata(self, batch):
        time.sleep(30)


@pytest.mark.parametrize("subject", [_Sleeps, _Spins, _SwallowsExceptions], ids=["sleep", "busy-loop", "catches-Exception"])
def test_a_hanging_subject_is_a_timeout_divergence(subject):
    d = _diverges(subject, timeout_s=QUICK)
    assert d.kind == "timeout"
    assert d.sentence == "At forward 1 (decode), layer 0, swa_write_location did not return within 0.5 s."


def test_a_subject_hanging_in_init_is_a_timeout_at_setup():
    d = _diverges(_SleepsInInit, timeout_s=QUICK)
    assert d.kind == "timeout" and d.mode == "setup"


def test_a_subject_hanging_in_init_forward_metadata_is_a_timeout():
    d = _diverges(_SleepsInMetadata, timeout_s=QUICK)
    assert d.kind == "timeout"
    assert "init_forward_metadata did not return within 0.5 s" in d.sentence


class _SleepsAtSecondForwardLayer1(_Correct):
    def swa_write_location(self, batch, layer_id):
        if batch.forward_id == 2 and layer_id == 1:
            time.sleep(30)
        return self.right(batch)


def test_a_subject_hanging_at_a_later_layer_times_out_at_that_call_with_the_answers_before_it_counted():
    result = run_scenario(_SleepsAtSecondForwardLayer1, TWO_FORWARDS, timeout_s=QUICK)
    d = result.divergence
    assert d.kind == "timeout"
    assert d.sentence == "At forward 2 (decode), layer 1, swa_write_location did not return within 0.5 s."
    # __init__, register_mapping, then per forward a metadata init and two stores
    assert (d.call, result.checks, result.forwards) == (7, 3, 2)


class _SpinsOnSecondMicroBatchLayer1(_Correct):
    def swa_write_location(self, batch, layer_id):
        if batch.micro_batch == 1 and layer_id == 1:
            _Spins.swa_write_location(self, batch, layer_id)
        return self.right(batch)


@pytest.mark.parametrize("subject", [_Sleeps, _Spins, _SwallowsExceptions, _SpinsOnSecondMicroBatchLayer1],
                         ids=["sleep", "busy-loop", "catches-Exception", "one-call"])
def test_a_hang_on_a_micro_batch_thread_is_the_timeout_of_the_call_that_hung(subject):
    result = run_scenario(subject, EXAMPLES["two-batch-overlap"], threads=True, timeout_s=QUICK)
    d = result.divergence
    assert d.kind == "timeout"
    if subject is _SpinsOnSecondMicroBatchLayer1:
        assert (d.micro_batch, d.layer_id) == (1, 1)
    assert d.sentence.endswith(f"layer {d.layer_id}, swa_write_location did not return within 0.5 s."), d.sentence


class _SwallowsTheInterruptAndReturns(_Correct):
    def swa_write_location(self, batch, layer_id):
        try:
            _Spins.swa_write_location(self, batch, layer_id)
        except BaseException:  # noqa: BLE001 - a subject that hides even the interruption
            pass
        return self.right(batch)


class _NeverEnds(_Correct):
    released = threading.Event()  # set when the test is over, so that the thread it left ends

    def swa_write_location(self, batch, layer_id):
        while not self.released.is_set():
            try:
                self.released.wait(0.01)
            except BaseException:  # noqa: BLE001 - a subject that cannot be interrupted
                pass
        return self.right(batch)


@pytest.mark.parametrize("subject", [_SwallowsTheInterruptAndReturns, _NeverEnds], ids=["returns-late", "never-ends"])
def test_a_micro_batch_thread_that_defeats_the_interruption_is_still_a_timeout(subject):
    _NeverEnds.released = released = threading.Event()
    try:
        d = _diverges(subject, EXAMPLES["two-batch-overlap"], threads=True, timeout_s=QUICK)
    finally:
        released.set()
    assert d.kind == "timeout"
    assert d.sentence.endswith(f"layer {d.layer_id}, swa_write_location did not return within 0.5 s."), d.sentence


def test_a_subject_raising_at_a_later_layer_names_that_call_with_the_answers_before_it_counted():
    result = run_scenario(_RaisesAtSecondForwardLayer1, TWO_FORWARDS)
    d = result.divergence
    assert (d.kind, d.forward, d.layer_id) == ("raised", 2, 1)
    assert (d.call, result.checks) == (7, 3)


def test_calls_after_a_judged_store_keep_their_numbers():
    seen = []
    result = run_scenario(PoolStartLayer, EXAMPLES["first-swa-layer-not-start"], keep_going=True,
                          on_store=lambda outcome: seen.append(outcome))
    assert result.checks == len(seen)
    stale = [o for o in seen if o.divergence is not None]
    assert stale and result.divergence == stale[0].divergence
    assert [o.divergence.call for o in stale] == sorted({o.divergence.call for o in stale})


class _CountsCalls(Uncached):
    calls = 0

    def swa_write_location(self, batch, layer_id):
        _CountsCalls.calls += 1
        return super().swa_write_location(batch, layer_id)


def _deep_decodes(graph: bool) -> Scenario:
    forward = {"op": "forward", "requests": [0, 1], **({"graph": True} if graph else {})}
    return Scenario.from_dict({
        "config": {"end_layer": 20, "sliding_window": 8, "num_req_slots": 3, "full_pool_size": 16,
                   "swa_pool_size": 16, "graph_batch_sizes": [2]},
        "events": [{"op": "admit", "count": 2}, forward, forward],
    })


class _Slow(Uncached):
    def swa_write_location(self, batch, layer_id):
        time.sleep(0.01)
        return super().swa_write_location(batch, layer_id)


def test_a_run_reports_its_own_time_and_two_runs_with_one_outcome_compare_equal():
    before = time.monotonic()
    slow = run_scenario(_Slow, TWO_FORWARDS)  # 4 calls of at least 10 ms
    took = time.monotonic() - before
    assert 0.04 <= slow.elapsed_s <= took
    assert run_scenario(Uncached, TWO_FORWARDS) == slow  # the time is no part of the outcome


def test_a_run_whose_deadline_has_passed_does_not_start():
    _CountsCalls.calls = 0
    with pytest.raises(executor.DeadlinePassed) as stopped:
        run_scenario(_CountsCalls, _deep_decodes(graph=False), deadline=time.monotonic() - 1)
    assert (_CountsCalls.calls, stopped.value.checks) == (0, 0)


@pytest.mark.parametrize("graph, checked", [(False, 5), (True, 0)], ids=["eager", "graph warm-up"])
def test_a_deadline_passed_during_a_call_stops_the_run_after_it_with_the_stores_checked_counted(
        graph, checked, monkeypatch):
    # the run's clock jumps past the deadline in the fifth call, so however slowly the machine
    # runs the first four, the deadline passes in that call and no other
    late = []

    def clock():
        return time.monotonic() + (3600.0 if late else 0.0)

    # every module of the run that reads the clock
    for module in (executor, progress, store_calls):
        monkeypatch.setattr(module, "monotonic", clock)

    class OutlastsTheDeadlineAtItsFifthStore(_CountsCalls):
        def swa_write_location(self, batch, layer_id):
            if _CountsCalls.calls == 4:
                late.append(True)
            return super().swa_write_location(batch, layer_id)

    _CountsCalls.calls = 0
    with pytest.raises(executor.DeadlinePassed) as stopped:
        run_scenario(OutlastsTheDeadlineAtItsFifthStore, _deep_decodes(graph), deadline=time.monotonic() + 600)
    # a graph's first replay captures it first: its warm-up calls are checked against the
    # deadline too, though none of them is a checked store
    assert (_CountsCalls.calls, stopped.value.checks) == (5, checked)


def test_the_run_after_a_timeout_is_not_interrupted_by_it():
    assert run_scenario(_Sleeps, TWO_FORWARDS, timeout_s=QUICK).divergence.kind == "timeout"
    end = time.monotonic() + 2 * QUICK
    while time.monotonic() < end:  # a stale alarm would land here
        pass
    assert run_scenario(Uncached, TWO_FORWARDS, timeout_s=QUICK).passed


# ---- the subject returns something that is not an answer ----------------------------------


class _ReturnsList(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch).tolist()


class _ReturnsNaN(_Correct):
    def swa_write_location(self, batch, layer_id):
        out = self.right(batch).to(torch.float32)
        out[0] = float("nan")
        return out


class _ReturnsFloat(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch).to(torch.float32)


class _ReturnsInt64(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch).to(torch.int64)


class _ReturnsShort(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch)[:-1]


class _ReturnsLong(_Correct):
    def swa_write_location(self, batch, layer_id):
        return torch.cat([self.right(batch), torch.zeros(1, dtype=torch.int32)])


class _ReturnsColumn(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch)[:, None]


class _ReturnsMeta(_Correct):
    def swa_write_location(self, batch, layer_id):
        return torch.empty(batch.num_tokens, dtype=torch.int32, device="meta")


def test_a_non_tensor_answer_is_a_non_tensor_divergence():
    d = _diverges(_ReturnsList)
    assert d.kind == "non_tensor"
    assert d.sentence == "At forward 1 (decode), layer 0, swa_write_location returned list, not a tensor."


class _ReturnsSparse(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch).to_sparse()


class _ReturnsNested(_Correct):
    def swa_write_location(self, batch, layer_id):
        return torch.nested.nested_tensor([self.right(batch)])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("subject, layout", [(_ReturnsSparse, "sparse_coo"), (_ReturnsNested, "nested")])
def test_an_answer_that_is_not_a_dense_tensor_is_a_non_tensor_divergence(subject, layout):
    d = _diverges(subject)
    assert d.kind == "non_tensor"
    assert d.sentence == f"At forward 1 (decode), layer 0, swa_write_location returned a {layout} tensor, not a dense one."


def test_a_float_answer_with_nan_is_a_wrong_dtype_divergence_mentioning_nan():
    d = _diverges(_ReturnsNaN)
    assert d.kind == "wrong_dtype"
    assert "NaN" in d.sentence and "torch.float32" in d.sentence


def test_a_float_answer_without_nan_does_not_claim_nan():
    d = _diverges(_ReturnsFloat)
    assert d.kind == "wrong_dtype"
    assert "NaN" not in d.sentence


def test_an_int64_answer_with_right_values_is_a_wrong_dtype_divergence():
    d = _diverges(_ReturnsInt64)
    assert d.kind == "wrong_dtype"
    assert d.sentence == "At forward 1 (decode), layer 0, swa_write_location returned torch.int64, not torch.int32."


@pytest.mark.parametrize("subject", [_ReturnsShort, _ReturnsLong, _ReturnsColumn], ids=["short", "long", "2-d"])
def test_an_answer_of_the_wrong_shape_is_a_wrong_length_divergence(subject):
    d = _diverges(subject)
    assert d.kind == "wrong_length"
    assert "for 2 rows" in d.sentence


def test_an_answer_on_another_device_is_a_wrong_device_divergence():
    d = _diverges(_ReturnsMeta)
    assert d.kind == "wrong_device"
    assert "meta" in d.sentence and "cpu" in d.sentence


class _ReturnsFirstForwardRows(_Correct):
    def swa_write_location(self, batch, layer_id):
        if batch.forward_id == 1:
            self.first = self.right(batch)
        return self.first


def test_a_wrong_length_answer_that_is_an_earlier_forwards_rows_is_explained_as_stale():
    scenario = _scenario({"end_layer": 1}, [
        {"op": "admit", "count": 3}, {"op": "forward", "requests": [0, 1]},
        {"op": "forward", "requests": [0, 1, 2]},
    ])
    d = _diverges(_ReturnsFirstForwardRows, scenario)
    assert d.kind == "wrong_length"
    assert d.source["kind"] == "earlier_forward"
    assert d.sentence.startswith("Stale cache: at forward 2 (decode), layer 0, 2 rows came back for 3")


# ---- padding rows ------------------------------------------------------------------------


class _PadsToUnownedSlot(_Correct):
    def swa_write_location(self, batch, layer_id):
        out = self.right(batch)
        out[batch.num_live_tokens:] = 77
        return out


class _PadsToLiveSlot(_Correct):
    def swa_write_location(self, batch, layer_id):
        out = self.right(batch)
        out[batch.num_live_tokens:] = self.mapping[self.mapping != 0][0].to(torch.int32)
        return out


class _RingPadsToLiveRing(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        out = super().swa_write_location(batch, layer_id).clone()
        out[batch.num_live_tokens:] = self.spec.ring  # row 0 of request slot 1
        return out


def test_correct_padding_rows_on_the_dummy_slot_pass():
    assert run_scenario(Uncached, IDLE_PADDING).passed
    assert run_scenario(Uncached, GRAPH_PADDING).passed
    assert run_scenario(UncachedRing, GRAPH_PADDING).passed


def test_padding_rows_off_the_dummy_slot_are_a_padding_divergence():
    d = _diverges(_PadsToUnownedSlot, IDLE_PADDING)
    assert d.kind == "padding"
    assert d.sentence == "At forward 2 (idle), layer 0, padding row 0 writes to 77, not to the dummy slot."
    assert d.source["kind"] != "aliases_live"
    assert d.actual == [77, 77] and d.expected == [0, 0]


def test_a_padding_row_aliasing_a_live_slot_says_so():
    d = _diverges(_PadsToLiveSlot, IDLE_PADDING)
    assert d.kind == "padding"
    assert d.source["kind"] == "aliases_live"
    assert "which a live request owns" in d.sentence
    assert d.sentence.startswith("At forward 2 (idle), layer 0, padding row 0 writes to ")


def test_a_padding_row_aliasing_a_live_ring_says_so():
    d = _diverges(_RingPadsToLiveRing, IDLE_PADDING)
    assert d.kind == "padding"
    assert d.source["kind"] == "aliases_live"
    assert d.sentence == (
        "At forward 2 (idle), layer 0, padding row 0 writes to 8, which a live request owns, "
        "instead of the dummy slot."
    )


# ---- subjects that write into what they are given ----------------------------------------


class _CountingKeys(dict):
    """A dict subclass: its methods are the subject's code, which naming must not run."""

    reads = 0

    def items(self):
        type(self).reads += 1
        return super().items()


class _Scribbler(Subject):
    """Correct rows computed from private copies; then writes garbage into every input."""

    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        self.slots = {}  # request slot per token, per forward (draft steps do not change it)
        self.rows = {}

    def swa_write_location(self, batch, layer_id):
        if batch.forward_id not in self.slots:
            self.slots[batch.forward_id] = batch.req_pool_indices.repeat_interleave(
                batch.extend_seq_lens, output_size=batch.num_tokens
            )
        key = (batch.forward_id, batch.draft_step)
        if key not in self.rows:
            self.rows[key] = self.compute(batch.out_cache_loc, self.slots[batch.forward_id], batch.positions)
        for tensor in (batch.out_cache_loc, batch.positions, batch.req_pool_indices):
            tensor.fill_(3)
        batch.extend_seq_lens.fill_(1)
        return self.rows[key].clone()

    def compute(self, loc, slots, positions):
        return self.mapping[loc].to(torch.int32)


class _RingScribbler(_Scribbler):
    truth = Truth.RING

    def compute(self, loc, slots, positions):
        return (slots * self.spec.ring + positions % self.spec.ring).to(torch.int32)


_SCRIBBLED = _scenario(
    {"start_layer": 0, "end_layer": 3, "speculative": True, "num_draft_tokens": 2},
    [
        {"op": "admit", "count": 3},
        {"op": "forward", "mode": "extend", "requests": [0, 1, 2], "tokens": [1, 3, 2]},
        {"op": "forward", "requests": [0, 1, 2], "micro_batches": 2},
        {"op": "forward", "mode": "draft", "requests": [0, 2], "steps": 2},
        {"op": "forward", "mode": "idle", "pad": 2},
        {"op": "forward", "requests": [0, 1, 2]},
    ],
)


@pytest.mark.parametrize("subject", [_Scribbler, _RingScribbler], ids=["pool", "ring"])
def test_a_subject_writing_into_its_inputs_is_a_wrote_input_divergence_though_its_rows_are_right(subject):
    d = _diverges(subject, _SCRIBBLED)
    assert d.kind == "wrote_input"
    assert (d.forward, d.mode) == (1, "extend")
    assert d.sentence.startswith("By the end of forward 1 (extend), the subject had written into req_pool_indices (rows 0-1)")


_NAMES = CodeNames({"swa_write_location": "Pool.store (pool.py:10)", "init_forward_metadata": "Backend.init (b.py:3)"},
                   {"req_pool_indices": "batch.req_pool_indices"})


class _NamedSleeps(_Sleeps):
    code_names = _NAMES


class _NamedScribbler(_Scribbler):
    code_names = _NAMES


class _NamedNumpyScribbler(_Correct):
    code_names = _NAMES

    def swa_write_location(self, batch, layer_id):
        rows = self.right(batch)
        batch.req_pool_indices.numpy()[:] = 3  # through numpy: the tensor's version stays
        return rows


class _BadlyNamedSleeps(_Sleeps):
    code_names = CodeNames(_CountingKeys({"swa_write_location": "Pool.store"}), {})


def test_a_subject_that_names_its_code_gets_timeouts_and_writes_told_as_that_code():
    d = _diverges(_NamedSleeps, timeout_s=QUICK)
    assert d.sentence == "At forward 1 (decode), layer 0, Pool.store (pool.py:10) did not return within 0.5 s."
    # its inputs' versions are read after each call: the write is found at the call that made it
    d = _diverges(_NamedScribbler, _SCRIBBLED)
    assert d.sentence.startswith(
        "By forward 1 (extend), layer 0, Pool.store (pool.py:10) had written into batch.req_pool_indices (rows 0-1), "
        "which the engine hands in read-only: ")
    # a write that moves no version is found at the end of the forward, told as every call since
    d = _diverges(_NamedNumpyScribbler, _SCRIBBLED)
    assert d.sentence.startswith(
        "By the end of forward 1 (extend), Backend.init (b.py:3) or Pool.store (pool.py:10) had written into "
        "batch.req_pool_indices (rows 0-1), which the engine hands in read-only: ")


def test_names_that_are_not_a_plain_dict_of_text_are_not_read():
    d = _diverges(_BadlyNamedSleeps, timeout_s=QUICK)
    assert d.sentence == "At forward 1 (decode), layer 0, swa_write_location did not return within 0.5 s."
    assert _CountingKeys.reads == 0


class _ZeroesItsMapping(_Correct):
    """Answers right, and wipes the mapping it was given after forward 1's last layer."""

    def swa_write_location(self, batch, layer_id):
        rows = self.right(batch)
        if batch.forward_id == 1 and layer_id == self.spec.end_layer - 1:
            self.mapping.zero_()
        return rows


def test_a_subject_wiping_its_mapping_is_stopped_before_the_next_sync_could_put_it_back():
    result = run_scenario(_ZeroesItsMapping, TWO_FORWARDS)
    d = result.divergence
    assert d is not None and d.kind == "wrote_input"
    assert d.sentence.startswith("By the eviction after forward 1, the subject had written into the target "
                                 "model's mapping (rows 1-")
    assert result.checks == 2


# ---- which classes are subjects ----------------------------------------------------------


def test_check_subject_accepts_a_subject_class_and_returns_it():
    assert check_subject(Uncached) is Uncached


@pytest.mark.parametrize("thing", [Uncached.__new__(Uncached), lambda spec: None, "uncached", None],
                         ids=["instance", "function", "string", "None"])
def test_check_subject_rejects_non_classes(thing):
    with pytest.raises(SubjectError, match="a subject is a class, got"):
        check_subject(thing)


def test_check_subject_rejects_a_class_without_truth():
    class NoTruth(Subject):
        def swa_write_location(self, batch, layer_id):
            return None

    with pytest.raises(SubjectError, match=r"NoTruth\.truth must be Truth\.POOL or Truth\.RING, got None"):
        check_subject(NoTruth)


def test_check_subject_rejects_a_truth_that_is_not_a_truth_member():
    class StringTruth(Uncached):
        truth = "pool"

    with pytest.raises(SubjectError, match=r"StringTruth\.truth must be Truth\.POOL or Truth\.RING, got 'pool'"):
        check_subject(StringTruth)


def test_check_subject_rejects_a_class_without_swa_write_location():
    class Duck:
        truth = Truth.POOL
        api_version = SUBJECT_API_VERSION

    with pytest.raises(SubjectError, match="Duck has no swa_write_location method"):
        check_subject(Duck)


def test_run_scenario_refuses_a_non_subject_before_running():
    with pytest.raises(SubjectError):
        run_scenario("uncached", TWO_FORWARDS)


# ---- what a run counts -------------------------------------------------------------------


_COUNTED = _scenario(
    {"start_layer": 0, "end_layer": 3, "non_swa_layers": [1], "speculative": True, "num_draft_tokens": 2},
    [
        {"op": "admit", "count": 4},
        {"op": "forward", "requests": [0, 1]},  # 2 stores
        {"op": "forward", "mode": "draft", "requests": [0, 1, 2, 3], "steps": 2, "micro_batches": 2},  # 8
        {"op": "finish", "request": 3},
        {"op": "forward", "requests": [0, 1, 2], "graph": True},  # 2
        {"op": "forward", "mode": "idle", "pad": 1},  # 2
        {"op": "forward", "mode": "verify", "requests": [2], "layers": [2, 0, 2]},  # 3
    ],
)


@pytest.mark.parametrize("subject", [Uncached, UncachedRing])
def test_a_passing_run_counts_every_store_check_and_every_forward(subject):
    result = run_scenario(subject, _COUNTED)
    assert result.passed
    assert (result.checks, result.forwards) == (17, 5)


def test_a_diverging_run_counts_up_to_and_including_the_diverging_check():
    result = run_scenario(PoolStartLayer, EXAMPLES["first-swa-layer-not-start"])
    assert (result.checks, result.forwards) == (3, 2)


def test_a_run_diverging_at_setup_counts_nothing():
    result = run_scenario(_RaisesInInit, TWO_FORWARDS)
    assert (result.checks, result.forwards) == (0, 0)


def test_a_scenario_without_forwards_passes_with_no_checks():
    result = run_scenario(Uncached, _scenario({}, [_TWO, {"op": "finish", "request": 0}]))
    assert result.passed and (result.checks, result.forwards) == (0, 0)


# ---- what a diagnosis says ---------------------------------------------------------------


class _RingStaleAtStep1(UncachedRing):
    """Returns draft step 0's rows for micro-batch 1 at draft step 1, layer 1."""

    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        if batch.draft_step == 0:
            batch.backend.step0 = rows
        if (batch.draft_step, batch.micro_batch, layer_id) == (1, 1, 1):
            return batch.backend.step0
        return rows


def test_a_diagnosis_fills_every_field():
    scenario = _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 2},
        [{"op": "admit", "count": 4},
         {"op": "forward", "mode": "draft", "requests": [0, 1, 2, 3], "steps": 2, "micro_batches": 2}],
    )
    d = _diverges(_RingStaleAtStep1, scenario)
    ring = 9  # window 8 + 2 draft tokens - 1; requests 2 and 3 own request slots 3 and 4
    assert d.kind == "wrong_rows"
    assert (d.forward, d.event, d.mode, d.model) == (1, 1, "draft", "target")
    assert (d.draft_step, d.micro_batch, d.layer_id) == (1, 1, 1)
    assert d.expected == [3 * ring + 1, 4 * ring + 1]
    assert d.actual == [3 * ring + 0, 4 * ring + 0]
    assert d.source["kind"] == "earlier_step"
    assert (d.source["forward"], d.source["draft_step"], d.source["micro_batch"]) == (1, 0, 1)
    assert d.stale
    assert d.sentence == (
        "Stale cache: at forward 1 (draft), micro-batch 1, draft step 1, layer 1, all live rows "
        "hold the rows of draft step 0: the cache was not refreshed between draft steps."
    )


def test_a_diagnosis_counts_the_diverging_call_from_zero():
    scenario = _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 2},
        [{"op": "admit", "count": 4},
         {"op": "forward", "mode": "draft", "requests": [0, 1, 2, 3], "steps": 2, "micro_batches": 2}],
    )
    # before it: __init__, register_mapping, 2 metadata inits and 7 stores
    assert _diverges(_RingStaleAtStep1, scenario).call == 11


def test_consecutive_subject_calls_have_consecutive_call_numbers():
    # whichever base the executor uses, the first call and the next differ by one
    first = _diverges(_RaisesInInit).call
    second = _diverges(_RaisesInRegister).call
    assert second == first + 1


def test_a_divergence_survives_its_dict_form():
    d = _diverges(PoolStartLayer, EXAMPLES["two-batch-overlap"])
    assert Divergence.from_dict(d.to_dict()) == d


class _OffByOne(_Correct):
    def swa_write_location(self, batch, layer_id):
        return self.right(batch) + 1000


def test_rows_no_candidate_explains_are_wrong_rows_of_unknown_source():
    d = _diverges(_OffByOne)
    assert d.kind == "wrong_rows"
    assert d.source["kind"] == "unknown"
    assert not d.stale
    assert d.sentence.startswith("At forward 1 (decode), layer 0, all live rows are wrong")


# ---- graphs ------------------------------------------------------------------------------


class _SyncsInCapture(_Correct):
    def swa_write_location(self, batch, layer_id):
        if int(batch.out_cache_loc.max().item()) < 0:
            raise AssertionError("unreachable")
        return self.right(batch)


def test_a_host_sync_inside_graph_capture_is_a_capture_divergence():
    d = _diverges(_SyncsInCapture, EXAMPLES["graph-replay"])
    assert d.kind == "capture"
    assert "graph capture" in d.sentence


def test_the_same_host_sync_outside_a_graph_passes():
    assert run_scenario(_SyncsInCapture, TWO_FORWARDS).passed


class _ShrinksWhatItsGraphReads(_Correct):
    """Translates through its own copy of the mapping, and empties the copy before a
    replay: the replayed lookup runs out of bounds."""

    def init_capture_metadata(self, batch):
        self.table = self.mapping.clone()

    def swa_write_location(self, batch, layer_id):
        return self.table[batch.out_cache_loc].to(torch.int32)

    def init_replay_metadata(self, batch):
        self.table.resize_(0)


def test_a_replay_that_raises_is_told_as_the_replay_of_the_captured_code():
    d = _diverges(_ShrinksWhatItsGraphReads, EXAMPLES["graph-replay"])
    assert d.kind == "raised"
    assert "the graph replay of init_graph_metadata and swa_write_location raised IndexError" in d.sentence, \
        d.sentence


# ---- in-forward mutations ----------------------------------------------------------------


class _SeesFirstLocs(_Correct):
    """Records, at every store, what the forward-1 locations of request 0 translate to."""

    seen: list[int] = []

    def swa_write_location(self, batch, layer_id):
        if batch.forward_id == 1 and layer_id == 0:
            self.first = batch.out_cache_loc[:1].clone()
        type(self).seen.append(int(self.mapping[self.first]))
        return self.right(batch)


def test_a_mutation_changes_the_mapping_from_the_next_store_on():
    scenario = _scenario({"start_layer": 0, "end_layer": 2}, [
        _TWO,
        {"op": "forward", "requests": [0, 1], "mutation": {"after_calls": 1, "op": "relocate", "request": 0}},
        {"op": "forward", "requests": [0, 1]},
    ])
    _SeesFirstLocs.seen = []
    assert run_scenario(_SeesFirstLocs, scenario).passed
    seen = _SeesFirstLocs.seen
    assert seen[0] != seen[1] and seen[1:] == [seen[1]] * 3


def test_a_mutation_after_the_last_store_still_happens():
    scenario = _scenario({"start_layer": 0, "end_layer": 2}, [
        _TWO,
        {"op": "forward", "requests": [0, 1], "mutation": {"after_calls": 2, "op": "relocate", "request": 0}},
        {"op": "forward", "requests": [0, 1]},
    ])
    _SeesFirstLocs.seen = []
    assert run_scenario(_SeesFirstLocs, scenario).passed
    seen = _SeesFirstLocs.seen
    assert seen[0] == seen[1] and seen[2] != seen[1]


class _OneBufferRightOnlyAtTheLastLayer(_Correct):
    """Returns the same tensor at every layer, wrong at layer 0 and put right at layer 1."""

    def swa_write_location(self, batch, layer_id):
        rows = self.right(batch)
        if getattr(self, "buffer", None) is None or self.buffer.shape != rows.shape:
            self.buffer = torch.empty_like(rows)
        self.buffer.copy_(rows + 1 if layer_id == 0 else rows)
        return self.buffer


def test_an_answer_is_checked_when_it_returns_not_after_the_subject_rewrote_its_buffer():
    d = _diverges(_OneBufferRightOnlyAtTheLastLayer)
    assert (d.forward, d.layer_id, d.kind) == (1, 0, "wrong_rows")


# ---- answers checked once the device settles -------------------------------------------


class _WrongAtSecondForwardLayer0(_Correct):
    def swa_write_location(self, batch, layer_id):
        rows = self.right(batch)
        return rows + 1 if batch.forward_id == 2 and layer_id == 0 else rows


class _SettledAfterTheCalls(HostTimeline):
    """The host timeline, answers checked after each step's calls, as on a GPU."""

    deferred = True


def test_an_answer_checked_after_the_device_settles_names_its_own_call(monkeypatch):
    immediate = _diverges(_WrongAtSecondForwardLayer0)
    monkeypatch.setattr(executor, "timeline_for", lambda device, delay_cycles=0: _SettledAfterTheCalls(device))
    settled = _diverges(_WrongAtSecondForwardLayer0)
    assert settled.layer_id == immediate.layer_id == 0
    assert settled.call == immediate.call
    assert settled.sentence == immediate.sentence


# ---- runs of one forward, planned as a block ----------------------------------------------


class _StaleAtFifth(Uncached):
    """Right, except that the fifth forward's layers get the fourth's rows."""

    def init_forward_metadata(self, batch):
        batch.backend.previous = getattr(batch.backend, "rows", None)
        batch.backend.rows = self.mapping[batch.out_cache_loc].to(torch.int32)

    def swa_write_location(self, batch, layer_id):
        stale = batch.forward_id == 5 and batch.backend.previous is not None
        return (batch.backend.previous if stale else batch.backend.rows).clone()


def _decode_run(graph: bool = False, micro_batches: int = 1) -> Scenario:
    forward = {"op": "forward", "requests": [0, 1, 2], "micro_batches": micro_batches,
               **({"graph": True} if graph else {})}
    return _scenario(
        {"start_layer": 0, "end_layer": 3, "sliding_window": 6, "graph_batch_sizes": [4]},
        [{"op": "admit", "count": 3}] + [forward] * 12,
    )


def _everything_seen(subject, scenario: Scenario) -> tuple:
    stores = []
    result = run_scenario(subject, scenario, keep_going=True, on_store=stores.append)
    return result, stores


@pytest.mark.parametrize("subject", [Uncached, UncachedRing, PoolStartLayer, _StaleAtFifth, *(
    resolve_subject(name).subject for name in ("step-keyed", "unified-metadata", "swa-out-shape-guard", "unified-graph-assign")
)])
@pytest.mark.parametrize("scenario", [_decode_run(), _decode_run(graph=True), _decode_run(micro_batches=2)])
def test_a_run_planned_as_blocks_is_checked_and_diagnosed_as_forward_by_forward(subject, scenario, monkeypatch):
    blocked = _everything_seen(subject, scenario)
    monkeypatch.setattr("swafuzz.reference.planning._MAX_BLOCK", 1)
    assert blocked == _everything_seen(subject, scenario)
    assert blocked[0].forwards == 12


def test_a_divergence_inside_a_block_stops_the_run_where_forward_by_forward_planning_does(monkeypatch):
    blocked = run_scenario(_StaleAtFifth, _decode_run())
    assert blocked.divergence.forward == 5 and "the rows of forward 4" in blocked.divergence.sentence
    monkeypatch.setattr("swafuzz.reference.planning._MAX_BLOCK", 1)
    assert blocked == run_scenario(_StaleAtFifth, _decode_run())


@pytest.mark.parametrize("subject", ["uncached", "step-keyed-capture"])
@pytest.mark.parametrize("profile", ["realistic", "adversarial"])
def test_mapping_rows_synced_one_by_one_keep_a_correct_subject_right(subject, profile, monkeypatch):
    # step-keyed-capture keys its cache on the mapping's in-place version: a row written
    # without moving it would show as a stale answer
    from swafuzz.search.fuzz import fuzz

    monkeypatch.setattr(mappings, "ROWS_COPIED_WHOLE_BELOW", 0)
    result = fuzz(resolve_subject(subject), profile=profile, settings="ci", seed=3, max_examples=40)
    assert result.divergence is None, result.divergence.sentence
    assert result.checks > 0


@pytest.mark.parametrize("rows_copied_whole_below", [0, mappings.ROWS_COPIED_WHOLE_BELOW])
@pytest.mark.parametrize("profile", ["realistic", "adversarial"])
def test_the_diagnosis_copy_of_every_mapping_equals_the_engine_state_after_each_sync(
        profile, rows_copied_whole_below, monkeypatch):
    # the diagnosis rebuilds earlier mappings from this copy and the changes kept: a copy
    # that missed a write would name the wrong source for a stale value; a sync that waits
    # for the next one leaves the copy as the subject holds it
    from hypothesis import given, settings
    from swafuzz.strategies.scenarios import scenarios

    monkeypatch.setattr(mappings, "ROWS_COPIED_WHOLE_BELOW", rows_copied_whole_below)
    sync, syncs = mappings.MappingSync.sync, []

    def checked_sync(run, what, until_called=False):
        sync(run, what, until_called)
        syncs.append(what)
        for model, truth in run.state.mappings.items():
            assert torch.equal(run.history.mappings[model], run.mappings[model]), f"{model} after the sync for {what}"
            if not until_called:
                assert torch.equal(run.history.mappings[model], truth), f"{model} after the sync for {what}"

    monkeypatch.setattr(mappings.MappingSync, "sync", checked_sync)

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(scenarios(profile))
    def every_sync_keeps_the_copy(scenario):
        run_scenario(Uncached, scenario)

    every_sync_keeps_the_copy()
    assert len(syncs) > 40
