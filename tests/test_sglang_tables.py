"""SGLang's builders of the per-step index tables (page table, SWA indices and lengths, the
C4 top-k table, compress-state ring rows), bound from each release and run on CPU, hold every
row they make to the truths of :mod:`swafuzz.reference.compressed`.

The Triton builders need triton (the ``triton`` extra); without it they are not checked and
the tests that run them skip with that reason. Edited trees are a released wheel's files
with one small edit, made at test time.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import SUITE_RELEASES, edited_release, release_or_skip

from swafuzz.errors import BindError
from swafuzz.reference import compressed as truth
from swafuzz.subjects.sglang import tables, tree_checks
from swafuzz.subjects.sglang.compressed import HIP_GLUE_FILE, CompressionBatch, generated_batches
from swafuzz.subjects.sglang.interpreted import TRITON_MISSING, triton_available
from swafuzz.subjects.sglang.targets import CUDA_BACKEND_FILE, HIP_BACKEND_FILE

BUILDERS = {builder.name: builder for builder in tables.BUILDERS}
# the releases that have each builder, first and last, as their wheels have them
RELEASES_WITH = {
    "build_page_table_positions": ((0, 5, 16), None),
    "build_page_table_positions_triton": ((0, 5, 16), None),
    "build_page_table_positions_small": ((0, 5, 21), None),
    "build_causal_swa_page_indices": ((0, 5, 16), None),
    "build_causal_swa_page_indices_triton": ((0, 5, 16), None),
    "DeepseekV4AttnBackend.make_core_attn_metadata": ((0, 5, 12), (0, 5, 15)),  # inline, before the builders
    "DSV4AttnMetadata.init_flashmla_related": ((0, 5, 12), None),
    "CompressStatePool.translate_from_req_position_to_state_loc": ((0, 5, 15), None),
    "page_table_from_req_to_token": ((0, 5, 21), None),
    "DeepseekV4HipRadixBackend.get_swa_page_indices": ((0, 5, 13), None),
}


def _number(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def _has(version: str, name: str) -> bool:
    first, last = RELEASES_WITH[name]
    return first <= _number(version) and (last is None or _number(version) <= last)


def _batch() -> CompressionBatch:
    """Rows at positions 5 and 200 of request slot 1 (the second past the 128-token
    window), 300 of slot 2 (on its second 256-token page), and a graph padding row."""
    slots, columns = 4, 1024
    req_to_token = (torch.arange(slots * columns, dtype=torch.int32) + 1).reshape(slots, columns)
    mapping = torch.full((slots * columns + 2,), truth.NO_SLOT, dtype=torch.int64)
    mapping[:-1] = torch.arange(slots * columns + 1) * 3  # an SWA slot of its own per full slot
    positions, req_slots = torch.tensor([5, 200, 300, 0]), torch.tensor([1, 1, 2, 0])
    out_loc = torch.tensor([int(req_to_token[s, p]) for s, p in zip(req_slots[:3], positions[:3])] + [0])
    return CompressionBatch(positions=positions, out_loc=out_loc, req_slots=req_slots, req_to_token=req_to_token,
                            mapping=mapping)


def _skip_without_triton(builder: tables.TableBuilder) -> None:
    if builder.needs_triton and not triton_available():
        pytest.skip(TRITON_MISSING)


@pytest.mark.parametrize("name", list(RELEASES_WITH))
@pytest.mark.parametrize("version", SUITE_RELEASES)
def test_each_builder_a_release_has_matches_the_truth_and_one_it_lacks_is_named_absent(version, name):
    builder, tree = BUILDERS[name], release_or_skip(version)
    if not _has(version, name):
        with pytest.raises(BindError, match="has no|checked there"):
            builder.bind(tree)
        return
    _skip_without_triton(builder)
    result = tables.check_builder(builder, tree, generated_batches(3, seed=11))
    assert result.passed, result.wrong


def test_the_generated_batches_cross_the_window_and_page_boundaries_and_read_free_swa_entries():
    batches = generated_batches(4)
    assert any(int(b.positions.max()) >= 256 for b in batches)
    assert any(bool(((b.positions > 0) & (b.positions < truth.SWA_WINDOW)).any()) for b in batches)
    # a row short of the window reads free entries, which SGLang sends through the mapping's last entry
    assert all(int(b.mapping[-1]) == truth.NO_SLOT for b in batches)


@pytest.mark.parametrize("name, version, path, old, new, first_wrong", [
    # the window one token late (it ends at the length, not the position): every row reads
    # a token it has not written (row 0, position 5 of slot 1, reads full slot 1031, SWA
    # slot 3093); masking one offset too many leaves out the request's first token
    ("build_causal_swa_page_indices_triton", "0.5.23", tables.TABLE_FILES[0],
     "pos = tl.load(seq_lens_ptr + row).to(tl.int64) - 1", "pos = tl.load(seq_lens_ptr + row).to(tl.int64)",
     "build_causal_swa_page_indices_triton: swa_page_indices row 0: SGLang [3093, 3090, "),
    ("build_causal_swa_page_indices", "0.5.23", tables.TABLE_FILES[0],
     "invalid_offset_mask = offsets < 0", "invalid_offset_mask = offsets < 1",
     "build_causal_swa_page_indices: swa_page_indices row 0: SGLang [3090, 3087, 3084, 3081, 3078, -1, "),
    # every row reads the first row's request slot: row 2 is the first of another request
    ("build_page_table_positions_triton", "0.5.23", tables.TABLE_FILES[0],
     "rp = tl.load(req_pool_ptr + row).to(tl.int64)\n    base = req_to_token_ptr + rp * rt_stride\n    out_base = page_table_ptr",
     "rp = tl.load(req_pool_ptr).to(tl.int64)\n    base = req_to_token_ptr + rp * rt_stride\n    out_base = page_table_ptr",
     "build_page_table_positions_triton: page_table row 2:"),
    ("build_page_table_positions_small", "0.5.23", tables.TABLE_FILES[0],
     "tl.store(SWA + row, tl.minimum(length, WINDOW))", "tl.store(SWA + row, tl.minimum(length, WINDOW - 1))",
     "build_page_table_positions_small: swa_topk_lengths row 1: SGLang 127, the truth 128"),
    # the graph padding row (length 1) keeps no compressed entry, yet its clamp keeps one
    ("DSV4AttnMetadata.init_flashmla_related", "0.5.23", CUDA_BACKEND_FILE,
     "torch.clamp(\n                self.c4_topk_lengths_clamp1, max=self.index_topk",
     "torch.clamp(\n                self.c4_topk_lengths_raw, max=self.index_topk",
     "DSV4AttnMetadata.init_flashmla_related: c4_sparse_topk_lengths row 3: SGLang 0, the truth 1"),
    # the ring of 1 cannot tell; the ring of 2 puts position 5 on the other row
    ("CompressStatePool.translate_from_req_position_to_state_loc", "0.5.23", tables.COMPRESS_STATE_FILE,
     "positions % self.ring_size", "(positions + 1) % self.ring_size",
     "CompressStatePool.translate_from_req_position_to_state_loc (ring of 2) row 0: SGLang 2, the truth 3"),
    ("page_table_from_req_to_token", "0.5.23", HIP_GLUE_FILE,
     "req = tl.load(req_ptr + row).to(tl.int64)", "req = tl.load(req_ptr).to(tl.int64)",
     "page_table_from_req_to_token: page_table row 2:"),
    ("DeepseekV4HipRadixBackend.get_swa_page_indices", "0.5.23", HIP_BACKEND_FILE,
     "invalid_offset_mask = offsets < 0", "invalid_offset_mask = offsets < 1",
     "DeepseekV4HipRadixBackend.get_swa_page_indices: swa_page_indices row 0: SGLang [3090, 3087, 3084, 3081, 3078, -1, "),
    ("DeepseekV4AttnBackend.make_core_attn_metadata", "0.5.12", CUDA_BACKEND_FILE,
     "swa_topk_lengths = torch.clamp(seq_lens_casual, max=SWA_WINDOW)",
     "swa_topk_lengths = torch.clamp(seq_lens_casual, max=SWA_WINDOW + 1)",
     "DeepseekV4AttnBackend.make_core_attn_metadata: swa_topk_lengths row 1: SGLang 129, the truth 128"),
])
def test_an_edited_builder_is_caught_at_its_first_wrong_row(name, version, path, old, new, first_wrong):
    builder = BUILDERS[name]
    _skip_without_triton(builder)
    result = tables.check_builder(builder, edited_release(version, path, old, new, "edited"), [_batch()])
    assert result.bound and not result.passed
    assert result.wrong[0].startswith(first_wrong), result.wrong


def test_without_triton_the_triton_builders_are_not_checked_and_the_torch_ones_still_run(monkeypatch):
    tree = release_or_skip("0.5.23")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    checks = {check.name: check for check in tree_checks.check_tables(tree)}
    assert list(checks) == [builder.name for builder in tables.BUILDERS]
    for builder in tables.BUILDERS:
        check = checks[builder.name]
        assert check.kind == tree_checks.KERNEL
        if builder.needs_triton:
            assert (check.outcome, check.detail) == (tree_checks.GAP, TRITON_MISSING)
        elif _has("0.5.23", builder.name):
            assert (check.outcome, check.detail) == (tree_checks.RIGHT, "every value matches the truth")
        else:
            assert check.outcome == tree_checks.ABSENT and "checked there" in check.detail


def test_the_matrix_shows_each_builder_as_a_column_and_each_release_as_a_row(tmp_path):
    from swafuzz.tools.sglang_matrix import Matrix, render

    checks = {version: tree_checks.check_tables(release_or_skip(version)) for version in ("0.5.12", "0.5.23")}
    text = render(Matrix(list(checks), [], {}, "ci", 10, 0, 1.0, tables=checks), tmp_path / "sglang-matrix.md")
    section = text.split("## Index tables by release", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0] == "| release | " + " | ".join(f"`{b.name}`" for b in tables.BUILDERS) + " |"
    assert lines[1].startswith("| --- |")
    for version, line in zip(checks, lines[2:], strict=True):
        cells = line.strip("| ").split(" | ")
        assert cells[0] == version
        for builder, cell in zip(tables.BUILDERS, cells[1:]):
            if not _has(version, builder.name):
                assert cell == tree_checks.ABSENT
            elif builder.needs_triton and not triton_available():
                assert cell == f"not checked: {TRITON_MISSING}"
            else:
                assert cell == tree_checks.RIGHT
