"""SGLang's compression metadata kernel, bound from a release and run under Triton's
interpreter, holds every value it makes to the compressed-KV truths.

The kernel needs triton (the ``triton`` extra); without it the check says so and each test
that runs the kernel skips with that reason. Edited trees are a released wheel's files with
one small edit, made at test time.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from conftest import edited_release, release_or_skip

from swafuzz.errors import BindError
from swafuzz.subjects.sglang.targets import HIP_BACKEND_FILE
from swafuzz.subjects.sglang import compressed, locate
from swafuzz.subjects.sglang.compressed import (
    HIP_GLUE_FILE,
    KERNEL_FILES,
    TRITON_MISSING,
    CompressionBatch,
    check_release,
    generated_batches,
)

needs_triton = pytest.mark.skipif(not compressed.triton_available(), reason=TRITON_MISSING)


def _batch() -> CompressionBatch:
    # lengths 6, 4, 1: only the second row completes a ratio-4 group; the third is graph padding
    req_to_token = torch.arange(2 * 1024, dtype=torch.int32).reshape(2, 1024)
    return CompressionBatch(
        positions=torch.tensor([5, 3, 0]), out_loc=torch.tensor([1029, 1027, 0]), req_slots=torch.tensor([1, 1, 0]),
        req_to_token=req_to_token, mapping=torch.arange(2 * 1024 + 1, dtype=torch.int64),
    )


def test_without_triton_the_values_are_not_checked_and_the_check_says_so(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    result = check_release(release_or_skip("0.5.23"))
    assert not result.checked and not result.passed
    assert result.summary().endswith("not checked on CPU: install swafuzz[triton]")


@needs_triton
@pytest.mark.parametrize("version, absent", [("0.5.12", ("build_low_ratio_metadata", "HIP DSV4AttnMetadata")),
                                             ("0.5.17", ("build_low_ratio_metadata",)), ("0.5.23", ())])
def test_each_release_kernel_matches_the_truth(version, absent):
    # 0.5.12 returns eight values from the old file and has no HIP backend; 0.5.17 nine from
    # the new file, the HIP metadata adding the unified offsets; 0.5.23 adds the V4.1 kernels
    result = check_release(release_or_skip(version), generated_batches(3, seed=7))
    assert result.passed, result.summary()
    assert result.absent == absent


def test_the_generated_batches_write_both_compressed_caches_and_pad_like_a_graph():
    batches = generated_batches(4)
    expected = [batch.expected() for batch in batches]
    assert any(bool((e["c4_out_loc"] != 0).any()) for e in expected)
    assert any(bool((e["c128_out_loc"] != 0).any()) for e in expected)
    assert any(int(b.positions[-1]) == 0 and int(b.out_loc[-1]) == 0 for b in batches)


@needs_triton
def test_an_off_by_one_in_the_kernel_c4_condition_is_caught_at_its_first_wrong_row():
    tree = edited_release("0.5.23", KERNEL_FILES[0], "c4_should_compress = (seq_len % 4) == 0",
                   "c4_should_compress = (seq_len % 4) == 1", "c4 condition off by one")
    result = check_release(tree, [_batch()])
    assert result.checked and not result.passed
    # row 1 (length 4) writes 1027 // 4; the edited kernel writes the dummy there
    assert "init_compression_metadata: c4_out_loc row 1: SGLang 0, the truth 256" in result.wrong
    assert "DSV4AttnMetadata.c4_out_loc row 1: SGLang 0, the truth 256" in result.wrong
    assert "c4 condition off by one" in result.summary()


@needs_triton
def test_metadata_that_keeps_the_wrong_kernel_output_is_caught():
    # the raw ratio-4 lengths kept where the clamped ones belong: rows shorter than 4 read 0
    tree = edited_release("0.5.23", "sglang/srt/layers/attention/deepseek_v4_backend.py",
                   "self.c4_topk_lengths_clamp1 = c4_topk_lengths_clamp1",
                   "self.c4_topk_lengths_clamp1 = c4_topk_lengths_raw", "raw lengths kept as clamped")
    result = check_release(tree, [_batch()])
    assert result.wrong == (
        "DSV4AttnMetadata.c4_topk_lengths_clamp1 row 2: SGLang 0, the truth 1",
        "DSV4AttnMetadata with build_low_ratio_metadata's buffers.c4_topk_lengths_clamp1 row 2: SGLang 0, the truth 1",
    )


@needs_triton
def test_a_flipped_parity_in_the_low_ratio_kernel_is_caught_in_the_kernel_and_the_metadata():
    # 0.5.21+'s V4.1 kernel: ratio 2 writes where the length is even, else -1
    tree = edited_release("0.5.23", KERNEL_FILES[0], "tl.where((length & 1) == 0, loc >> 1, -1)",
                   "tl.where((length & 1) == 1, loc >> 1, -1)", "c2 parity flipped")
    result = check_release(tree, [_batch()])
    # row 0 (length 6) writes 1029 >> 1; the edited kernel writes nothing there
    assert result.wrong == (
        "build_low_ratio_metadata: c2_out_loc row 0: SGLang -1, the truth 514",
        "DSV4AttnMetadata with build_low_ratio_metadata's buffers.c2_out_loc row 0: SGLang -1, the truth 514",
    )


def test_the_command_exits_2_saying_the_extra_is_missing_without_triton(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    assert compressed.main(["0.5.23"]) == 2
    assert "not checked on CPU: install swafuzz[triton]" in capsys.readouterr().err


@needs_triton
def test_the_command_checks_each_release_named(capsys):
    release_or_skip("0.5.23")
    assert compressed.main(["0.5.23"]) == 0
    assert capsys.readouterr().out == "sglang 0.5.23 wheel (source mode): compressed-KV values match the truth\n"


@needs_triton
def test_hip_unified_locations_that_leave_dummy_rows_unoffset_are_caught():
    tree = edited_release("0.5.23", HIP_BACKEND_FILE, "self.unified.c4_out_loc = self.c4_out_loc + unified_swa_pages",
                   "self.unified.c4_out_loc = torch.where(self.c4_out_loc > 0, self.c4_out_loc + unified_swa_pages, 0)",
                   "dummy rows not offset")
    result = check_release(tree, [replace(_batch(), unified_swa_pages=1000)])
    # row 0 completes no group: its dummy slot 0 still sits past the 1000-page SWA region
    assert result.wrong == ("HIP DSV4AttnMetadata.unified.c4_out_loc row 0: SGLang 0, the truth 1000",)


@needs_triton
def test_a_flipped_parity_in_the_hip_low_ratio_kernel_is_caught():
    tree = edited_release("0.5.23", HIP_GLUE_FILE, "completes = (seq_len % 2) == 0", "completes = (seq_len % 2) == 1",
                   "HIP c2 parity flipped")
    result = check_release(tree, [_batch()])
    assert result.wrong == ("HIP DSV4AttnMetadata.c2_out_loc row 0: SGLang -1, the truth 514",)


@needs_triton
def test_a_tree_without_the_kernel_file_names_where_it_looked():
    tree = release_or_skip("0.5.23")
    without = locate.EditedTree(root=tree.root, origin=tree.origin, path=KERNEL_FILES[0], text=None, name="no kernel")
    with pytest.raises(BindError, match="has no compression metadata kernel"):
        check_release(without)
