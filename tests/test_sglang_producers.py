"""The rows SGLang's backends produce for target-verify and prefill stores match the truth.

``req_pool_indices_repeated`` (the verify store's state slot) and the prefill rows
``pf_state_slot``, ``pf_chunk_start``, ``pf_cu_q``, ``pf_final_pos`` are derived by the
reference from the live batch; each release's producers (bound in source mode) are run on
drawn batches and compared. Releases: ``$SWAFUZZ_SGLANG_TEST_VERSIONS`` and any already in
the wheel cache; one that cannot be downloaded is skipped with the reason.
"""

from __future__ import annotations

import functools
import os
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.sglang import locate
from harness.sglang.producers import PREFILL_EXPANSION, PREFILL_ROWS, VERIFY_EXPANSION, Batch, bind_producers, check
from harness.sglang.targets import HIP_BACKEND_FILE
from reference import TruthError, prefill_rows, token_state_slots

TEST_VERSIONS_ENV = "SWAFUZZ_SGLANG_TEST_VERSIONS"
REQUESTED = tuple(
    v.strip() for v in os.environ.get(TEST_VERSIONS_ENV, "0.5.12,0.5.19,0.5.23").split(",") if v.strip()
)
CHECKED = tuple(v for v in locate.RELEASES if v in REQUESTED or v in locate.cached_releases())


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
def batches(draw, uniform: bool = False) -> Batch:
    requests = draw(st.integers(1, 5))
    slots = draw(st.lists(st.integers(0, 15), min_size=requests, max_size=requests, unique=True))
    prefixes = draw(st.lists(st.integers(0, 40), min_size=requests, max_size=requests))
    if uniform:
        counts = [draw(st.integers(1, 6))] * requests
    else:
        counts = draw(st.lists(st.integers(1, 6), min_size=requests, max_size=requests))
    return Batch(torch.tensor(slots), torch.tensor(prefixes), torch.tensor(counts))


@pytest.mark.parametrize("version", CHECKED)
@settings(max_examples=40, deadline=None)
@given(ragged=batches(), uniform=batches(uniform=True))
def test_every_producer_a_release_has_matches_the_truth(version, ragged, uniform):
    found, _ = _bound(version)
    assert found, f"sglang {version} has none of the producers"
    for producer in found:
        for batch in (ragged, uniform):
            assert check(producer, batch) == [], f"{producer.backend}.{producer.method} on {batch}"


@pytest.mark.parametrize("version,present,absent", [
    ("0.5.12", (VERIFY_EXPANSION, PREFILL_EXPANSION), (PREFILL_ROWS,)),
    ("0.5.19", (VERIFY_EXPANSION, PREFILL_EXPANSION, PREFILL_ROWS), ()),
    ("0.5.23", (VERIFY_EXPANSION, PREFILL_ROWS), (PREFILL_EXPANSION,)),
])
def test_the_producers_follow_the_releases_and_absent_ones_are_explained(version, present, absent):
    if version not in CHECKED:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    found, missing = _bound(version)
    assert tuple(p.method for p in found) == present
    assert tuple(missing) == absent
    assert all(version in reason for reason in missing.values())


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
    assert "imports fused_expand from sglang.kernels.expand, which swafuzz has no stand-in for" in missing[VERIFY_EXPANSION]
