"""Specification of the reference truth: pool translation, ring size and ring rows.

The reference computes both write-location quantities from live inputs only, returns int32
rows, and refuses (TruthError) whatever does not describe a valid write.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swafuzz.reference import DUMMY_SLOT, INT32_MAX, TruthError, ring_rows, ring_size, translate_pool

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FAST = settings(max_examples=75, deadline=None)


def _mapping(values: dict[int, int], size: int = 16) -> torch.Tensor:
    table = torch.zeros(size, dtype=torch.int64)
    for full, swa in values.items():
        table[full] = swa
    return table


def _loc(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ---- translate_pool ----------------------------------------------------------------------


def test_translate_pool_returns_mapping_of_each_location_as_int32():
    mapping = _mapping({3: 7, 4: 9, 10: 2})
    out = translate_pool(mapping, _loc([4, 3, 10, 3]))
    assert out.dtype == torch.int32
    assert out.tolist() == [9, 7, 2, 7]


def test_translate_pool_translates_dummy_location_0_to_dummy_slot_0():
    mapping = _mapping({1: 5, 2: 6})
    out = translate_pool(mapping, _loc([1, 0, 2, 0]))
    assert out.tolist() == [5, DUMMY_SLOT, 6, DUMMY_SLOT]
    assert DUMMY_SLOT == 0


def test_translate_pool_of_only_padding_is_all_dummy_even_for_an_empty_mapping():
    out = translate_pool(torch.zeros(8, dtype=torch.int64), _loc([0, 0, 0]))
    assert out.dtype == torch.int32
    assert out.tolist() == [0, 0, 0]


def test_translate_pool_of_no_locations_is_an_empty_int32_tensor():
    out = translate_pool(_mapping({1: 1}), torch.empty(0, dtype=torch.int64))
    assert out.dtype == torch.int32
    assert out.shape == (0,)


def test_translate_pool_reads_the_mapping_at_call_time_not_at_an_earlier_call():
    mapping = _mapping({3: 7})
    first = translate_pool(mapping, _loc([3]))
    mapping[3] = 11  # an in-place change, as allocation and relocation do
    second = translate_pool(mapping, _loc([3]))
    assert second.tolist() == [11]
    # the earlier answer is a value, not a view of the mapping
    assert first.tolist() == [7]


def test_translate_pool_result_does_not_alias_its_inputs():
    mapping = _mapping({3: 7})
    loc = _loc([3])
    out = translate_pool(mapping, loc)
    out.fill_(99)
    assert mapping[3].item() == 7
    assert loc.tolist() == [3]


def test_translate_pool_accepts_int32_mapping_and_locations():
    mapping = _mapping({2: 4, 5: 1}).to(torch.int32)
    out = translate_pool(mapping, _loc([5, 2]).to(torch.int32))
    assert out.dtype == torch.int32
    assert out.tolist() == [1, 4]


@pytest.mark.parametrize("bad", [16, 17, 2**40])
def test_translate_pool_rejects_location_past_the_full_pool_naming_it(bad):
    with pytest.raises(TruthError, match=rf"out_cache_loc {bad} is outside the full pool \[0, 16\)"):
        translate_pool(_mapping({1: 1}), _loc([1, bad]))


@pytest.mark.parametrize("bad", [-1, -(2**40)])
def test_translate_pool_rejects_negative_location(bad):
    with pytest.raises(TruthError, match=rf"out_cache_loc {bad} is outside the full pool"):
        translate_pool(_mapping({1: 1}), _loc([bad, 1]))


def test_translate_pool_rejects_live_location_without_swa_slot_naming_the_slot():
    with pytest.raises(TruthError, match=r"live full slot 4 has no SWA slot \(mapping\[4\] == 0\)"):
        translate_pool(_mapping({3: 7}), _loc([3, 4]))


@pytest.mark.parametrize("value", [-2, INT32_MAX + 1, 2**40])
def test_translate_pool_rejects_swa_slot_outside_int32(value):
    with pytest.raises(TruthError, match="int32"):
        translate_pool(_mapping({3: value}), _loc([3]))


def test_translate_pool_accepts_the_largest_int32_swa_slot():
    assert translate_pool(_mapping({3: INT32_MAX}), _loc([3])).tolist() == [INT32_MAX]


def test_translate_pool_never_sends_dummy_location_to_a_real_slot():
    corrupt = _mapping({0: 5, 3: 7})
    try:
        out = translate_pool(corrupt, _loc([3, 0]))
    except TruthError:
        return
    assert out.tolist() == [7, DUMMY_SLOT]


@st.composite
def _pool_and_locations(draw):
    size = draw(st.integers(2, 64))
    mapped = draw(st.dictionaries(st.integers(1, size - 1), st.integers(1, INT32_MAX), max_size=size))
    live = sorted(mapped)
    choices = [0] + live
    locs = draw(st.lists(st.sampled_from(choices), max_size=20))
    return _mapping(mapped, size), mapped, locs


@FAST
@given(_pool_and_locations())
def test_translate_pool_property_equals_elementwise_lookup(case):
    mapping, mapped, locs = case
    out = translate_pool(mapping, _loc(locs))
    assert out.dtype == torch.int32
    assert out.tolist() == [mapped.get(loc, DUMMY_SLOT) for loc in locs]
    # padding rows and only padding rows land on the dummy slot
    assert [value == DUMMY_SLOT for value in out.tolist()] == [loc == 0 for loc in locs]


# ---- ring_size ---------------------------------------------------------------------------


def test_ring_size_is_the_window_without_speculation_whatever_the_draft_tokens():
    assert ring_size(8, False, 1) == 8
    assert ring_size(8, False, 4) == 8


def test_ring_size_adds_draft_tokens_minus_one_under_speculation():
    assert ring_size(8, True, 1) == 8
    assert ring_size(8, True, 3) == 10


@FAST
@given(st.integers(1, 10_000), st.booleans(), st.integers(1, 64))
def test_ring_size_property(window, speculative, draft):
    assert ring_size(window, speculative, draft) == window + (draft - 1 if speculative else 0)


@pytest.mark.parametrize("window", [0, -1])
def test_ring_size_rejects_non_positive_window(window):
    with pytest.raises(TruthError, match="sliding_window must be positive"):
        ring_size(window, False, 1)


@pytest.mark.parametrize("draft", [0, -3])
def test_ring_size_rejects_fewer_than_one_draft_token(draft):
    with pytest.raises(TruthError, match="num_draft_tokens must be >= 1"):
        ring_size(8, True, draft)


# ---- ring_rows ---------------------------------------------------------------------------


def test_ring_rows_is_slot_times_ring_plus_position_mod_ring_as_int32():
    out = ring_rows(_loc([1, 2, 2, 3]), _loc([0, 9, 10, 25]), 10, 4)
    assert out.dtype == torch.int32
    assert out.tolist() == [10, 29, 20, 35]


def test_ring_rows_of_no_tokens_is_an_empty_int32_tensor():
    out = ring_rows(_loc([]), _loc([]), 8, 4)
    assert out.dtype == torch.int32
    assert out.shape == (0,)


def test_ring_rows_uses_int64_arithmetic_for_large_positions_and_slots():
    # slot * ring fits int32 only as the final result; position % ring of a huge position
    ring, slots = 2, 2**30
    out = ring_rows(_loc([slots - 1, 1]), _loc([2**40 + 1, 2**33]), ring, slots)
    assert out.tolist() == [INT32_MAX, 2]


def test_ring_rows_accepts_int32_inputs_without_overflowing():
    ring, slots = 3, 1000
    positions = torch.tensor([INT32_MAX], dtype=torch.int32)
    out = ring_rows(torch.tensor([999], dtype=torch.int32), positions, ring, slots)
    assert out.tolist() == [999 * ring + INT32_MAX % ring]


def test_ring_rows_accepts_the_largest_ring_that_fits_int32():
    assert ring_rows(_loc([1]), _loc([0]), 2**30, 2).tolist() == [2**30]


def test_ring_rows_rejects_slots_times_ring_overflowing_int32():
    with pytest.raises(TruthError, match="overflows int32"):
        ring_rows(_loc([1]), _loc([0]), 2**30 + 1, 2)


def test_ring_rows_rejects_overflow_even_without_tokens():
    with pytest.raises(TruthError, match="overflows int32"):
        ring_rows(_loc([]), _loc([]), 2**31, 2)


@pytest.mark.parametrize("slot", [4, 5, -1])
def test_ring_rows_rejects_request_slot_out_of_range(slot):
    with pytest.raises(TruthError, match=r"request slot outside \[0, 4\)"):
        ring_rows(_loc([1, slot]), _loc([0, 0]), 8, 4)


def test_ring_rows_rejects_mismatched_lengths_saying_both_counts():
    with pytest.raises(TruthError, match="2 request slots for 3 positions"):
        ring_rows(_loc([1, 2]), _loc([0, 1, 2]), 8, 4)


def test_ring_rows_rejects_negative_position():
    with pytest.raises(TruthError, match="negative position"):
        ring_rows(_loc([1]), _loc([-1]), 8, 4)


@pytest.mark.parametrize("ring", [0, -2])
def test_ring_rows_rejects_non_positive_ring(ring):
    with pytest.raises(TruthError, match="ring must be positive"):
        ring_rows(_loc([1]), _loc([0]), ring, 4)


@st.composite
def _ring_case(draw):
    ring = draw(st.integers(1, 4096))
    num_req_slots = draw(st.integers(1, max(1, min(4096, (INT32_MAX + 1) // ring))))
    n = draw(st.integers(0, 16))
    slots = draw(st.lists(st.integers(0, num_req_slots - 1), min_size=n, max_size=n))
    positions = draw(st.lists(st.integers(0, 2**45), min_size=n, max_size=n))
    return ring, num_req_slots, slots, positions


@FAST
@given(_ring_case())
def test_ring_rows_property_rows_in_range_and_exact(case):
    ring, num_req_slots, slots, positions = case
    out = ring_rows(_loc(slots), _loc(positions), ring, num_req_slots)
    assert out.dtype == torch.int32
    rows = out.tolist()
    assert rows == [s * ring + p % ring for s, p in zip(slots, positions)]
    assert all(0 <= row < num_req_slots * ring for row in rows)
    # a row belongs to the ring of its own request slot
    assert [row // ring for row in rows] == slots


@FAST
@given(st.integers(1, 64), st.integers(2, 16), st.integers(0, 10_000))
def test_ring_rows_property_a_window_of_positions_never_collides(ring, num_req_slots, start):
    slots = [s for s in range(num_req_slots) for _ in range(ring)]
    positions = [start + i for _ in range(num_req_slots) for i in range(ring)]
    rows = ring_rows(_loc(slots), _loc(positions), ring, num_req_slots).tolist()
    assert sorted(rows) == list(range(num_req_slots * ring))
