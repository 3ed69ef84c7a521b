"""Real SGLang code as subjects: binding, correct lifecycles, and known history.

Tests that need SGLang read released wheels from the wheel cache (scripts/fetch-test-releases
fills it) or the installed package, and skip with the reason when neither is there. The
versions checked default to a few that cover every target and the 0.5.20 fix;
``$SWAFUZZ_SGLANG_TEST_VERSIONS`` (comma-separated) widens them, as ``tox -e
sglang-matrix`` does with the whole matrix. The tests without SGLang write small modules
of their own under a temporary checkout.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import released_tree

import swafuzz.subjects.sglang as sglang
from swafuzz.run.diagnosis import GRAPH_CAPTURE
from swafuzz.run.executor import UnmodelledPath, check_subject, run_scenario
from swafuzz.search.fuzz import fuzz
from swafuzz.results.replay import load_replay
from swafuzz.subjects.sglang import BindError, ImportModeUnavailable, locate
from swafuzz.tools.sglang_matrix import Finding, reachability, render, run_matrix
from swafuzz.subjects.sglang.reachability import releases
from swafuzz.subjects.sglang.targets import TARGETS, target
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import GRAPH_REPLAY

TEST_VERSIONS_ENV = "SWAFUZZ_SGLANG_TEST_VERSIONS"
# the pool-level cache, the last release with assign-listed ring rows, and the newest
DEFAULT_TEST_VERSIONS = ("0.5.12", "0.5.19", "0.5.23")
VERSIONS = tuple(
    v.strip() for v in os.environ.get(TEST_VERSIONS_ENV, ",".join(DEFAULT_TEST_VERSIONS)).split(",") if v.strip()
)
ASSIGN_LISTED = releases("0.5.14", "0.5.19")  # ring rows re-pointed before replay
_version_key = locate.release_key


def _has(item, version: str) -> bool:
    after_first = _version_key(version) >= _version_key(item.first)
    return after_first and (item.last is None or _version_key(version) <= _version_key(item.last))


def _tree(version: str) -> locate.SourceTree:
    """The installed package when it is this version, else the release's wheel."""
    found = released_tree(version)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _released_wheel(wanted=lambda version: True) -> str:
    """A version under test that is read from its wheel (so pinned names can bind it)."""
    installed = locate.installed()
    for version in VERSIONS:
        if wanted(version) and (installed is None or installed.version != version):
            assert _tree(version).origin == "wheel"
            return version
    pytest.skip(f"no wheel-read version fits among {', '.join(VERSIONS)}")


def _info(name: str, version: str):
    return target(name).info(_tree(version), "source", name=f"sglang:{name}@{version}")


# ---- binding follows the releases ----------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("item", TARGETS, ids=lambda t: t.name)
def test_each_target_binds_in_the_releases_that_have_it(item, version):
    tree = _tree(version)
    if _has(item, version):
        info = item.info(tree, "source")
        assert info.kind == "sglang" and info.name == item.subject_name
        check_subject(info.subject)
    else:
        with pytest.raises(BindError, match=r"has no (file|method|class)|does not take 'raw_loc'") as caught:
            item.info(tree, "source")
        assert version in str(caught.value)


# ---- real code on a correct lifecycle matches the reference --------------------------------


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


_SPECULATIVE = {"start_layer": 0, "end_layer": 3, "speculative": True, "num_draft_tokens": 3, "sliding_window": 4}
LIFECYCLES = {
    # admissions, finishes and window eviction change the mapping between forwards
    "decode": _scenario({"start_layer": 0, "end_layer": 3, "sliding_window": 2}, [
        {"op": "admit", "count": 3}, {"op": "forward", "requests": [0, 1, 2]},
        {"op": "forward", "requests": [0, 1, 2]}, {"op": "finish", "request": 1},
        {"op": "admit", "count": 1}, {"op": "forward", "requests": [2, 0, 3]},
        {"op": "forward", "requests": [3]}, {"op": "forward", "requests": [0, 2, 3]},
    ]),
    "pipeline-stage": _scenario({"start_layer": 2, "end_layer": 5}, [
        {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]},
        {"op": "forward", "requests": [1, 0]}, {"op": "forward", "requests": [1]},
    ]),
    "extend": _scenario({"start_layer": 0, "end_layer": 2}, [
        {"op": "admit", "count": 3}, {"op": "forward", "mode": "extend", "requests": [0, 1, 2], "tokens": [3, 1, 2]},
        {"op": "forward", "requests": [0, 1, 2]}, {"op": "forward", "mode": "extend", "requests": [1], "tokens": [2]},
    ]),
    "speculative-decode": _scenario(_SPECULATIVE, [
        {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]},
        {"op": "forward", "mode": "draft", "requests": [0, 1], "steps": 2},
        {"op": "forward", "mode": "verify", "requests": [0, 1]},
        {"op": "forward", "mode": "idle", "skip_init": True, "pad": 1},
        {"op": "forward", "mode": "draft", "requests": [1], "steps": 2},
    ]),
    "speculative-extend": _scenario({**_SPECULATIVE, "draft_model": True}, [
        {"op": "admit", "count": 2}, {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [2, 3]},
        {"op": "forward", "mode": "verify", "requests": [0, 1]},
        {"op": "forward", "mode": "draft_extend", "requests": [0, 1], "tokens": [1, 3]},
        {"op": "forward", "mode": "draft", "requests": [0, 1], "steps": 2},
    ]),
    "graph-replays": _scenario({"start_layer": 0, "end_layer": 3, "graph_batch_sizes": [2, 4]}, [
        {"op": "admit", "count": 3}, {"op": "forward", "requests": [0, 1], "graph": True},
        {"op": "forward", "requests": [1, 0], "graph": True}, {"op": "forward", "requests": [0, 1, 2]},
        {"op": "forward", "requests": [2, 1, 0], "graph": True}, {"op": "forward", "requests": [2], "graph": True},
        {"op": "forward", "mode": "idle", "graph": True, "pad": 2},
        {"op": "forward", "requests": [0, 2], "graph": True},
    ]),
    "two-batch-overlap": _scenario({"start_layer": 0, "end_layer": 3}, [
        {"op": "admit", "count": 4}, {"op": "forward", "requests": [0, 1, 2, 3], "micro_batches": 2},
        {"op": "forward", "requests": [3, 2, 1, 0], "micro_batches": 2},
    ]),
}
_ALL = tuple(LIFECYCLES)
_DECODE_ARM = ("decode", "pipeline-stage", "speculative-decode", "graph-replays", "two-batch-overlap")
CORRECT_LIFECYCLES = {
    # the pool's one cache is shared by micro-batches: two-batch overlap breaks it (see the matrix)
    "pool-fused-store": tuple(n for n in _ALL if n != "two-batch-overlap"),
    "pool-norm-rope-store": tuple(n for n in _ALL if n != "two-batch-overlap"),
    "cuda-swa-out-cache-loc": _ALL,
    "hip-swa-out-cache-loc": _ALL,
    # SGLang's model calls the ring getter on the decode arm only
    "hip-unified-swa-loc": _DECODE_ARM,
    "unified-metadata-merge": _ALL,
}


def _correct_cases():
    for item in TARGETS:
        for version in VERSIONS:
            if not _has(item, version):
                continue
            for lifecycle in CORRECT_LIFECYCLES[item.name]:
                if item.name == "unified-metadata-merge" and lifecycle == "graph-replays" and version in ASSIGN_LISTED:
                    continue  # the historical problem, tested below
                yield pytest.param(item.name, version, lifecycle, id=f"{item.name}-{version}-{lifecycle}")


@pytest.mark.parametrize("name,version,lifecycle", list(_correct_cases()))
def test_real_code_fed_a_correct_lifecycle_matches_the_reference(name, version, lifecycle):
    result = run_scenario(_info(name, version).subject, LIFECYCLES[lifecycle])
    assert result.passed, result.divergence.sentence
    assert result.checks > 0


# ---- the assign-listed ring rows of 0.5.14-0.5.19 ------------------------------------------


@pytest.mark.parametrize("version", [v for v in VERSIONS if _version_key(v) >= _version_key("0.5.14")])
def test_fuzzing_finds_assign_listed_ring_rows_only_before_0_5_20(version):
    result = fuzz(_info("unified-metadata-merge", version), profile="realistic", settings="ci", seed=0)
    if version in ASSIGN_LISTED:
        assert result.divergence is not None and result.divergence.source["kind"] == GRAPH_CAPTURE, (
            result.divergence)
        assert result.weakest_profile == "realistic"
        replayed = run_scenario(_info("unified-metadata-merge", version).subject, result.scenario)
        assert replayed.divergence.sentence == result.divergence.sentence
    else:
        assert result.coverage.get(GRAPH_REPLAY, 0) > 0, "the search never replayed a graph"
        found = result.divergence
        assert found is None or (found.source or {}).get("kind") != GRAPH_CAPTURE, found.sentence
        assert run_scenario(_info("unified-metadata-merge", version).subject, LIFECYCLES["graph-replays"]).passed


# ---- reachability verdicts on real divergences ---------------------------------------------


@pytest.mark.parametrize("name,example,verdict", [
    ("hip-unified-swa-loc", "ragged-extend", "not reached"),
    # the idle-init problem the release's path never reaches, though found by an adversarial scenario
    ("hip-unified-swa-loc", "idle-replay-skips-init", "not reached"),
    ("cuda-swa-out-cache-loc", "in-place-change-mid-forward", "adversarial only"),
])
def test_divergences_are_judged_against_sglangs_lifecycle(name, example, verdict, tmp_path):
    version = next((v for v in VERSIONS if v in ASSIGN_LISTED), None)
    if version is None:
        pytest.skip(f"needs one of {', '.join(ASSIGN_LISTED)} in ${TEST_VERSIONS_ENV}")
    scenario = EXAMPLES[example]
    divergence = run_scenario(_info(name, version).subject, scenario).divergence
    assert divergence is not None
    finding = Finding(version, target(name), "examples", divergence, scenario, tmp_path / "replay.json", example)
    judged, why = reachability(finding)
    assert judged == verdict, why


def _judged_example(name: str, version: str, example: str, tmp_path: Path, judged_as: str | None = None):
    """The verdict on a release's divergence on a hand-written example; ``judged_as`` files
    the same divergence under another release number."""
    scenario = EXAMPLES[example]
    divergence = run_scenario(_info(name, version).subject, scenario).divergence
    assert divergence is not None, f"{name} {version} passes {example}"
    finding = Finding(judged_as or version, target(name), "examples", divergence, scenario,
                      tmp_path / "replay.json", example)
    return reachability(finding)


@pytest.mark.parametrize("version,verdict,cited", [
    # in-graph preparation on by default: the replay merges raw metadata, never UnifiedKvMetadata
    ("0.5.17", "reachable off-default", ("SGLANG_PREP_IN_CUDA_GRAPH=0", "UnifiedKvMetadata.copy_",
                                         "DecodeCudaGraphRunner.load_batch")),
    ("0.5.19", "not reached", ("never takes the path", "always from 0.5.18, the replay merges raw metadata")),
])
def test_assign_listed_ring_rows_are_judged_by_the_replay_path_of_the_release(version, verdict, cited, tmp_path):
    _tree(version)
    judged, why = _judged_example("unified-metadata-merge", version, "graph-replay", tmp_path)
    assert judged == verdict, why
    for hop in cited:
        assert hop in why


@pytest.mark.parametrize("name", ["pool-fused-store", "pool-norm-rope-store"])
def test_a_pool_cache_shared_by_micro_batches_is_not_reached_without_two_batch_overlap(name, tmp_path):
    version = "0.5.12"
    if version not in VERSIONS:
        pytest.skip(f"needs {version} in ${TEST_VERSIONS_ENV}")
    judged, why = _judged_example(name, version, "two-batch-overlap", tmp_path)
    assert judged == "not reached", why
    assert "models/deepseek_v4.py:DeepseekV4Model.forward" in why


def test_a_realistic_divergence_without_a_cited_path_is_never_reachable(tmp_path):
    version = _released_wheel(lambda v: v in ASSIGN_LISTED)
    judged, why = _judged_example("unified-metadata-merge", version, "graph-replay", tmp_path, judged_as="9.9.9")
    assert judged == "unconfirmed", why


# ---- the version matrix --------------------------------------------------------------------


def test_matrix_writes_verdicts_and_replay_files(tmp_path):
    version = _released_wheel()
    matrix = run_matrix([version], max_examples=15, replay_dir=tmp_path / "replays")
    report = tmp_path / "sglang-matrix.md"
    text = render(matrix, report)
    for heading in ("## Verdicts: examples", "## Verdicts: realistic", "## Verdicts: adversarial", "## Divergences"):
        assert heading in text
    bound = [cell.target.name for cell in matrix.cells if cell.bound]
    assert bound == [item.name for item in TARGETS if _has(item, version)]
    replays = sorted((tmp_path / "replays").glob("*.json"))
    assert replays, "every divergence gets a replay file"
    for path in replays:
        recorded = load_replay(path)
        assert recorded.subject.startswith("sglang:") and recorded.subject.endswith(f"@{version}")
        assert f"replays/{path.name}" in text


# ---- resolving names -----------------------------------------------------------------------


def test_pinned_names_bind_that_release():
    version = _released_wheel(lambda v: _has(target("hip-unified-swa-loc"), v))
    info = sglang.resolve(f"sglang:hip-unified-swa-loc@{version}")
    assert info.name == f"sglang:hip-unified-swa-loc@{version}" and info.kind == "sglang"
    assert version in info.to_dict()["summary"]


def test_unknown_target_names_the_known_ones():
    with pytest.raises(BindError, match="sglang:unified-metadata-merge"):
        sglang.resolve("sglang:no-such-target@0.5.23")


def test_installed_sglang_is_discovered_in_auto_mode():
    installed = locate.installed()
    if installed is None:
        pytest.skip("sglang is not installed (.ci/run installs sglang==0.5.23 --no-deps)")
    found = sglang.discover()
    names = {info.name for info in found}
    assert names == {t.subject_name for t in TARGETS if installed.version and _has(t, installed.version)}
    assert all(info.to_dict()["kind"] == "sglang" for info in found)


def test_installed_sglang_in_import_mode_matches_on_a_correct_lifecycle():
    installed = locate.installed()
    if installed is None:
        pytest.skip("sglang is not installed")
    try:
        info = sglang.bind_target(target("cuda-swa-out-cache-loc"), installed, "import")
    except ImportModeUnavailable as exc:
        pytest.skip(f"import mode does not work here: {exc}")
    assert run_scenario(info.subject, LIFECYCLES["decode"]).passed


# ---- binding without SGLang: a checkout of our own -----------------------------------------

RING_BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py"
RING_PRODUCER = """
    def _attach_unified_kv_decode_streams(self, core, state_slot):
        ring = self.token_to_kv_pool.unified_swa_ring_size
        rows = state_slot.to(torch.int64) * ring + core.positions_casual.to(torch.int64) % ring
        core.unified.swa_loc = rows.to(torch.int32)
"""
UNCACHED_RING_GETTER = """
class DeepseekV4HipRadixBackend:
    def get_unified_swa_loc(self, forward_batch):
        ring = self.token_to_kv_pool.unified_swa_ring_size
        slots = forward_batch.req_pool_indices.to(torch.int64)
        return (slots * ring + forward_batch.positions.to(torch.int64) % ring).to(torch.int32)
""" + RING_PRODUCER
CACHED_RING_GETTER = """
class DeepseekV4HipRadixBackend:
    def get_unified_swa_loc(self, forward_batch):
        return self.forward_metadata.core_attn_metadata.unified.swa_loc
""" + RING_PRODUCER


def _checkout(root: Path, files: dict[str, str], version: str = "9.9.9") -> Path:
    package = root / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    for path, text in files.items():
        file = root / "python" / path
        file.parent.mkdir(parents=True, exist_ok=True)
        for folder in file.parent.relative_to(root / "python").parents:
            (root / "python" / folder / "__init__.py").touch()
        (file.parent / "__init__.py").touch()
        file.write_text("import torch\n" + textwrap.dedent(text))
    return root


def test_a_checkout_binds_and_runs_in_source_mode(tmp_path, monkeypatch):
    root = _checkout(tmp_path, {RING_BACKEND: UNCACHED_RING_GETTER})
    monkeypatch.setenv(sglang.SOURCE_ENV, str(root))
    found = sglang.discover()
    assert [info.name for info in found] == ["sglang:hip-unified-swa-loc"]
    assert "9.9.9" in found[0].summary and "source mode" in found[0].summary
    assert run_scenario(found[0].subject, LIFECYCLES["decode"]).passed


@pytest.mark.parametrize("producer,passes", [
    (RING_PRODUCER, True),
    # a change to the producer alone: the request slot left out of the row
    (RING_PRODUCER.replace("state_slot.to(torch.int64) * ring + ", ""), False),
])
def test_the_ring_rows_a_getter_caches_come_from_the_releases_producer(tmp_path, producer, passes):
    getter = CACHED_RING_GETTER.replace(RING_PRODUCER, producer)
    tree = locate.checkout(_checkout(tmp_path, {RING_BACKEND: getter}))
    result = run_scenario(target("hip-unified-swa-loc").info(tree, "source").subject, LIFECYCLES["decode"])
    assert result.passed is passes, result.divergence and result.divergence.sentence


@pytest.mark.parametrize("body,message", [
    ("class DeepseekV4HipRadixBackend:\n    pass\n", r"DeepseekV4HipRadixBackend has no method get_unified_swa_loc\(\)"),
    ("class Other:\n    pass\n", "has no class DeepseekV4HipRadixBackend"),
    (UNCACHED_RING_GETTER.replace("torch.int32)", "torch.int32) + ring_offset_kernel()"),
     "uses ring_offset_kernel, which swafuzz has no stand-in for"),
    (UNCACHED_RING_GETTER.replace("self.token_to_kv_pool", "self.ring_pool"),
     "reads self.ring_pool, which the stand-in backend does not provide"),
])
def test_binding_names_what_a_source_lacks(tmp_path, body, message):
    tree = locate.checkout(_checkout(tmp_path, {RING_BACKEND: body}))
    with pytest.raises(BindError, match=message):
        target("hip-unified-swa-loc").info(tree, "source")


def test_a_missing_file_is_named(tmp_path):
    tree = locate.checkout(_checkout(tmp_path, {}))
    with pytest.raises(BindError, match="has no file sglang/srt/layers/attention/"):
        target("unified-metadata-merge").info(tree, "source")


def test_a_read_the_stand_ins_do_not_model_ends_the_run_as_a_gap_never_a_divergence(tmp_path):
    getter = UNCACHED_RING_GETTER.replace("forward_batch.positions", "forward_batch.seq_lens")
    tree = locate.checkout(_checkout(tmp_path, {RING_BACKEND: getter}))
    subject = target("hip-unified-swa-loc").info(tree, "source")
    with pytest.raises(UnmodelledPath, match="read 'seq_lens' from the stand-in forward batch"):
        run_scenario(subject.subject, EXAMPLES["graph-replay"])
    with pytest.raises(UnmodelledPath, match="seq_lens"):  # at once: Hypothesis does not shrink it
        fuzz(subject, settings="ci", max_examples=50)


def test_import_mode_takes_the_installed_classes(tmp_path, monkeypatch):
    root = _checkout(tmp_path, {RING_BACKEND: UNCACHED_RING_GETTER})
    monkeypatch.syspath_prepend(str(root / "python"))
    before = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "sglang"}
    for name in before:
        monkeypatch.delitem(sys.modules, name)
    try:
        tree = locate.installed()
        assert tree.root == root / "python"
        info = sglang.bind_target(target("hip-unified-swa-loc"), tree)  # auto: import works here
        assert "import mode" in info.summary
        assert run_scenario(info.subject, LIFECYCLES["graph-replays"]).passed
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "sglang"]:
            del sys.modules[name]


def test_a_default_value_that_reads_a_file_constant_binds(tmp_path):
    from swafuzz.subjects.sglang.binding import FunctionCode, bind

    helper = "sglang/srt/helpers.py"
    tree = locate.checkout(_checkout(tmp_path, {helper: """
        ALIGN = 64

        def aligned(width, multiple=ALIGN):
            return -(-width // multiple) * multiple
    """}))
    aligned = bind(tree, (FunctionCode(helper, "aligned"),), {}, {}).functions["aligned"]
    assert (aligned(65), aligned(65, 8)) == (128, 72)


def test_import_mode_is_refused_for_a_checkout(tmp_path):
    tree = locate.checkout(_checkout(tmp_path, {RING_BACKEND: UNCACHED_RING_GETTER}))
    with pytest.raises(BindError, match="import mode reads the installed package"):
        sglang.bind_target(target("hip-unified-swa-loc"), tree, "import")


def test_a_folder_without_sglang_is_refused(tmp_path):
    with pytest.raises(BindError, match="holds no sglang package"):
        sglang.resolve("sglang:hip-unified-swa-loc", source=tmp_path)
