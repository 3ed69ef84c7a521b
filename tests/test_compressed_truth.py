"""Specification of the compressed-KV truths: the per-step values beside the SWA write location.

Each rule is pinned twice: on a small batch worked by hand, and as a property over generated
rows that a formula off by one position, one ratio or one padding rule fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swafuzz.reference import (
    TruthError,
    c128_page_indices,
    compress_state_ring_size,
    compress_state_slots,
    compressed_lengths,
    compressed_out_loc,
    compressed_positions,
    compression_metadata,
    low_ratio_out_loc,
    page_table,
    sparse_topk_lengths,
    swa_page_indices,
    swa_topk_lengths,
    unified_compressed_out_loc,
)

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FAST = settings(max_examples=75, deadline=None)


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


positions_st = st.lists(st.integers(0, 5000), min_size=1, max_size=24)


# ---- compressed write locations ------------------------------------------------------------


def test_a_row_writes_its_compressed_entry_only_when_it_completes_a_group():
    # lengths 4, 5, 8, 128: the 4th and 8th tokens complete a C4 group, the 128th a C128 one
    positions, loc = _t([3, 4, 7, 127]), _t([100, 101, 1003, 2048])
    assert compressed_out_loc(positions, loc, 4).tolist() == [25, 0, 250, 512]
    assert compressed_out_loc(positions, loc, 128).tolist() == [0, 0, 0, 16]
    assert compressed_out_loc(positions, loc, 4).dtype == torch.int64


def test_a_graph_padding_row_writes_the_dummy_slot():
    # a CUDA graph bucket pads with sequence length 1 (position 0) and location 0
    assert compressed_out_loc(_t([0]), _t([0]), 4).tolist() == [0]
    assert compressed_out_loc(_t([0]), _t([0]), 128).tolist() == [0]
    assert low_ratio_out_loc(_t([0]), _t([0]), 2).tolist() == [-1]


def test_only_write_rows_have_a_write_location():
    # metadata padded past the write rows (context parallelism): two rows, one write
    assert compressed_out_loc(_t([3, 7]), _t([40]), 4).tolist() == [10]
    with pytest.raises(TruthError):
        compressed_out_loc(_t([3]), _t([40, 44]), 4)


@given(positions_st, st.sampled_from([4, 128]), st.data())
@FAST
def test_compressed_out_loc_is_loc_over_ratio_exactly_at_group_ends(positions, ratio, data):
    loc = data.draw(st.lists(st.integers(1, 10**9), min_size=len(positions), max_size=len(positions)))
    got = compressed_out_loc(_t(positions), _t(loc), ratio).tolist()
    for p, location, value in zip(positions, loc, got):
        assert value == (location // ratio if (p + 1) % ratio == 0 else 0)


def test_low_ratio_locations_write_every_token_or_every_second_one_else_minus_one():
    positions, loc = _t([0, 1, 2, 5]), _t([10, 11, 13, 17])
    assert low_ratio_out_loc(positions, loc, 1).tolist() == [10, 11, 13, 17]
    assert low_ratio_out_loc(positions, loc, 2).tolist() == [-1, 5, -1, 8]


def test_unified_locations_offset_every_row_by_the_swa_region_dummy_rows_too():
    positions, loc = _t([3, 4]), _t([100, 101])
    assert unified_compressed_out_loc(positions, loc, 4, 1000).tolist() == [1025, 1000]
    with pytest.raises(TruthError):
        unified_compressed_out_loc(positions, loc, 4, -1)


def test_an_unknown_ratio_is_refused():
    with pytest.raises(TruthError):
        compressed_out_loc(_t([3]), _t([4]), 8)
    with pytest.raises(TruthError):
        low_ratio_out_loc(_t([3]), _t([4]), 4)


# ---- positions and lengths -----------------------------------------------------------------


def test_compressed_positions_round_down_to_the_group_start():
    assert compressed_positions(_t([0, 3, 4, 130, 255]), 4).tolist() == [0, 0, 4, 128, 252]
    assert compressed_positions(_t([0, 127, 128, 300]), 128).tolist() == [0, 0, 128, 256]
    assert compressed_positions(_t([5]), 4).dtype == torch.int32


def test_compressed_lengths_count_whole_groups_and_the_clamp_reads_at_least_one():
    lengths = compressed_lengths(_t([0, 2, 3, 7, 126, 127]), 4)
    assert lengths.raw.tolist() == [0, 0, 1, 2, 31, 32]
    assert lengths.clamp1.tolist() == [1, 1, 1, 2, 31, 32]
    assert compressed_lengths(_t([126, 127, 0]), 128).raw.tolist() == [0, 1, 0]
    assert compressed_lengths(_t([126, 127, 0]), 128).clamp1.tolist() == [1, 1, 1]


def test_sparse_topk_lengths_are_capped_by_the_index_topk():
    # lengths 4, 2048, 4096 at ratio 4: 1, 512, 1024 entries; the indexer keeps 512 at most
    assert sparse_topk_lengths(_t([3, 2047, 4095]), 512).tolist() == [1, 512, 512]
    assert sparse_topk_lengths(_t([0]), 512).tolist() == [1]
    with pytest.raises(TruthError):
        sparse_topk_lengths(_t([3]), 512, ratio=128)


@given(positions_st, st.sampled_from([1, 2, 4, 128]))
@FAST
def test_lengths_properties(positions, ratio):
    lengths = compressed_lengths(_t(positions), ratio)
    for p, raw, clamp1 in zip(positions, lengths.raw.tolist(), lengths.clamp1.tolist()):
        assert raw * ratio <= p + 1 < (raw + 1) * ratio
        assert clamp1 == max(raw, 1)
    if ratio in (4, 128):
        for p, start in zip(positions, compressed_positions(_t(positions), ratio).tolist()):
            assert start % ratio == 0 and start <= p < start + ratio


def test_swa_topk_lengths_are_the_causal_length_up_to_the_window():
    assert swa_topk_lengths(_t([0, 126, 127, 128, 5000])).tolist() == [1, 127, 128, 128, 128]


# ---- page and index tables -----------------------------------------------------------------


def _req_to_token(slots: int, columns: int) -> torch.Tensor:
    # request r's token j sits at full slot 1000 * (r + 1) + j: its page is readable by eye
    return (torch.arange(columns).unsqueeze(0) + 1000 * (torch.arange(slots).unsqueeze(1) + 1)).int()


def test_page_table_reads_each_page_first_slot_over_the_page_size():
    table = torch.zeros(2, 1024, dtype=torch.int32)
    table[1, 0], table[1, 256], table[1, 512] = 2560, 512, 7680  # pages 10, 2, 30
    got = page_table(table, _t([1, 0]), max_seq_len=600, page_size=256)
    assert got.tolist() == [[10, 2, 30], [0, 0, 0]]
    assert got.dtype == torch.int32
    with pytest.raises(TruthError):
        page_table(table, _t([2]), max_seq_len=600, page_size=256)


def test_c128_page_indices_list_each_readable_entry_then_minus_one():
    # page size 256: two ratio-128 entries per page; pages 10 and 30
    pages = torch.tensor([[10, 30], [10, 30]], dtype=torch.int32)
    got = c128_page_indices(pages, _t([127, 511]), page_size=256)
    assert got.shape == (2, 64)  # 4 columns, padded to a multiple of 64
    assert got[0, :4].tolist() == [20, -1, -1, -1]  # length 128: one entry
    assert got[1, :4].tolist() == [20, 21, 60, 61]  # length 512: four entries over two pages
    assert (got[:, 4:] == -1).all()
    with pytest.raises(TruthError):
        c128_page_indices(pages, _t([127, 511]), page_size=192)


@given(st.lists(st.integers(0, 1023), min_size=1, max_size=8), st.sampled_from([128, 256, 512]))
@FAST
def test_c128_page_indices_properties(positions, page_size):
    per_page = page_size // 128
    pages = torch.randint(0, 1000, (len(positions), -(-1024 // page_size)), dtype=torch.int32)
    got = c128_page_indices(pages, _t(positions), page_size)
    assert got.shape[1] % 64 == 0
    for row, p in enumerate(positions):
        readable = (p + 1) // 128
        for j in range(got.shape[1]):
            want = int(pages[row, j // per_page]) * per_page + j % per_page if j < readable else -1
            assert int(got[row, j]) == want


def test_swa_page_indices_read_the_window_newest_first_through_the_mapping():
    table = _req_to_token(2, 300)
    mapping = torch.zeros(3000, dtype=torch.int64)
    mapping[1000:1300] = torch.arange(1000, 1300) * 2  # request 0's tokens
    mapping[2000:2300] = torch.arange(2000, 2300) * 3  # request 1's tokens
    got = swa_page_indices(table, mapping, _t([0, 1]), _t([2, 200]))
    assert got.shape == (2, 128) and got.dtype == torch.int32
    assert got[0, :4].tolist() == [2004, 2002, 2000, -1]  # positions 2, 1, 0, then nothing
    assert (got[0, 3:] == -1).all()
    assert got[1, 0] == 2200 * 3 and got[1, 127] == 2073 * 3  # positions 200 down to 73


def test_swa_page_indices_read_the_mapping_as_it_is_now():
    table = _req_to_token(1, 10)
    mapping = torch.arange(2000, dtype=torch.int64)
    before = swa_page_indices(table, mapping, _t([0]), _t([1]))
    mapping[1001] = 7
    after = swa_page_indices(table, mapping, _t([0]), _t([1]))
    assert before[0, :2].tolist() == [1001, 1000] and after[0, :2].tolist() == [7, 1000]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 299)), min_size=1, max_size=6))
@FAST
def test_swa_page_indices_properties(rows):
    table = _req_to_token(4, 300)
    mapping = torch.arange(5000, dtype=torch.int64) + 7
    slots, positions = _t([r for r, _ in rows]), _t([p for _, p in rows])
    got = swa_page_indices(table, mapping, slots, positions)
    lengths = swa_topk_lengths(positions)
    for row, (r, p) in enumerate(rows):
        valid = got[row] != -1
        assert int(valid.sum()) == int(lengths[row]) == min(p + 1, 128)
        assert valid[: int(lengths[row])].all()  # the readable entries come first
        for j in range(int(lengths[row])):
            assert int(got[row, j]) == 1000 * (r + 1) + (p - j) + 7


# ---- compress-state ring -------------------------------------------------------------------


def test_compress_state_ring_sizes_follow_ratio_and_speculation():
    assert [compress_state_ring_size(4), compress_state_ring_size(4, 3)] == [8, 16]
    assert [compress_state_ring_size(128), compress_state_ring_size(128, 3)] == [128, 256]
    assert compress_state_ring_size(128, online_c128=True) == 1
    assert [compress_state_ring_size(2), compress_state_ring_size(2, 3), compress_state_ring_size(2, 4)] == [2, 8, 8]
    assert compress_state_ring_size(2, 6) == 8 and compress_state_ring_size(2, 7) == 16
    with pytest.raises(TruthError):
        compress_state_ring_size(1)


def test_compress_state_slots_wrap_each_request_ring_and_a_negative_position_has_none():
    got = compress_state_slots(_t([0, 2, 2, 1]), _t([5, 8, 17, -1]), ring=8)
    assert got.tolist() == [5, 16, 17, -1]


@given(st.lists(st.tuples(st.integers(0, 31), st.integers(0, 10**6)), min_size=1, max_size=16),
       st.sampled_from([2, 8, 16, 128, 256]))
@FAST
def test_compress_state_slots_stay_in_their_request_ring(rows, ring):
    got = compress_state_slots(_t([r for r, _ in rows]), _t([p for _, p in rows]), ring).tolist()
    for (r, p), slot in zip(rows, got):
        assert r * ring <= slot < (r + 1) * ring and slot % ring == p % ring


# ---- the kernel's values together ----------------------------------------------------------


def test_compression_metadata_gathers_every_kernel_output():
    pages = torch.tensor([[3, 4]], dtype=torch.int32)
    values = compression_metadata(_t([255]), _t([1024]), pages, page_size=256)
    assert values.c4_out_loc.tolist() == [256] and values.c128_out_loc.tolist() == [8]
    assert values.c4_positions.tolist() == [252] and values.c128_positions.tolist() == [128]
    assert values.c4_lengths_raw.tolist() == [64] and values.c128_lengths_clamp1.tolist() == [2]
    assert values.c128_page_indices.tolist() == [[6, 7, -1, -1]]  # unpadded: 2 per page x 2 pages
    assert compression_metadata(_t([255]), _t([1024]), None, page_size=256).c128_page_indices is None
