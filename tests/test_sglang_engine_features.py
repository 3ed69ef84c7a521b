"""The engine features read from each release (harness/subjects/sglang/engine_features.py),
and the realistic profile of an SGLang subject drawing only those its tree reaches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import find

from conftest import SUITE_RELEASES, edited_release, released_tree
from swafuzz.search.fuzz import fuzz
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import (
    DRAFT_EXTEND, DRAFT_MODEL, DRAFT_MULTISTEP, FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, NON_SWA_LAYERS, PIPELINE_STAGE, features_of, in_mode,
    restriction_terms_of, together,
)
from swafuzz.strategies.restrictions import scenarios_without
from swafuzz.strategies.scenarios import ADVERSARIAL, REALISTIC, weakest_profile
from swafuzz.subjects.sglang import engine_features
from swafuzz.subjects.sglang.reachability import POOL_CACHE_RELEASES, question, route_problems
from swafuzz.subjects.sglang.switches import REQUEST_WINDOW_SWITCH, settings_for, settings_of

EVERY_LAYER_STORES = {NON_SWA_LAYERS, FIRST_SWA_LAYER_NOT_START}
NOT_IN_EXTEND = {in_mode(MICRO_BATCHES, mode) for mode in ("decode", "verify", "draft", "draft_extend", "idle")}
STAGED_OVERLAP = together(MICRO_BATCHES, PIPELINE_STAGE)
# what each release of the suite never takes, as read from its files: no two-batch overlap
# before 0.5.15, then prefill-only overlap on a single stage; every layer stores SWA keys
UNREACHED = {
    "0.5.12": {MICRO_BATCHES, *EVERY_LAYER_STORES},
    "0.5.12.post1": {MICRO_BATCHES, *EVERY_LAYER_STORES},
    "0.5.17": {*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES},
    "0.5.19": {*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES},
    "0.5.20": {*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES},
    "0.5.22": {*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES},
    "0.5.23": {*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES},
}


def _tree(version: str):
    tree = released_tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    return tree


@pytest.mark.parametrize("version", SUITE_RELEASES)
def test_each_release_reaches_the_engine_features_its_files_say(version):
    readings = engine_features.read(_tree(version), settings_for(version))
    assert frozenset().union(*(r.unreached for r in readings)) == UNREACHED[version]
    for reading in readings:
        assert reading.unconfirmed or ".py" in reading.where, reading.describe()


# the releases whose matrix routes read the model for these two problems (later ones have no pool cache)
MODEL_ROUTED = [v for v in SUITE_RELEASES if v in POOL_CACHE_RELEASES]


@pytest.mark.parametrize("version", MODEL_ROUTED)
@pytest.mark.parametrize("key,terms", [("pool-cache-two-batch-overlap", {MICRO_BATCHES}),
                                       ("pool-cache-first-swa-layer", {FIRST_SWA_LAYER_NOT_START})])
def test_the_readings_agree_with_the_matrix_on_two_batch_overlap_and_hybrid_layers(version, key, terms):
    # the matrix judges these problems not reached on a route through the model that has no
    # two-batch overlap and stores SWA keys in every layer: the reading excludes the feature
    tree = _tree(version)
    route = question(key).routes_for(version)[0]
    assert not route.reached and not route_problems(tree, route)
    assert terms <= engine_features.unreached(tree, settings_for(version))


def _merge(version: str, **switches: bool):
    readings = engine_features.read(_tree(version), settings_for(version, switches))
    return next(r for r in readings if r.feature.startswith("metadata merge"))


BACKEND = "layers/attention/deepseek_v4_backend.py:DeepseekV4AttnBackend"
MERGED = ("decode and idle replays: init_forward_metadata_decode builds the decode_or_idle bucket's metadata outside "
          "the graph ({}) and replay_cuda_graph_metadata_from merges it with copy_ into the captured metadata")
RAW = "raw inputs only, from which the graph rebuilds the rest"


def test_before_0_5_18_the_decode_bucket_merges_the_metadata_itself_only_with_in_graph_preparation_off():
    off = _merge("0.5.17", SGLANG_PREP_IN_CUDA_GRAPH=False)
    assert off.unconfirmed is None and off.unreached == frozenset()
    assert off.says.startswith(MERGED.format("the metadata itself") + "; verify replays: ")
    assert off.where.startswith(
        f"{BACKEND}.init_forward_metadata_out_graph line 1335; {BACKEND}.replay_cuda_graph_metadata_from line 1542; "
        "model_executor/runner/decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch line 1168; "
        f"{BACKEND}.init_forward_metadata_out_graph line 1239; {BACKEND}.init_forward_metadata_decode line 702; ")
    assert _merge("0.5.17").says.startswith(MERGED.format(RAW) + "; ")


def test_from_0_5_18_the_decode_bucket_merges_raw_inputs_only_and_0_5_12_prepares_in_the_older_runner():
    raw = _merge("0.5.18")
    assert raw.says.startswith(MERGED.format(RAW) + "; ") and raw.unreached == frozenset()
    assert f"{BACKEND}.init_forward_metadata_decode line 693" in raw.where
    old = _merge("0.5.12", SGLANG_PREP_IN_CUDA_GRAPH=False)
    assert old.says.startswith(MERGED.format("the metadata itself") + "; ")
    assert old.where.startswith(
        f"{BACKEND}.init_forward_metadata_replay_cuda_graph line 867; {BACKEND}.replay_cuda_graph_metadata_from "
        "line 882; model_executor/cuda_graph_runner.py:CudaGraphRunner.replay_prepare line 1297; "
        f"{BACKEND}.init_forward_metadata_replay_cuda_graph line 832; {BACKEND}.init_forward_metadata_decode line 430")


VERIFY_MERGED = ("verify replays: init_forward_metadata_target_verify builds the target_verify bucket's metadata "
                 "outside the graph ({}) and replay_cuda_graph_metadata_from merges it with copy_ into the captured "
                 "metadata; draft_block replays: init_forward_metadata_dspark_draft_block builds the target_verify "
                 "bucket's metadata for the DSpark draft outside the graph (the metadata itself) and "
                 "replay_cuda_graph_metadata_from merges it with copy_ into the captured metadata")


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_a_dspark_draft_block_replays_the_target_verify_bucket_its_own_branch_of_the_replay_prep_builds(version):
    merge = _merge(version)
    assert merge.says.endswith("; " + VERIFY_MERGED.format(RAW)), merge.says
    assert f"{BACKEND}.init_forward_metadata_dspark_draft_block line " in merge.where
    graphs = next(r for r in engine_features.read(_tree(version), settings_for(version))
                  if r.feature.startswith("graph capture"))
    assert graphs.says == "a graph bucket for decode, verify, draft_block, idle forwards"


@pytest.mark.parametrize("version", SUITE_RELEASES)
def test_every_release_of_the_suite_merges_decode_and_idle_replays_as_the_matrix_draws_them(version):
    # the matrix draws graph replays of decode and idle for every release: the reading excludes neither
    merge = _merge(version)
    assert merge.unconfirmed is None and merge.unreached == frozenset(), merge.describe()


def test_the_realistic_profile_of_0_5_12_post1_has_no_two_batch_overlap():
    import swafuzz.subjects.sglang as sglang

    _tree("0.5.12.post1")
    info = sglang.resolve("sglang:pool-fused-store@0.5.12.post1")
    assert {MICRO_BATCHES, FIRST_SWA_LAYER_NOT_START} <= info.subject.realistic_exclusions
    assert weakest_profile(EXAMPLES["two-batch-overlap"], info.subject.realistic_exclusions) == ADVERSARIAL
    result = fuzz(info, profile=REALISTIC, settings="ci", max_examples=200, seed=0)
    assert result.coverage.get(MICRO_BATCHES, 0) == 0
    found = result.divergence
    assert found is None or MICRO_BATCHES not in features_of(result.scenario), found.sentence


RESTRICTED = frozenset({*NOT_IN_EXTEND, STAGED_OVERLAP, *EVERY_LAYER_STORES, DRAFT_EXTEND})


@settings(max_examples=200, deadline=None, database=None)
@given(scenarios_without(REALISTIC, RESTRICTED))
def test_a_restricted_profile_draws_its_restriction_without_rejecting_draws(scenario):
    assert not restriction_terms_of(scenario) & RESTRICTED
    assert weakest_profile(scenario, RESTRICTED) == REALISTIC


def test_a_restricted_profile_still_draws_two_micro_batches_in_extend_on_a_single_stage():
    found = find(scenarios_without(REALISTIC, RESTRICTED), lambda s: MICRO_BATCHES in features_of(s),
                 settings=settings(database=None, derandomize=True, max_examples=2000))
    assert found.config.start_layer == 0
    assert all(e.mode == "extend" for e in found.events if e.op == "forward" and e.micro_batches > 1)


def _refusals(tree, window: bool):
    readings = engine_features.read(tree, settings_of(tree, {REQUEST_WINDOW_SWITCH: window}))
    return next(reading for reading in readings if reading.feature.startswith("features DeepSeek-V4.1 refuses"))


def test_under_the_request_window_the_profile_draws_nothing_deepseek_v4_1_refuses():
    tree = _tree("0.5.23")
    refusals = _refusals(tree, window=True)
    assert refusals.unreached == {DRAFT_MODEL, DRAFT_EXTEND, DRAFT_MULTISTEP, MICRO_BATCHES, PIPELINE_STAGE}
    assert refusals.says == ("under --enable-encoder-swa-bounded-replay DeepSeek-V4.1 refuses speculative decoding "
                             "other than DSpark, two-batch overlap, pipeline parallelism")
    assert refusals.where.startswith("arg_groups/deepseek_v4_hook.py:validate_deepseek_v41_features line ")
    assert refusals.unreached <= engine_features.unreached(tree, settings_of(tree, {REQUEST_WINDOW_SWITCH: True}))
    assert not _refusals(tree, window=False).unreached


def test_a_tree_that_stops_refusing_two_batch_overlap_under_the_window_has_it_drawn():
    _tree("0.5.23")
    refusal = '        ("two-batch overlap", cfg.enable_two_batch_overlap),\n'
    tree = edited_release("0.5.23", engine_features.V41_VALIDATION_FILE, refusal, "", "overlap allowed")
    refusals = _refusals(tree, window=True)
    assert MICRO_BATCHES not in refusals.unreached and PIPELINE_STAGE in refusals.unreached
