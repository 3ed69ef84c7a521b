"""Specifications of the mutants of SGLang targets: they are made from the functions a
target binds, each one the tree with one edit in that function's file, bound again the
ordinary way; an edit the binding refuses is not runnable, and so is one that reaches code
swafuzz does not model. The trees are released wheels (downloaded on first use); no SGLang
code is kept in this repository."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import released_tree

from swafuzz.tools import mutate as mutation
from swafuzz.cli import main
from swafuzz.run.executor import run_scenario
from swafuzz.tools.mutate import KILLED_STATUS, NOT_RUNNABLE, PASSES, derive_tree_mutants, examine, mutate
from swafuzz.subjects.registry import resolve_subject
from swafuzz.subjects.sglang import locate
from swafuzz.subjects.sglang.targets import POOL_FILE, target
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES

VERSION = "0.5.12.post1"  # the last release with the pool's inline cache, on by default
POOL_TARGET = f"sglang:pool-fused-store@{VERSION}"
# the pool cache is right where its release runs it: every stage's first layer stores SWA
# keys, and no micro-batches interleave (harness/subjects/sglang/reachability.py: not reached)
POOL_SCOPE = {"profiles": ("realistic",), "exclude": frozenset({FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES})}
# a search here is bounded by its examples, seeded, so it finds the same on a busy machine as
# on an idle one; its time budget is only a net that no run comes near
NEVER_BINDS_S = 600.0


@pytest.fixture(scope="module")
def release():
    tree = released_tree(VERSION)
    if isinstance(tree, str):
        pytest.skip(tree)
    return tree


def _mutants(spec: str = POOL_TARGET, operators: tuple[str, ...] | None = None):
    info = resolve_subject(spec)
    return info, {m.id: m for m in derive_tree_mutants(spec, info.subject.binding, operators)}


@pytest.mark.quick
def test_an_sglang_targets_mutants_are_made_from_the_functions_its_binding_runs(release):
    info, mutants = _mutants()
    bound = info.subject.binding.classes["DeepSeekV4TokenToKVPool"].methods
    assert mutants and {m.qualname for m in mutants.values()} <= {f"DeepSeekV4TokenToKVPool.{name}" for name in bound}
    assert all(m.path == POOL_FILE and m.tree_subject == POOL_TARGET for m in mutants.values())
    reset = mutants["drop-reset/DeepSeekV4TokenToKVPool.register_mapping/1"]
    assert reset.diff.startswith(f"--- {POOL_FILE}\n+++ {POOL_FILE} (drop-reset/")
    assert "-        self.cached_loc = None" in reset.diff and "+        pass" in reset.diff


@pytest.mark.quick
def test_a_tree_mutant_is_bound_from_the_tree_with_its_one_edit_and_the_release_is_left_as_it_was(release):
    info, mutants = _mutants(operators=("layer-bound",))
    stage = EXAMPLES["pipeline-stage"]  # a stage that starts past layer 0
    refreshed_at_layer_0 = next(m for m in mutants.values() if "replaced by layer 0" in m.description)
    mutated = mutation.tree_mutant_subject(refreshed_at_layer_0)
    assert not run_scenario(mutated, stage).passed
    assert run_scenario(info.subject, stage).passed
    assert run_scenario(resolve_subject(POOL_TARGET).subject, stage).passed  # the wheel is unchanged


@pytest.mark.quick
def test_a_tree_mutant_the_binding_refuses_is_not_runnable_with_the_bindings_reason(release):
    info, mutants = _mutants(operators=("layer-bound",))
    unbound = next(m for m in mutants.values() if "`first_swa_layer`" in m.description)
    outcome = examine(info.subject, unbound, budget_s=1, seed=0, **POOL_SCOPE)
    assert outcome.status == NOT_RUNNABLE
    assert outcome.sentence.startswith("it does not bind: ") and "self.first_swa_layer" in outcome.sentence


def test_a_mutant_that_reaches_code_swafuzz_does_not_model_is_not_runnable_never_killed(release):
    info, mutants = _mutants(operators=("drop-guard",))
    mutant = mutants["drop-guard/DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused/1"]
    assert "`self._should_cache_swa` dropped" in mutant.description
    # the same place made to read, as it runs, a pool attribute the stand-in does not model
    gap = mutation.dataclasses.replace(mutant, replacement='getattr(self, "unmodelled_switch_of_the_pool")')
    outcome = examine(info.subject, gap, budget_s=NEVER_BINDS_S, seed=0, max_examples=10, **POOL_SCOPE)
    assert outcome.status == NOT_RUNNABLE, outcome
    assert outcome.sentence.startswith("it reaches code swafuzz does not model")
    assert "unmodelled_switch_of_the_pool" in outcome.sentence


def test_mutate_on_a_release_kills_its_mutants_within_the_scope_the_release_is_right_on(release):
    report = mutate(POOL_TARGET, budget_s=NEVER_BINDS_S, max_examples=10, isolated=False,
                    operators=("layer-bound", "swap-arguments"), **POOL_SCOPE)
    assert report.baseline.status == PASSES, report.baseline
    statuses = {o.mutant.id: o.status for o in report.outcomes}
    assert NOT_RUNNABLE in statuses.values() and KILLED_STATUS in statuses.values()
    assert all(o.profile == "realistic" for o in report.outcomes if o.status == KILLED_STATUS)
    data = report.to_dict()
    assert data["profiles"] == ["realistic"] and data["exclude"] == sorted(POOL_SCOPE["exclude"])
    assert "realistic; never drawing first_swa_layer_not_start, micro_batches" in report.markdown()


def test_mutate_on_a_checkout_named_by_sglang_source_mutates_that_tree(release, tmp_path, capsys):
    root = tmp_path / "checkout"
    for path in (POOL_FILE, *locate.VERSION_FILES, "sglang/__init__.py"):
        text = release.read(path)
        if text is not None or path == "sglang/__init__.py":
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text or "")
    code = main(["mutate", "--subject", "sglang:pool-fused-store", "--sglang-source", str(root),
                 "--profile", "realistic", "--exclude", FIRST_SWA_LAYER_NOT_START, "--exclude", MICRO_BATCHES,
                 "--operator", "layer-bound", "--budget", "600", "--max-examples", "10",
                 "--report-dir", str(tmp_path / "reports"), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["unmutated"]["status"] == PASSES and printed["killed"] >= 1
    assert {m["path"] for m in printed["mutants"]} == {POOL_FILE}
    assert code == (0 if printed["survived"] == 0 else 1)
    shutil.rmtree(root)  # nothing the mutants need is left behind in it: each was bound from its own copy


@pytest.mark.quick
def test_the_reviewed_equivalents_of_sglang_targets_name_only_mutants_that_exist():
    lists = json.loads(mutation.BUILTIN_EQUIVALENTS.read_text())
    for subject, listed in lists.items():
        if not subject.startswith("sglang:"):
            continue
        tree = released_tree(subject.partition("@")[2])
        if isinstance(tree, str):
            pytest.skip(tree)
        ids = set(_mutants(subject)[1])
        assert set(listed) <= ids, (subject, set(listed) - ids)
        assert all(reason.strip() for reason in listed.values())


@pytest.mark.quick
def test_the_mutants_suite_searches_each_release_only_where_its_code_never_goes_unread():
    from swafuzz.tools.bench import MUTATED_TARGETS
    from swafuzz.subjects.sglang.reachability import question

    for item in MUTATED_TARGETS:
        target(item.subject.partition("@")[0])  # a target that exists
        assert item.version in locate.RELEASES
        for feature, key in item.excluded:
            verdict, routes = question(key).verdict(item.version)
            assert verdict == "not reached" and routes, (item.subject, feature, verdict)
        assert all(reason.split(":")[0] in {f for f, _ in item.excluded} for reason in item.reasons())


@pytest.mark.quick
def test_a_tree_mutant_reads_its_call_sites_from_the_whole_tree_as_the_unmutated_target_does():
    # a mutant bound from the bound files alone would read no call site, keep every mode,
    # and be "killed" in a mode the release never calls the target in
    if isinstance(tree := released_tree("0.5.23"), str):
        pytest.skip(tree)
    info, mutants = _mutants("sglang:hip-unified-swa-loc@0.5.23", operators=("drop-reset",))
    mutant = next(m for m in mutants.values() if m.qualname.endswith("._attach_unified_kv_decode_streams"))
    mutated = mutation.tree_mutant_subject(mutant)
    assert info.subject.call_sites.to_dict() == mutated.call_sites.to_dict()
    assert "unconfirmed" not in mutated.call_sites.describe()


HIP_TARGET = "sglang:hip-unified-swa-loc@0.5.23"


@pytest.fixture(scope="module")
def hip_mutants():
    if isinstance(tree := released_tree("0.5.23"), str):
        pytest.skip(tree)
    return _mutants(HIP_TARGET)


@pytest.mark.quick
def test_a_tree_function_the_binding_replaces_with_a_stand_in_is_not_mutated(hip_mutants):
    # _grouped_asm_enabled is swafuzz's stand-in there: an edit of the tree's would never run
    info, mutants = hip_mutants
    functions = {m.qualname for m in mutants.values()}
    assert "_grouped_asm_enabled" not in functions
    assert "DeepseekV4HipRadixBackend._attach_unified_kv_decode_streams" in functions


@pytest.mark.quick
def test_edits_of_the_hip_producers_read_streams_are_never_read_and_of_its_ring_rows_are_read(hip_mutants):
    _, mutants = hip_mutants
    producer = [m for m in mutants.values() if m.function == "_attach_unified_kv_decode_streams"]
    streams = [m for m in producer if "build_decode_streams" in m.description]
    assert streams and all(m.never_read and "core.unified.swa_indices" in m.never_read for m in streams)
    ring_rows = [m for m in producer if m.operator == "off-by-one" and "unified_swa_ring_size" in m.description]
    assert ring_rows and not any(m.never_read for m in ring_rows)
    assert not any(m.never_read for m in mutants.values() if m.function == "get_unified_swa_loc")


def test_a_kernel_call_the_stand_ins_do_not_model_is_not_runnable_never_killed(hip_mutants):
    # entering the grouped fp8 verify branch calls runtime.build_grouped_verify_streams
    info, mutants = hip_mutants
    mutant = next(m for m in mutants.values() if m.operator == "negate-guard"
                  and "self.is_dspark and num_reqs and is_unified_kv_fp8()" in m.description)
    outcome = examine(info.subject, mutant, budget_s=NEVER_BINDS_S, seed=0, max_examples=10, profiles=("realistic",))
    assert outcome.status == NOT_RUNNABLE, outcome
    assert "runtime.build_grouped_verify_streams" in outcome.sentence
