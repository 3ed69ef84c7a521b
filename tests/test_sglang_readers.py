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
from swafuzz.subjects.sglang.targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND

needs_triton = pytest.mark.skipif(not triton_available(), reason=TRITON_MISSING)

GET_OUT_LOC_FIELD = 'attr_name = f"c{compress_ratio}_out_loc"'
UNIFIED_READ = "self.forward_metadata.core_metadata.unified,"


def _reader_checks(tree, *names: str) -> dict[str, tree_checks.TreeCheck]:
    return {check.name: check for check in tree_checks.check_readers(tree, names or None)}


COMPRESSOR_READERS = (readers.OUT_LOC_READER, readers.STORE_PATH)


def test_the_reader_batches_are_live_padded_and_draft():
    batches = dict(readers.reader_batches())
    assert list(batches) == ["live", "padded", "draft", readers.DRAFT_DECODE]
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
    checks = _reader_checks(release_or_skip(version), *COMPRESSOR_READERS)
    assert checks[readers.OUT_LOC_READER].outcome == checks[readers.STORE_PATH].outcome == tree_checks.RIGHT


@needs_triton
def test_a_store_path_that_reads_what_swafuzz_does_not_model_is_not_checked_never_wrong():
    # 0.5.12's forward_unified asks the backend to upgrade its metadata first
    check = _reader_checks(release_or_skip("0.5.12"), readers.STORE_PATH)[readers.STORE_PATH]
    assert check.outcome == tree_checks.GAP, check
    assert "'_maybe_upgrade_forward_metadata' from the stand-in attention backend" in check.detail


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
    found = _reader_checks(tree, reader)[reader]
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
    checks = list(_reader_checks(tree, *COMPRESSOR_READERS).values())
    assert {c.outcome for c in checks} == {tree_checks.ABSENT}
    assert all(f"{readers.COMPRESSOR_FILE} has no class {readers.MIXIN}" in c.detail for c in checks)


# ---- each draft step's slots and compressed locations ------------------------------------------

CUDA_SLOTS = f"{CUDA_BACKEND} {readers.DRAFT_STEP_SLOTS}"
CUDA_LOCATIONS = f"{CUDA_BACKEND} {readers.DRAFT_STEP_LOCATIONS}"
HIP_SLOTS = f"{HIP_BACKEND} {readers.DRAFT_STEP_SLOTS}"
HIP_LOCATIONS = f"{HIP_BACKEND} {readers.DRAFT_STEP_LOCATIONS}"
# 0.5.23's eager build: the per-step slice, and the test that takes it
STEP_SLICE = ")[self.speculative_step_id]"
SLICE_TEST = "            if self.topk > 0 and self.speculative_num_steps > 1:\n"


def test_the_draft_decode_batch_completes_a_group_in_every_row():
    draft = dict(readers.reader_batches())[readers.DRAFT_DECODE]
    lengths = draft.positions + 1
    assert (lengths % 4 == 0).all() and (lengths[1::2] % 128 == 0).all() and draft.positions.numel() > 1


NEXTN_FILE = "sglang/srt/models/deepseek_v4_nextn.py"
MISREAD = "(the slots are a view with stride 3, and the compression metadata kernel reads them as contiguous)"


@needs_triton
@pytest.mark.parametrize("version, hip_says", [
    # the HIP build is init_forward_metadata up to 0.5.20
    ("0.5.13", f"built from the slots {HIP_BACKEND}.init_forward_metadata hands it row 1: SGLang "),
    # from 0.5.22 the HIP metadata's V4.1 low-ratio kernel asserts its slots contiguous first
    ("0.5.23", "raised AssertionError at attn_glue_hip.py line 191: "
                                          "assert raw_out_loc.dim() == 1 and raw_out_loc.is_contiguous()"),
])
def test_each_release_hands_every_draft_step_its_slots_in_a_view_the_kernel_misreads(version, hip_says):
    # by value each step gets its own slots; but the slice is a strided view, and the
    # compression metadata kernel reads it as contiguous
    checks = _reader_checks(release_or_skip(version), CUDA_SLOTS, CUDA_LOCATIONS, HIP_SLOTS, HIP_LOCATIONS)
    assert checks[CUDA_SLOTS].outcome == checks[HIP_SLOTS].outcome == tree_checks.RIGHT
    assert checks[CUDA_LOCATIONS].outcome == checks[HIP_LOCATIONS].outcome == tree_checks.WRONG
    # wrong, but no layer reads them: DeepSeek-V4's draft layers store no compressed KV
    unread = "never read: the draft model's layers are built with compress ratio 0 and store no compressed KV"
    cuda = checks[CUDA_LOCATIONS].detail
    assert cuda.startswith(unread) and (f"; c4_out_loc of step 0 of 3's metadata, built from the slots "
                                        f"{CUDA_BACKEND}._build_forward_metadata hands it row 1: SGLang ") in cuda, cuda
    assert MISREAD in cuda
    assert hip_says in checks[HIP_LOCATIONS].detail
    # a raise is no value left unread: it ends the forward
    assert checks[HIP_LOCATIONS].detail.startswith(unread) is ("raised" not in hip_says)


@needs_triton
def test_a_draft_model_that_compresses_makes_wrong_draft_step_locations_a_plain_finding(tmp_path):
    tree = edited_release("0.5.23", NEXTN_FILE, "COMPRESS_RATIO_NEXTN_LAYER = 0", "COMPRESS_RATIO_NEXTN_LAYER = 4",
                          "compressing draft layer")
    detail = _reader_checks(tree, CUDA_LOCATIONS)[CUDA_LOCATIONS].detail
    assert detail.startswith("c4_out_loc of step 0 of 3's metadata"), detail


@needs_triton
def test_a_build_that_hands_the_kernel_contiguous_slots_gets_every_steps_locations_right():
    tree = edited_release("0.5.23", CUDA_BACKEND_FILE, STEP_SLICE, STEP_SLICE + ".contiguous()", "contiguous step slots")
    checks = _reader_checks(tree, CUDA_SLOTS, CUDA_LOCATIONS)
    assert checks[CUDA_SLOTS].outcome == checks[CUDA_LOCATIONS].outcome == tree_checks.RIGHT


@needs_triton
@pytest.mark.parametrize("old, new, first_wrong", [
    # every step writes step 0's slots
    (STEP_SLICE, ")[0]", "out_cache_loc, the write slots DeepseekV4AttnBackend._build_forward_metadata hands step 1 "
                         "of 3's decode metadata row 0: SGLang "),
    # no slice: every step is handed the whole multi-step buffer (#24750)
    (SLICE_TEST, SLICE_TEST.replace("self.topk > 0", "False"),
     "out_cache_loc, the write slots DeepseekV4AttnBackend._build_forward_metadata hands step 0 of 3's decode "
     "metadata: SGLang's has shape (6,), the truth's (2,)"),
])
def test_a_build_that_hands_a_draft_step_the_wrong_slots_is_wrong_naming_them(old, new, first_wrong):
    checks = _reader_checks(edited_release("0.5.23", CUDA_BACKEND_FILE, old, new, "wrong step slots"), CUDA_SLOTS,
                            HIP_SLOTS)
    assert checks[CUDA_SLOTS].outcome == tree_checks.WRONG
    assert checks[CUDA_SLOTS].detail.startswith(first_wrong), checks[CUDA_SLOTS].detail
    assert checks[HIP_SLOTS].outcome == tree_checks.RIGHT  # another file


def test_a_release_without_the_per_step_slice_is_absent_saying_so():
    checks = _reader_checks(release_or_skip("0.5.12"), CUDA_SLOTS, CUDA_LOCATIONS, HIP_SLOTS)
    for name in (CUDA_SLOTS, CUDA_LOCATIONS):
        assert checks[name].outcome == tree_checks.ABSENT
        assert "has no function per_step_draft_out_cache_loc()" in checks[name].detail
    assert checks[HIP_SLOTS].outcome == tree_checks.ABSENT
