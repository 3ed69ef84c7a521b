"""The readers of the compressed-KV values, run on the metadata a tree's own
``init_compression_metadata`` made, hand each C4 / C128 store the truth's rows.

The metadata comes from Triton kernels run under the interpreter, so every test that runs a
reader skips without triton. Edited trees are a released wheel's files with one small edit,
made at test time.
"""

from __future__ import annotations

import importlib.util

import pytest
from conftest import edited_release, release_or_skip

from swafuzz.subjects.sglang import readers, tree_checks
from swafuzz.subjects.sglang.interpreted import TRITON_MISSING, triton_available

needs_triton = pytest.mark.skipif(not triton_available(), reason=TRITON_MISSING)

GET_OUT_LOC_FIELD = 'attr_name = f"c{compress_ratio}_out_loc"'
UNIFIED_READ = "self.forward_metadata.core_metadata.unified,"


def _reader_checks(tree) -> dict[str, tree_checks.TreeCheck]:
    return {check.name: check for check in tree_checks.check_readers(tree)}


def test_the_reader_batches_are_live_padded_and_draft():
    batches = dict(readers.reader_batches())
    assert list(batches) == ["live", "padded", "draft"]
    live, padded, draft = batches["live"], batches["padded"], batches["draft"]
    assert live.out_loc.ne(0).all() and live.req_slots.unique().numel() == live.positions.numel()
    # a graph bucket's padding rows: length 1, slot 0, location 0
    assert padded.positions[-3:].tolist() == [0, 0, 0] and padded.out_loc[-3:].tolist() == [0, 0, 0]
    # four consecutive positions per request
    assert (draft.positions.reshape(-1, 4).diff(dim=1) == 1).all()
    assert all(batch.positions.numel() <= 8 for batch in batches.values())


@needs_triton
@pytest.mark.parametrize("version", ["0.5.13", "0.5.23"])
def test_each_release_compressor_reads_the_truths_rows(version):
    # 0.5.13's forward_unified has no unified-KV branch and its HIP metadata no unified
    # locations; 0.5.23 runs the unified layout too
    checks = _reader_checks(release_or_skip(version))
    assert {name: c.outcome for name, c in checks.items()} == {
        readers.OUT_LOC_READER: tree_checks.RIGHT, readers.STORE_PATH: tree_checks.RIGHT}


@needs_triton
@pytest.mark.parametrize("old, new, reader, quantity", [
    # the wrong field: the C4 lengths instead of the write locations
    (GET_OUT_LOC_FIELD, 'attr_name = f"c{compress_ratio}_topk_lengths_clamp1"', readers.OUT_LOC_READER,
     "c4_out_loc, the rows a C4 layer stores, as CompressorBackendMixin._get_out_loc(4) reads it from the DSV4AttnMetadata"),
    # the wrong ratio: every layer reads the C4 locations
    (GET_OUT_LOC_FIELD, 'attr_name = "c4_out_loc"', readers.STORE_PATH,
     "c128_out_loc, the rows the C128 store writes, as CompressorBackendMixin.forward_unified hands them over from "
     "the DSV4AttnMetadata"),
    # the unified offset dropped: the plain locations under the unified layout
    (UNIFIED_READ, "self.forward_metadata.core_metadata,", readers.STORE_PATH,
     "unified.c4_out_loc, the rows the C4 store writes, as CompressorBackendMixin.forward_unified hands them over "
     "from the HIP DSV4AttnMetadata under the unified Triton layout"),
])
def test_a_compressor_reading_the_wrong_rows_is_wrong_with_the_quantity_named(old, new, reader, quantity):
    tree = edited_release("0.5.23", readers.COMPRESSOR_FILE, old, new, "misread compressed rows")
    found = _reader_checks(tree)[reader]
    assert found.outcome == tree_checks.WRONG
    assert found.detail.startswith(f"{quantity} row "), found.detail
    assert "SGLang" in found.detail and "the truth" in found.detail and " batch: positions [" in found.detail


def test_without_triton_the_readers_are_not_checked_and_say_why(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    checks = _reader_checks(release_or_skip("0.5.23"))
    assert {c.outcome for c in checks.values()} == {tree_checks.GAP}
    assert all(c.detail.endswith(TRITON_MISSING) for c in checks.values())


def test_a_tree_without_the_compressor_is_absent_naming_the_file():
    tree = edited_release("0.5.23", readers.COMPRESSOR_FILE, "class CompressorBackendMixin", "class Renamed",
                          "no compressor mixin")
    checks = _reader_checks(tree)
    assert {c.outcome for c in checks.values()} == {tree_checks.ABSENT}
    assert all(f"{readers.COMPRESSOR_FILE} has no class {readers.MIXIN}" in c.detail for c in checks.values())
