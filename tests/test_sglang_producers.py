"""The rows SGLang's producers hand its SWA stores match the truth, release by release.

The reference derives every row from the live batch: the target-verify and prefill state
slots (``req_pool_indices_repeated``, ``verify_store_state_slot``, ``pf_state_slot``,
``pf_chunk_start``, ``pf_cu_q``, ``pf_final_pos``), the decode and verify ring rows, the
request window's workspace rows, commits and idle rows (0.5.21+), the late-layer tail, the
graph buffer of translated locations and the draft SWA ring (0.5.23). Each release's
producers (the table ``PRODUCERS``, bound in source mode) run on drawn batches, ragged,
padded and idle ones included, and are compared row by row. Releases:
``$SWAFUZZ_SGLANG_TEST_VERSIONS`` and any already in the wheel cache; one that cannot be
downloaded is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import edited_release
from hypothesis import given, settings
from hypothesis import strategies as st

from swafuzz.subjects.sglang import locate
from swafuzz.subjects.sglang.producers import (
    ATTN_METADATA_FILES,
    CONTEXT_INJECTION,
    CUDA_DRAFT_BLOCK_GETTER,
    CUDA_IN_GRAPH_DSPARK,
    CUDA_IN_GRAPH_INIT,
    CUDA_WINDOW_GETTER,
    DECODE_STREAMS,
    DRAFT_RING_ROWS,
    DRAFT_RING_SIZE,
    DRAFT_STEP_LOCS,
    GRAPH_LOC_BUFFER,
    HIP_IN_GRAPH_INIT,
    HIP_WINDOW_GETTER,
    KV_INJECT_FILE,
    LATE_LAYER_TAIL,
    PREFILL_EXPANSION,
    PREFILL_ROWS,
    PRODUCERS,
    TAIL_METADATA,
    VERIFY_EXPANSION,
    WINDOW_COMMIT,
    WINDOW_FILE,
    WINDOW_IDLE,
    WINDOW_LAYOUT,
    WINDOW_ROW,
    Batch,
    bind_producers,
    check,
    idle,
)
from swafuzz.subjects.sglang.real_classes import attributes
from swafuzz.subjects.sglang.targets import CUDA_BACKEND_FILE, HIP_BACKEND_FILE
from swafuzz.reference import (
    TruthError,
    draft_step_slots,
    injected_context_rows,
    late_layer_tail_tokens,
    prefill_rows,
    request_window_rows,
    token_state_slots,
    whole_page_ring,
)

TEST_VERSIONS_ENV = "SWAFUZZ_SGLANG_TEST_VERSIONS"
REQUESTED = tuple(
    v.strip() for v in os.environ.get(TEST_VERSIONS_ENV, "0.5.12,0.5.19,0.5.23").split(",") if v.strip()
)
CHECKED = tuple(v for v in locate.RELEASES if v in REQUESTED)


# ---- the truth ---------------------------------------------------------------------------------


def test_each_token_gets_its_own_requests_slot_in_a_ragged_batch():
    slots = token_state_slots(torch.tensor([5, 2, 7]), torch.tensor([2, 0, 3]))
    assert slots.tolist() == [5, 5, 7, 7, 7] and slots.dtype == torch.int64


def test_prefill_rows_follow_each_requests_prefix_and_place_in_the_batch():
    rows = prefill_rows(torch.tensor([5, 2, 7]), torch.tensor([4, 1, 0]), torch.tensor([2, 1, 3]))
    assert rows.state_slot.tolist() == [5, 5, 2, 7, 7, 7]
    assert rows.chunk_start.tolist() == [4, 4, 1, 0, 0, 0]
    assert rows.cu_q.tolist() == [0, 0, 2, 3, 3, 3]
    assert rows.final_pos.tolist() == [5, 5, 1, 2, 2, 2]


@pytest.mark.parametrize("prefixes,counts,message", [
    ([0, 0], [1], "1 token counts for 2 requests"),
    ([0], [-1], "negative token counts"),
    ([-2], [1], "negative prefix lengths"),
])
def test_the_truth_refuses_counts_that_do_not_describe_the_batch(prefixes, counts, message):
    with pytest.raises(TruthError, match=message):
        prefill_rows(torch.arange(len(prefixes)), torch.tensor(prefixes), torch.tensor(counts))


def test_request_window_rows_stage_after_the_history_and_commit_the_newest_capacity_rows():
    rows = request_window_rows(torch.tensor([5, 2]), torch.tensor([7, 0]), torch.tensor([2, 3]),
                               window=4, capacity=4, history_groups=2, padding=1)
    assert rows.write_loc.tolist() == [8, 9, 10, 11, 12, 13] and rows.write_loc.dtype == torch.int32
    assert rows.commit_row.tolist() == [5 * 4 + 3, 5 * 4 + 0, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2]


def test_a_request_with_more_rows_than_its_ring_commits_only_the_newest_capacity_rows():
    rows = request_window_rows(torch.tensor([1]), torch.tensor([0]), torch.tensor([6]), window=4, capacity=4)
    assert rows.commit_row.tolist() == [-1, -1, 4 + 2, 4 + 3, 4 + 0, 4 + 1]
    assert rows.write_loc.tolist() == [6 * 4 + i for i in range(6)]  # one history group per row


def test_idle_request_window_rows_follow_one_empty_history_group_and_commit_nothing():
    empty = torch.empty(0, dtype=torch.int64)
    rows = request_window_rows(empty, empty, empty, window=128, capacity=131, padding=3)
    assert rows.write_loc.tolist() == [128, 129, 130] and rows.commit_row.tolist() == []


@pytest.mark.parametrize("window,draft,page,ring", [
    (128, 0, 1, 128), (128, 3, 2, 132), (128, 3, 64, 192), (128, 0, 256, 256),
])
def test_a_page_aligned_ring_holds_the_window_and_the_draft_tokens_in_whole_pages(window, draft, page, ring):
    assert whole_page_ring(window, draft, page) == ring


def test_the_request_window_truth_refuses_a_capacity_smaller_than_the_window():
    with pytest.raises(TruthError, match="must be positive and fit in the capacity"):
        request_window_rows(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]), window=8, capacity=4)


def test_the_late_layers_store_each_requests_last_window_tokens_or_its_whole_extend():
    assert late_layer_tail_tokens(torch.tensor([3, 1, 6]), 2).tolist() == [1, 2, 3, 8, 9]
    whole_last = late_layer_tail_tokens(torch.tensor([3, 1, 6]), 2, [False, False, True])
    assert whole_last.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_injected_context_skips_rejected_tokens_and_on_a_ring_those_a_window_behind_their_last():
    rows, positions = torch.tensor([10, 11, 12, 13]), torch.tensor([0, 1, 2, 3])
    committed = torch.tensor([True, True, True, False])
    final = torch.tensor([3, 3, 3, 3])
    assert injected_context_rows(rows, positions, committed).tolist() == [10, 11, 12, -1]
    # a window of 2 behind position 3: positions 2 and 3 land on the ring, 0 and 1 would race
    assert injected_context_rows(rows, positions, None, final, ring_window=2).tolist() == [-1, -1, 12, 13]
    assert injected_context_rows(rows, positions, committed, final, ring_window=2).tolist() == [-1, -1, 12, -1]
    assert injected_context_rows(rows, positions, None, final).tolist() == [10, 11, 12, 13]  # paged rows


def test_each_draft_step_writes_the_slot_allocated_to_that_step_of_every_branch():
    allocated = torch.tensor([[[11, 12, 13], [21, 22, 23]], [[31, 32, 33], [41, 42, 43]]])  # [request, branch, step]
    assert draft_step_slots(allocated).tolist() == [[11, 21, 31, 41], [12, 22, 32, 42], [13, 23, 33, 43]]


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 20), min_size=1, max_size=4), capacity=st.integers(8, 12),
       prefixes=st.lists(st.integers(0, 50), min_size=4, max_size=4), padding=st.integers(0, 3))
def test_request_window_rows_never_write_one_ring_row_twice_nor_outside_their_requests_ring(
    counts, capacity, prefixes, padding,
):
    slots = torch.arange(len(counts)) * 3 + 1
    rows = request_window_rows(slots, torch.tensor(prefixes[: len(counts)]), torch.tensor(counts),
                               window=8, capacity=capacity, padding=padding)
    committed = rows.commit_row[rows.commit_row >= 0]
    assert committed.unique().numel() == committed.numel()
    owners = token_state_slots(slots, torch.tensor(counts))[rows.commit_row >= 0]
    assert torch.equal(committed // capacity, owners)
    assert rows.write_loc.unique().numel() == sum(counts) + padding
    assert int(rows.write_loc.min()) >= 8 * sum(counts)  # past every history row


# ---- the releases' producers -------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _producers(version: str):
    try:
        tree = locate.wheel(version)
    except locate.SglangUnavailable as exc:
        return f"no sglang {version} wheel: {exc}"
    return bind_producers(tree)


def _bound(version: str):
    found = _producers(version)
    if isinstance(found, str):
        pytest.skip(found)
    return found


@st.composite
def batches(draw, uniform: bool = False, padded: bool = False, long: bool = False, decode: bool = False) -> Batch:
    requests = draw(st.integers(1, 5))
    slots = draw(st.lists(st.integers(0, 15), min_size=requests, max_size=requests, unique=True))
    prefixes = draw(st.lists(st.integers(0, 300), min_size=requests, max_size=requests))
    if decode:
        counts = [1] * requests
    elif uniform:
        counts = [draw(st.integers(1, 6))] * requests
    else:
        counts = draw(st.lists(st.integers(1, 6), min_size=requests, max_size=requests))
    if long:
        # one request's chunk around the request window's capacity (132 rows)
        counts[draw(st.integers(0, requests - 1))] = draw(st.integers(128, 136))
    padding = draw(st.integers(1, 4)) if padded else 0
    return Batch(torch.tensor(slots), torch.tensor(prefixes), torch.tensor(counts), padding=padding)


@pytest.mark.parametrize("version", CHECKED)
@settings(max_examples=25, deadline=None)
@given(ragged=batches(), uniform=batches(uniform=True), decode=batches(decode=True), padded=batches(padded=True),
       long=batches(long=True), idle_rows=st.integers(1, 6))
def test_every_producer_a_release_has_matches_the_truth(version, ragged, uniform, decode, padded, long, idle_rows):
    found, _ = _bound(version)
    assert found, f"sglang {version} has none of the producers"
    for producer in found:
        for batch in (ragged, uniform, decode, padded, long, idle(idle_rows)):
            assert check(producer, batch) == [], f"{producer.name} on {batch}"


_ALL = tuple(info.name for info in PRODUCERS)
_STATE_ROWS = (VERIFY_EXPANSION, PREFILL_EXPANSION, PREFILL_ROWS)
_IN_GRAPH = (CUDA_IN_GRAPH_INIT, HIP_IN_GRAPH_INIT)
_DSPARK_IN_GRAPH = (CUDA_IN_GRAPH_INIT, CUDA_IN_GRAPH_DSPARK, HIP_IN_GRAPH_INIT)


@pytest.mark.parametrize("version,present", [
    ("0.5.12", (VERIFY_EXPANSION, PREFILL_EXPANSION)),
    ("0.5.19", (*_STATE_ROWS, DECODE_STREAMS, DRAFT_STEP_LOCS, *_DSPARK_IN_GRAPH, GRAPH_LOC_BUFFER,
                CUDA_DRAFT_BLOCK_GETTER, CONTEXT_INJECTION)),
    ("0.5.21", (*_STATE_ROWS, DECODE_STREAMS, WINDOW_LAYOUT, WINDOW_COMMIT, CUDA_WINDOW_GETTER,
                LATE_LAYER_TAIL, TAIL_METADATA, DRAFT_STEP_LOCS, *_DSPARK_IN_GRAPH, GRAPH_LOC_BUFFER,
                CUDA_DRAFT_BLOCK_GETTER, CONTEXT_INJECTION)),
    ("0.5.22", (*_STATE_ROWS, DECODE_STREAMS, WINDOW_LAYOUT, WINDOW_COMMIT, CUDA_WINDOW_GETTER,
                HIP_WINDOW_GETTER, LATE_LAYER_TAIL, TAIL_METADATA, DRAFT_STEP_LOCS, *_DSPARK_IN_GRAPH,
                GRAPH_LOC_BUFFER, CUDA_DRAFT_BLOCK_GETTER, CONTEXT_INJECTION)),
    ("0.5.23", (*_STATE_ROWS, DECODE_STREAMS, WINDOW_LAYOUT, WINDOW_IDLE, WINDOW_ROW,
                CUDA_WINDOW_GETTER, HIP_WINDOW_GETTER, LATE_LAYER_TAIL, TAIL_METADATA, DRAFT_STEP_LOCS,
                *_DSPARK_IN_GRAPH, GRAPH_LOC_BUFFER, DRAFT_RING_SIZE, DRAFT_RING_ROWS, CUDA_DRAFT_BLOCK_GETTER,
                CONTEXT_INJECTION)),
])
def test_the_producers_follow_the_releases_and_absent_ones_are_explained(version, present):
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    found, missing = _bound(version)
    assert tuple(p.name for p in found) == present
    assert tuple(missing) == tuple(name for name in _ALL if name not in present)
    assert all(version in reason for reason in missing.values())


def test_the_request_window_commit_of_0_5_23_is_absent_because_it_is_a_triton_kernel():
    if "0.5.23" not in CHECKED:
        pytest.skip(f"needs 0.5.23 in ${TEST_VERSIONS_ENV}")
    _, missing = _bound("0.5.23")
    assert "copy_packed_rows, which swafuzz has no stand-in for" in missing[WINDOW_COMMIT]


@pytest.mark.parametrize("version", CHECKED)
def test_every_stand_in_carries_only_attributes_of_the_sglang_class_it_replaces(version):
    found, _ = _bound(version)
    tree = locate.wheel(version)
    uses = [(p, use) for p in found for use in p.stand_ins]
    if not uses:
        pytest.skip(f"no producer of sglang {version} runs on stand-ins")
    for producer, use in uses:
        real = attributes(tree, use.replaces)
        extra = use.stand_in.attributes - real
        stand_in = use.stand_in.__name__
        assert not extra, f"{producer.name}: stand-in {stand_in} has {sorted(extra)}, which {use.replaces} lacks"


@pytest.mark.parametrize("version,stale", [("0.5.21", True), ("0.5.22", True), ("0.5.23", False)])
def test_an_idle_forward_after_a_live_one_gets_the_idle_rows_only_from_0_5_23(version, stale):
    """Idle skips metadata init; before 0.5.23 the backends hand the store the previous
    forward's request-window rows (0.5.23 activates an idle layout instead)."""
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    found, _ = _bound(version)
    getters = [p for p in found if p.name in (CUDA_WINDOW_GETTER, HIP_WINDOW_GETTER)]
    live = Batch(torch.tensor([4, 9]), torch.tensor([10, 0]), torch.tensor([1, 3]))
    assert getters
    for getter in getters:
        assert check(getter, live) == []
        problems = check(getter, idle(2, previous=live))
        assert bool(problems) == stale, problems
        if stale:
            assert problems[0].startswith("store write_loc: got [256, 257, 258, 259], want [128, 129]")


UNIFORM_PREFILL_EXPANSION = """
class DeepseekV4HipRadixBackend:
    def expand_prefill_casually(self, num_tokens, seq_lens, extend_seq_lens, req_pool_indices, padded_num_tokens):
        repeated = req_pool_indices.repeat_interleave(num_tokens // req_pool_indices.shape[0])
        return None, repeated
"""


def test_a_producer_that_assumes_equal_counts_is_caught_on_a_ragged_batch(tmp_path: Path):
    file = tmp_path / HIP_BACKEND_FILE
    file.parent.mkdir(parents=True)
    file.write_text("import torch\n" + textwrap.dedent(UNIFORM_PREFILL_EXPANSION))
    found, _ = bind_producers(locate.SourceTree(tmp_path, "checkout"))
    (producer,) = [p for p in found if p.method == PREFILL_EXPANSION]
    ragged = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([3, 1]))
    assert check(producer, ragged) == ["req_pool_indices_repeated: got [3, 3, 1, 1], want [3, 3, 3, 1]"]
    uniform = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([2, 2]))
    assert check(producer, uniform) == []


def test_a_deferred_sglang_import_without_a_stand_in_is_named(tmp_path: Path):
    file = tmp_path / HIP_BACKEND_FILE
    file.parent.mkdir(parents=True)
    file.write_text(textwrap.dedent("""
        class DeepseekV4HipRadixBackend:
            def expand_extend_with_same_length(self, bs, qo_len, seq_lens, req_pool_indices):
                from sglang.kernels.expand import fused_expand
                return None, fused_expand(req_pool_indices, qo_len)
    """))
    _, missing = bind_producers(locate.SourceTree(tmp_path, "checkout"))
    reason = "imports fused_expand from sglang.kernels.expand, which swafuzz has no stand-in for"
    assert reason in missing[VERIFY_EXPANSION]


COMMIT_EVERY_ROW_WINDOW = """
class WindowLayout:
    req: object
    pos: object
    write_loc: object
    commit_mask: object


def window_layout(req, pos, *, window=128, capacity=256, floor=None, num_groups=None):
    n = pos.numel()
    groups = n if num_groups is None else num_groups
    write_loc = (groups * window + torch.arange(n)).to(torch.int32)
    return WindowLayout(req, pos, write_loc, torch.ones(n, dtype=torch.bool))


def _capturing():
    return False


def _first_row_offsets(req):
    return None
"""


def test_a_request_window_that_commits_rows_its_ring_cannot_hold_is_caught(tmp_path: Path):
    file = tmp_path / WINDOW_FILE
    file.parent.mkdir(parents=True)
    file.write_text("import torch\n" + textwrap.dedent(COMMIT_EVERY_ROW_WINDOW))
    found, _ = bind_producers(locate.SourceTree(tmp_path, "checkout"))
    (producer,) = [p for p in found if p.name == WINDOW_LAYOUT]
    short = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([3, 1]))
    assert check(producer, short) == []
    long = Batch(torch.tensor([3]), torch.tensor([0]), torch.tensor([134]))
    problems = check(producer, long)
    assert len(problems) == 2
    assert problems[0].endswith("(a history group per request)") and problems[1].endswith("(a history group per row)")
    assert all(p.startswith("commit_mask: got [1, 1, 1,") and "want [0, 0, 1," in p for p in problems)


def test_a_graph_buffer_that_leaves_stale_rows_past_the_batch_is_caught():
    if "0.5.19" not in CHECKED:
        pytest.skip(f"needs 0.5.19 in ${TEST_VERSIONS_ENV}")
    found, _ = _bound("0.5.19")
    (real,) = [p for p in found if p.name == GRAPH_LOC_BUFFER]

    def without_clearing(backend, out_cache_loc):
        n = out_cache_loc.shape[0]
        rows = backend.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc).to(torch.int32)
        backend.cuda_graph_swa_out_cache_loc[:n].copy_(rows)
        return backend.cuda_graph_swa_out_cache_loc[:n]

    broken = dataclasses.replace(real, function=without_clearing)
    batch = Batch(torch.tensor([2, 6]), torch.tensor([3, 0]), torch.tensor([1, 1]), padding=2)
    assert check(real, batch) == []
    (problem,) = check(broken, batch)
    assert problem == "graph buffer past the batch: got [-7, -7, -7], want [0, 0, 0]"


FIRST_TOKENS_TAIL = """
def late_layer_tail_layout(*, extend_lens_cpu, seq_lens_cpu, tail_len, device):
    tails = [min(tail_len, n) for n in extend_lens_cpu]
    starts = [sum(extend_lens_cpu[:r]) for r in range(len(extend_lens_cpu))]
    rows = [s + i for s, t in zip(starts, tails) for i in range(t)]
    return torch.tensor(rows), tails, None
"""


def test_a_late_layer_tail_of_each_requests_first_tokens_is_caught(tmp_path: Path):
    file = tmp_path / ATTN_METADATA_FILES[1]
    file.parent.mkdir(parents=True)
    file.write_text("import torch\n" + textwrap.dedent(FIRST_TOKENS_TAIL))
    found, _ = bind_producers(locate.SourceTree(tmp_path, "checkout"))
    (producer,) = [p for p in found if p.name == LATE_LAYER_TAIL]
    assert check(producer, Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([3, 1]))) == []
    long = Batch(torch.tensor([3]), torch.tensor([0]), torch.tensor([130]))
    (problem,) = check(producer, long)
    assert problem.startswith("tail rows: got [0, 1, 2,") and "want [2, 3, 4," in problem


@pytest.mark.parametrize("version", ("0.5.21", "0.5.22"))
def test_a_request_window_commit_into_another_requests_ring_is_caught(version):
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    found, _ = _bound(version)
    (real,) = [p for p in found if p.name == WINDOW_COMMIT]

    class CommitsIntoSlotZero(real.function):
        def commit(self, layer):
            layout = self.layout
            self.layout = dataclasses.replace(layout, req=torch.zeros_like(layout.req))
            super().commit(layer)
            self.layout = layout

    broken = dataclasses.replace(real, function=CommitsIntoSlotZero)
    batch = Batch(torch.tensor([3]), torch.tensor([10]), torch.tensor([2]))
    assert check(real, batch) == []
    problems = check(broken, batch)
    assert problems[0] == "committed tags: got [-1, -1], want [10, 11]"
    assert problems[-1] == "ring rows [10, 11] changed, which no row commits to"


def test_draft_steps_that_all_read_step_zeros_rows_are_caught():
    version = "0.5.19"
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    found, _ = _bound(version)
    (real,) = [p for p in found if p.name == CUDA_IN_GRAPH_INIT]

    def metadata_of_step_zero(backend, forward_batch):
        backend.speculative_step_id = 0
        return real.function(backend, forward_batch)

    broken = dataclasses.replace(real, function=metadata_of_step_zero)
    three_steps = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([2, 1]))
    assert check(real, three_steps) == []
    problems = check(broken, three_steps)
    assert [p.split(":")[0] for p in problems] == ["step 1 of 3 swa_out_cache_loc", "step 2 of 3 swa_out_cache_loc"]


# plausible edits of 0.5.23's getter and of the draft block's metadata: translate a draft
# block's locations as the paged SWA pool would, keep the first block's rows for every later
# one, join the staged commit writes only on the translating path, hand a block on paged SWA
# rows its full-pool locations, write each ring row one position late, extend each request's
# host context by one token too many
CACHED_RETURN = "        if cached is not None and cached.shape[0] == out_cache_loc.shape[0]:\n            return cached\n"
STORE_JOIN = "        if self.pre_kv_store_hook is not None:\n            self.pre_kv_store_hook()\n"
FALLBACK = "        return self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc).to(\n"
RING_POSITION = "            seq_lens_casual.to(torch.int64) - 1,\n"
UNIFORM_LENGTHS = "seq_lens_cpu_extended = [x + extend_len for x in seq_lens_cpu]"
# plausible edits of 0.5.23's in-graph refresh for a DSpark draft graph: leave the previous
# replay's ring rows in place, or lay the block one position late
RING_REFRESH = "                if self.token_to_kv_pool.swa_req_ring_size is not None:\n"
BLOCK_CONTEXT = "seq_lens=forward_batch.seq_lens, block_size=block_size"
RAGGED_VERIFY_FILE = "sglang/srt/speculative/ragged_verify.py"


@pytest.mark.parametrize("producer,path,edit,problem", [
    (CUDA_DRAFT_BLOCK_GETTER, CUDA_BACKEND_FILE, (CACHED_RETURN, ""), f"{CUDA_DRAFT_BLOCK_GETTER} raised AssertionError"),
    (CUDA_DRAFT_BLOCK_GETTER, CUDA_BACKEND_FILE,
     (CACHED_RETURN, CACHED_RETURN.replace("return cached", "if getattr(self, '_kept', None) is None:\n"
                                           "                self._kept = cached\n            return self._kept")),
     "draft block store rows on the draft ring: got "),
    (CUDA_DRAFT_BLOCK_GETTER, CUDA_BACKEND_FILE,
     (STORE_JOIN + "        out_cache_loc = forward_batch.out_cache_loc\n",
      "        out_cache_loc = forward_batch.out_cache_loc\n"),
     "draft block store rows on the draft ring (earlier block): returned without calling the pre_kv_store_hook"),
    (CUDA_DRAFT_BLOCK_GETTER, CUDA_BACKEND_FILE, (FALLBACK, "        return out_cache_loc.to(torch.int32)\n        return (\n"),
     "draft block store rows on paged SWA rows (earlier block): got "),
    (CUDA_DRAFT_BLOCK_GETTER, CUDA_BACKEND_FILE, (RING_POSITION, RING_POSITION.replace(" - 1", "")),
     "draft block store rows on the draft ring (earlier block): got "),
    (CUDA_DRAFT_BLOCK_GETTER, RAGGED_VERIFY_FILE,
     (UNIFORM_LENGTHS, UNIFORM_LENGTHS.replace("x + extend_len", "x + extend_len + 1")),
     "draft block store rows on the draft ring (earlier block): got "),
    (CUDA_IN_GRAPH_DSPARK, CUDA_BACKEND_FILE, (RING_REFRESH, "                if False:\n"),
     "draft block swa_out_cache_loc on the draft ring: got [-7, "),
    (CUDA_IN_GRAPH_DSPARK, CUDA_BACKEND_FILE,
     (BLOCK_CONTEXT, BLOCK_CONTEXT.replace("forward_batch.seq_lens", "forward_batch.seq_lens + 1")),
     "draft block swa_out_cache_loc on the draft ring: got "),
])
def test_a_dspark_draft_block_stored_anywhere_but_its_rows_is_caught(producer, path, edit, problem):
    if "0.5.23" not in CHECKED:
        pytest.skip(f"needs 0.5.23 in ${TEST_VERSIONS_ENV}")
    block = Batch(torch.tensor([3, 1]), torch.tensor([7, 130]), torch.tensor([3, 3]))
    (real,) = [p for p in _bound("0.5.23")[0] if p.name == producer]
    assert check(real, block) == []
    tree = edited_release("0.5.23", path, *edit, name="draft block store")
    (edited,) = [p for p in bind_producers(tree)[0] if p.name == producer]
    problems = check(edited, block)
    assert problems and problems[0].startswith(problem), problems


# plausible edits of DSpark's context injection: store the verify's first rejected token too,
# keep a prefill token exactly a window behind its request's last one on the ring (whose
# ring row a newer token shares), or lay the unified ring out one row short per request
COMMIT_GATE = "committed = (col < commit_lens.to(torch.long).view(-1, 1)).reshape(-1)"
WINDOW_GATE = "keep = pos > (final_pos.to(torch.int64) - win)"
UNIFIED_ROW = "loc = state_slot.to(torch.int64) * ring + pos % ring"


@pytest.mark.parametrize("version,edit,problem", [
    ("0.5.23", (COMMIT_GATE, COMMIT_GATE.replace("col <", "col <=")), "verify injection rows on the draft ring: got "),
    ("0.5.23", (WINDOW_GATE, WINDOW_GATE.replace(">", ">=")), "prefill injection rows on the draft ring: got "),
    ("0.5.22", (UNIFIED_ROW, UNIFIED_ROW.replace("pos % ring", "pos % (ring - 1)")),
     "prefill injection rows on the unified ring: got "),
    ("0.5.16", ("col < commit_lens", "col <= commit_lens"), "verify injection rows on paged SWA rows: got "),
])
def test_context_keys_injected_into_any_draft_row_but_their_own_are_caught(version, edit, problem):
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    # two requests that each verified three tokens and accepted two; the second prefill's
    # context reaches past a window
    verify = Batch(torch.tensor([3, 1]), torch.tensor([6, 129]), torch.tensor([3, 3]))
    prefill = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([140, 2]))
    (real,) = [p for p in _bound(version)[0] if p.name == CONTEXT_INJECTION]
    assert check(real, verify) == [] and check(real, prefill) == []
    tree = edited_release(version, KV_INJECT_FILE, *edit, name="context injection")
    (edited,) = [p for p in bind_producers(tree)[0] if p.name == CONTEXT_INJECTION]
    problems = check(edited, verify) + check(edited, prefill)
    assert problems and problems[0].startswith(problem), problems


def test_the_draft_block_check_runs_the_getters_store_join_and_translating_fallback():
    if "0.5.23" not in CHECKED:
        pytest.skip(f"needs 0.5.23 in ${TEST_VERSIONS_ENV}")
    (real,) = [p for p in bind_producers(locate.wheel("0.5.23"))[0] if p.name == CUDA_DRAFT_BLOCK_GETTER]
    assert check(real, Batch(torch.tensor([3, 1]), torch.tensor([7, 130]), torch.tensor([2, 2]))) == []
    ran = {s.text for s, done in zip(real.statements.statements, real.statements.ran) if done}
    assert {"self.pre_kv_store_hook()", "return cached"} <= ran, ran
    assert any(text.startswith("return self.token_to_kv_pool.translate_loc_from_full_to_swa(") for text in ran), ran




# 0.5.22+ reset the prefill-graph tail block's padding rows on every build
LOC_PADDING_RESET = "            loc_buf[real_rows:].zero_()\n"
POS_PADDING_RESET = "            pos_buf[real_rows:].zero_()\n"


@pytest.mark.parametrize("reset,problem", [
    (LOC_PADDING_RESET, "prefill-graph tail (the next, shorter extend) swa_out_cache_loc: got "),
    (POS_PADDING_RESET, "prefill-graph tail (the next, shorter extend) positions: got "),
])
def test_a_prefill_graph_tail_block_that_keeps_an_earlier_blocks_padding_rows_is_caught(reset, problem):
    if "0.5.23" not in CHECKED:
        pytest.skip(f"needs 0.5.23 in ${TEST_VERSIONS_ENV}")
    # two short requests: each tail is its whole extend, so the shorter extend's block has fewer real rows
    extend = Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([6, 4]), padding=3)
    (real,) = [p for p in _bound("0.5.23")[0] if p.name == TAIL_METADATA]
    assert check(real, extend) == []
    tree = edited_release("0.5.23", CUDA_BACKEND_FILE, reset, "", name="stale tail block")
    (edited,) = [p for p in bind_producers(tree)[0] if p.name == TAIL_METADATA]
    problems = check(edited, extend)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_context_parallel_tail_that_gives_rows_to_the_wrong_rank_is_caught():
    if "0.5.23" not in CHECKED:
        pytest.skip(f"needs 0.5.23 in ${TEST_VERSIONS_ENV}")
    owner = "        owner_rank = token_indices % cp_size\n"
    tree = edited_release("0.5.23", CUDA_BACKEND_FILE, owner, owner.replace("token_indices %", "(token_indices + 1) %"),
                          name="tail rows on the next rank")
    (edited,) = [p for p in bind_producers(tree)[0] if p.name == TAIL_METADATA]
    problems = check(edited, Batch(torch.tensor([3, 1]), torch.tensor([0, 5]), torch.tensor([6, 4])))
    assert problems and problems[0].startswith("tail on context-parallel rank 0 of 2 positions: got "), problems
    assert not any(problem.startswith("tail rows") or "prefill-graph" in problem for problem in problems)
