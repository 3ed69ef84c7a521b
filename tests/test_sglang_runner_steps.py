"""The graph runner's metadata steps keep the SWA store rows at the captured address.

Before a CUDA graph replays, SGLang carries freshly built metadata into the captured
objects (``copy_`` for a full replay, ``refresh_for_breakable_cuda_graph_replay_`` for a
breakable one). A store inside the graph reads its rows by address, so a store-row field
must end with the new rows in the captured tensor unless the recorded graph refills it, and
a full replay's merge must do the same for every compressed-KV field the layers read.
Each release's steps (the table ``STEPS``, bound in source mode with SGLang's own
``copy_metadata``) run on CPU tensors with distinct rows. Releases:
``$SWAFUZZ_SGLANG_TEST_VERSIONS`` and any already in the wheel cache.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import textwrap

import pytest
from conftest import release_or_skip

from swafuzz.subjects.sglang import locate, tree_checks
from swafuzz.subjects.sglang.binding import BindError
from swafuzz.subjects.sglang.real_classes import attributes
from swafuzz.subjects.sglang.runner_steps import (
    ATTN_METADATA,
    COMPRESSED,
    EARLY_VERIFY_INSTALL,
    GRAPH_REPLAY,
    MERGE,
    REFRESH,
    STEPS,
    UNBOUND,
    UNIFIED_METADATA,
    BoundStep,
    EarlyVerifyBackend,
    GraphReplayBackend,
    Step,
    SwaTranslatingPool,
    bind_steps,
    check_early_verify_install,
    check_graph_replay,
    check_step,
    describe,
    function_releases,
)
from swafuzz.subjects.sglang.targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE

TEST_VERSIONS_ENV = "SWAFUZZ_SGLANG_TEST_VERSIONS"
REQUESTED = tuple(
    v.strip() for v in os.environ.get(TEST_VERSIONS_ENV, "0.5.12,0.5.19,0.5.20,0.5.23").split(",") if v.strip()
)
CHECKED = tuple(v for v in locate.RELEASES if v in REQUESTED)


@functools.lru_cache(maxsize=None)
def tree(version: str) -> locate.SourceTree:
    try:
        return locate.wheel(version)
    except locate.SglangUnavailable as exc:
        pytest.skip(str(exc))


@functools.lru_cache(maxsize=None)
def steps_of(version: str):
    return bind_steps(tree(version))


def _class_defines(source: str, class_name: str, method: str) -> bool:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return any(isinstance(n, ast.FunctionDef) and n.name == method for n in node.body)
    return False


# ---- the check itself, on metadata classes written here ---------------------------------------


UNIFIED_STEP = Step("HIP", HIP_BACKEND_FILE, "unused", UNIFIED_METADATA, REFRESH,
                    ("swa_loc", "verify_store_state_slot", "pf_state_slot"))


def _written_step(method_body: str, recomputed: frozenset[str] = frozenset()) -> BoundStep:
    """A unified-record step whose method is ``method_body`` (``self`` and ``other``)."""
    namespace: dict = {}
    exec("def step(self, other):\n" + textwrap.indent(method_body, "    "), namespace)
    fields = {"swa_loc": "torch.Tensor", "verify_store_state_slot": "torch.Tensor",
              "pf_state_slot": "torch.Tensor", "swa_indptr": "torch.Tensor", "num_pages": "int"}
    cls = dataclasses.make_dataclass(UNIFIED_METADATA, list(fields))
    return BoundStep(UNIFIED_STEP, None, cls, namespace["step"], fields, recomputed)


IN_PLACE = """
for name in ("swa_loc", "verify_store_state_slot", "pf_state_slot", "swa_indptr"):
    getattr(self, name).copy_(getattr(other, name))
"""


def test_a_step_that_copies_every_store_row_in_place_has_no_finding():
    report = check_step(_written_step(IN_PLACE))
    assert report.findings == ()
    assert set(report.copied) == {"swa_loc", "verify_store_state_slot", "pf_state_slot", "swa_indptr"}


def test_a_step_that_reference_assigns_a_store_row_leaves_the_captured_graph_stale_rows():
    report = check_step(_written_step(IN_PLACE + "\nself.swa_loc = other.swa_loc\n"))
    assert report.assigned == ("swa_loc",)
    assert report.findings == ("swa_loc is reference-assigned: the captured graph keeps the previous rows",)


def test_a_step_that_skips_a_store_row_leaves_the_captured_graph_stale_rows():
    skipping = IN_PLACE.replace('"pf_state_slot", ', "")
    report = check_step(_written_step(skipping))
    assert report.untouched == ("pf_state_slot",)
    assert report.findings == ("pf_state_slot is left untouched: the captured graph keeps the previous rows",)


def test_a_store_row_the_graph_refills_may_be_reassigned_by_the_step():
    assigning = IN_PLACE + "\nself.swa_loc = other.swa_loc\n"
    assert check_step(_written_step(assigning, recomputed=frozenset({"swa_loc"}))).findings == ()


def test_a_field_that_is_no_store_row_is_classified_but_never_a_finding():
    report = check_step(_written_step(IN_PLACE + "\nself.swa_indptr = other.swa_indptr\n"))
    assert report.assigned == ("swa_indptr",) and report.findings == ()


# ---- the releases ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", CHECKED)
def test_every_step_a_release_defines_binds_and_runs(version):
    found, absent = steps_of(version)
    bound = {b.step.name for b in found}
    for step in STEPS:
        source = tree(version).read(step.path)
        defined = source is not None and _class_defines(source, step.class_name, step.method)
        assert (step.name in bound) == defined, absent.get(step.name)
    for step in found:
        check_step(step)  # raises if SGLang's code cannot run on the rebuilt class


@pytest.mark.parametrize("version", CHECKED)
def test_the_breakable_graph_refresh_leaves_no_swa_store_row_stale(version):
    refreshes = [b for b in steps_of(version)[0] if b.step.method == REFRESH]
    if not refreshes:
        pytest.skip(f"sglang {version} has no breakable-graph refresh")
    for bound in refreshes:
        assert check_step(bound).findings == (), bound.step.name


@pytest.mark.parametrize("version", CHECKED)
def test_the_cuda_in_graph_init_refills_swa_out_cache_loc_where_the_field_exists(version):
    for bound in steps_of(version)[0]:
        if bound.step.class_name == ATTN_METADATA and "swa_out_cache_loc" in bound.fields:
            assert "swa_out_cache_loc" in bound.recomputed_in_graph, bound.step.name


def test_the_hip_unified_copy_is_found_assigning_swa_loc_until_0_5_20_copies_it_in_place():
    for version in ("0.5.19", "0.5.20"):
        if version not in CHECKED:
            pytest.skip(f"sglang {version} is not among the checked releases")
    merges = {
        version: next(b for b in steps_of(version)[0]
                      if b.step.backend == "HIP" and b.step.class_name == UNIFIED_METADATA and b.step.method == MERGE)
        for version in ("0.5.19", "0.5.20")
    }
    assert check_step(merges["0.5.19"]).findings == (
        "swa_loc is reference-assigned: the captured graph keeps the previous rows",)
    assert check_step(merges["0.5.20"]).findings == ()


@pytest.mark.parametrize("unbound", UNBOUND, ids=lambda u: u.function)
def test_each_unbound_step_exists_from_the_release_cited(unbound):
    trees = {v: tree(v) for v in CHECKED}
    having = function_releases(trees, unbound.path, unbound.function)
    later = [v for v in CHECKED if locate.release_key(v) >= locate.release_key(unbound.first_release)]
    assert having == tuple(later)



# ---- the early target-verify install (0.5.23+) ---------------------------------------------------


# A backend file and metadata helpers written here, in the shape the install check binds: a
# merge that reassigns the SWA rows, and an install that either restores the captured
# tensor (as a graph needs) or keeps the merge's reassignment.
WRITTEN_HELPERS = '''
def copy_metadata(*, src, dst, check_eq_fields, copy_fields, assign_fields=None):
    for name in copy_fields:
        if getattr(dst, name) is not None:
            getattr(dst, name).copy_(getattr(src, name))
    for name in assign_fields or []:
        setattr(dst, name, getattr(src, name))


def maybe_copy_inplace(dst, *, src):
    if dst is not None:
        dst.copy_(src)
'''
WRITTEN_BACKEND = '''
class DSV4AttnMetadata:
    raw_out_loc: torch.Tensor
    swa_out_cache_loc: torch.Tensor

    def copy_(self, other):
        copy_metadata(src=other, dst=self, check_eq_fields=[], copy_fields=["raw_out_loc"],
                      assign_fields=["swa_out_cache_loc"])


class DSV4Metadata:
    core_attn_metadata: DSV4AttnMetadata

    def copy_(self, other):
        self.core_attn_metadata.copy_(other.core_attn_metadata)


class DeepseekV4AttnBackend:
    def _install_early_verify_metadata(self, *, graph_key, raw_metadata, out_cache_loc):
        metadata = self.make_forward_metadata_from_raw_verify(raw_metadata=raw_metadata)
        rows = self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc).to(torch.int32)
        captured = self.cuda_graph_metadata_of_bucket_and_bs[_GraphBucket.TARGET_VERIFY][(graph_key, "early")]
        kept = captured.core_attn_metadata.swa_out_cache_loc
        captured.copy_(metadata)
        RESTORE
        self.forward_metadata = captured

    def replay_cuda_graph_metadata_from(self, bs, temp_metadata, bucket):
        chosen = self.cuda_graph_metadata_of_bucket_and_bs[bucket][bs]
        chosen.copy_(temp_metadata)
        self.forward_metadata = INSTALLED
'''


def _written_tree(tmp_path, restore: str = "pass", installed: str = "chosen") -> locate.SourceTree:
    helpers = tmp_path / "sglang/srt/layers/attention/dsv4/metadata.py"
    helpers.parent.mkdir(parents=True)
    helpers.write_text(WRITTEN_HELPERS)
    backend = tmp_path / "sglang/srt/layers/attention/deepseek_v4_backend.py"
    backend.write_text(WRITTEN_BACKEND.replace("RESTORE", restore).replace("INSTALLED", installed))
    return locate.SourceTree(tmp_path, "checkout")


def test_an_install_that_restores_the_captured_rows_tensor_passes(tmp_path):
    restore = "kept.copy_(rows)\n        captured.core_attn_metadata.swa_out_cache_loc = kept"
    report = check_early_verify_install(_written_tree(tmp_path, restore))
    assert report.kept_address and report.rows_match and report.installed_captured


def test_an_install_that_keeps_the_merges_reassignment_is_found_off_the_captured_address(tmp_path):
    report = check_early_verify_install(_written_tree(tmp_path, "pass"))
    assert not report.kept_address and not report.rows_match


@pytest.mark.parametrize("version", CHECKED)
def test_the_early_verify_install_leaves_the_new_swa_rows_at_the_captured_address(version):
    source = tree(version).read(CUDA_BACKEND_FILE) or ""
    if not _class_defines(source, CUDA_BACKEND, EARLY_VERIFY_INSTALL):
        with pytest.raises(BindError, match=EARLY_VERIFY_INSTALL):
            check_early_verify_install(tree(version))
        return
    report = check_early_verify_install(tree(version))
    assert report.kept_address and report.rows_match and report.installed_captured


@pytest.mark.parametrize("version", CHECKED)
def test_the_early_verify_stand_ins_carry_only_attributes_of_the_classes_they_replace(version):
    if not _class_defines(tree(version).read(CUDA_BACKEND_FILE) or "", CUDA_BACKEND, EARLY_VERIFY_INSTALL):
        pytest.skip(f"sglang {version} has no {EARLY_VERIFY_INSTALL}")
    for stand_in in (EarlyVerifyBackend, SwaTranslatingPool):
        extra = stand_in.attributes - attributes(tree(version), stand_in.replaces)
        assert not extra, f"{stand_in.__name__} has {sorted(extra)}"


@pytest.mark.parametrize("version", CHECKED)
def test_the_description_names_every_step_once_with_its_verdict_or_why_it_is_absent(version):
    lines = describe(tree(version))
    for step in STEPS:
        (line,) = [line for line in lines if line.startswith(f"{step.name}: ")]
        assert "absent (" in line or "store rows at the captured address" in line or "keeps the previous rows" in line



# ---- the full graph replay's merge -------------------------------------------------------------


def test_a_replay_whose_merge_reassigns_rows_nothing_refills_is_found(tmp_path):
    report, installed_captured = check_graph_replay(_written_tree(tmp_path), "CUDA")
    assert installed_captured
    assert report.findings == ("swa_out_cache_loc is reference-assigned: the captured graph keeps the previous rows",)


def test_a_replay_that_installs_the_fresh_metadata_instead_of_the_captured_one_is_found(tmp_path):
    _, installed_captured = check_graph_replay(_written_tree(tmp_path, installed="temp_metadata"), "CUDA")
    assert not installed_captured


@pytest.mark.parametrize("version", CHECKED)
@pytest.mark.parametrize("backend,path,backend_class", [
    ("CUDA", CUDA_BACKEND_FILE, CUDA_BACKEND), ("HIP", HIP_BACKEND_FILE, HIP_BACKEND),
])
def test_the_graph_replay_runs_on_the_captured_metadata_with_its_swa_rows_refilled_in_graph(
        version, backend, path, backend_class):
    if not _class_defines(tree(version).read(path) or "", backend_class, GRAPH_REPLAY):
        pytest.skip(f"sglang {version} has no {backend} {GRAPH_REPLAY}")
    report, installed_captured = check_graph_replay(tree(version), backend)
    assert installed_captured and report.findings == ()
    extra = GraphReplayBackend.attributes - attributes(tree(version), GraphReplayBackend.replaces)
    assert not extra, f"{GraphReplayBackend.__name__} has {sorted(extra)}"


# ---- the merge's compressed-KV fields ----------------------------------------------------------


COMPRESSED_MERGE = Step("CUDA", CUDA_BACKEND_FILE, "unused", ATTN_METADATA, MERGE, ("swa_out_cache_loc",),
                        ("c4_out_loc", "c128_out_loc", "page_table"))


def _written_merge(method_body: str) -> BoundStep:
    namespace: dict = {}
    exec("def step(self, other):\n" + textwrap.indent(method_body, "    "), namespace)
    fields = {name: "torch.Tensor" for name in ("swa_out_cache_loc", "c4_out_loc", "c128_out_loc", "page_table")}
    return BoundStep(COMPRESSED_MERGE, None, dataclasses.make_dataclass(ATTN_METADATA, list(fields)),
                     namespace["step"], fields, frozenset())


COPY_ALL = """
for name in ("swa_out_cache_loc", "c4_out_loc", "c128_out_loc", "page_table"):
    getattr(self, name).copy_(getattr(other, name))
"""


def test_a_merge_that_copies_every_compressed_field_in_place_has_no_compressed_finding():
    assert check_step(_written_merge(COPY_ALL)).compressed_findings == ()


def test_a_merge_that_repoints_or_skips_a_compressed_field_is_found_naming_it():
    report = check_step(_written_merge(COPY_ALL.replace('"page_table"', "") + "self.c4_out_loc = other.c4_out_loc\n"))
    assert report.findings == ()  # the SWA store rows are copied
    assert report.compressed_findings == (
        "c4_out_loc is re-pointed to the replayed forward's tensor, not copied into the captured one: "
        "the captured kernels read the previous replay's values",
        "page_table is left out of the merge: the captured tensor keeps the previous replay's values",
    )


def test_the_breakable_refresh_is_not_judged_for_compressed_fields():
    # the same re-pointing that a full replay's merge is found for
    repointing = COPY_ALL + "self.c4_out_loc = other.c4_out_loc\n"
    assert check_step(_written_merge(repointing)).compressed_findings != ()
    refresh = dataclasses.replace(_written_merge(repointing), step=dataclasses.replace(COMPRESSED_MERGE, method=REFRESH))
    assert check_step(refresh).compressed_findings == ()


def _compressed_verdicts(tree) -> dict[str, tree_checks.TreeCheck]:
    return {c.name: c for c in tree_checks.check_runner_steps(tree) if c.name.endswith(f"({COMPRESSED})")}


@pytest.mark.parametrize("version, hip_unified", [("0.5.13", False), ("0.5.23", True)])
def test_each_release_merge_copies_every_compressed_field_in_place(version, hip_unified):
    # 0.5.13's HIP backend has no unified record yet
    found = _compressed_verdicts(release_or_skip(version))
    assert list(found) == [f"CUDA {ATTN_METADATA}.copy_ ({COMPRESSED})", f"HIP {ATTN_METADATA}.copy_ ({COMPRESSED})",
                           f"HIP {UNIFIED_METADATA}.copy_ ({COMPRESSED})"]
    outcomes = [c.outcome for c in found.values()]
    assert outcomes == [tree_checks.RIGHT, tree_checks.RIGHT, tree_checks.RIGHT if hip_unified else tree_checks.ABSENT]
    cuda = found[f"CUDA {ATTN_METADATA}.copy_ ({COMPRESSED})"]
    assert cuda.detail.startswith("judged c4_out_loc, c128_out_loc, ")


# 0.5.23's merges: the CUDA DSV4AttnMetadata.copy_'s write locations in its copy list, the
# start and the end of its assign list; the HIP unified record's copy list and empty assign list
CUDA_COPY_LOCATIONS = '                "c4_out_loc",\n                "c128_out_loc",\n                "page_table",'
CUDA_ASSIGN_START = "            assign_fields=[\n"
CUDA_ASSIGN_END = '                "trtllm_prefill_c128",\n            ],\n        )\n\n    def refresh_for_breakable'
HIP_UNIFIED_COPY = '                "c4_out_loc",\n                "c128_out_loc",\n                # Captured store_cache'
HIP_UNIFIED_ASSIGN = "            assign_fields=[],"


def _edited(path: str, edits: list[tuple[str, str]], name: str) -> locate.SourceTree:
    """0.5.23 with each ``(old, new)`` made in ``path``, where each ``old`` occurs once."""
    release = release_or_skip("0.5.23")
    text = release.read(path)
    for old, new in edits:
        assert text.count(old) == 1, f"sglang 0.5.23's {path} no longer holds the text this edit replaces once"
        text = text.replace(old, new)
    return locate.EditedTree(root=release.root, origin=release.origin, path=path, text=text, name=name)


REPOINTED = "is re-pointed to the replayed forward's tensor, not copied into the captured one"


@pytest.mark.parametrize("path, edits, step, field, finding", [
    # c128_out_loc moved from the copy list to the assign list
    (CUDA_BACKEND_FILE, [(CUDA_COPY_LOCATIONS, CUDA_COPY_LOCATIONS.replace('"c128_out_loc",\n                ', "")),
                         (CUDA_ASSIGN_START, CUDA_ASSIGN_START + '                "c128_out_loc",\n')],
     f"CUDA {ATTN_METADATA}.copy_", "c128_out_loc", REPOINTED),
    # a plain assignment after the merge
    (CUDA_BACKEND_FILE, [(CUDA_ASSIGN_END, CUDA_ASSIGN_END.replace(
        "        )\n\n", "        )\n        self.c128_page_indices = other.c128_page_indices\n\n"))],
     f"CUDA {ATTN_METADATA}.copy_", "c128_page_indices", REPOINTED),
    # dropped from the copy list alone: copy_metadata's own check raises, naming it
    (CUDA_BACKEND_FILE, [(CUDA_COPY_LOCATIONS, CUDA_COPY_LOCATIONS.replace('"c4_out_loc",\n                ', ""))],
     f"CUDA {ATTN_METADATA}.copy_", "c4_out_loc", "the step raised AssertionError: "),
    # the HIP unified record's offset C4 locations moved to its assign list
    (HIP_BACKEND_FILE, [(HIP_UNIFIED_COPY, HIP_UNIFIED_COPY.replace('                "c4_out_loc",\n', "")),
                        (HIP_UNIFIED_ASSIGN, '            assign_fields=["c4_out_loc"],')],
     f"HIP {UNIFIED_METADATA}.copy_", "c4_out_loc", REPOINTED),
])
def test_a_merge_that_leaves_a_compressed_field_off_the_captured_tensor_is_wrong_naming_it(path, edits, step, field,
                                                                                          finding):
    found = _compressed_verdicts(_edited(path, edits, "compressed field off the copy list"))
    edited = found.pop(f"{step} ({COMPRESSED})")
    assert edited.outcome == tree_checks.WRONG
    assert finding in edited.detail and field in edited.detail, edited.detail
    # the other merges are untouched by the edit
    assert {c.outcome for c in found.values()} == {tree_checks.RIGHT}
