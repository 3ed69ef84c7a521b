"""Trees that are not releases bind as they are, and get the verdict their code deserves.

Each tree here is a released wheel's files with one small edit, made at test time, of the
kind a pull request makes: extract a helper, rename a private method, read a new attribute,
add a metadata field and read it, drop a bypass. No SGLang code is kept in this repository;
an edit names the released text it replaces, so a test fails loudly when a release moves.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import release_or_skip, released_tree, wait_until

from swafuzz.api import ForwardMode, ModelSpec
from swafuzz.errors import UnmodelledPath
from swafuzz.reference import EngineConfig, Scenario
from swafuzz.run.executor import run_scenario
from swafuzz.search.fuzz import fuzz
from swafuzz.subjects.sglang import BindError, bind_target, callsites, engine_features, locate, tree_checks
from swafuzz.subjects.sglang.drivers import RING_GETTER_MODES
from swafuzz.subjects.sglang.late_layer_tail import ATTN_METADATA_FILES
from swafuzz.subjects.sglang.request_window import WINDOW_FILE
from swafuzz.subjects.sglang.switches import (
    DECODER_REPLAY_SWITCH, ENVIRON, REQUEST_WINDOW_SWITCH, settings_of, switch,
)
from swafuzz.subjects.sglang.targets import CUDA_BACKEND_FILE, HIP_BACKEND_FILE, METADATA_FILE, POOL_FILE, target
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import DRAFT_EXTEND, GRAPH_REPLAY, IDLE, MICRO_BATCHES, RAGGED_EXTEND, in_mode

# what a target binds, and what its call sites and switches are read from
WINDOW_SWITCH_FILE = switch(REQUEST_WINDOW_SWITCH).declared_in[0]
FILES = (POOL_FILE, HIP_BACKEND_FILE, CUDA_BACKEND_FILE, METADATA_FILE, WINDOW_FILE, WINDOW_SWITCH_FILE,
         *ATTN_METADATA_FILES, "sglang/srt/utils/common.py", *locate.VERSION_FILES,
         *callsites.CALLER_FILES, callsites.DSPARK_MODEL_FILE, callsites.FORWARD_MODE_FILE, ENVIRON, "sglang/srt/layers/attention/dsv4/unified_kv_gate.py",
         *engine_features.RUNNER_FILES, engine_features.V41_VALIDATION_FILE)


@functools.lru_cache(maxsize=None)
def files_the_tree_checks_read(version: str) -> frozenset[str]:
    """The files of ``version`` its producers and runner steps are read from."""
    read: set[str] = set()

    class Recording(locate.SourceTree):
        def read(self, path: str) -> str | None:
            read.add(path)
            return super().read(path)

    release = released_tree(version)
    tree_checks.check_tree(Recording(release.root, release.origin))
    return frozenset(read)


def edited_tree(tmp_path: Path, version: str, edits: dict[str, list[tuple[str, str]]],
                with_tree_checks: bool = False) -> locate.SourceTree:
    """A checkout of ``version``'s files with each ``(old, new)`` replacement made (every
    occurrence; ``old`` must occur); ``with_tree_checks`` adds the files the producers and
    runner steps read."""
    release = released_tree(version)
    if isinstance(release, str):
        pytest.skip(release)
    root = tmp_path / "tree" / "python"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    for path in sorted({*FILES, *(files_the_tree_checks_read(version) if with_tree_checks else ())}):
        text = release.read(path)
        if text is None:
            continue
        for old, new in edits.get(path, []):
            assert old in text, f"sglang {version}'s {path} no longer holds the text this edit replaces"
            text = text.replace(old, new)
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return locate.checkout(tmp_path / "tree")


def _subject(tree: locate.SourceTree, name: str):
    return bind_target(target(name), tree, "source")


def _diverges(info, max_examples: int = 300, exclude: frozenset[str] = frozenset(),
              profile: str = "realistic") -> bool:
    found = fuzz(info, profile=profile, settings="ci", max_examples=max_examples, exclude=exclude)
    return found.divergence is not None


# ---- the pool's inline cache (0.5.12) ----------------------------------------------------------

INLINE_CACHE = """        if self._should_cache_swa:
            if layer_id == self.start_layer or self.cached_loc is None:
                self.cached_loc = self.translate_loc_from_full_to_swa(raw_loc)
            swa_loc = self.cached_loc
        else:
            swa_loc = self.translate_loc_from_full_to_swa(raw_loc)
"""
STORE = "    def set_swa_key_buffer_radix_fused(\n"
INIT = "        self.cached_loc = None\n"  # in the pool's __init__


def _helper(body_reads: str = "") -> str:
    return ("    def get_cached_swa_loc(self, layer_id, raw_loc):\n" + body_reads
            + INLINE_CACHE + "        return swa_loc\n\n")


EXTRACTED = [(INLINE_CACHE, "        swa_loc = self.get_cached_swa_loc(layer_id, raw_loc)\n"),
             (STORE, _helper() + STORE)]


def test_a_helper_a_pull_request_extracts_binds_and_keeps_the_releases_verdict(tmp_path):
    tree = edited_tree(tmp_path, "0.5.12", {POOL_FILE: EXTRACTED})
    info = _subject(tree, "pool-fused-store")
    assert "get_cached_swa_loc" in info.subject.binding.classes["DeepSeekV4TokenToKVPool"].methods
    # the release's stale cache, now inside the helper (its DeepSeek-V4 reaches it on no realistic path)
    assert _diverges(info, profile="adversarial")
    fixed = edited_tree(tmp_path / "fixed", "0.5.12", {POOL_FILE: [
        *EXTRACTED, ("if layer_id == self.start_layer or self.cached_loc is None:", "if True:")]})
    assert not _diverges(_subject(fixed, "pool-fused-store"), max_examples=150, profile="adversarial")


def test_a_renamed_private_method_binds_under_its_new_name(tmp_path):
    tree = edited_tree(tmp_path, "0.5.12", {POOL_FILE: [("_swa_local_layer_id", "_stage_local_swa_layer")]})
    methods = _subject(tree, "pool-fused-store").subject.binding.classes["DeepSeekV4TokenToKVPool"].methods
    assert "_stage_local_swa_layer" in methods and "_swa_local_layer_id" not in methods


def _pool_helper_reading(tmp_path: Path, reads: str, init: str = "") -> locate.SourceTree:
    """0.5.12's pool with its cache extracted into a helper that first runs ``reads``, and
    ``init`` added to the pool's __init__."""
    return edited_tree(tmp_path, "0.5.12", {POOL_FILE: [
        (INLINE_CACHE, "        swa_loc = self.get_cached_swa_loc(layer_id, raw_loc)\n"),
        (STORE, _helper(reads) + STORE),
        (INIT, INIT + init),
    ]})


def test_an_attribute_the_class_sets_to_a_literal_is_read_from_the_tree(tmp_path):
    reads = "        if self.swa_cache_epoch != 0:\n            raise RuntimeError('epoch moved')\n"
    tree = _pool_helper_reading(tmp_path, reads, "        self.swa_cache_epoch = 0\n")
    assert run_scenario(_subject(tree, "pool-fused-store").subject, EXAMPLES["pipeline-stage"]).passed


def test_every_piece_a_tree_lacks_is_named_at_once_with_how_to_supply_it(tmp_path):
    reads = "        if self.swa_cache_layers and self.swa_cache_policy:\n            pass\n"
    tree = _pool_helper_reading(tmp_path, reads, "        self.swa_cache_layers = get_int_env_var('SWA_CACHE_LAYERS', 0)\n")
    with pytest.raises(BindError) as caught:
        _subject(tree, "pool-fused-store")
    message = str(caught.value)
    assert "2 pieces are missing" in message
    assert "self.swa_cache_layers" in message and "get_int_env_var('SWA_CACHE_LAYERS', 0)" in message
    assert "--sglang-attr swa_cache_layers=VALUE" in message and "--sglang-attr swa_cache_policy=VALUE" in message


def test_supplied_attributes_complete_the_binding(tmp_path, monkeypatch):
    reads = "        if self.swa_cache_layers and self.swa_cache_policy:\n            pass\n"
    tree = _pool_helper_reading(tmp_path, reads)
    monkeypatch.setenv("SWAFUZZ_SGLANG_ATTRS", '["swa_cache_layers=0", "swa_cache_policy=\'lru\'"]')
    assert run_scenario(_subject(tree, "pool-fused-store").subject, EXAMPLES["pipeline-stage"]).passed


# ---- findings told in SGLang's terms (0.5.12) --------------------------------------------------

REFRESHED_AT_START = "            if layer_id == self.start_layer or self.cached_loc is None:\n"
REFRESHED_AT_LAYER_0 = "            if layer_id == 0:\n"


def _line_of(tree: locate.SourceTree, path: str, after: str, text: str) -> int:
    """The line of the first ``text`` in ``path`` past ``after``."""
    source = tree.read(path)
    return source[:source.index(text, source.index(after))].count("\n") + 1


@pytest.mark.parametrize("name, store, callee, call", [
    ("pool-fused-store", "set_swa_key_buffer_radix_fused", "set_key_buffer_fused",
     "return self.swa_kv_pool.set_key_buffer_fused("),
    ("pool-norm-rope-store", "set_swa_key_buffer_radix_fused_norm_rope", "fused_k_norm_rope_flashmla",
     "fused_k_norm_rope_flashmla("),
])
def test_a_store_handed_no_location_is_told_at_the_sglang_line_that_handed_it(tmp_path, name, store, callee, call):
    # refreshed only at layer 0: a stage starting later never fills its cache
    tree = edited_tree(tmp_path, "0.5.12", {POOL_FILE: [(REFRESHED_AT_START, REFRESHED_AT_LAYER_0)]})
    found = fuzz(_subject(tree, name), settings="ci", max_examples=300).divergence
    assert found is not None and found.kind == "raised"
    line = _line_of(tree, POOL_FILE, f"def {store}(", call)
    assert (f"DeepSeekV4TokenToKVPool.{store} (sglang/srt/mem_cache/deepseek_v4_memory_pool.py:{line}) "
            f"handed {callee} the location None") in found.sentence
    assert "swa_write_location" not in found.sentence and "RuntimeError" not in found.sentence


def test_what_sglang_code_raises_is_told_at_the_sglang_line_that_raised_it(tmp_path):
    signature_end = "        cache_k: torch.Tensor,\n    ) -> None:\n        if self._should_cache_swa:\n"
    tree = edited_tree(tmp_path, "0.5.12", {POOL_FILE: [
        (signature_end, signature_end.replace("None:\n", "None:\n        second_token = raw_loc[1]\n"))]})
    found = fuzz(_subject(tree, "pool-fused-store"), settings="ci", max_examples=100).divergence
    line = _line_of(tree, POOL_FILE, "def set_swa_key_buffer_radix_fused(", "second_token = raw_loc[1]")
    assert found is not None and found.kind == "raised"
    assert (f"DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused (sglang/srt/mem_cache/deepseek_v4_memory_pool.py:"
            f"{line}) raised IndexError") in found.sentence
    assert "swa_write_location" not in found.sentence


def test_wrong_rows_are_told_as_what_the_sglang_function_handed_on(tmp_path):
    release = released_tree("0.5.12")
    if isinstance(release, str):
        pytest.skip(release)
    found = run_scenario(_subject(release, "pool-fused-store").subject, EXAMPLES["first-swa-layer-not-start"]).divergence
    line = _line_of(release, POOL_FILE, "class DeepSeekV4TokenToKVPool", "def set_swa_key_buffer_radix_fused(")
    assert found.sentence == (
        "Stale cache: at forward 2 (decode), layer 1, all live rows that DeepSeekV4TokenToKVPool."
        f"set_swa_key_buffer_radix_fused (sglang/srt/mem_cache/deepseek_v4_memory_pool.py:{line}) handed the key "
        "store hold the rows of forward 1 (decode): a cached value was not refreshed for this forward.")


# ---- timeouts, writes into inputs and stale fields, told in SGLang's terms (0.5.23) -------------

GETTER_START = '        out_cache_loc to the dummy slot."""\n        join_in_graph_metadata_prep()\n'
CUDA_GETTER = "DeepseekV4AttnBackend.get_swa_out_cache_loc (sglang/srt/layers/attention/deepseek_v4_backend.py:{})"


def _cuda_getter_running(tmp_path: Path, statement: str) -> tuple[locate.SourceTree, int]:
    """0.5.23 with ``statement`` run first in the CUDA getter, and the line it is on."""
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [(GETTER_START, GETTER_START + statement + "\n")]})
    return tree, _line_of(tree, CUDA_BACKEND_FILE, "def get_swa_out_cache_loc(", statement.strip())


def _getter_defined_at(tree: locate.SourceTree) -> int:
    return _line_of(tree, CUDA_BACKEND_FILE, "class DeepseekV4AttnBackend", "def get_swa_out_cache_loc(")


WINDOW_INIT = "        self.page_size = page_size\n"


def test_a_constructor_that_never_returns_is_told_at_the_sglang_line_the_alarm_interrupted(tmp_path):
    # the target's constructor builds the tree's RequestWindow under the window switch
    hang = "        while pool_factory is not None: pass\n"
    tree = edited_tree(tmp_path, "0.5.23", {WINDOW_FILE: [(WINDOW_INIT, WINDOW_INIT + hang)]})
    line = _line_of(tree, WINDOW_FILE, "class RequestWindow", hang.strip())
    found = run_scenario(_window_getter(tree).subject, EXAMPLES["first-swa-layer-not-start"], timeout_s=1).divergence
    assert found.kind == "timeout"
    assert found.sentence.endswith(f"RequestWindow.__init__ (sglang/srt/mem_cache/dsv41_request_window.py:{line}) "
                                   "did not return within 1 s."), found.sentence


@pytest.mark.parametrize("threads", [False, True], ids=["main-thread", "micro-batch-threads"])
def test_a_getter_that_never_returns_is_told_at_the_sglang_line_the_interruption_found(tmp_path, threads):
    tree, line = _cuda_getter_running(tmp_path, "        while forward_batch.positions is not None: pass")
    scenario = EXAMPLES["two-batch-overlap" if threads else "first-swa-layer-not-start"]
    found = run_scenario(_subject(tree, "cuda-swa-out-cache-loc").subject, scenario, threads=threads,
                         timeout_s=1).divergence
    assert found.kind == "timeout"
    assert found.sentence.endswith(f"layer {found.layer_id}, {CUDA_GETTER.format(line)} did not return within 1 s."), \
        found.sentence
    if not threads:
        assert found.sentence.startswith("At forward 1 (decode), layer 1,")


def _statements(info) -> dict:
    return info.to_dict()["statements"]


def test_a_run_names_each_statement_of_the_getter_that_no_scenario_ran_by_its_tree_line(tmp_path):
    # a branch HEAD adds for inputs no scenario has: the run passes, and says the branch never ran
    unreachable = "        if forward_batch.out_cache_loc.shape[0] > 1 << 40:\n            return None\n"
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [(GETTER_START, GETTER_START + unreachable)]})
    line = _line_of(tree, CUDA_BACKEND_FILE, "def get_swa_out_cache_loc(", "return None\n")
    window_line = _line_of(tree, CUDA_BACKEND_FILE, "def get_swa_out_cache_loc(", "window.activate(layout)")
    info = _subject(tree, "cuda-swa-out-cache-loc")
    assert "statements" not in info.to_dict()  # nothing ran yet
    assert fuzz(info, settings="ci", max_examples=30).divergence is None
    statements = _statements(info)
    never = {entry["line"]: entry["text"] for entry in statements["never_ran"]}
    assert never[line] == "return None"
    assert never[window_line] == "window.activate(layout)"  # the request window is off by default
    assert 0 < statements["ran"] == statements["statements"] - len(never)
    assert f"no scenario ran line {line} `return None`" in statements["sentence"]


def test_the_request_window_switch_runs_the_getters_window_statements():
    tree = release_or_skip("0.5.23")
    info = _window_getter(tree)
    scenario = Scenario.from_dict({"config": {"start_layer": 0, "end_layer": 2}, "events": [
        {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "mode": "idle", "pad": 2},
    ]})
    assert run_scenario(info.subject, scenario).passed
    ran = {entry["text"] for entry in _statements(info)["never_ran"]}
    assert not ran & {"window.activate(layout)", "return layout.write_loc",
                      "return window.activate_idle(out_cache_loc.shape[0])"}, ran


def test_a_getter_that_writes_into_the_locations_it_is_handed_is_told_as_that_sglang_function(tmp_path):
    # the getter returns the metadata's rows, right as they are: the write is found at its call all the same
    tree, _ = _cuda_getter_running(tmp_path, "        forward_batch.out_cache_loc.add_(1)")
    found = run_scenario(_subject(tree, "cuda-swa-out-cache-loc").subject, EXAMPLES["graph-replay"]).divergence
    assert found.kind == "wrote_input"
    assert found.sentence == (
        f"By forward 1 (decode), layer 0, {CUDA_GETTER.format(_getter_defined_at(tree))} had written into "
        "forward_batch.out_cache_loc (rows 0-1), which the engine hands in read-only: in SGLang this tensor is "
        "shared by every later layer and the allocator.")


@pytest.mark.parametrize("name, field", [
    ("cuda-swa-out-cache-loc", "forward_metadata.core_attn_metadata.swa_out_cache_loc"),
    ("hip-unified-swa-loc", "forward_metadata.core_attn_metadata.unified.swa_loc"),
])
def test_stale_rows_name_the_metadata_field_they_were_returned_from_and_the_forward_that_set_it(name, field):
    release = released_tree("0.5.23")
    if isinstance(release, str):
        pytest.skip(release)
    found = run_scenario(_subject(release, name).subject, EXAMPLES["skipped-metadata-init"]).divergence
    assert found.kind == "wrong_rows"
    assert (f"returned from {field}, as forward 1 (decode) set it, hold the rows of forward 1 (decode)"
            in found.sentence)


def test_stale_rows_of_a_graph_replay_name_no_field_as_the_replay_returns_what_the_capture_recorded():
    release = released_tree("0.5.14")
    if isinstance(release, str):
        pytest.skip(release)
    found = run_scenario(_subject(release, "unified-metadata-merge").subject, EXAMPLES["graph-replay"]).divergence
    line = _line_of(release, HIP_BACKEND_FILE, "class DeepseekV4HipRadixBackend", "def get_unified_swa_loc(")
    assert found.sentence == (
        "Stale cache: at forward 1 (decode), layer 0, all live rows that DeepseekV4HipRadixBackend.get_unified_swa_loc "
        f"(sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py:{line}) returned hold the rows recorded at "
        "graph capture (forward 1): the captured layers read a tensor that the replay no longer updates.")


# ---- the ring getter reading a per-forward field (0.5.23) --------------------------------------

FIELD = "    unified: Optional[UnifiedKvMetadata] = None\n"
PRODUCED = "        core.unified.verify_store_state_slot = state_slot\n"
CACHED_READ = "        cached = unified.swa_loc if unified is not None else None\n"
BYPASS = "            and not is_multistep_draft_decode\n"


def _ring_field_tree(tmp_path: Path, read: str, *more: tuple[str, str], with_tree_checks: bool = False
                     ) -> locate.SourceTree:
    return edited_tree(tmp_path, "0.5.23", {HIP_BACKEND_FILE: [
        (FIELD, FIELD + "    unified_swa_loc: Optional[torch.Tensor] = None\n"),
        (PRODUCED, PRODUCED + "        core.unified_swa_loc = core.unified.swa_loc\n"),
        (CACHED_READ, f"        cached = {read}\n"),
        *more,
    ]}, with_tree_checks=with_tree_checks)


# what the release itself diverges on first (the ragged fallback of extends, padding rows in an idle
# replay), left out so that the search is about the cached rows the edits move
RELEASE_FINDINGS = frozenset({RAGGED_EXTEND, DRAFT_EXTEND, IDLE, GRAPH_REPLAY})


@pytest.mark.parametrize("read", ["core.unified_swa_loc", 'getattr(core, "unified_swa_loc", None)'])
def test_a_field_the_producer_writes_reaches_the_getter(tmp_path, read):
    release = released_tree("0.5.23")
    if isinstance(release, str):
        pytest.skip(release)
    assert not _diverges(_subject(release, "hip-unified-swa-loc"), 150, RELEASE_FINDINGS)
    tree = _ring_field_tree(tmp_path, read)
    assert not _diverges(_subject(tree, "hip-unified-swa-loc"), 150, RELEASE_FINDINGS)
    # with the multi-step draft bypass dropped, the rows cached at init go stale between steps
    broken = _ring_field_tree(tmp_path / "broken", read, (BYPASS, ""))
    result = fuzz(_subject(broken, "hip-unified-swa-loc"), settings="ci", max_examples=600, exclude=RELEASE_FINDINGS)
    assert result.divergence is not None and "draft" in result.divergence.sentence


def test_a_gap_met_while_fuzzing_a_tree_exits_2_naming_it(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {HIP_BACKEND_FILE: [
        ("        positions = forward_batch.positions\n        core = getattr(self.forward_metadata",
         "        positions = forward_batch.positions\n        forward_batch.spec_info.draft_token_num\n"
         "        core = getattr(self.forward_metadata")]})
    done = subprocess.run(
        [sys.executable, "-m", "swafuzz", "fuzz", "--subject", "sglang:hip-unified-swa-loc", "--sglang-source",
         str(tree.root), "--sglang-mode", "source", "--settings", "ci", "--report-dir", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'spec_info'" in done.stderr and "does not model" in done.stderr
    assert "divergence" not in done.stdout


# ---- attributes the backend's __init__ derives from the engine model (0.5.23) --------------------

MULTISTEP = """        is_multistep_draft_decode = (
            forward_batch.forward_mode.is_decode_or_idle()
            and self.speculative_num_steps > 1
        )
"""


def _getter_reading(tmp_path: Path, branch: str) -> locate.SourceTree:
    """0.5.23's HIP backend whose ring getter runs ``branch`` after its multi-step test."""
    return edited_tree(tmp_path, "0.5.23", {HIP_BACKEND_FILE: [(MULTISTEP, MULTISTEP + branch)]})


DSPARK_BRANCH = """        if self.is_dspark_draft and forward_batch.forward_mode.is_target_verify():
            # a DSpark draft verifies gamma rows, one fewer than the target's
            is_multistep_draft_decode = (
                positions.shape[0] != self.target_verify_num_draft_tokens * forward_batch.batch_size
            )
"""


def test_what_the_backend_init_derives_from_the_worker_and_the_scenario_binds_without_being_supplied(tmp_path):
    tree = _getter_reading(tmp_path, DSPARK_BRANCH)
    subject = _subject(tree, "hip-unified-swa-loc").subject  # no --sglang-attr
    scenario = EXAMPLES["multi-step-draft"]
    backends = {}
    for role in ("target", "draft"):
        batch = SimpleNamespace(backend=SimpleNamespace(), mode=ForwardMode.DECODE)
        backends[role] = subject(ModelSpec.of(scenario.config, role, torch.device("cpu")))._backend(batch, 0)
    # the role of the worker the backend serves, as SGLang's draft worker sets it
    assert backends["draft"].is_draft_worker and not backends["target"].is_draft_worker
    assert backends["target"].need_compress and not backends["draft"].need_compress
    for backend in backends.values():  # DSpark is no algorithm the engine model runs
        assert backend.is_dspark_draft is False
        assert backend.target_verify_num_draft_tokens == scenario.config.num_draft_tokens
    assert run_scenario(subject, scenario).passed


def test_a_dspark_draft_backend_is_derived_as_one_from_the_scenario(tmp_path):
    subject = _subject(_getter_reading(tmp_path, DSPARK_BRANCH), "hip-unified-swa-loc").subject
    config = EngineConfig(speculative=True, num_draft_tokens=3, draft_model=True, dspark=True)
    backends = {}
    for role in ("target", "draft"):
        batch = SimpleNamespace(backend=SimpleNamespace(), mode=ForwardMode.DRAFT_BLOCK)
        backends[role] = subject(ModelSpec.of(config, role, torch.device("cpu")))._backend(batch, 0)
    assert backends["draft"].is_dspark_draft is True and backends["target"].is_dspark_draft is False


def test_what_the_pool_init_derives_from_the_worker_binds_without_being_supplied(tmp_path):
    # a pool that keeps its worker's role, and a translation that reads it
    kept = "        self.full_to_swa_index_mapping = None\n"
    tree = edited_tree(tmp_path, "0.5.23", {POOL_FILE: [
        (kept, kept + "        self.is_draft_worker = is_draft_worker\n"),
        ("    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor):\n",
         "    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor):\n"
         "        assert self.is_draft_worker in (True, False)\n"),
    ]})
    subject = _subject(tree, "cuda-swa-out-cache-loc").subject  # no --sglang-attr
    scenario = EXAMPLES["multi-step-draft"]
    spec = ModelSpec.of(scenario.config, "target", torch.device("cpu"))
    assert subject(spec).pool.is_draft_worker is False
    assert run_scenario(subject, scenario).passed


def test_only_what_no_model_of_the_engine_knows_is_asked_for_and_the_message_says_why(tmp_path):
    tree = _getter_reading(tmp_path, "        if self.is_dsv41 and self.is_dspark_draft:\n            pass\n")
    with pytest.raises(BindError) as caught:
        _subject(tree, "hip-unified-swa-loc")
    message = str(caught.value)
    assert "--sglang-attr is_dsv41=VALUE" in message and "model_runner.model_config" in message
    assert "no model of the engine knows" in message
    assert "is_dspark_draft" not in message


# ---- replays of a tree ---------------------------------------------------------------------------


def _swafuzz(*arguments: str) -> subprocess.CompletedProcess:
    # a safety net only: every run that must find something is bounded by examples, not time
    return subprocess.run([sys.executable, "-m", "swafuzz", *arguments], capture_output=True, text=True, timeout=3600)


def test_a_replay_records_the_tree_and_reproduces_as_printed(tmp_path):
    tree = edited_tree(tmp_path / "head", "0.5.12", {POOL_FILE: EXTRACTED})
    found = _swafuzz("fuzz", "--subject", "sglang:pool-fused-store", "--sglang-source", str(tree.root),
                     "--sglang-mode", "source", "--profile", "adversarial", "--settings", "ci",
                     "--report-dir", str(tmp_path / "reports"))
    assert found.returncode == 1, found.stdout + found.stderr
    command = next(line.split("reproduce:", 1)[1].strip() for line in found.stdout.splitlines() if "reproduce:" in line)
    replay_file = command.split()[-1]
    assert command == f"swafuzz replay {replay_file}"
    assert _swafuzz("replay", replay_file).returncode == 1  # as printed: the file names the tree

    moved = tmp_path / "moved"
    (tmp_path / "head" / "tree").rename(moved)
    lost = _swafuzz("replay", replay_file)
    assert lost.returncode == 2 and "--sglang-source" in lost.stderr, lost.stderr
    assert _swafuzz("replay", replay_file, "--sglang-source", str(moved)).returncode == 1

    pool = moved / "python" / POOL_FILE
    pool.write_text(pool.read_text().replace("if layer_id == self.start_layer or self.cached_loc is None:", "if True:"))
    fixed = _swafuzz("replay", replay_file, "--sglang-source", str(moved))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "differ from those this replay was recorded on" in fixed.stderr


def test_a_replay_on_a_tree_that_does_not_bind_the_target_exits_125_for_git_bisect(tmp_path):
    tree = edited_tree(tmp_path / "head", "0.5.12", {})
    found = _swafuzz("fuzz", "--subject", "sglang:pool-fused-store", "--sglang-source", str(tree.root),
                     "--sglang-mode", "source", "--profile", "adversarial", "--settings", "ci",
                     "--report-dir", str(tmp_path / "reports"))
    assert found.returncode == 1, found.stdout + found.stderr
    replay_file = next((tmp_path / "reports" / "replays").glob("*.json"))
    pool = tree.root / POOL_FILE
    # a commit from before the class existed: nothing to test there
    pool.write_text(pool.read_text().replace("class DeepSeekV4TokenToKVPool", "class SomeOtherPool"))
    skipped = _swafuzz("replay", str(replay_file), "--sglang-source", str(tree.root))
    assert skipped.returncode == 125, skipped.stdout + skipped.stderr
    assert skipped.stderr.startswith("swafuzz replay: cannot test this tree: ") and skipped.stderr.count("\n") == 1


# ---- the pull-request gate ---------------------------------------------------------------------


def test_the_pull_request_gate_fails_only_on_what_head_brings(tmp_path):
    head = _ring_field_tree(tmp_path / "head", "core.unified_swa_loc", (BYPASS, ""), with_tree_checks=True)
    done = _swafuzz("gate", "--sglang-source", str(head.root), "--sglang-base", "0.5.23", "--max-examples", "150",
                    "--budget", "600", "--report-dir", str(tmp_path / "reports"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "swafuzz gate: [14/14] " in done.stderr  # each run's outcome as it ends
    table = (tmp_path / "reports" / "pr-gate.md").read_text()
    assert table in done.stdout
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" *") for line in table.splitlines()
            if line.startswith("| `sglang:")}
    # the multi-step draft bypass this HEAD drops: both ring targets read the getter
    assert rows["sglang:unified-metadata-merge"] == rows["sglang:hip-unified-swa-loc"] == "diverges only in HEAD"
    assert rows["sglang:pool-fused-store"] == "not in HEAD"  # 0.5.13 moved the translation out of the store
    assert rows["sglang:cuda-swa-out-cache-loc"] == "clean"
    assert ("- `sglang:hip-unified-swa-loc` in HEAD: get_unified_swa_loc is called in decode, draft, draft_block, "
            "idle forwards, from models/deepseek_v4.py:MQALayer._forward_prepare") in table
    # with the request window off, the getter's window branch is code no scenario ran, on both trees
    unrun = table.split("## Statements of the targets' code that no scenario ran")[1]
    for side in ("HEAD", "BASE"):
        said = next(line for line in unrun.splitlines() if line.startswith(f"- `sglang:cuda-swa-out-cache-loc` in {side}:"))
        assert "`window.activate(layout)`" in said, said
        # DSpark draft blocks run the store hook the DSpark worker sets; the producer check
        # runs the translating fallback, on a draft block's metadata before its refresh
        assert "pre_kv_store_hook" not in said, said
        ran_by_checks = said.split("; of these, the producer checks ")[1]
        assert "`DeepseekV4AttnBackend.get_swa_out_cache_loc for a DSpark draft block`" in ran_by_checks, said
    # the field HEAD adds to the HIP metadata is in neither merge list: SGLang's copy_ asserts
    # every field is named, so each graph replay's merge of HEAD raises
    steps = {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" *") for line in table.splitlines()
             if line.startswith("| `HIP ")}
    merges = ("HIP DSV4AttnMetadata.copy_", "HIP DSV4AttnMetadata.copy_ (compressed-KV fields)",
              "HIP replay_cuda_graph_metadata_from")
    assert all(steps[name] == "diverges only in HEAD" for name in merges), steps
    assert "all_fields - provided_fields={'unified_swa_loc'}" in table
    junit = (tmp_path / "reports" / "pr-gate.xml").read_text()
    assert 'failures="5"' in junit and 'name="sglang:unified-metadata-merge"' in junit


# 0.5.21's order in 0.5.23's CUDA getter: the request window before the idle test
IDLE_FIRST = """        if forward_batch.forward_mode.is_idle():
            if window is not None:
                return window.activate_idle(out_cache_loc.shape[0])
            return self.token_to_kv_pool.translate_loc_from_full_to_swa(
                out_cache_loc
            ).to(torch.int32)
"""
WINDOW_BRANCH = """        metadata = self.forward_metadata
        if window is not None:
            layout = metadata.core_attn_metadata.request_window_layout
            window.activate(layout)
            return layout.write_loc
"""


# the verdicts of rows that do not hold the gate
# what leaves the gate passing: BASE's own findings (0.5.23's draft-step compressed locations)
# stay with it
QUIET = {"clean", "not in HEAD", "not checked in either tree", "diverges in BASE too"}


def _checks(tree) -> dict:
    from swafuzz.tools.pr_gate import Tree, run_checks

    return run_checks(Tree.parse(tree if isinstance(tree, str) else str(tree.root), "tree"), seed=0)


def test_the_gate_fails_a_producer_that_head_gets_wrong_and_names_its_first_wrong_row(tmp_path):
    from swafuzz.tools.pr_gate import DIVERGES, FAILS, check_rows

    head = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [(IDLE_FIRST + WINDOW_BRANCH, WINDOW_BRANCH + IDLE_FIRST)]},
                       with_tree_checks=True)
    rows = {row.name: row for row in check_rows(_checks(head), _checks("0.5.23"))}
    getter = rows["DeepseekV4AttnBackend.get_swa_out_cache_loc"]
    assert getter.verdict == FAILS and getter.head.outcome == DIVERGES
    # the idle forward gets the live forward's workspace rows, not the idle layout's
    assert getter.head.detail.startswith("store write_loc row 0: got ")
    assert "(idle after a live forward batch: " in getter.head.detail
    # the rest hold nothing: "not in HEAD" is a check of code neither tree has (the inline
    # index tables of 0.5.12 to 0.5.15)
    assert {row.verdict for name, row in rows.items() if name != getter.name} <= QUIET


def test_the_gate_says_a_release_fixed_the_idle_request_window_rows_of_the_one_before():
    from swafuzz.tools.pr_gate import check_rows

    for version in ("0.5.22", "0.5.23"):
        if isinstance(release := released_tree(version), str):
            pytest.skip(release)
    rows = {row.name: row.verdict for row in check_rows(_checks("0.5.23"), _checks("0.5.22"))}
    assert rows["DeepseekV4AttnBackend.get_swa_out_cache_loc"] == "fixed in HEAD"
    assert rows["DeepseekV4HipRadixBackend.get_swa_out_cache_loc"] == "fixed in HEAD"
    assert rows["RequestWindow.activate_idle"] == "clean"  # new in 0.5.23, right there
    assert rows["RequestWindow.commit"] == "not checked"  # 0.5.23 made it a kernel swafuzz cannot run


def test_the_tree_checks_run_the_compressed_kv_kernels_where_triton_can_and_say_so_where_not():
    from swafuzz.subjects.sglang import compressed

    if isinstance(release := released_tree("0.5.23"), str):
        pytest.skip(release)
    (kernels,) = tree_checks.check_compressed_values(release)
    if compressed.triton_available():
        assert (kernels.outcome, kernels.detail) == (tree_checks.RIGHT, "every value matches the truth")
    else:
        assert (kernels.outcome, kernels.detail) == (tree_checks.GAP, compressed.TRITON_MISSING)


# 0.5.23's Triton SWA read-index kernel takes a row's position as its length minus one
SWA_POSITION = "pos = tl.load(seq_lens_ptr + row).to(tl.int64) - 1"


def test_a_table_builder_that_head_gets_wrong_fails_the_gate_at_its_first_wrong_row(tmp_path):
    from swafuzz.subjects.sglang import tables
    from swafuzz.subjects.sglang.compressed import generated_batches
    from swafuzz.subjects.sglang.interpreted import TRITON_MISSING, triton_available
    from swafuzz.tools.pr_gate import DIVERGES, FAILS, check_rows

    if not triton_available():
        pytest.skip(TRITON_MISSING)
    # the window one token late: every row reads a token its request has not written
    head = edited_tree(tmp_path, "0.5.23", {tables.TABLE_FILES[0]: [(SWA_POSITION, SWA_POSITION.removesuffix(" - 1"))]},
                       with_tree_checks=True)
    name = "build_causal_swa_page_indices_triton"
    (found,) = [check for check in tree_checks.check_tree(head) if check.name == name]
    assert (found.kind, found.outcome) == (tree_checks.KERNEL, tree_checks.WRONG)
    assert found.detail.startswith(f"{name}: swa_page_indices row 0: SGLang [")
    assert found.detail.endswith(f"(batch: {tables.describe(generated_batches(1)[0])})")
    rows = {row.name: row for row in check_rows(_checks(head), _checks("0.5.23"))}
    assert rows[name].verdict == FAILS and rows[name].head.outcome == DIVERGES
    assert rows[name].head.detail == found.detail
    assert rows["DeepseekV4AttnBackend.make_core_attn_metadata"].verdict == "not in HEAD"  # 0.5.12 to 0.5.15 only
    assert {row.verdict for other, row in rows.items() if other != name} <= QUIET


def test_code_swafuzz_cannot_run_holds_the_gate_only_where_head_brings_it():
    from swafuzz.tools.pr_gate import CLEAN, GAP, TARGET, Row, Side, exit_code

    clean, gap = Side(CLEAN), Side(GAP, "reads a kernel swafuzz has no stand-in for")
    target = Row("sglang:hip-unified-swa-loc", TARGET, clean, clean)
    in_both = Row("RequestWindow.commit", tree_checks.PRODUCER, gap, gap)
    brought = Row("RequestWindow.commit", tree_checks.PRODUCER, gap, clean)
    assert in_both.verdict == "not checked in either tree" and exit_code([target, in_both]) == 0
    assert brought.verdict == "not checked" and exit_code([target, brought]) == 2
    # a target is vouched for by its own run alone
    assert Row(target.name, TARGET, gap, gap).verdict == "not checked"


def _workflow() -> str:
    page = (Path(__file__).parent.parent / "docs" / "sglang.md").read_text()
    return page.split("<!-- workflow: swafuzz-gate -->\n```yaml\n", 1)[1].split("```", 1)[0]


def test_the_sglang_workflow_gates_every_pull_request_that_touches_a_file_the_gate_reads():
    import fnmatch
    import shlex

    from swafuzz.cli import build_parser
    from swafuzz.subjects.sglang import TARGETS, provenance

    if isinstance(release := released_tree("0.5.23"), str):
        pytest.skip(release)
    workflow = _workflow()
    globs = [line.split('"')[1].removeprefix("python/").replace("**", "*")
             for line in workflow.splitlines() if line.lstrip().startswith('- "python/')]
    read = set(files_the_tree_checks_read("0.5.23")) | set(FILES) | set(provenance.sglang_paths())
    read |= {engine_features.MODEL_FILE, engine_features.DRAFT_MODEL_FILE, engine_features.BACKEND_FILE,
             *engine_features.RUNNER_FILES}
    for item in TARGETS:
        read |= {code.path for code in item.code}
    missed = sorted(path for path in read if release.read(path) is not None
                    and not any(fnmatch.fnmatch(path, glob) for glob in globs))
    assert not missed, f"the workflow does not run on {missed}"
    (command,) = [line.split("run: ", 1)[1] for line in workflow.splitlines() if "run: swafuzz gate" in line]
    options = build_parser().parse_args(shlex.split(command)[1:])
    assert (options.sglang_source, options.sglang_base) == ("head", "base")


def test_the_gate_names_which_unrun_statements_a_producer_check_ran():
    from swafuzz.tools.pr_gate import TARGET, Row, Side, markdown

    name = "Backend.get_loc (sglang/backend.py:10)"
    statements = {"sentence": f"2 of the 4 statements of {name} ran; no scenario ran line 12 `hook()`, line 14 "
                              "`return fallback()`", "name": name, "statements": 4, "ran": 2,
                  "never_ran": [{"line": 12, "text": "hook()"}, {"line": 14, "text": "return fallback()"}]}
    target = Side("clean", "30 scenarios", statements=statements)
    check = Side("clean", statements={"name": name, "lines": [11, 12]})
    other = Side("clean", statements={"name": "Backend.other (sglang/backend.py:40)", "lines": [14]})
    rows = [Row("sglang:getter", TARGET, target, target), Row("getter on the ring", "producer", check, Side("absent")),
            Row("other", "producer", other, other)]
    tree = SimpleNamespace(label="tree")
    table = markdown(rows, tree, tree, 60, 0)
    said = {line.split(": ", 1)[0]: line for line in table.splitlines() if line.startswith("- `sglang:getter` in ")}
    assert said["- `sglang:getter` in HEAD"].endswith(
        "; of these, the producer checks `getter on the ring` ran line 12, and nothing ran line 14 `return fallback()`")
    assert said["- `sglang:getter` in BASE"].endswith("line 14 `return fallback()`")  # no BASE check ran line 12


def _gate_rows(table: str) -> dict[str, str]:
    return {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" *") for line in table.splitlines()
            if line.startswith("| `sglang:")}


def test_the_gate_with_the_request_window_on_finds_the_idle_layout_fixed_in_0_5_23(tmp_path):
    # --sglang-switch reaches both sides' runs: each inherits the switches the gate was given
    release_or_skip("0.5.22")  # the base, which the gate reads from the wheel cache as the suite does
    head = edited_tree(tmp_path / "head", "0.5.23", {}, with_tree_checks=True)
    done = _swafuzz("gate", "--sglang-source", str(head.root), "--sglang-base", "0.5.22", "--max-examples", "100",
                    "--budget", "600", "--seed", "4", "--sglang-switch", "enable-encoder-swa-bounded-replay=1",
                    "--report-dir", str(tmp_path / "reports"))
    table = (tmp_path / "reports" / "pr-gate.md").read_text()
    assert "engine switches `enable-encoder-swa-bounded-replay=1`" in table.splitlines()[2]
    rows = _gate_rows(table)
    assert rows["sglang:cuda-swa-out-cache-loc"] == "fixed in HEAD", rows
    # the switch is on: the getter's window branch ran on HEAD
    head_unrun = [line for line in table.splitlines() if line.startswith("- `sglang:cuda-swa-out-cache-loc` in HEAD: ")
                  and "no scenario ran" in line]
    assert not any("window.activate(" in line for line in head_unrun), head_unrun
    # 0.5.23's request-window commit is a Triton kernel swafuzz does not run, 0.5.22's was
    # torch: what HEAD brings unchecked, the gate does not vouch for
    unchecked = [line for line in table.splitlines() if line.startswith("| `") and line.split("|")[2].strip() == "not checked"]
    assert done.returncode == 2 and len(unchecked) == 1 and "`RequestWindow.commit`" in unchecked[0], table


def test_a_gate_whose_base_cannot_be_had_exits_2_with_one_line_before_any_search(tmp_path):
    # the suite reads releases offline: a release outside the cache cannot be had, as one
    # that does not exist cannot
    done = _swafuzz("gate", "--sglang-source", "0.5.23", "--sglang-base", "0.5.99",
                    "--report-dir", str(tmp_path / "reports"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("swafuzz gate: error: BASE (sglang 0.5.99): ")
    assert not (tmp_path / "reports").exists()  # no search ran


def test_a_release_that_is_not_on_the_package_index_is_named_in_one_line(monkeypatch, tmp_path):
    def no_such_release(command, **options):
        said = ("ERROR: Could not find a version that satisfies the requirement sglang==0.5.99 (from versions: "
                + ", ".join(f"0.{i}.0" for i in range(200)) + ")\nERROR: No matching distribution found")
        return subprocess.CompletedProcess(command, 1, "", said)

    monkeypatch.setattr(locate.subprocess, "run", no_such_release)
    with pytest.raises(locate.SglangUnavailable) as refused:
        locate.fetch_wheel("0.5.99", tmp_path, download=True)
    assert str(refused.value) == "sglang 0.5.99 is no release on the package index (pip found no wheel of it)"


def test_an_interrupted_gate_names_the_reports_its_ended_runs_wrote(tmp_path):
    if isinstance(release := released_tree("0.5.23"), str):
        pytest.skip(release)
    reports = tmp_path / "reports"
    gate = subprocess.Popen([sys.executable, "-m", "swafuzz", "gate", "--sglang-source", "0.5.23", "--sglang-base",
                             "0.5.23", "--budget", "5", "--max-examples", "30", "--report-dir", str(reports)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: any(reports.glob("*/*/report.json")), "a run of the gate wrote its reports", gate)
    gate.send_signal(signal.SIGINT)
    out, err = gate.communicate(timeout=300)
    assert gate.returncode == 130, err
    assert "interrupted by SIGINT with no verdict; the runs that ended wrote their reports in " in err
    assert "nothing was written" not in err and out == ""


def test_the_pull_request_gate_needs_a_head_tree_and_no_subject():
    done = _swafuzz("gate", "--sglang-base", "0.5.23")
    assert done.returncode == 2 and "--sglang-source HEAD" in done.stderr


# ---- switches and call sites on any tree ---------------------------------------------------------


def test_a_switch_sets_on_a_tree_that_is_no_release_as_the_tree_declares_it(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {})
    item = target("hip-unified-swa-loc")
    default = bind_target(item, tree, "source").subject
    # the DSpark model's block stores take the ring rows from the getter under unified KV
    assert default.target_modes == {ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.IDLE,
                                    ForwardMode.DRAFT_BLOCK}
    fp8 = bind_target(item, tree, "source", switches={"SGLANG_DSV4_UNIFIED_KV_FP8": True}).subject
    assert ForwardMode.TARGET_VERIFY in fp8.target_modes
    assert fp8.environment.settings.off_default() == ("SGLANG_DSV4_UNIFIED_KV_FP8=1",)


def test_a_tree_whose_call_sites_cannot_be_read_is_unconfirmed_and_keeps_every_mode(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {})
    (tree.root / callsites.MODEL_FILE).unlink()
    subject = bind_target(target("unified-metadata-merge"), tree, "source").subject
    assert subject.target_modes is None and subject.modelled_modes == RING_GETTER_MODES
    assert subject.call_sites.describe().startswith("reachability unconfirmed: no call of get_unified_swa_loc")


def test_two_batch_overlap_is_drawn_in_the_modes_the_models_gate_names(tmp_path):
    gate = "global_forward_mode.is_extend_without_speculative()"
    tree = edited_tree(tmp_path, "0.5.17", {callsites.MODEL_FILE: [(gate, "global_forward_mode.is_decode()")]})
    unreached = engine_features.unreached(tree, settings_of(tree))
    assert in_mode(MICRO_BATCHES, "extend") in unreached
    assert in_mode(MICRO_BATCHES, "decode") not in unreached and in_mode(MICRO_BATCHES, "draft") not in unreached


def test_a_tree_without_the_model_class_leaves_two_batch_overlap_unconfirmed_and_drawn(tmp_path):
    tree = edited_tree(tmp_path, "0.5.17", {callsites.MODEL_FILE: [("class DeepseekV4Model(", "class OtherModel(")]})
    overlap = engine_features.read(tree, settings_of(tree))[0]
    assert overlap.unconfirmed == "models/deepseek_v4.py defines no DeepseekV4Model" and not overlap.unreached


def _merge_reading(tree: locate.SourceTree):
    readings = engine_features.read(tree, settings_of(tree))
    return next(reading for reading in readings if reading.feature.startswith("metadata merge"))


MERGE = "        chosen_metadata.copy_(temp_metadata)\n"


def test_a_tree_whose_replay_merges_without_copy_leaves_the_merge_unconfirmed_and_drawn(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [(MERGE, MERGE.replace("copy_", "update_from"))]})
    merge = _merge_reading(tree)
    # (0.5.23's early verify metadata still copies into the captured metadata, from its own branch)
    assert merge.unconfirmed == ("DeepseekV4AttnBackend.init_forward_metadata_out_graph in "
                                 "layers/attention/deepseek_v4_backend.py merges none of the metadata its bucket "
                                 "branches build")
    assert not merge.unreached and "drawn anyway" in merge.describe()


def test_a_replay_prep_with_no_branch_for_the_decode_bucket_replays_no_decode_or_idle_graph(tmp_path):
    # the decode bucket's branch builds under another bucket's name: decode and idle have nothing to merge
    branch = "        if bucket == _GraphBucket.DECODE_OR_IDLE:\n            assert out_cache_loc is not None\n"
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [
        (branch, branch.replace("DECODE_OR_IDLE", "DRAFT_EXTEND"))]})
    merge = _merge_reading(tree)
    assert merge.unconfirmed is None
    assert merge.unreached == {in_mode(GRAPH_REPLAY, "decode"), in_mode(GRAPH_REPLAY, "idle")}
    assert merge.says.startswith("decode and idle: no branch of init_forward_metadata_out_graph builds their bucket")
    assert {in_mode(GRAPH_REPLAY, "decode"), in_mode(GRAPH_REPLAY, "idle")} <= engine_features.unreached(
        tree, settings_of(tree))


# ---- the getter's request-window branch (0.5.21+) ------------------------------------------------

WINDOW_ON = {REQUEST_WINDOW_SWITCH: True}
# 0.5.23's getter lays an idle forward out before it reads the window's metadata or the
# late-layer tail; 0.5.21 and 0.5.22 test for idle after both, so an idle forward reuses
# the metadata it left stale
IDLE_BRANCH = """        if forward_batch.forward_mode.is_idle():
            if window is not None:
                return window.activate_idle(out_cache_loc.shape[0])
            return self.token_to_kv_pool.translate_loc_from_full_to_swa(
                out_cache_loc
            ).to(torch.int32)
"""
AFTER_IDLE = "        metadata = self.forward_metadata\n        if window is not None:\n"
TAIL_RETURN = "            return metadata.late_layer_tail.swa_out_cache_loc\n"
IDLE_AFTER_WINDOW_AND_TAIL = [(IDLE_BRANCH + AFTER_IDLE, AFTER_IDLE), (TAIL_RETURN, TAIL_RETURN + IDLE_BRANCH)]


def _window_getter(tree: locate.SourceTree, window: bool = True):
    return bind_target(target("cuda-swa-out-cache-loc"), tree, "source", switches={REQUEST_WINDOW_SWITCH: window})


def _window_finding(tree: locate.SourceTree, max_examples: int = 100):
    """What a short seeded search of the getter under the request window finds (None: nothing)."""
    return fuzz(_window_getter(tree), settings="ci", max_examples=max_examples, seed=4)


@pytest.fixture(scope="module")
def idle_after_window_finding():
    found = _window_finding(release_or_skip("0.5.22"))
    assert found.divergence is not None, "0.5.22's getter under the request window was not found wrong"
    return found


def test_the_cuda_getter_of_0_5_22_under_the_request_window_trusts_an_idle_forwards_stale_or_unset_metadata(
        idle_after_window_finding):
    # an idle forward that skips metadata init meets another forward's layout, or none
    sentence = idle_after_window_finding.divergence.sentence
    assert "(idle)" in sentence and (
        "writes to -1" in sentence or "returned shape" in sentence
        or "raised AttributeError: 'NoneType' object has no attribute 'core_attn_metadata'" in sentence), sentence


def test_the_cuda_getter_of_0_5_23_lays_out_the_idle_forward_that_0_5_22_gets_wrong(idle_after_window_finding):
    scenario = idle_after_window_finding.scenario
    assert not run_scenario(_window_getter(release_or_skip("0.5.22")).subject, scenario).passed
    assert run_scenario(_window_getter(release_or_skip("0.5.23")).subject, scenario).passed
    # with the window off, 0.5.22's getter translates locations and stores that forward right
    assert run_scenario(_window_getter(release_or_skip("0.5.22"), window=False).subject, scenario).passed


def test_a_getter_that_tests_for_idle_after_the_window_and_the_tail_diverges(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: IDLE_AFTER_WINDOW_AND_TAIL})
    # the realistic profile of 0.5.23 draws only what its engine reaches: the idle forward
    # after a window forward comes later in this seed's search than in 0.5.22's
    divergence = _window_finding(tree, max_examples=200).divergence
    assert divergence is not None and "(idle)" in divergence.sentence, divergence


# 0.5.20+ MQALayer.forward returns before any store on a rank with no rows
NO_ROWS_RETURN = "        if not get_attn_tp_context().input_scattered and x.shape[0] == 0:\n            return x\n"


def test_a_release_whose_layers_return_on_no_rows_stores_nothing_for_an_idle_forward_without_rows():
    subject = _window_getter(release_or_skip("0.5.23")).subject
    assert subject.zero_rows.reaches_store is False
    assert subject.zero_rows.says.startswith("MQALayer.forward returns before storing when its rank has no rows "
                                             "(models/deepseek_v4.py:MQALayer.forward line ")
    assert "scattered only in extend forwards" in subject.zero_rows.says
    assert not any("no rows" in note for note in subject.not_checked())


def test_a_tree_whose_layers_store_an_idle_forward_without_rows_raises_in_the_window_layout(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {callsites.MODEL_FILE: [(NO_ROWS_RETURN, "")]})
    assert _window_getter(tree).subject.zero_rows.reaches_store is True
    divergence = _window_finding(tree).divergence
    assert divergence is not None, "a store of no rows under the request window was not found"
    assert "(idle)" in divergence.sentence and (
        "window_layout (sglang/srt/mem_cache/dsv41_request_window.py:" in divergence.sentence
        and "raised ValueError: request-window layout needs at least one query" in divergence.sentence
    ), divergence.sentence


def test_a_return_on_no_rows_guarded_by_an_unread_condition_leaves_the_idle_store_unchecked(tmp_path):
    guard = NO_ROWS_RETURN.replace("not get_attn_tp_context().input_scattered", "self.skip_empty")
    tree = edited_tree(tmp_path, "0.5.23", {callsites.MODEL_FILE: [(NO_ROWS_RETURN, guard)]})
    subject = _window_getter(tree).subject
    assert subject.zero_rows.reaches_store is None
    assert "`self.skip_empty and x.shape[0] == 0`, which is not read" in subject.zero_rows.says
    (note,) = [note for note in subject.not_checked() if "no rows" in note]
    assert note.startswith("request window: an idle forward with no rows is not checked")


def test_the_gate_fails_each_compressed_kv_reader_that_head_gets_wrong_naming_the_quantity(tmp_path):
    from swafuzz.subjects.sglang import readers
    from swafuzz.subjects.sglang.interpreted import TRITON_MISSING, triton_available
    from swafuzz.subjects.sglang.runner_steps import COMPRESSED
    from swafuzz.tools.pr_gate import DIVERGES, FAILS, check_rows

    if not triton_available():
        pytest.skip(TRITON_MISSING)
    copied = '                "c4_out_loc",\n                "c128_out_loc",\n                "page_table",'
    assign = "            assign_fields=[\n"
    head = edited_tree(tmp_path, "0.5.23", {
        # every compressor reads the C4 locations
        readers.COMPRESSOR_FILE: [('attr_name = f"c{compress_ratio}_out_loc"', 'attr_name = "c4_out_loc"')],
        CUDA_BACKEND_FILE: [
            # the merge re-points c128_out_loc instead of copying it
            (copied, copied.replace('"c128_out_loc",\n                ', "")),
            (assign, assign + '                "c128_out_loc",\n'),
            # every draft step is handed the whole multi-step buffer
            ("            if self.topk > 0 and self.speculative_num_steps > 1:\n",
             "            if False and self.speculative_num_steps > 1:\n"),
        ],
    }, with_tree_checks=True)
    rows = {row.name: row for row in check_rows(_checks(head), _checks("0.5.23"))}
    failing = {
        readers.OUT_LOC_READER: "c128_out_loc, the rows a C128 layer stores, as CompressorBackendMixin._get_out_loc(128)",
        readers.STORE_PATH: "c128_out_loc, the rows the C128 store writes, as CompressorBackendMixin.forward_unified",
        f"CUDA DSV4AttnMetadata.copy_ ({COMPRESSED})": "c128_out_loc is re-pointed to the replayed forward's tensor",
        f"DeepseekV4AttnBackend {readers.DRAFT_STEP_SLOTS}": "out_cache_loc, the write slots DeepseekV4AttnBackend.",
    }
    for name, quantity in failing.items():
        assert rows[name].verdict == FAILS and rows[name].head.outcome == DIVERGES, name
        assert rows[name].head.detail.startswith(quantity), rows[name].head.detail
    assert {row.verdict for name, row in rows.items() if name not in failing} <= QUIET


# ---- the getter's late-layer tail branch (0.5.21+) -----------------------------------------------

TAIL_ON = {DECODER_REPLAY_SWITCH: True}
# plausible edits of 0.5.23's tail branch: answer the tail layers with the full forward's
# translated locations, or with the tail a backend kept from its first extend
TAIL_AS_FULL_EXTENT = [(TAIL_RETURN, "            return self.token_to_kv_pool.translate_loc_from_full_to_swa(\n"
                                     "                out_cache_loc\n            ).to(torch.int32)\n")]
TAIL_KEPT = [(TAIL_RETURN, "            if getattr(self, \"_tail_swa_loc\", None) is None:\n"
                           "                self._tail_swa_loc = metadata.late_layer_tail.swa_out_cache_loc\n"
                           "            return self._tail_swa_loc\n")]


# two extends longer than the window (4): the late layers (2 and 3 of 0..3) store each
# request's last 4 rows, the second extend's other rows than the first's
TAIL_SCENARIO = Scenario.from_dict({"config": {"end_layer": 4, "sliding_window": 4}, "events": [
    {"op": "admit", "count": 2},
    {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [7, 2]},
    {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [5, 6]},
    {"op": "forward", "requests": [0, 1]},
]})


def _tail_getter(tree: locate.SourceTree, name: str = "cuda-swa-out-cache-loc", tail: bool = True,
                 window: bool = False):
    return bind_target(target(name), tree, "source",
                       switches={DECODER_REPLAY_SWITCH: tail, REQUEST_WINDOW_SWITCH: window})


def _tail_finding(tree: locate.SourceTree, max_examples: int = 40):
    """What a short seeded search of the CUDA getter under decoder SWA bounded replay finds."""
    return fuzz(_tail_getter(tree), settings="ci", max_examples=max_examples, seed=4)


def test_the_getters_of_0_5_23_store_the_late_layer_tail_rows_right():
    release = release_or_skip("0.5.23")
    for name in ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc"):
        info = _tail_getter(release, name)
        assert not any(note.startswith("late-layer tail: --enable") for note in info.subject.not_checked())
        found = fuzz(info, settings="ci", max_examples=40, seed=4)
        assert found.divergence is None, found.divergence.sentence


def test_a_getter_that_answers_tail_layers_with_the_full_extent_is_found(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: TAIL_AS_FULL_EXTENT})
    divergence = _tail_finding(tree).divergence
    assert divergence is not None and "DeepseekV4AttnBackend.get_swa_out_cache_loc" in divergence.sentence, divergence
    assert "late-layer tail layer" in divergence.sentence, divergence.sentence
    # the same tree with the switch off stores every row in every layer, which it gets right
    assert fuzz(_tail_getter(tree, tail=False), settings="ci", max_examples=40, seed=4).divergence is None


def test_a_getter_that_keeps_the_tail_of_an_earlier_extend_is_found(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: TAIL_KEPT})
    divergence = _tail_finding(tree).divergence
    assert divergence is not None and "DeepseekV4AttnBackend.get_swa_out_cache_loc" in divergence.sentence, divergence


def test_the_tail_branch_is_listed_unchecked_only_while_its_switch_is_off():
    release = release_or_skip("0.5.23")
    off = _tail_getter(release, tail=False).subject.not_checked()
    assert any(f"{DECODER_REPLAY_SWITCH} is off" in note for note in off), off
    on = _tail_getter(release).subject.not_checked()
    assert not any("is off" in note for note in on) and any(note.startswith("late-layer tail:") for note in on), on


def test_a_tail_layer_answered_with_the_whole_extent_names_the_getter_and_both_row_counts(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: TAIL_AS_FULL_EXTENT})
    result = run_scenario(_tail_getter(tree).subject, TAIL_SCENARIO)
    assert not result.passed
    assert result.divergence.sentence.startswith(
        "At forward 1 (extend), layer 2, DeepseekV4AttnBackend.get_swa_out_cache_loc"), result.divergence.sentence
    assert "returned 9 rows in a late-layer tail layer of an extend whose tail holds 6" in result.divergence.sentence


def test_under_both_bounded_replays_0_5_23_stores_the_tail_through_the_windows_layout_of_it():
    release = release_or_skip("0.5.23")
    for name in ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc"):
        stores = []
        result = run_scenario(_tail_getter(release, name, window=True).subject, TAIL_SCENARIO, on_store=stores.append)
        assert result.passed, result.divergence.sentence
        # every late layer of both extends was checked, and found right
        late = {(store.forward, store.layer_id) for store in stores if store.layer_id >= 2 and store.divergence is None}
        assert {(1, 2), (1, 3), (2, 2), (2, 3)} <= late, stores


# ---- DSpark draft blocks in the lifecycle (0.5.16+) ---------------------------------------------

DSPARK_SCENARIO = Scenario.from_dict({
    "config": {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 3, "draft_model": True,
               "dspark": True},
    "events": [{"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]},
               {"op": "forward", "mode": "draft_block", "requests": [0, 1]},
               {"op": "forward", "mode": "verify", "requests": [0, 1]},
               {"op": "forward", "mode": "draft_block", "requests": [1, 0]}]})
# 0.5.23's draft ring rows: row i of a block at position seq_lens_casual[i] - 1 of its request
RING_POSITION = "seq_lens_casual.to(torch.int64) - 1,"
# a getter that keeps the first draft block's rows for every later one
HOOK_INIT = "        self.pre_kv_store_hook: Optional[Callable[[], None]] = None\n"
FIRST_BLOCK_KEPT = """        if self.is_dspark_draft and forward_batch.forward_mode.is_target_verify():
            if self._block_loc is None:
                self._block_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                    forward_batch.out_cache_loc).to(torch.int32)
            return self._block_loc
"""


def _dspark_getter(tree: locate.SourceTree, window: bool):
    info = _window_getter(tree, window)
    assert info.subject.drafts_in_blocks, info.subject.draft_block_absent
    return info


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
@pytest.mark.parametrize("window", [False, True], ids=["paged-rows", "request-window"])
def test_dspark_draft_blocks_store_through_the_getter_on_the_metadata_the_tree_builds(version, window):
    tree = release_or_skip(version)
    info = _dspark_getter(tree, window and version == "0.5.23")
    assert run_scenario(info.subject, DSPARK_SCENARIO).passed
    ran = {entry["text"] for entry in _statements(info)["never_ran"]}
    if version == "0.5.23":  # the DSpark worker's hook is set on the draft backends and called
        assert "self.pre_kv_store_hook()" not in ran


def test_a_draft_ring_row_one_position_late_is_found_in_draft_blocks_under_the_request_window(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [(RING_POSITION, RING_POSITION.replace(" - 1", ""))]},
                       with_tree_checks=True)
    assert run_scenario(_dspark_getter(tree, window=False).subject, DSPARK_SCENARIO).passed  # paged rows: no ring
    result = fuzz(_dspark_getter(tree, window=True), settings="ci", max_examples=100, seed=4)
    assert result.divergence is not None and result.weakest_profile == "realistic"
    sentence = result.divergence.sentence
    assert "(draft_block)" in sentence and CUDA_GETTER.format(_getter_defined_at(tree)) in sentence


def test_a_getter_that_keeps_the_first_draft_blocks_rows_is_found_on_paged_rows(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [
        (GETTER_START, GETTER_START + FIRST_BLOCK_KEPT), (HOOK_INIT, HOOK_INIT + "        self._block_loc = None\n")]},
                       with_tree_checks=True)
    info = _dspark_getter(tree, window=False)
    found = run_scenario(info.subject, DSPARK_SCENARIO).divergence
    assert found.sentence.startswith("Stale cache: at forward 4 (draft_block), layer 0, all live rows that "
                                     + CUDA_GETTER.format(_getter_defined_at(tree)))
    assert found.sentence.endswith("returned hold the rows of forward 2 (draft_block): a cached value was not "
                                   "refreshed for this forward.")
    assert fuzz(info, settings="ci", max_examples=300, seed=0).divergence is not None


def test_a_draft_block_met_where_the_trees_draft_block_init_does_not_bind_is_a_gap_that_says_why(tmp_path):
    tree = edited_tree(tmp_path, "0.5.19", {CUDA_BACKEND_FILE: [
        ("def init_forward_metadata_dspark_draft_block(", "def init_forward_metadata_dspark_block(")]})
    subject = _window_getter(tree, window=False).subject
    assert not subject.drafts_in_blocks  # never drawn for it: only a replay brings one
    with pytest.raises(UnmodelledPath, match=r"forward 2 \(draft_block\): a DSpark draft block stores through "
                                             r"DeepseekV4AttnBackend\.get_swa_out_cache_loc here, but .* has no "
                                             r"DSpark draft-block metadata init the driver can run"):
        run_scenario(subject, DSPARK_SCENARIO)


HIP_GETTERS = {"hip-swa-out-cache-loc": "get_swa_out_cache_loc", "hip-unified-swa-loc": "get_unified_swa_loc"}
HIP_DSPARK_DRAFT = "        self.is_dspark_draft = self.is_draft_worker and self.is_dspark\n"
@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
@pytest.mark.parametrize("name", sorted(HIP_GETTERS))
def test_the_hip_getters_store_dspark_draft_blocks_on_a_draft_verify_forwards_metadata(version, name):
    info = _subject(release_or_skip(version), name)
    assert info.subject.drafts_in_blocks
    assert run_scenario(info.subject, DSPARK_SCENARIO).passed
    assert any("each on the metadata of a target-verify forward" in note for note in info.subject.not_checked())


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_the_ring_getter_reads_a_draft_blocks_rows_from_what_the_verify_init_attached(version):
    # the HIP verify init attaches the ring rows under unified KV (attach_decode_streams), so
    # the getter's cached branch answers a block, and its computing branch never runs
    info = _subject(release_or_skip(version), "hip-unified-swa-loc")
    assert run_scenario(info.subject, DSPARK_SCENARIO).passed
    never_ran = {entry["text"] for entry in _statements(info)["never_ran"]}
    assert "result = cached" not in never_ran and "req_slot = req_slot.repeat_interleave(" in never_ran, never_ran


@pytest.mark.parametrize("edit", [
    ("return get_exec().features.enable_encoder_swa_bounded_replay and not _is_hip\n",
     "return get_exec().features.enable_encoder_swa_bounded_replay\n"),
    ("    def get_swa_out_cache_loc(self, forward_batch: ForwardBatch) -> torch.Tensor:\n",
     "    def get_swa_out_cache_loc(self, forward_batch: ForwardBatch) -> torch.Tensor:\n"
     "        ring = self.token_to_kv_pool.swa_req_ring_size\n"),
], ids=["pool-gives-hip-a-draft-ring", "backend-reads-a-draft-ring"])
def test_hip_draft_blocks_are_not_drawn_where_the_tree_may_give_the_hip_draft_a_ring(tmp_path, edit):
    path = POOL_FILE if "_is_hip" in edit[0] else HIP_BACKEND_FILE
    tree = edited_tree(tmp_path, "0.5.23", {path: [edit]})
    subject = _subject(tree, "hip-swa-out-cache-loc").subject
    assert not subject.drafts_in_blocks
    (note,) = [note for note in subject.not_checked() if note.startswith("DSpark draft blocks")]
    assert note.startswith("DSpark draft blocks: not drawn: ") and "ring" in note and "swafuzz does not model" in note


@pytest.mark.parametrize("name", sorted(HIP_GETTERS))
def test_a_hip_getter_that_keeps_the_first_draft_blocks_rows_is_found(tmp_path, name):
    getter = f"    def {HIP_GETTERS[name]}(self, forward_batch: ForwardBatch) -> torch.Tensor:\n"
    kept = (f"        if self.is_dspark_draft and forward_batch.forward_mode.is_target_verify():\n"
            f"            if self._block_loc is None:  # the getter's own answer, for the first block only\n"
            f"                self.is_dspark_draft = False\n"
            f"                self._block_loc = self.{HIP_GETTERS[name]}(forward_batch)\n"
            f"                self.is_dspark_draft = True\n"
            f"            return self._block_loc\n")
    tree = edited_tree(tmp_path, "0.5.23", {HIP_BACKEND_FILE: [
        (getter, getter + kept), (HIP_DSPARK_DRAFT, HIP_DSPARK_DRAFT + "        self._block_loc = None\n")]})
    info = _subject(tree, name)
    found = run_scenario(info.subject, DSPARK_SCENARIO).divergence
    assert found is not None and found.sentence.startswith("Stale cache: at forward 4 (draft_block), layer 0, ")
    assert f"DeepseekV4HipRadixBackend.{HIP_GETTERS[name]}" in found.sentence
    assert found.sentence.endswith("hold the rows of forward 2 (draft_block): a cached value was not refreshed "
                                   "for this forward.")
    searched = fuzz(info, settings="ci", max_examples=300, seed=0)
    assert searched.divergence is not None and searched.weakest_profile == "realistic"
    assert "(draft_block)" in searched.divergence.sentence


# ---- graph-replayed target-verify forwards and DSpark draft blocks -----------------------------

VERIFY_GRAPHS_SCENARIO = Scenario.from_dict({
    "config": {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 3, "draft_model": True,
               "dspark": True, "graph_batch_sizes": [2, 4]},
    "events": [{"op": "admit", "count": 3}, {"op": "forward", "requests": [0, 1, 2]},
               {"op": "forward", "mode": "draft_block", "requests": [0, 1], "graph": True},
               {"op": "forward", "mode": "verify", "requests": [0, 1], "graph": True},
               {"op": "forward", "mode": "decode", "requests": [0, 1], "graph": True},
               {"op": "forward", "mode": "draft_block", "requests": [2, 0, 1], "graph": True},
               {"op": "forward", "mode": "verify", "requests": [2], "graph": True}]})


@pytest.mark.parametrize("window", [False, True], ids=["paged-rows", "request-window"])
@pytest.mark.parametrize("name", ["cuda-swa-out-cache-loc", "hip-swa-out-cache-loc"])
def test_the_swa_getters_answer_graph_replayed_verify_forwards_and_draft_blocks(name, window):
    info = bind_target(target(name), release_or_skip("0.5.23"), "source", switches={REQUEST_WINDOW_SWITCH: window})
    assert run_scenario(info.subject, VERIFY_GRAPHS_SCENARIO).passed


# only the DSpark draft's block graphs, after an extend of the requests they draft for
BLOCK_GRAPHS = Scenario.from_dict({**VERIFY_GRAPHS_SCENARIO.to_dict(), "events": [
    e for e in VERIFY_GRAPHS_SCENARIO.to_dict()["events"] if e.get("mode") not in ("verify", "decode")]})
# a getter that keeps a DSpark draft block's rows per input buffer: right in eager forwards,
# whose inputs move; a graph's static inputs never do
BLOCK_ROWS_PER_BUFFER = """        if self.is_dspark_draft and forward_batch.forward_mode.is_target_verify():
            if self._block_key != forward_batch.out_cache_loc.data_ptr():
                self._block_key = forward_batch.out_cache_loc.data_ptr()
                self._block_rows = self.forward_metadata.core_attn_metadata.swa_out_cache_loc.clone()
            return self._block_rows
"""


def test_a_draft_block_graph_on_the_draft_ring_writes_the_rows_the_trees_in_graph_refresh_writes(tmp_path):
    windowed = _window_getter(release_or_skip("0.5.23"), window=True)
    assert run_scenario(windowed.subject, BLOCK_GRAPHS).passed
    late = edited_tree(tmp_path / "late", "0.5.23", {CUDA_BACKEND_FILE: [
        (RING_POSITION, RING_POSITION.replace(" - 1", ""))]}, with_tree_checks=True)
    found = run_scenario(_window_getter(late, window=True).subject, BLOCK_GRAPHS).divergence
    assert found is not None and "(draft_block)" in found.sentence
    kept = edited_tree(tmp_path / "kept", "0.5.23", {CUDA_BACKEND_FILE: [
        (GETTER_START, GETTER_START + BLOCK_ROWS_PER_BUFFER), (HOOK_INIT, HOOK_INIT + "        self._block_key = None\n")]},
                       with_tree_checks=True)
    found = run_scenario(_window_getter(kept, window=True).subject, BLOCK_GRAPHS).divergence
    assert found is not None and found.sentence.startswith("At forward 1 (draft_block), layer 0, all live rows that "
                                                           + CUDA_GETTER.format(_getter_defined_at(kept)))
    eager = Scenario.from_dict({**BLOCK_GRAPHS.to_dict(), "events": [
        {k: v for k, v in e.items() if k != "graph"} for e in BLOCK_GRAPHS.to_dict()["events"]]})
    assert run_scenario(_window_getter(kept, window=True).subject, eager).passed


FP8_RING = {"SGLANG_DSV4_UNIFIED_KV_FP8": True}  # 0.5.23's fp8 ring: verify stores read the ring getter
# the scenario without its DSpark draft model: target-verify forwards of another drafter
EAGLE_VERIFY_GRAPHS = Scenario.from_dict({
    "config": {**VERIFY_GRAPHS_SCENARIO.to_dict()["config"], "dspark": False},
    "events": [e for e in VERIFY_GRAPHS_SCENARIO.to_dict()["events"] if e.get("mode") != "draft_block"]})


@pytest.mark.parametrize("scenario", [VERIFY_GRAPHS_SCENARIO, EAGLE_VERIFY_GRAPHS], ids=["dspark", "eagle"])
@pytest.mark.parametrize("name", ["hip-unified-swa-loc", "unified-metadata-merge"])
def test_the_ring_getters_answer_graph_replayed_verify_forwards_and_draft_blocks(name, scenario):
    info = bind_target(target(name), release_or_skip("0.5.23"), "source", switches=FP8_RING)
    assert {ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_BLOCK} <= info.subject.target_modes
    assert run_scenario(info.subject, scenario).passed


def test_a_released_merge_that_re_points_the_ring_rows_is_found_in_a_dspark_draft_block_graph():
    # 0.5.18-0.5.19 build a draft block's metadata for a graph replay eagerly and merge it
    # with UnifiedKvMetadata.copy_, whose assign list re-points swa_loc; 0.5.20 copies it
    searched = fuzz(_subject(release_or_skip("0.5.19"), "unified-metadata-merge"), settings="ci",
                    max_examples=300, seed=0)
    found = searched.divergence
    assert found is not None and searched.weakest_profile == "realistic"
    assert found.sentence.startswith("Stale cache: at forward 1 (draft_block), layer 0, all live rows that "
                                     "DeepseekV4HipRadixBackend.get_unified_swa_loc")
    assert found.sentence.endswith("hold the rows recorded at graph capture (forward 1): the captured layers read a "
                                   "tensor that the replay no longer updates.")
    assert run_scenario(_subject(release_or_skip("0.5.20"), "unified-metadata-merge").subject,
                        searched.scenario).passed


# 0.5.19's merge restored in 0.5.23: the ring rows moved from the copy list to the assign list
ASSIGNED_RING_ROWS = [
    ('                "c128_out_loc",\n'
     '                # Captured store_cache reads swa_loc by address, and the eager\n'
     '                # target-verify path builds it outside the graph.\n'
     '                "swa_loc",\n'
     '            ],\n'
     '            assign_fields=[],',
     '                "c128_out_loc",\n'
     '            ],\n'
     '            assign_fields=["swa_loc"],'),
]


def _without_decode_graphs(scenario: Scenario) -> Scenario:
    # 0.5.23 rebuilds a decode graph's ring rows in the graph: the merge target draws none
    return Scenario.from_dict({**scenario.to_dict(), "events": [
        e for e in scenario.to_dict()["events"] if e.get("mode") != "decode"]})


def test_a_merge_that_re_points_the_ring_rows_fails_only_where_the_tree_merges_them(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {HIP_BACKEND_FILE: ASSIGNED_RING_ROWS})
    fp8 = bind_target(target("unified-metadata-merge"), tree, "source", switches=FP8_RING)
    eagle, dspark = (_without_decode_graphs(s) for s in (EAGLE_VERIFY_GRAPHS, VERIFY_GRAPHS_SCENARIO))
    found = run_scenario(fp8.subject, eagle).divergence
    assert found is not None and found.sentence.startswith("Stale cache: at forward 1 (verify), layer 0")
    # a DSpark verify replay hands raw inputs to the graph, which rebuilds the rows: no merge
    assert run_scenario(fp8.subject, dspark).passed
    # without the fp8 ring no verify store reads the getter
    assert run_scenario(_subject(tree, "unified-metadata-merge").subject, eagle).passed
    assert in_mode(GRAPH_REPLAY, "decode") in fp8.subject.realistic_exclusions


# a getter that translates a target-verify forward's locations once per input buffer: right
# in eager forwards, whose inputs move; a graph's static inputs never do
VERIFY_ROWS_PER_BUFFER = """        if forward_batch.forward_mode.is_target_verify():
            if self._verify_key != forward_batch.out_cache_loc.data_ptr():
                self._verify_key = forward_batch.out_cache_loc.data_ptr()
                self._verify_rows = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                    forward_batch.out_cache_loc).to(torch.int32)
            return self._verify_rows
"""


def test_a_getter_whose_verify_rows_outlive_their_forward_is_found_in_a_verify_graph_replay(tmp_path):
    tree = edited_tree(tmp_path, "0.5.23", {CUDA_BACKEND_FILE: [
        (GETTER_START, GETTER_START + VERIFY_ROWS_PER_BUFFER),
        (HOOK_INIT, HOOK_INIT + "        self._verify_key = None\n")]})
    info = _subject(tree, "cuda-swa-out-cache-loc")
    events = [e for e in VERIFY_GRAPHS_SCENARIO.to_dict()["events"] if e.get("mode") in (None, "verify")]
    one_verify_graph = Scenario.from_dict({**VERIFY_GRAPHS_SCENARIO.to_dict(), "events": events[:3]})
    found = run_scenario(info.subject, one_verify_graph).divergence
    assert found is not None
    assert found.sentence.startswith("Stale cache: at forward 1 (verify), layer 0, all live rows that "
                                     + CUDA_GETTER.format(_getter_defined_at(tree)))
    assert found.sentence.endswith("hold the rows recorded at graph capture (forward 1): the captured layers read a "
                                   "tensor that the replay no longer updates.")
    eager = Scenario.from_dict({**one_verify_graph.to_dict(), "events": [
        {k: v for k, v in e.items() if k != "graph"} for e in events[:3]]})
    assert run_scenario(info.subject, eager).passed
    searched = fuzz(info, settings="ci", max_examples=300, seed=0)
    assert searched.divergence is not None and searched.weakest_profile == "realistic"
