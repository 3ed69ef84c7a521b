"""Specification of the engine model (``swafuzz.reference.engine.EngineState``).

Random, valid sequences of lifecycle events are applied to the model while a mirror kept
here follows only what the model publishes (the forward plans and the mapping tensors) and
what the scenario format promises (request ids count up from 0, a new request takes the
lowest free request slot, the window slides after every forward). After every event the
pool layout must be one a real engine could be in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swafuzz.reference import (
    DUMMY_SLOT, EngineConfig, EngineState, Event, ScenarioError, TruthError, ring_rows, translate_pool,
)

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FAST = settings(max_examples=60, deadline=None)


# ---- the mirror ----------------------------------------------------------------------------


@dataclass
class _Req:
    rid: int
    slot: int
    full: list[int] = field(default_factory=list)  # full slot per position, in position order
    evicted_upto: int = 0

    @property
    def length(self) -> int:
        return len(self.full)

    def live_positions(self) -> range:
        return range(self.evicted_upto, self.length)


@dataclass
class _Mirror:
    config: EngineConfig
    requests: dict[int, _Req] = field(default_factory=dict)
    next_rid: int = 0

    def free_slots(self) -> list[int]:
        used = {r.slot for r in self.requests.values()}
        return [s for s in range(1, self.config.num_req_slots) if s not in used]

    def admit(self, count: int) -> None:
        for _ in range(count):
            slot = min(self.free_slots())
            self.requests[self.next_rid] = _Req(self.next_rid, slot)
            self.next_rid += 1

    def evict(self) -> None:
        window = self.config.sliding_window
        for r in self.requests.values():
            r.evicted_upto = max(r.evicted_upto, r.length - window)


def _tokens_per_request(event: Event, config: EngineConfig) -> list[int]:
    if event.mode in ("extend", "draft_extend"):
        return list(event.tokens)
    if event.mode == "verify":
        return [config.num_draft_tokens] * len(event.requests)
    if event.mode == "draft_block":
        return [config.num_draft_tokens - 1] * len(event.requests)
    return [1] * len(event.requests)


def _expected_chunks(requests: tuple[int, ...], parts: int) -> list[list[int]]:
    size, extra = divmod(len(requests), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(requests[start:end]))
        start = end
    return out


def _follow_plan(mirror: _Mirror, event: Event, plan) -> None:
    """Check a plan's inputs against the mirror and record the tokens it allocated."""
    config = mirror.config
    counts = dict(zip(event.requests, _tokens_per_request(event, config)))
    chunks = _expected_chunks(event.requests, event.micro_batches)
    assert len(plan.steps) == event.steps
    for step in plan.steps:
        assert [list(inputs.request_ids) for inputs in step] == chunks
        for inputs in step:
            n_req = len(inputs.request_ids)
            row = 0
            for i, rid in enumerate(inputs.request_ids):
                request = mirror.requests[rid]
                n = counts[rid]
                assert int(inputs.req_slots[i]) == request.slot
                assert int(inputs.token_counts[i]) == n
                # the cached prefix is what the request held before this step's tokens;
                # SGLang's verify and DSpark draft block seq_lens leave the draft tokens out
                assert int(inputs.prefix_lens[i]) == request.length
                committed = request.length if event.mode in ("verify", "draft_block") else request.length + n
                assert int(inputs.seq_lens[i]) == committed
                for _ in range(n):
                    assert int(inputs.token_slots[row]) == request.slot
                    assert int(inputs.positions[row]) == request.length
                    request.full.append(int(inputs.out_cache_loc[row]))
                    row += 1
            assert inputs.num_live == row
            # padding rows: dummy request slot, position 0, dummy full slot
            assert inputs.token_slots[row:].eq(DUMMY_SLOT).all()
            assert inputs.positions[row:].eq(0).all()
            assert inputs.out_cache_loc[row:].eq(DUMMY_SLOT).all()
            assert inputs.req_slots[n_req:].eq(DUMMY_SLOT).all()
            # padded request rows: one token on no prefix, as the graph runner fills them
            assert inputs.seq_lens[n_req:].eq(1).all() and inputs.prefix_lens[n_req:].eq(0).all()
            assert len(inputs.seq_lens) == len(inputs.prefix_lens) == len(inputs.req_slots)
            for name in ("req_slots", "token_counts", "prefix_lens", "seq_lens", "token_slots", "positions",
                         "out_cache_loc"):
                assert getattr(inputs, name).dtype == torch.int64, name


# ---- the invariants ------------------------------------------------------------------------


def _check_layout(state: EngineState, mirror: _Mirror, *, window_applied: bool) -> None:
    c = mirror.config
    assert sorted(state.requests) == sorted(mirror.requests)
    slots = [r.slot for r in mirror.requests.values()]
    assert len(set(slots)) == len(slots), "two live requests share a request slot"
    assert all(1 <= s < c.num_req_slots for s in slots), "request slot 0 is the dummy"
    for rid, r in mirror.requests.items():
        assert state.requests[rid].slot == r.slot

    # full slots: page 0 reserved, page structure, never shared while a request lives
    all_full = [f for r in mirror.requests.values() for f in r.full]
    assert len(set(all_full)) == len(all_full), "two tokens share a full slot"
    full_pages: dict[int, int] = {}
    for r in mirror.requests.values():
        for position, full in enumerate(r.full):
            assert c.full_page_size <= full < c.full_pool_size, "full page 0 is the dummy"
            assert full % c.full_page_size == position % c.full_page_size
            owner = full_pages.setdefault(full // c.full_page_size, r.rid)
            assert owner == r.rid, "a full page is shared by two requests"

    for model in c.models:
        mapping = state.mappings[model]
        assert mapping.dtype == torch.int64 and mapping.shape == (c.full_pool_size,)
        live = {r.full[p]: (r, p) for r in mirror.requests.values() for p in r.live_positions()}
        # every full slot that is not a live token's maps to the dummy SWA slot
        dead = torch.ones(c.full_pool_size, dtype=torch.bool)
        if live:
            dead[torch.tensor(sorted(live))] = False
        assert mapping[dead].eq(DUMMY_SLOT).all(), f"{model}: a freed or evicted full slot is still mapped"
        assert int(mapping[0]) == DUMMY_SLOT
        swa_slots = [int(mapping[full]) for full in live]
        assert len(set(swa_slots)) == len(swa_slots), f"{model}: two live tokens share an SWA slot"
        swa_pages: dict[int, int] = {}
        for full, (r, position) in live.items():
            swa = int(mapping[full])
            assert c.swa_page_size <= swa < c.swa_pool_size, f"{model}: SWA page 0 is the dummy"
            assert swa % c.swa_page_size == position % c.swa_page_size
            owner = swa_pages.setdefault(swa // c.swa_page_size, r.rid)
            assert owner == r.rid, f"{model}: an SWA page is shared by two requests"
        if live:
            translate_pool(mapping, torch.tensor(sorted(live)))  # every live token has a slot

    if window_applied:
        rows: list[int] = []
        for r in mirror.requests.values():
            positions = list(r.live_positions())
            assert len(positions) <= c.sliding_window
            assert r.evicted_upto == max(0, r.length - c.sliding_window)
            own = ring_rows(
                torch.full((len(positions),), r.slot, dtype=torch.int64),
                torch.tensor(positions, dtype=torch.int64), c.ring, c.num_req_slots,
            ).tolist()
            assert all(r.slot * c.ring <= row < (r.slot + 1) * c.ring for row in own)
            rows += own
        assert len(set(rows)) == len(rows), "two live tokens share a ring row"


# ---- generating valid histories ------------------------------------------------------------


@st.composite
def _configs(draw, paged: bool | None = None, draft_model: bool | None = None, dspark: bool = False):
    start = draw(st.integers(0, 2))
    end = start + draw(st.integers(1, 3))
    speculative = draw(st.booleans())
    if paged is None:
        sizes = st.sampled_from([1, 2, 4])
    elif paged:
        sizes = st.sampled_from([2, 3, 4])
    else:
        sizes = st.just(1)
    full_page, swa_page = draw(sizes), draw(sizes)
    return EngineConfig(
        start_layer=start,
        end_layer=end,
        sliding_window=draw(st.integers(1, 6)),
        speculative=speculative,
        num_draft_tokens=draw(st.integers(1, 3)) if speculative else 1,
        num_req_slots=draw(st.integers(2, 6)),
        full_page_size=full_page,
        swa_page_size=swa_page,
        full_pool_size=full_page * 1024,
        swa_pool_size=swa_page * 96,
        draft_model=draw(st.booleans()) if draft_model is None else draft_model,
    ).validate()
    if dspark:
        config = replace(config, speculative=True, num_draft_tokens=max(2, config.num_draft_tokens),
                         draft_model=True, dspark=True).validate()
    return config


def _draw_forward(data, config: EngineConfig, live: list[int]) -> Event:
    modes = ["idle"] + (["decode", "extend"] if live else [])
    if config.speculative and live:
        modes += ["verify"] + (["draft_block"] if config.dspark else ["draft", "draft_extend"])
    mode = data.draw(st.sampled_from(modes), label="mode")
    if mode == "idle":
        graph = data.draw(st.booleans(), label="graph")
        return Event.from_dict({"op": "forward", "mode": "idle", "graph": graph,
                                "pad": data.draw(st.integers(0, 3), label="pad")}, "idle")
    requests = data.draw(st.permutations(live), label="order").__getitem__(
        slice(0, data.draw(st.integers(1, len(live)), label="n"))
    )
    spec: dict = {"op": "forward", "mode": mode, "requests": list(requests)}
    if mode in ("extend", "draft_extend"):
        spec["tokens"] = data.draw(
            st.lists(st.integers(1, 4), min_size=len(requests), max_size=len(requests)), label="tokens"
        )
    if mode == "draft":
        spec["steps"] = data.draw(st.integers(1, 3), label="steps")
    spec["micro_batches"] = data.draw(st.integers(1, len(requests)), label="micro_batches")
    if mode == "decode" and spec["micro_batches"] == 1:
        spec["graph"] = data.draw(st.booleans(), label="graph")
    return Event.from_dict(spec, "forward")


def _run_history(data, config: EngineConfig, max_events: int = 14) -> None:
    state = EngineState(config)
    mirror = _Mirror(config)
    _check_layout(state, mirror, window_applied=True)
    for index in range(data.draw(st.integers(1, max_events), label="events")):
        live = sorted(mirror.requests)
        ops = ["register_mapping", "clear", "forward"]
        if mirror.free_slots():
            ops.append("admit")
        if live:
            ops += ["finish", "relocate"]
        op = data.draw(st.sampled_from(ops), label="op")
        before = dict(state.mappings)
        version, epoch = state.version, state.mapping_epoch
        where = f"events[{index}]"
        if op == "forward":
            event = _draw_forward(data, config, live)
            plan = state.plan_forward(event, index, where)
            _follow_plan(mirror, event, plan)
            assert state.version > version
            _check_layout(state, mirror, window_applied=False)
            mid, kept = state.version, {model: rows.clone() for model, rows in state.mappings.items()}
            state.finish_forward()
            mirror.evict()
            # an eviction that changes a mapping is counted; one that leaves them alone need not be
            assert state.version > mid or all(torch.equal(kept[m], state.mappings[m]) for m in kept)
            _check_layout(state, mirror, window_applied=True)
        else:
            if op == "admit":
                event = Event(op="admit", count=data.draw(st.integers(1, len(mirror.free_slots()))))
            elif op in ("finish", "relocate"):
                event = Event(op=op, request=data.draw(st.sampled_from(live)))
            elif op == "register_mapping":
                event = Event(op=op, shuffle=data.draw(st.integers(0, 50)))
            else:
                event = Event(op="clear")
            swa_before = {
                m: {f: int(state.mappings[m][f]) for r in mirror.requests.values()
                    for f in (r.full[p] for p in r.live_positions())}
                for m in config.models
            }
            state.apply(event, where)
            if op == "admit":
                mirror.admit(event.count)
            elif op == "finish":
                del mirror.requests[event.request]
            elif op == "clear":
                mirror.requests.clear()
            assert state.version > version
            _check_layout(state, mirror, window_applied=True)
            if op == "relocate":
                moved = mirror.requests[event.request]
                for m in config.models:
                    for p in moved.live_positions():
                        full = moved.full[p]
                        assert int(state.mappings[m][full]) != swa_before[m][full], "relocate kept a page"
                    for r in mirror.requests.values():
                        if r.rid != moved.rid:
                            for p in r.live_positions():
                                assert int(state.mappings[m][r.full[p]]) == swa_before[m][r.full[p]]
        if op == "register_mapping":
            assert state.mapping_epoch == epoch + 1
            for m in config.models:
                assert state.mappings[m] is not before[m], "register_mapping must install a new tensor"
        else:
            assert state.mapping_epoch == epoch
            for m in config.models:
                assert state.mappings[m] is before[m], f"{op} must change the mapping in place"


@FAST
@given(st.data())
def test_random_histories_keep_a_valid_pool_layout(data):
    _run_history(data, data.draw(_configs()))


@FAST
@given(st.data())
def test_random_histories_with_paged_pools_keep_a_valid_pool_layout(data):
    _run_history(data, data.draw(_configs(paged=True)))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_histories_with_a_draft_model_keep_both_pools_valid(data):
    _run_history(data, data.draw(_configs(draft_model=True)))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_histories_with_a_dspark_draft_model_keep_both_pools_valid(data):
    _run_history(data, data.draw(_configs(dspark=True)))


# ---- deterministic specifications ----------------------------------------------------------


def _state(**config) -> EngineState:
    return EngineState(EngineConfig(**config))


def _forward(state: EngineState, index: int = 0, **spec):
    event = Event.from_dict({"op": "forward", **spec}, f"events[{index}]")
    plan = state.plan_forward(event, index, f"events[{index}]")
    state.finish_forward()
    return plan


def test_admit_takes_lowest_free_request_slot_and_ids_count_up():
    state = _state()
    state.apply(Event(op="admit", count=3), "e0")
    state.apply(Event(op="finish", request=1), "e1")
    state.apply(Event(op="admit", count=1), "e2")
    assert {rid: r.slot for rid, r in state.requests.items()} == {0: 1, 2: 3, 3: 2}


def test_first_tokens_never_use_page_0_of_either_pool():
    state = _state(full_page_size=4, swa_page_size=2, full_pool_size=64, swa_pool_size=32)
    state.apply(Event(op="admit", count=1), "e0")
    plan = _forward(state, mode="decode", requests=[0])
    loc = plan.steps[0][0].out_cache_loc
    assert int(loc[0]) >= 4
    assert int(state.mappings["target"][loc[0]]) >= 2


def test_tokens_that_leave_the_window_are_unmapped_after_the_forward():
    state = _state(sliding_window=2)
    state.apply(Event(op="admit", count=1), "e0")
    locs = []
    for i in range(4):
        event = Event.from_dict({"op": "forward", "requests": [0]}, "f")
        plan = state.plan_forward(event, i, "f")
        locs.append(int(plan.steps[0][0].out_cache_loc[0]))
        # during the forward the previous window is still mapped
        assert all(int(state.mappings["target"][loc]) != 0 for loc in locs[-3:])
        state.finish_forward()
    mapping = state.mappings["target"]
    assert [int(mapping[loc]) != 0 for loc in locs] == [False, False, True, True]


def test_an_extend_longer_than_the_window_keeps_only_the_window_after_the_forward():
    state = _state(sliding_window=3)
    state.apply(Event(op="admit", count=1), "e0")
    plan = _forward(state, mode="extend", requests=[0], tokens=[5])
    locs = plan.steps[0][0].out_cache_loc.tolist()
    assert [int(state.mappings["target"][loc]) != 0 for loc in locs] == [False, False, True, True, True]


def test_finish_unmaps_every_token_and_frees_the_request_slot():
    state = _state()
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, mode="extend", requests=[0, 1], tokens=[2, 3])
    state.apply(Event(op="finish", request=0), "e1")
    loc = plan.steps[0][0].out_cache_loc
    mapping = state.mappings["target"]
    assert mapping[loc[:2]].eq(0).all()
    assert mapping[loc[2:]].ne(0).all()
    state.apply(Event(op="admit", count=1), "e2")
    assert state.requests[2].slot == 1


def test_clear_fills_the_same_mapping_tensor_with_zeros():
    state = _state()
    mapping = state.mappings["target"]
    state.apply(Event(op="admit", count=2), "e0")
    _forward(state, requests=[0, 1])
    state.apply(Event(op="clear"), "e1")
    assert state.mappings["target"] is mapping
    assert mapping.eq(0).all()
    assert not state.requests


def test_relocate_changes_the_mapping_in_place_and_register_mapping_replaces_it():
    state = _state(draft_model=True)
    state.apply(Event(op="admit", count=1), "e0")
    plan = _forward(state, requests=[0])
    loc = plan.steps[0][0].out_cache_loc
    target, draft = state.mappings["target"], state.mappings["draft"]
    old = int(target[loc[0]])
    state.apply(Event(op="relocate", request=0), "e1")
    assert state.mappings["target"] is target and state.mappings["draft"] is draft
    assert int(target[loc[0]]) not in (0, old)
    epoch = state.mapping_epoch
    state.apply(Event(op="register_mapping", shuffle=7), "e2")
    assert state.mapping_epoch == epoch + 1
    assert state.mappings["target"] is not target and state.mappings["draft"] is not draft
    assert int(state.mappings["target"][loc[0]]) != 0


def test_draft_forwards_allocate_every_step_and_positions_advance():
    state = _state(speculative=True, num_draft_tokens=3)
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, mode="draft", requests=[0, 1], steps=3)
    assert [inputs[0].positions.tolist() for inputs in plan.steps] == [[0, 0], [1, 1], [2, 2]]
    locs = torch.cat([inputs[0].out_cache_loc for inputs in plan.steps]).tolist()
    assert len(set(locs)) == 6


def test_draft_forwards_use_the_draft_pool_when_there_is_a_draft_model():
    state = _state(speculative=True, num_draft_tokens=2, draft_model=True)
    state.apply(Event(op="admit", count=1), "e0")
    assert _forward(state, mode="draft", requests=[0]).model == "draft"
    assert _forward(state, 1, mode="draft_extend", requests=[0], tokens=[2]).model == "draft"
    assert _forward(state, 2, mode="verify", requests=[0]).model == "target"
    assert _forward(state, 3, mode="decode", requests=[0]).model == "target"


def test_a_dspark_draft_block_writes_one_block_per_request_in_the_draft_pool():
    state = _state(speculative=True, num_draft_tokens=4, draft_model=True, dspark=True)
    state.apply(Event(op="admit", count=2), "e0")
    _forward(state, 1, mode="extend", requests=[0, 1], tokens=[2, 5])
    plan = _forward(state, 2, mode="draft_block", requests=[1, 0])
    (inputs,), = plan.steps
    assert plan.model == "draft"
    # gamma = num_draft_tokens - 1 tokens each, from each request's length on
    assert inputs.positions.tolist() == [5, 6, 7, 2, 3, 4]
    assert inputs.token_counts.tolist() == [3, 3]
    # SGLang's draft forward of the block is a target-verify one: seq_lens leave the block out
    assert inputs.seq_lens.tolist() == inputs.prefix_lens.tolist() == [5, 2]


def test_graph_forwards_pad_to_the_smallest_graph_batch_size():
    state = _state(graph_batch_sizes=(2, 4, 8))
    state.apply(Event(op="admit", count=3), "e0")
    plan = _forward(state, requests=[0, 1, 2], graph=True)
    inputs = plan.steps[0][0]
    assert plan.graph_batch_size == 4
    assert inputs.num_live == 3 and inputs.num_rows == 4
    assert inputs.out_cache_loc[3:].tolist() == [0]
    idle = _forward(state, 1, mode="idle", graph=True, pad=1)
    assert idle.graph_batch_size == 2 and idle.steps[0][0].num_live == 0


def test_idle_forwards_write_only_padding_rows():
    state = _state()
    plan = _forward(state, mode="idle", pad=3)
    inputs = plan.steps[0][0]
    assert inputs.num_live == 0
    assert inputs.out_cache_loc.tolist() == [0, 0, 0]
    assert translate_pool(state.mappings["target"], inputs.out_cache_loc).tolist() == [0, 0, 0]


def test_store_schedule_runs_swa_layers_ascending_with_micro_batches_interleaved():
    state = _state(start_layer=2, end_layer=6, non_swa_layers=(3,))
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, requests=[0, 1], micro_batches=2, skip_layers=[5])
    assert plan.calls == ((0, 2), (1, 2), (0, 4), (1, 4))


def test_store_schedule_follows_an_explicit_interleaving_order():
    state = _state(start_layer=0, end_layer=2)
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, requests=[0, 1], micro_batches=2, order=[0, 0, 1, 1])
    assert plan.calls == ((0, 0), (0, 1), (1, 0), (1, 1))


def test_store_schedule_follows_an_explicit_layer_list():
    state = _state(start_layer=0, end_layer=4)
    state.apply(Event(op="admit", count=1), "e0")
    assert _forward(state, requests=[0], layers=[3, 1, 2]).calls == ((0, 3), (0, 1), (0, 2))


def test_pool_exhaustion_is_a_scenario_error_naming_the_event():
    state = _state(full_pool_size=4, swa_pool_size=4)
    state.apply(Event(op="admit", count=1), "e0")
    event = Event.from_dict({"op": "forward", "mode": "extend", "requests": [0], "tokens": [4]}, "f")
    with pytest.raises(ScenarioError, match=r"events\[3\]: the full KV pool is full"):
        state.plan_forward(event, 3, "events[3]")


@pytest.mark.parametrize(
    "event, message",
    [
        (Event(op="finish", request=5), r"events\[1\]: request 5 is not live \(live requests: \[0\]\)"),
        (Event(op="relocate", request=5), r"events\[1\]: request 5 is not live"),
        (Event(op="admit", count=2), r"events\[1\]: no free request slot"),
    ],
)
def test_events_on_impossible_state_are_scenario_errors_naming_the_event(event, message):
    state = _state(num_req_slots=2)
    state.apply(Event(op="admit", count=1), "events[0]")
    with pytest.raises(ScenarioError, match=message):
        state.apply(event, "events[1]")


def test_speculative_modes_need_speculative_decoding():
    state = _state()
    state.apply(Event(op="admit", count=1), "e0")
    event = Event.from_dict({"op": "forward", "mode": "verify", "requests": [0]}, "f")
    with pytest.raises(ScenarioError, match="events\\[1\\]: a verify forward needs speculative decoding on"):
        state.plan_forward(event, 1, "events[1]")


def test_reference_refuses_a_token_the_engine_did_not_map():
    state = _state()
    with pytest.raises(TruthError):
        translate_pool(state.mappings["target"], torch.tensor([5]))


# ---- allocation order (replay files depend on it: a saved scenario must lay its pools out
# ---- the same way in every version) ------------------------------------------------------


def _swa(state: EngineState, plan, model: str = "target") -> list[int]:
    return [int(state.mappings[model][loc]) for step in plan.steps for inputs in step
            for loc in inputs.out_cache_loc[: inputs.num_live]]


def test_tokens_take_pages_in_the_order_the_forward_lists_requests():
    state = _state()
    state.apply(Event(op="admit", count=2), "e0")
    plan = state.plan_forward(Event.from_dict({"op": "forward", "requests": [1, 0]}, "f"), 1, "f")
    assert plan.steps[0][0].out_cache_loc.tolist() == [1, 2]
    assert _swa(state, plan) == [1, 2]


def test_draft_steps_take_pages_step_by_step_then_request_by_request():
    state = _state(speculative=True, num_draft_tokens=2)
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, mode="draft", requests=[0, 1], steps=2)
    assert [inputs[0].out_cache_loc.tolist() for inputs in plan.steps] == [[1, 2], [3, 4]]


def test_freed_pages_are_reused_lowest_first():
    state = _state(full_page_size=2, swa_page_size=2, full_pool_size=32, swa_pool_size=32)
    state.apply(Event(op="admit", count=3), "e0")
    _forward(state, mode="extend", requests=[0, 1, 2], tokens=[2, 2, 2])  # pages 1, 2, 3 of each pool
    state.apply(Event(op="finish", request=1), "e1")
    state.apply(Event(op="finish", request=0), "e2")
    state.apply(Event(op="admit", count=1), "e3")
    plan = _forward(state, 1, mode="extend", requests=[3], tokens=[5])
    # pages 1 and 2 came back; the next pages are 1, 2, then 4 (above the live request's 3)
    assert plan.steps[0][0].out_cache_loc.tolist() == [2, 3, 4, 5, 8]
    assert _swa(state, plan) == [2, 3, 4, 5, 8]


def test_an_swa_page_returns_only_when_its_last_position_leaves_the_window():
    state = _state(sliding_window=2, swa_page_size=2, swa_pool_size=32, full_pool_size=64)
    state.apply(Event(op="admit", count=1), "e0")
    _forward(state, mode="extend", requests=[0], tokens=[3])  # positions 0-2 on SWA pages 1, 2
    # position 0 left the window, position 1 (on page 1) did not: page 1 is still held
    state.apply(Event(op="admit", count=1), "e1")
    assert _swa(state, _forward(state, 1, requests=[1])) == [3 * 2]
    _forward(state, 2, requests=[0])  # position 3; positions 0 and 1 have left: page 1 is free
    assert _swa(state, _forward(state, 3, mode="extend", requests=[1], tokens=[2])) == [3 * 2 + 1, 1 * 2]


def test_relocate_moves_pages_to_the_highest_free_ones_in_page_order():
    state = _state(swa_page_size=2, swa_pool_size=20, full_pool_size=64, sliding_window=8)
    state.apply(Event(op="admit", count=1), "e0")
    plan = _forward(state, mode="extend", requests=[0], tokens=[4])  # SWA pages 1, 2
    state.apply(Event(op="relocate", request=0), "e1")
    # pages 9 and 8 are the highest of 1..9 free: the first page takes the highest
    assert _swa(state, plan) == [18, 19, 16, 17]
    state.apply(Event(op="relocate", request=0), "e2")
    assert _swa(state, plan) == [14, 15, 12, 13]  # 9 and 8 are still held while moving


def test_register_mapping_lays_pages_out_from_a_seeded_shuffle():
    import random

    state = _state(sliding_window=8, swa_pool_size=12, full_pool_size=64)
    state.apply(Event(op="admit", count=2), "e0")
    plan = _forward(state, mode="extend", requests=[1, 0], tokens=[2, 3])
    state.apply(Event(op="register_mapping", shuffle=5), "e1")
    order = list(range(1, 12))
    random.Random(5).shuffle(order)
    # request by request in admission order, page by page: each takes the last page left
    request_0 = [order.pop() for _ in range(3)]
    request_1 = [order.pop() for _ in range(2)]
    assert _swa(state, plan) == request_1 + request_0


def test_the_first_token_to_find_its_pool_empty_names_that_pool():
    # the full pool lasts two tokens, the SWA pool one: the second token fails on SWA
    state = _state(full_pool_size=3, swa_pool_size=2)
    state.apply(Event(op="admit", count=1), "e0")
    event = Event.from_dict({"op": "forward", "mode": "extend", "requests": [0], "tokens": [3]}, "f")
    with pytest.raises(ScenarioError, match=r"target SWA pool is full \(1 pages in use\)"):
        state.plan_forward(event, 1, "f")
    # both run out at the same token: the full pool is taken first, so it is named
    state = _state(full_pool_size=2, swa_pool_size=2, draft_model=True)
    state.apply(Event(op="admit", count=1), "e0")
    with pytest.raises(ScenarioError, match=r"the full KV pool is full"):
        state.plan_forward(event, 1, "f")


def test_long_requests_keep_every_token_mapped_as_their_page_tables_grow():
    state = _state(sliding_window=512, num_req_slots=40, full_pool_size=8192, swa_pool_size=8192)
    state.apply(Event(op="admit", count=39), "e0")
    locs: dict[int, list[int]] = {rid: [] for rid in range(39)}
    for index in range(3):
        plan = _forward(state, index, mode="extend", requests=list(range(39)), tokens=[50] * 39)
        for row, loc in zip(np.repeat(np.arange(39), 50), plan.steps[0][0].out_cache_loc.tolist()):
            locs[int(row)].append(loc)
    mapping = state.mappings["target"]
    swa = {rid: mapping[torch.tensor(full)].tolist() for rid, full in locs.items()}
    every = [slot for slots in swa.values() for slot in slots]
    assert 0 not in every and len(set(every)) == len(every) == 39 * 150
    state.apply(Event(op="finish", request=7), "e1")
    assert mapping[torch.tensor(locs[7])].eq(0).all()
    assert [mapping[torch.tensor(locs[rid])].tolist() for rid in (6, 8)] == [swa[6], swa[8]]
    state.apply(Event(op="admit", count=1), "e2")
    # request 7's tokens were the 8th of each request's 50 in every forward: its first
    # pages are the lowest free now
    plan = _forward(state, 3, mode="extend", requests=[39], tokens=[3])
    assert plan.steps[0][0].out_cache_loc.tolist() == sorted(locs[7])[:3]


# ---- runs of one forward, planned as a block ----------------------------------------------


def _plan_record(plan) -> tuple:
    steps = tuple(
        tuple((inputs.request_ids, inputs.num_live, *(getattr(inputs, name).tolist() for name in (
            "req_slots", "token_counts", "prefix_lens", "seq_lens", "token_slots", "positions", "out_cache_loc",
        ))) for inputs in step)
        for step in plan.steps
    )
    return plan.index, plan.model, plan.calls, plan.graph_batch_size, steps


def _read(state: EngineState, model: str, inputs, truth: str):
    try:
        return state.expected(model, inputs, truth).tolist()
    except TruthError as exc:
        return str(exc)


def _driven(state: EngineState, events: list, blocks: bool):
    """Drive ``state`` through ``events`` as the executor does, yielding after each change
    what made it: a state event's op, a forward's plan, "mutation", "eviction"; a scenario
    error ends it, yielded as ("error", message). ``blocks``: the planner is shown the
    events ahead."""
    for index, event in enumerate(events):
        where = f"events[{index}]"
        try:
            if event.op != "forward":
                state.apply(event, where)
                yield event.op
                continue
            yield state.plan_forward(event, index, where, events if blocks else ())
            if event.mutation is not None:
                state.apply(event.mutation, f"{where}.mutation")
                yield "mutation"
        except ScenarioError as exc:
            yield "error", str(exc)
            return
        state.finish_forward()
        yield "eviction"


def _observed_run(scenario_events, config: EngineConfig, blocks: bool) -> list:
    """Everything a caller sees, event by event: each plan and the reference's rows for
    it, and the mappings, version and mapping epoch after each event, each plan and each
    forward's eviction; the first scenario error ends it."""
    state = EngineState(config)
    seen: list = []
    for what in _driven(state, list(scenario_events), blocks):
        if isinstance(what, tuple):
            seen.append(what)
            continue
        if not isinstance(what, str):
            plan = what
            what = _plan_record(plan)
            seen.append([_read(state, plan.model, inputs, truth)
                         for truth in ("pool", "ring") for step in plan.steps for inputs in step])
        seen.append((what, state.version, state.mapping_epoch,
                     {model: rows.tolist() for model, rows in state.mappings.items()}))
    return seen


def _drawn_events(data, profile: str) -> tuple[EngineConfig, list]:
    """A drawn scenario's configuration and its events, stuttered (see below)."""
    from swafuzz.strategies.scenarios import scenarios

    scenario = data.draw(scenarios(profile), label="scenario")
    return scenario.config, _stuttered(data, scenario.events)


def _stuttered(data, events) -> list:
    """``events`` with each forward repeated a drawn number of times, as one object or as
    equal copies: runs of every kind of forward."""
    out = []
    for event in events:
        out.append(event)
        if event.op == "forward":
            for _ in range(data.draw(st.integers(0, 3), label="repeats")):
                out.append(event if data.draw(st.booleans(), label="same object") else replace(event))
    return out


@pytest.mark.parametrize("profile", ["realistic", "adversarial"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_runs_planned_as_blocks_give_what_forward_by_forward_planning_gives(profile, data):
    config, events = _drawn_events(data, profile)
    assert _observed_run(events, config, blocks=True) == _observed_run(events, config, blocks=False)


def _decodes(count: int, requests: list[int], **spec) -> list[Event]:
    event = Event.from_dict({"op": "forward", "requests": requests, **spec}, "f")
    return [Event(op="admit", count=len(requests))] + [event] * count


@pytest.mark.parametrize("config, events", [
    # the run reaches the window, then evicts after every forward
    (EngineConfig(sliding_window=5, full_pool_size=64, swa_pool_size=64), _decodes(9, [0, 1])),
    (EngineConfig(sliding_window=6, full_page_size=2, swa_page_size=4, full_pool_size=64, swa_pool_size=64),
     _decodes(9, [0, 1, 2], micro_batches=2)),
    # the pools run out inside the run: the forward that finds one empty says so
    (EngineConfig(sliding_window=64, full_pool_size=12, swa_pool_size=64), _decodes(9, [0, 1])),
    (EngineConfig(sliding_window=64, full_pool_size=64, swa_pool_size=9, draft_model=True, speculative=True,
                  num_draft_tokens=2), _decodes(6, [0, 1], mode="draft", steps=2)),
    (EngineConfig(sliding_window=8, graph_batch_sizes=(4,)), _decodes(5, [0, 1, 2], graph=True)),
    (EngineConfig(sliding_window=16), _decodes(5, [0, 1], mode="extend", tokens=[1, 3])),
    # evictions between the forwards of a run give pages back to pools of two models
    (EngineConfig(sliding_window=3, full_page_size=4, swa_page_size=2, speculative=True, num_draft_tokens=3,
                  draft_model=True, full_pool_size=128, swa_pool_size=64), _decodes(12, [0, 1, 2], mode="draft", steps=2)),
    (EngineConfig(sliding_window=2, speculative=True, num_draft_tokens=3, full_pool_size=128, swa_pool_size=32),
     _decodes(12, [0, 1], mode="verify")),
])
def test_a_run_that_reaches_the_window_or_fills_a_pool_is_planned_as_forward_by_forward(config, events):
    blocked = _observed_run(events, config, blocks=True)
    assert blocked == _observed_run(events, config, blocks=False)
    assert len(blocked) > 4


def test_the_forwards_of_a_run_are_allocated_with_its_first_past_the_window_too():
    state = _state(sliding_window=8, full_pool_size=64, swa_pool_size=64)
    events = _decodes(10, [0, 1])
    state.apply(events[0], "events[0]")
    full, swa = state.full_pages.available, state.swa_pages["target"].available
    state.plan_forward(events[1], 1, "events[1]", events)
    # ten forwards' 2 tokens each are taken at once
    assert full - state.full_pages.available == 20
    # the positions 0 and 1 of each request left the window after the 9th and 10th forward,
    # their SWA pages went back to the pool
    assert swa - state.swa_pages["target"].available == 16
    # yet the mapping holds the first forward's tokens only
    assert int(state.mappings["target"].count_nonzero()) == 2


def test_a_block_cannot_be_left_half_applied():
    state = _state(sliding_window=8)
    events = _decodes(3, [0])
    state.apply(events[0], "events[0]")
    state.plan_forward(events[1], 1, "events[1]", events)
    state.finish_forward()
    with pytest.raises(RuntimeError, match="planned block"):
        state.apply(Event(op="admit", count=1), "events[2]")
    with pytest.raises(RuntimeError, match="planned block"):
        state.plan_forward(events[3], 3, "events[3]", events)


def test_a_forward_of_a_block_that_the_reference_refuses_is_refused_when_it_asks():
    state = _state(sliding_window=8)
    events = _decodes(3, [0, 1])
    state.apply(events[0], "events[0]")
    first = state.plan_forward(events[1], 1, "events[1]", events).steps[0][0]
    unmapped = int(first.out_cache_loc[1])
    state.mappings["target"][unmapped] = DUMMY_SLOT  # a mapping the engine never leaves
    with pytest.raises(TruthError, match=rf"live full slot {unmapped} has no SWA slot"):
        state.expected("target", first, "pool")
    assert state.expected("target", first, "ring").tolist() == [8, 16]
    state.finish_forward()
    second = state.plan_forward(events[2], 2, "events[2]", events).steps[0][0]
    mapping = state.mappings["target"]
    assert state.expected("target", second, "pool").tolist() == mapping[second.out_cache_loc].tolist()
    assert 0 not in mapping[second.out_cache_loc].tolist()


def test_a_run_is_a_block_after_another_request_left_the_window():
    config = EngineConfig(sliding_window=4, full_pool_size=64, swa_pool_size=64)
    long = Event.from_dict({"op": "forward", "mode": "extend", "requests": [0], "tokens": [6]}, "f")
    short = Event.from_dict({"op": "forward", "requests": [1, 2]}, "f")
    events = [Event(op="admit", count=3), long, short, short, short, short, short]
    assert _observed_run(events, config, blocks=True) == _observed_run(events, config, blocks=False)
    state = EngineState(config)
    state.apply(events[0], "events[0]")
    state.plan_forward(long, 1, "events[1]")
    state.finish_forward()
    available = state.full_pages.available
    state.plan_forward(short, 2, "events[2]", events)
    assert available - state.full_pages.available == 10  # five forwards of two tokens


# ---- the rows a copy of the mapping must follow ------------------------------------------


@pytest.mark.parametrize("profile", ["realistic", "adversarial"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_copy_of_the_mapping_kept_in_line_through_the_written_rows_stays_equal_to_it(profile, data):
    config, events = _drawn_events(data, profile)
    state = EngineState(config)
    copies = {model: mapping.clone() for model, mapping in state.mappings.items()}
    for _ in _driven(state, events, blocks=True):
        for model, mapping in state.mappings.items():
            written = state.take_written(model)
            if written is None:
                copies[model] = mapping.clone()
            else:
                copies[model][written] = mapping[written]
            assert torch.equal(copies[model], mapping)


def test_rows_written_past_the_pool_size_since_the_last_look_count_as_any_row():
    state = _state(sliding_window=2, full_pool_size=16, swa_pool_size=16)
    events = _decodes(12, [0])
    state.apply(events[0], "events[0]")
    assert len(state.take_written("target")) == 0
    for index, event in enumerate(events[1:], 1):
        state.plan_forward(event, index, f"events[{index}]", events)
        state.finish_forward()
    # 12 tokens mapped and 10 of them unmapped again: 22 writes to a pool of 16 slots
    assert state.take_written("target") is None
    assert len(state.take_written("target")) == 0
