"""Whether SGLang's own call paths reach each historical problem, release by release.

Every answer is a :class:`Route`: the call path read in the released source, as a list of
``file:function`` hops (files relative to ``sglang/srt/``, or from ``sglang/`` for the kernel
sources outside it; nested functions joined by dots),
whether the path reaches the problem, and the engine setting it needs when that is not the
release's default. A route also names what a hop must say (``mentions``) or must not say
(``lacks``) for the reading to hold; ``tests/test_sglang_reachability.py`` checks every hop
and every such claim against each release's wheel, so the table cannot drift from the code.

The matrix judges a realistic divergence "reachable" only through a route here that reaches
it, and prints the route; where the release's route does not reach it, the divergence is
"not reached" whatever profile found it.

:data:`QUESTIONS` ask about the SWA write location, whose code the targets bind;
:data:`COMPRESSED_QUESTIONS` ask the same of the compressed-KV values a DeepSeek-V4 layer
reads (write plans, compressed write locations, page table, HIP fp4 write metadata), which
no target binds: the tree checks run those values, and these routes say whether a release's
own paths get to each problem of their public history.

The engine switches also decide which lifecycle a target's driver may be given at all:
:data:`MODELLED_PATHS` names each feature a driver models through a path of SGLang's that a
release takes only under one setting of a switch (the realistic profile of a release does
not draw it under the others), and :data:`DRIVER_SWITCHES` each switch a driver follows.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from ...strategies.features import GRAPH_REPLAY, in_mode

from .locate import RELEASES, SourceTree, release_key
from .switches import SwitchSettings, settings_for, switch

PACKAGE = "sglang/srt/"

MODEL = "models/deepseek_v4.py"
POOL = "mem_cache/deepseek_v4_memory_pool.py"
ALLOCATOR = "mem_cache/swa_memory_pool.py"
KV_CACHE_SETUP = "model_executor/model_runner_kv_cache_mixin.py"
CUDA_BACKEND = "layers/attention/deepseek_v4_backend.py"
HIP_BACKEND = "layers/attention/deepseek_v4_backend_hip_radix.py"
DECODE_RUNNER = "model_executor/runner/decode_cuda_graph_runner.py"
DSPARK_MODEL = "models/deepseek_v4_dspark.py"

PREP_IN_GRAPH_OFF = switch("SGLANG_PREP_IN_CUDA_GRAPH").setting(False)
UNIFIED_KV_FP8_ON = switch("SGLANG_DSV4_UNIFIED_KV_FP8").setting(True)
REQUEST_WINDOW_ON = switch("--enable-encoder-swa-bounded-replay").setting(True)


@dataclass(frozen=True)
class Hop:
    """One function on a call path; ``function`` empty means the whole file (the only
    reading of a kernel's C++ source, which the checker does not parse)."""

    path: str  # relative to sglang/srt/, or starting with sglang/ for a file outside it
    function: str = ""
    mentions: tuple[str, ...] = ()  # names the function's source must contain
    lacks: tuple[str, ...] = ()  # names it must not contain

    def __str__(self) -> str:
        return f"{self.path}:{self.function}" if self.function else self.path

    @property
    def file(self) -> str:
        """The hop's file in a tree (``sglang/...``)."""
        return self.path if self.path.startswith("sglang/") else PACKAGE + self.path


@dataclass(frozen=True)
class Route:
    releases: tuple[str, ...]
    reached: bool
    hops: tuple[Hop, ...]
    why: str
    setting: str | None = None  # the non-default engine setting the route needs (switches.SWITCHES)
    # the targets whose code the hops read, where that is not every target of the question
    targets: tuple[str, ...] | None = None

    def covers(self, target: str | None) -> bool:
        return target is None or self.targets is None or target in self.targets

    def cited(self) -> str:
        return " -> ".join(f"`{hop}`" for hop in self.hops)


POOL_TARGETS = ("pool-fused-store", "pool-norm-rope-store")
TRANSLATED_TARGETS = ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc")
RING_TARGETS = ("hip-unified-swa-loc", "unified-metadata-merge")


@dataclass(frozen=True)
class Question:
    key: str
    title: str
    targets: tuple[str, ...]  # the targets whose code the routes read; none for values no target binds
    routes: tuple[Route, ...]

    def routes_for(self, version: str, target: str | None = None) -> tuple[Route, ...]:
        """The routes read for ``version`` (and for ``target``'s code, when given): the
        default one first, then any that need a setting."""
        found = [r for r in self.routes if version in r.releases and r.covers(target)]
        return tuple(sorted(found, key=lambda r: r.setting is not None))

    def verdict(self, version: str, target: str | None = None) -> tuple[str, tuple[Route, ...]]:
        """Whether ``version`` reaches the problem: ``reachable`` (its default route does),
        ``reachable off-default`` (only a route that needs a setting does; those routes
        come first, then the default one), ``not reached``, or ``not read``; with the routes
        that say so."""
        routes = self.routes_for(version, target)
        if not routes:
            return "not read", ()
        default, switched = routes[0], tuple(r for r in routes[1:] if r.reached)
        if default.reached:
            return "reachable", (default,)
        if switched:
            return "reachable off-default", (*switched, default)
        return "not reached", (default,)


def releases(first: str, last: str | None = None) -> tuple[str, ...]:
    low, high = release_key(first), release_key(last) if last else None
    return tuple(v for v in RELEASES if release_key(v) >= low and (high is None or release_key(v) <= high))


# ---- hops shared by several questions --------------------------------------------------------

POOL_CACHE_RELEASES = releases("0.5.12", "0.5.12.post1")
RING_RELEASES = releases("0.5.14")
BEFORE_RING = releases("0.5.12", "0.5.13.post1")

STAGE_LOOP = Hop(MODEL, "DeepseekV4Model.forward", mentions=("self.start_layer", "self.end_layer"))
MODEL_STORE_0_5_12 = (
    STAGE_LOOP,
    Hop(MODEL, "DeepseekV4DecoderLayer.forward", mentions=("self_attn",)),
    Hop(MODEL, "MQALayer.forward", mentions=("_forward_prepare",)),
    Hop(MODEL, "MQALayer._forward_prepare", mentions=("_compute_kv_to_cache", "store_cache")),
    Hop(MODEL, "MQALayer._compute_kv_to_cache", mentions=("set_swa_key_buffer_radix_fused_norm_rope",)),
)
POOL_STORE_CACHE = Hop(
    POOL, "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope",
    mentions=("cached_loc", "self.start_layer"),
)
NO_POOL_CACHE = Route(
    releases("0.5.13"), False,
    (Hop(POOL, "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope", lacks=("cached_loc",)),
     Hop(POOL, "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused", lacks=("cached_loc",))),
    "the pool-level cache is gone: the stores take a location translated by the backend",
)
NO_RING_GETTER = Route(
    BEFORE_RING, False, (Hop(MODEL, lacks=("get_unified_swa_loc",)),),
    "no unified-KV ring getter yet: the model never reads cached ring rows",
)
RING_GETTER_ON_DECODE = Hop(
    MODEL, "MQALayer._forward_prepare", mentions=("get_unified_swa_loc", "is_decode_or_idle"),
)


def _ring_getter(*mentions: str) -> Hop:
    return Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.get_unified_swa_loc", mentions=mentions)


def _raw_decode_replay(replay_prep: str, in_graph_prep: str, decode_builder: Hop) -> tuple[Hop, ...]:
    """Decode graph replay when decode metadata is raw: request slots, lengths and
    locations are copied in place, and the prep recorded in the graph rebuilds the rows."""
    return (
        Hop(DECODE_RUNNER, replay_prep, mentions=("init_forward_metadata_out_graph",)),
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph",
            mentions=("init_forward_metadata_decode", "replay_cuda_graph_metadata_from")),
        decode_builder,
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.replay_cuda_graph_metadata_from", mentions=("copy_",)),
        Hop(HIP_BACKEND, "DSV4RawDecodeMetadata.copy_", mentions=("req_pool_indices", "out_cache_loc")),
        Hop(DECODE_RUNNER, in_graph_prep, mentions=("init_forward_metadata_in_graph",)),
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_in_graph",
            mentions=("make_forward_metadata_from_raw_decode",)),
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.make_forward_metadata_from_raw_decode",
            mentions=("_attach_unified_kv_decode_streams",)),
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend._attach_unified_kv_decode_streams", mentions=("swa_loc",)),
        RING_GETTER_ON_DECODE,
    )


_SWITCHED_DECODE_BUILDER = Hop(
    HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_decode",
    mentions=("SGLANG_PREP_IN_CUDA_GRAPH", "DSV4RawDecodeMetadata", "_attach_unified_kv_decode_streams"),
)
_RAW_DECODE_BUILDER = Hop(
    HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_decode",
    mentions=("DSV4RawDecodeMetadata",), lacks=("SGLANG_PREP_IN_CUDA_GRAPH", "_attach_unified_kv_decode_streams"),
)
_RUNNER_0_5_14 = ("DecodeCudaGraphRunner.load_batch", "DecodeCudaGraphRunner.capture_one_shape.run_once")
_RUNNER_0_5_23 = (
    "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view",
    "DecodeCudaGraphRunner._run_in_graph_metadata_prep.prep",
)
_RAW_REPLAY_WHY = (
    "decode graph replay merges raw metadata (request slots, lengths, locations copied in place) "
    "and the in-graph prep recorded at capture rebuilds the ring rows from them on every replay; "
    "UnifiedKvMetadata.copy_ is not on this path"
)

_RING_ROWS_COPIED = Hop(HIP_BACKEND, "UnifiedKvMetadata.copy_", mentions=("copy_fields", "swa_loc"),
                        lacks=('assign_fields=["swa_loc"',))
_VERIFY_BUCKET_WHY = (
    "; the target-verify bucket's replay (verify forwards, DSpark draft blocks) merges eagerly "
    "built metadata, whose copy_ copies swa_loc in place, or hands a DSpark backend raw inputs"
)

_IDLE_REPLAY_PREP = Hop(
    HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph", mentions=("ForwardMode.IDLE",),
)
_IDLE_WHY = (
    "both getters never trust metadata on idle forwards (idle recomputes from the zero-padded "
    "inputs, which address the dummy slot), and graph replay prep runs on every replay, idle "
    "included, rebuilding the metadata from zeroed request slots and locations"
)
_WINDOW_BEFORE_IDLE_WHY = (
    "under the request window the getter activates the layout of the forward's metadata before "
    "it tests for an idle forward, so an idle forward gets the rows of the forward that set the "
    "metadata last, or fails where none has"
)

# ---- the questions ---------------------------------------------------------------------------

QUESTIONS: tuple[Question, ...] = (
    Question(
        "pool-cache-first-swa-layer",
        "pool cache refreshed at start_layer while the first SWA-storing layer is another",
        POOL_TARGETS,
        (
            Route(
                POOL_CACHE_RELEASES, False,
                (Hop(KV_CACHE_SETUP, "ModelRunnerKVCacheMixin._init_pools", mentions=("start_layer=self.start_layer",)),
                 *MODEL_STORE_0_5_12, POOL_STORE_CACHE),
                "the pool gets the stage's start_layer and every DeepSeek-V4 layer of the stage stores "
                "SWA keys, starting with start_layer, in every forward mode",
            ),
            NO_POOL_CACHE,
        ),
    ),
    Question(
        "pool-cache-refresh-at-layer-0",
        "pool cache refreshed at layer_id == 0 on a pipeline stage that starts later",
        POOL_TARGETS,
        (
            Route(
                POOL_CACHE_RELEASES, False,
                (Hop(KV_CACHE_SETUP, "ModelRunnerKVCacheMixin._init_pools", mentions=("start_layer=self.start_layer",)),
                 *(Hop(POOL, f"DeepSeekV4TokenToKVPool.{store}", mentions=("layer_id == self.start_layer",),
                       lacks=("layer_id == 0",))
                   for store in ("set_swa_key_buffer_radix_fused", "set_swa_key_buffer_radix_fused_norm_rope"))),
                "both stores refresh the cache at the stage's own start_layer, which the model runner "
                "passes to the pool, never at layer 0",
            ),
            NO_POOL_CACHE,
        ),
    ),
    Question(
        "pool-cache-two-batch-overlap",
        "one pool cache shared by two-batch-overlap micro-batches",
        POOL_TARGETS,
        (
            Route(
                POOL_CACHE_RELEASES, False,
                (Hop(MODEL, lacks=("tbo", "two_batch")), STAGE_LOOP, POOL_STORE_CACHE),
                "DeepSeek-V4's model has no two-batch overlap in these releases: its forward runs the "
                "stage's layers on the whole batch in one loop, so micro-batch layers never interleave",
            ),
            NO_POOL_CACHE,
        ),
    ),
    Question(
        "pool-register-mapping-keeps-cache",
        "register_mapping (0.5.12) does not clear the pool cache",
        POOL_TARGETS,
        (
            Route(
                releases("0.5.12", "0.5.12"), False,
                (Hop(ALLOCATOR, "SWATokenToKVPoolAllocator.__init__", mentions=("register_mapping",)),
                 Hop(POOL, "DeepSeekV4TokenToKVPool.register_mapping", lacks=("cached_loc",)),
                 POOL_STORE_CACHE),
                "the allocator registers its mapping once, at construction, before any store; later "
                "changes are in place, and every forward re-translates at start_layer",
            ),
            Route(
                releases("0.5.12.post1", "0.5.12.post1"), False,
                (Hop(POOL, "DeepSeekV4TokenToKVPool.register_mapping", mentions=("cached_loc",)),
                 Hop(POOL, "DeepSeekV4TokenToKVPool.invalidate_loc_cache", mentions=("cached_loc",))),
                "fixed: register_mapping clears the cache",
            ),
            NO_POOL_CACHE,
        ),
    ),
    Question(
        "assign-listed-ring-rows",
        "ring rows re-pointed (assign list) by the merge before graph replay",
        ("unified-metadata-merge",),
        (
            NO_RING_GETTER,
            Route(
                releases("0.5.14", "0.5.17"), False,
                _raw_decode_replay(*_RUNNER_0_5_14, _SWITCHED_DECODE_BUILDER), _RAW_REPLAY_WHY,
            ),
            Route(
                releases("0.5.14", "0.5.17"), True,
                (Hop(DECODE_RUNNER, _RUNNER_0_5_14[0], mentions=("init_forward_metadata_out_graph",)),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph",
                     mentions=("init_forward_metadata_decode", "replay_cuda_graph_metadata_from")),
                 _SWITCHED_DECODE_BUILDER,
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.replay_cuda_graph_metadata_from", mentions=("copy_",)),
                 Hop(HIP_BACKEND, "DSV4Metadata.copy_", mentions=("core_attn_metadata",)),
                 Hop(HIP_BACKEND, "DSV4AttnMetadata.copy_", mentions=("unified",)),
                 Hop(HIP_BACKEND, "UnifiedKvMetadata.copy_", mentions=("assign_fields", "swa_loc")),
                 RING_GETTER_ON_DECODE),
                "with in-graph preparation off, decode metadata is built eagerly with its ring rows and "
                "merged into the captured metadata, whose copy_ re-points swa_loc; the captured getter "
                "keeps reading the capture-time rows",
                setting=PREP_IN_GRAPH_OFF,
            ),
            Route(
                releases("0.5.18", "0.5.19"), True,
                (Hop(DSPARK_MODEL, "DSparkAttention._store_block_kv", mentions=("get_unified_swa_loc",)),
                 Hop("speculative/dspark_components/dspark_draft.py", "DraftBlockProposer._run_forward",
                     mentions=("ForwardMode.TARGET_VERIFY", "decode_cuda_graph_runner")),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph",
                     mentions=("_GraphBucket.TARGET_VERIFY", "init_forward_metadata_target_verify",
                               "replay_cuda_graph_metadata_from")),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_target_verify_old",
                     mentions=("attach_decode_streams=True",)),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.replay_cuda_graph_metadata_from", mentions=("copy_",)),
                 Hop(HIP_BACKEND, "UnifiedKvMetadata.copy_", mentions=("assign_fields", "swa_loc"))),
                "decode replays rebuild their ring rows in the graph (the switch is gone), but a DSpark draft "
                "block replays the target-verify bucket's graph, whose replay prep builds the block's metadata "
                "eagerly, ring rows attached, and merges it with copy_, which re-points swa_loc; the captured "
                "block store keeps reading the capture-time rows",
            ),
            Route(releases("0.5.20", "0.5.22"), False,
                  (*_raw_decode_replay(*_RUNNER_0_5_14, _RAW_DECODE_BUILDER), _RING_ROWS_COPIED),
                  _RAW_REPLAY_WHY + "; the switch is gone" + _VERIFY_BUCKET_WHY),
            Route(releases("0.5.23"), False, (*_raw_decode_replay(*_RUNNER_0_5_23, _RAW_DECODE_BUILDER),
                                              _RING_ROWS_COPIED),
                  _RAW_REPLAY_WHY + "; the switch is gone" + _VERIFY_BUCKET_WHY),
        ),
    ),
    Question(
        "multi-step-draft-ring-rows",
        "multi-step draft decode reusing step 0's ring rows",
        RING_TARGETS,
        (
            NO_RING_GETTER,
            Route(
                RING_RELEASES, False, (RING_GETTER_ON_DECODE, _ring_getter("speculative_num_steps")),
                "the getter bypasses the cached rows when speculative_num_steps > 1 and recomputes "
                "from the live positions",
            ),
        ),
    ),
    Question(
        "uniform-repeat-interleave",
        "the getter's uniform repeat_interleave fallback meeting a ragged batch",
        RING_TARGETS,
        (
            NO_RING_GETTER,
            Route(
                releases("0.5.14", "0.5.22"), False, (RING_GETTER_ON_DECODE, _ring_getter("repeat_interleave")),
                "the model reads the getter only on the decode arm (decode or idle), one token per "
                "request, where the expansion is the identity",
            ),
            Route(
                releases("0.5.23"), False,
                (Hop(MODEL, "MQALayer._forward_prepare", mentions=("get_unified_swa_loc", "fuse_verify_fp8")),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend._attach_unified_kv_decode_streams",
                     mentions=("swa_loc", "state_slot")),
                 _ring_getter("repeat_interleave")),
                "the getter is read on the decode arm and by fp8 target-verify stores, whose rows are "
                "cached per token from the repeated request slots, so the fallback's expansion only "
                "meets decode's one token per request",
            ),
        ),
    ),
    Question(
        "skipped-metadata-init-idle",
        "metadata init skipped on idle: stale cached rows returned",
        POOL_TARGETS + TRANSLATED_TARGETS + RING_TARGETS,
        (
            Route(
                releases("0.5.12", "0.5.12.post1"), False, (POOL_STORE_CACHE,),
                "no per-forward metadata cache: the pool re-translates at start_layer in every forward",
            ),
            Route(
                releases("0.5.13", "0.5.13.post1"), False,
                (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc", mentions=("is_idle",)),
                 _IDLE_REPLAY_PREP),
                "the translated-location getter never trusts metadata on idle forwards, and graph "
                "replay prep rebuilds idle metadata from zeroed inputs" ,
            ),
            Route(
                releases("0.5.14", "0.5.22"), False,
                (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc", mentions=("is_idle",)),
                 _ring_getter("is_idle"),
                 Hop(DECODE_RUNNER, _RUNNER_0_5_14[0], mentions=("init_forward_metadata_out_graph",)),
                 _IDLE_REPLAY_PREP),
                _IDLE_WHY,
            ),
            Route(
                releases("0.5.23"), False,
                (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc", mentions=("is_idle",)),
                 _ring_getter("is_idle"),
                 Hop(DECODE_RUNNER, _RUNNER_0_5_23[0], mentions=("init_forward_metadata_out_graph",)),
                 _IDLE_REPLAY_PREP),
                _IDLE_WHY,
            ),
            Route(
                releases("0.5.21", "0.5.22"), True,
                (Hop(POOL, "DeepSeekV4TokenToKVPool.__init__", mentions=("RequestWindow",)),
                 Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc",
                     mentions=("request_window", "core_attn_metadata", "is_idle"))),
                _WINDOW_BEFORE_IDLE_WHY,
                setting=REQUEST_WINDOW_ON, targets=("cuda-swa-out-cache-loc",),
            ),
            Route(
                releases("0.5.22"), True,
                (Hop(POOL, "DeepSeekV4TokenToKVPool.__init__", mentions=("RequestWindow",)),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.get_swa_out_cache_loc",
                     mentions=("request_window", "core_attn_metadata", "is_idle"))),
                _WINDOW_BEFORE_IDLE_WHY,
                setting=REQUEST_WINDOW_ON, targets=("hip-swa-out-cache-loc",),
            ),
        ),
    ),
    Question(
        "ring-getter-in-verify",
        "the model reads the ring getter in a target-verify forward",
        RING_TARGETS,
        (
            NO_RING_GETTER,
            Route(
                releases("0.5.14", "0.5.18"), False,
                (Hop(MODEL, "MQALayer._forward_prepare",
                     mentions=("do_fused_store = (unified and is_decode)", "get_unified_swa_loc")),),
                "only the decode arm (decode or idle) takes the fused store that reads the getter",
            ),
            Route(
                releases("0.5.19", "0.5.22"), False,
                (Hop(MODEL, "MQALayer._forward_prepare",
                     mentions=("if unified and fuse_verify:", "get_unified_swa_loc")),),
                "fused target-verify skips the kernel's own store (the backend stores by the "
                "per-token state slot), so it never reads the getter",
            ),
            Route(
                releases("0.5.23"), False,
                (Hop(MODEL, "MQALayer._forward_prepare",
                     mentions=("if unified and fuse_verify and not fuse_verify_fp8:", "get_unified_swa_loc")),),
                "bf16 target-verify skips the kernel's own store, so it never reads the getter",
            ),
            Route(
                releases("0.5.23"), True,
                (Hop(MODEL, "MQALayer._forward_prepare",
                     mentions=("fuse_verify_fp8 = (", "if unified and fuse_verify and not fuse_verify_fp8:",
                               "get_unified_swa_loc")),
                 Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend._attach_unified_kv_decode_streams",
                     mentions=("swa_loc",)),
                 _ring_getter("repeat_interleave")),
                "fp8 target-verify stores like decode, taking its ring rows from the getter",
                setting=UNIFIED_KV_FP8_ON,
            ),
        ),
    ),
    Question(
        "ring-getter-in-extend",
        "the model reads the ring getter in an extend, prefill or draft-extend forward",
        RING_TARGETS,
        (
            NO_RING_GETTER,
            Route(
                RING_RELEASES, False, (RING_GETTER_ON_DECODE,),
                "extend-like forwards store through the backend's prefill rows, never the getter",
            ),
        ),
    ),
)

# ---- the compressed-KV values a layer reads (no target binds them) ------------------------------

NEXTN_MODEL = "models/deepseek_v4_nextn.py"
COMPRESSOR = "layers/attention/dsv4/compressor_v2.py"
ENVIRON = "environ.py"
# the compress planner's Python wrapper and its C++ source: sglang/jit_kernel/ until 0.5.16,
# sglang/kernels/ from 0.5.17
JIT_PLANNER = ("sglang/jit_kernel/dsv4/compress.py", "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh")
KERNELS_PLANNER = (
    "sglang/kernels/ops/attention/dsv4/compress.py", "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh",
)

_UPGRADES = ("make_forward_metadata_from_raw_decode", "make_forward_metadata_from_raw_verify")
# where raw decode and verify metadata become built metadata: lazily at the forward's first
# layer until 0.5.12.post1, in the backend's in-graph init (recorded by a captured graph) after
LAZY_UPGRADE = Hop(CUDA_BACKEND, "DeepseekV4AttnBackend._maybe_upgrade_forward_metadata", mentions=_UPGRADES)
IN_GRAPH_UPGRADE = Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata_in_graph", mentions=_UPGRADES)

_RAW_VERIFY_PLAN = Hop(
    CUDA_BACKEND, "DeepseekV4AttnBackend.make_forward_metadata_from_raw_verify",
    mentions=("create_paged_compressor_data", "seq_lens_cpu=None", "compress_ratio=4"),
)
_PLAN_BUILDER = Hop(COMPRESSOR, "create_paged_compressor_data", mentions=("CompressorPrefillPlan.generate",))
_FIXED_DRAFT_PAD = ("kMaxMTPDraftTokens = 4", "std::min(ring_size - compress_ratio, kMaxMTPDraftTokens)")
_FIXED_DRAFT_PAD_WHY = (
    "target-verify metadata is kept raw (SGLANG_PREP_IN_CUDA_GRAPH's default) and upgraded from "
    "device lengths, so the C4 write plan comes from "
    "the device planner, which keeps at most min(ring - ratio, 4) trailing draft tokens resident: "
    "with more than 4 draft tokens the compress-state ring is under-written"
)
_VERIFY_KEPT_RAW = Hop(
    CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata_target_verify",
    mentions=("SGLANG_PREP_IN_CUDA_GRAPH", "DSV4RawVerifyMetadata"),
)
_COMPRESSOR_V2_DEFAULT = Hop(ENVIRON, "Envs", mentions=("SGLANG_OPT_USE_COMPRESSOR_V2 = EnvBool(True)",))


def _planned_verify(planner: tuple[str, str], pad: tuple[str, ...], *before: Hop, lacks: tuple[str, ...] = ()
                    ) -> tuple[Hop, ...]:
    """Target verify's C4 write plan: from the raw metadata's upgrade to what the planner's
    C++ source says of the resident draft tail."""
    wrapper, source = planner
    return (*before, _RAW_VERIFY_PLAN, _PLAN_BUILDER,
            Hop(wrapper, "CompressorPrefillPlan.generate", mentions=("plan_prefill",)),
            Hop(source, mentions=pad, lacks=lacks))


_DRAFT_LAYER_UNCOMPRESSED = (
    Hop(NEXTN_MODEL, mentions=("COMPRESS_RATIO_NEXTN_LAYER = 0",)),
    Hop(NEXTN_MODEL, "DeepseekV4ModelNextN.__init__", mentions=("compress_ratio_override=COMPRESS_RATIO_NEXTN_LAYER",)),
    Hop(MODEL, "MQALayer.__init__", mentions=("self.compress_ratio", "Compressor(")),
)
def draft_layers_store_no_compressed_kv(tree: SourceTree) -> str | None:
    """Why no layer of ``tree``'s draft model reads compressed-KV values, with the code
    that says so; None where the tree does not read so (a draft layer may compress)."""
    route = Route((), False, _DRAFT_LAYER_UNCOMPRESSED, "")
    if route_problems(tree, route):
        return None
    return f"the draft model's layers are built with compress ratio 0 and store no compressed KV ({route.cited()})"


_DRAFT_EXTEND_LIVE_LOCATIONS = Hop(
    CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata_out_graph",
    mentions=("_GraphBucket.DRAFT_EXTEND", "init_forward_metadata_draft_extend(", "out_cache_loc=out_cache_loc,"),
)
_BUILT_MERGE = (
    Hop(CUDA_BACKEND, "DSV4Metadata.copy_", mentions=("core_attn_metadata", "c4_compress_metadata")),
    Hop(CUDA_BACKEND, "DSV4AttnMetadata.copy_",
        mentions=("copy_fields", "c4_out_loc", "c128_out_loc", "c128_page_indices", "page_table")),
)
_REPLAY_MERGE = (
    Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.replay_cuda_graph_metadata_from",
        mentions=("cuda_graph_metadata_of_bucket_and_bs", ".copy_(")),
    Hop(CUDA_BACKEND, "DSV4RawDecodeMetadata.copy_", mentions=("req_pool_indices", "seq_lens", "out_cache_loc")),
    Hop(CUDA_BACKEND, "DSV4RawVerifyMetadata.copy_", mentions=("req_pool_indices", "seq_lens", "out_cache_loc")),
    *_BUILT_MERGE,
)


def _page_table_per_forward(upgrade: Hop) -> tuple[Hop, ...]:
    return (
        upgrade,
        Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.make_forward_metadata_from_raw_decode",
            mentions=("make_core_attn_metadata",)),
        Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.make_core_attn_metadata", mentions=("req_to_token", "page_table")),
        *_BUILT_MERGE,
    )


_PAGE_TABLE_WHY = (
    "every forward builds its page table afresh from req_to_token: decode upgrades its raw metadata "
    "{where}, and a replay that merges built metadata copies the table into the captured one in place"
)
_NO_FP4_WRITE_METADATA = Route(
    releases("0.5.12", "0.5.19"), False, (Hop(COMPRESSOR, lacks=("fp4_k_write_metadata",)),),
    "no fp4 write metadata: the C4 compressor's store takes no per-forward fp4 rows",
)


def _fp4_per_forward(in_graph_prep: str) -> tuple[Hop, ...]:
    return (
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata",
            mentions=("init_forward_metadata_in_graph",)),
        Hop(DECODE_RUNNER, in_graph_prep, mentions=("init_forward_metadata_in_graph",)),
        Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_in_graph",
            mentions=("prepare_fp4_k_write_metadata", "c4_compress_metadata", "c4_out_loc")),
        Hop(COMPRESSOR, "CompressorBackendMixin._forward_compress_all_in_one",
            mentions=('getattr(self.forward_metadata, "fp4_k_write_metadata", None)',)),
    )


_FP4_WHY = (
    "the backend derives the fp4 write metadata from the forward's C4 plan and c4_out_loc once per "
    "forward, before any layer (eagerly, and in the prep a graph records, so every replay redoes it); "
    "every C4 layer only reads it"
)

COMPRESSED_QUESTIONS: tuple[Question, ...] = (
    Question(
        "compress-plan-fixed-draft-pad",
        "the C4 write plan keeps a fixed 4 draft tokens resident in CUDA target verify (sglang#34189)",
        (),
        (
            Route(releases("0.5.12", "0.5.12.post1"), True,
                  _planned_verify(JIT_PLANNER, _FIXED_DRAFT_PAD, _COMPRESSOR_V2_DEFAULT, _VERIFY_KEPT_RAW,
                                  LAZY_UPGRADE),
                  _FIXED_DRAFT_PAD_WHY + " (compressor v2 is the default)"),
            Route(releases("0.5.13", "0.5.14"), True,
                  _planned_verify(JIT_PLANNER, _FIXED_DRAFT_PAD, _COMPRESSOR_V2_DEFAULT, _VERIFY_KEPT_RAW,
                                  IN_GRAPH_UPGRADE),
                  _FIXED_DRAFT_PAD_WHY + " (compressor v2 is the default)"),
            Route(releases("0.5.15", "0.5.16"), True,
                  _planned_verify(JIT_PLANNER, _FIXED_DRAFT_PAD, _VERIFY_KEPT_RAW, IN_GRAPH_UPGRADE),
                  _FIXED_DRAFT_PAD_WHY),
            Route(releases("0.5.17", "0.5.17"), True,
                  _planned_verify(KERNELS_PLANNER, _FIXED_DRAFT_PAD, _VERIFY_KEPT_RAW, IN_GRAPH_UPGRADE),
                  _FIXED_DRAFT_PAD_WHY),
            Route(releases("0.5.18"), False,
                  _planned_verify(KERNELS_PLANNER, ("ring_size - window_size + 2",), IN_GRAPH_UPGRADE,
                                  lacks=("kMaxMTPDraftTokens",)),
                  "the planner's resident tail is derived from the compress-state ring (ring - window + 2), "
                  "not from a fixed draft count"),
        ),
    ),
    Question(
        "draft-step-compressed-locations",
        "every multi-step draft step given the whole out_cache_loc for its c4/c128 locations "
        "(sglang#24750, sglang#26239)",
        (),
        (
            Route(releases("0.5.12", "0.5.12.post1"), False,
                  (*_DRAFT_LAYER_UNCOMPRESSED, Hop(CUDA_BACKEND, lacks=("per_step_draft_out_cache_loc",))),
                  "the backend takes no per-step slice of out_cache_loc for draft metadata, but "
                  "DeepSeek-V4's draft layer is built with compress ratio 0: no draft step stores "
                  "compressed KV, so no layer reads a draft step's c4/c128 locations"),
            Route(releases("0.5.13"), False,
                  (*_DRAFT_LAYER_UNCOMPRESSED,
                   Hop(CUDA_BACKEND, "DeepseekV4AttnBackend._build_forward_metadata",
                       mentions=("per_step_draft_out_cache_loc(", "speculative_step_id"))),
                  "each draft step's metadata takes its own slice of out_cache_loc, and the draft layer "
                  "(compress ratio 0) stores no compressed KV anyway"),
        ),
    ),
    Question(
        "draft-extend-bucket-zero-locations",
        "a CUDA draft-extend graph bucket replayed with zero write locations (sglang#27091 review)",
        (),
        (
            Route(releases("0.5.12", "0.5.12.post1"), False,
                  (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata_replay_cuda_graph",
                       mentions=("_GraphBucket.DRAFT_EXTEND", "init_forward_metadata_draft_extend(")),
                   Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata_draft_extend",
                       mentions=("seq_lens.new_zeros(num_tokens)", "need_compress=False")),
                   Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.store_cache",
                       mentions=("raw_loc = forward_batch.out_cache_loc",)),
                   *_DRAFT_LAYER_UNCOMPRESSED),
                  "the bucket's replay metadata does get zero write locations, but they feed only the "
                  "compressed locations, which draft extend never builds or stores (need_compress=False, "
                  "draft layer ratio 0); SWA stores translate the forward's own out_cache_loc"),
            Route(releases("0.5.13"), False, (_DRAFT_EXTEND_LIVE_LOCATIONS,),
                  "the draft-extend bucket's replay metadata is built from the forward's own out_cache_loc, "
                  "padded to the captured token count"),
        ),
    ),
    Question(
        "metadata-reallocated-per-replay",
        "CUDA decode, verify or draft graph replay installs fresh metadata, so captured kernels read "
        "old addresses (sglang#27664)",
        (),
        (
            Route(RELEASES, False, _REPLAY_MERGE,
                  "replay merges the fresh metadata into the bucket's captured object in place: raw decode "
                  "and verify metadata (request slots, lengths, locations), which the prep recorded in the "
                  "graph upgrades, or built metadata, whose copy_ copies the compressed locations, C128 page "
                  "indices, page table and C4/C128 plans"),
        ),
    ),
    Question(
        "page-table-not-repopulated",
        "a CUDA page table never repopulated, sending every compressed read to slot 0 (decode forwards "
        "and full-graph replays; sglang#26019 review)",
        (),
        (
            Route(releases("0.5.12", "0.5.12.post1"), False,
                  _page_table_per_forward(LAZY_UPGRADE),
                  _PAGE_TABLE_WHY.format(where="at its first layer (recorded in a captured graph)")),
            Route(releases("0.5.13"), False,
                  _page_table_per_forward(IN_GRAPH_UPGRADE),
                  _PAGE_TABLE_WHY.format(where="in the prep a captured graph records")),
        ),
    ),
    Question(
        "hip-fp4-write-metadata-reused",
        "HIP fp4 write metadata derived by the first C4 layer of a forward and reused by the rest",
        (),
        (
            _NO_FP4_WRITE_METADATA,
            Route(releases("0.5.20", "0.5.22"), False, _fp4_per_forward(_RUNNER_0_5_14[1]), _FP4_WHY),
            Route(releases("0.5.23"), False, _fp4_per_forward(_RUNNER_0_5_23[1]), _FP4_WHY),
        ),
    ),
)
ALL_QUESTIONS = QUESTIONS + COMPRESSED_QUESTIONS

_BY_KEY = {question.key: question for question in ALL_QUESTIONS}
# whether the model reads a target's code in a forward mode: conditions of the problems, not problems
MODE_QUESTIONS = ("ring-getter-in-verify", "ring-getter-in-extend")
PROBLEMS = tuple(item for item in QUESTIONS if item.key not in MODE_QUESTIONS)


def question(key: str) -> Question:
    return _BY_KEY[key]


# ---- what a target's driver models, by engine setting ----------------------------------------

EVERY_SCENARIO = "every scenario"  # a ModelledPath feature: the target's whole lifecycle


@dataclass(frozen=True)
class ModelledPath:
    """Lifecycle features (restriction terms of :mod:`swafuzz.strategies.features`, or
    :data:`EVERY_SCENARIO`) that the targets' driver models through a path of SGLang's which a
    release takes only when ``switch`` is ``value``: under another setting the realistic
    profile draws none of them for those targets. ``hops`` say where a release that has the switch decides
    (checked against the wheels like a route's)."""

    features: tuple[str, ...]
    targets: tuple[str, ...]
    switch: str
    value: bool
    without_switch: bool  # whether releases that lack the switch take the modelled path
    hops: tuple[Hop, ...]
    why: str

    def taken(self, settings: SwitchSettings) -> bool:
        value = settings.get(self.switch)
        return self.without_switch if value is None else value == self.value

    def setting(self) -> str:
        return switch(self.switch).setting(self.value)

    def cited(self) -> str:
        return " -> ".join(f"`{hop}`" for hop in self.hops)


# the graph replays whose metadata the replay prep builds in the decode bucket
# (_GraphBucket.DECODE_OR_IDLE), which SGLANG_PREP_IN_CUDA_GRAPH decides; verify forwards and
# DSpark draft blocks replay the target-verify bucket's, which no switch decides
DECODE_BUCKET_REPLAYS = (in_mode(GRAPH_REPLAY, "decode"), in_mode(GRAPH_REPLAY, "idle"))

MODELLED_PATHS: tuple[ModelledPath, ...] = (
    ModelledPath(
        DECODE_BUCKET_REPLAYS, ("unified-metadata-merge",), "SGLANG_PREP_IN_CUDA_GRAPH", False, False,
        (_SWITCHED_DECODE_BUILDER,
         Hop(HIP_BACKEND, "UnifiedKvMetadata.copy_", mentions=("assign_fields", "swa_loc"))),
        "its decode graph replay merges eagerly built ring rows into the captured metadata with "
        "UnifiedKvMetadata.copy_, which a release does before a decode replay only with in-graph "
        "preparation off; with it on, and always from 0.5.18, the replay merges raw metadata and "
        "the prep recorded in the graph rebuilds the rows",
    ),
    ModelledPath(
        DECODE_BUCKET_REPLAYS, ("hip-unified-swa-loc",), "SGLANG_PREP_IN_CUDA_GRAPH", True, True,
        (_SWITCHED_DECODE_BUILDER,
         Hop(HIP_BACKEND, "DeepseekV4HipRadixBackend.init_forward_metadata_in_graph",
             mentions=("make_forward_metadata_from_raw_decode",))),
        "its decode graph replay writes fresh ring rows into the captured tensor, as the prep recorded "
        "in the graph does from raw decode metadata; with in-graph preparation off a release "
        "merges eagerly built rows instead (the unified-metadata-merge target's path)",
    ),
)


@dataclass(frozen=True)
class DriverSwitch:
    """A switch the targets' driver follows: its class attribute ``attribute`` takes the
    switch's value in a run, or (None) the driver reads the run's settings itself
    (``hops``: where a release reads the switch)."""

    switch: str
    targets: tuple[str, ...]
    attribute: str | None
    hops: tuple[Hop, ...]


DRIVER_SWITCHES: tuple[DriverSwitch, ...] = (
    DriverSwitch(
        "--enable-encoder-swa-bounded-replay", ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc"), None,
        (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc", mentions=("request_window",)),),
    ),
    DriverSwitch(
        "--enable-decoder-swa-bounded-replay", ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc"), None,
        (Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.init_forward_metadata",
             mentions=("enable_decoder_swa_bounded_replay", "_build_late_layer_tail_metadata")),
         Hop(CUDA_BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc", mentions=("late_layer_tail",))),
    ),
    DriverSwitch(
        "SGLANG_OPT_CACHE_SWA_TRANSLATION", POOL_TARGETS, "cache_swa_translation",
        (Hop(POOL, "DeepSeekV4TokenToKVPool.__init__",
             mentions=("SGLANG_OPT_CACHE_SWA_TRANSLATION", "_should_cache_swa")),
         Hop(POOL, "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused", mentions=("_should_cache_swa",))),
    ),
)


def excluded_paths(target: str, settings: SwitchSettings) -> tuple[ModelledPath, ...]:
    """The modelled paths of ``target`` that a release does not take under ``settings``."""
    return tuple(p for p in MODELLED_PATHS if target in p.targets and not p.taken(settings))


def excluded_features(target: str, settings: SwitchSettings) -> frozenset[str]:
    """The lifecycle features the realistic profile must not draw for ``target`` under
    ``settings`` (:data:`EVERY_SCENARIO` among them: draw nothing)."""
    return frozenset(feature for p in excluded_paths(target, settings) for feature in p.features)


def driver_attributes(target: str, settings: SwitchSettings) -> dict[str, bool]:
    """The driver class attributes that follow the run's switches, for ``target``."""
    return {d.attribute: settings.get(d.switch) for d in DRIVER_SWITCHES
            if target in d.targets and d.attribute is not None and settings.get(d.switch) is not None}


def needed_settings(target: str, version: str, features: set[str]) -> tuple[list[str], list[ModelledPath]]:
    """What a lifecycle with ``features`` needs of ``version`` for ``target``: the switch
    settings against the release's defaults, and the modelled paths the release never takes
    (it lacks the switch that would; said only of the releases read, :data:`RELEASES`)."""
    defaults = settings_for(version)
    settings, absent = [], []
    for path in excluded_paths(target, defaults):
        if EVERY_SCENARIO not in path.features and not features & set(path.features):
            continue
        if defaults.get(path.switch) is None:
            if version in RELEASES:
                absent.append(path)
        else:
            settings.append(path.setting())
    return settings, absent


# ---- checking a route against a release ------------------------------------------------------


def function_source(tree: SourceTree, hop: Hop) -> str | None:
    """The source of the hop's function (or file) in ``tree``, or None when it is not there."""
    text, module = parsed(tree, hop.file)
    if text is None or not hop.function:
        return text
    body: list[ast.stmt] = module.body
    node = None
    for part in hop.function.split("."):
        node = next((n for n in _definitions(body) if n.name == part), None)
        if node is None:
            return None
        body = node.body
    return ast.get_source_segment(text, node)


@functools.lru_cache(maxsize=64)
def parsed(tree: SourceTree, path: str) -> tuple[str | None, ast.Module | None]:
    """The text of ``path`` in ``tree`` and its module (None for each it lacks)."""
    # routes cite the same few large files many times
    text = tree.read(path)
    return text, (ast.parse(text) if text is not None and path.endswith(".py") else None)


def _definitions(body: list[ast.stmt]):
    # breadth first, so the shallowest definition of a name wins; a nested function may sit
    # under if/with/try inside the one that encloses it
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node


def route_problems(tree: SourceTree, route: Route) -> list[str]:
    """What in ``tree`` contradicts the route (empty when every hop reads as cited)."""
    problems = []
    for hop in route.hops:
        source = function_source(tree, hop)
        if source is None:
            problems.append(f"{hop}: not found")
            continue
        problems += [f"{hop}: does not mention {name!r}" for name in hop.mentions if name not in source]
        problems += [f"{hop}: mentions {name!r}" for name in hop.lacks if name in source]
    return problems
