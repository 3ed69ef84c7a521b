"""Subjects that drive bound SGLang code through the engine lifecycle.

The SGLang functions run on stand-ins: objects that hold only the attributes the functions
read, the way SGLang's own unit tests call these methods. Three drivers cover the targets:

- :class:`PoolStoreSubject`: the memory pool's SWA store functions with their inline cache.
  The subject instance is the pool (every micro-batch shares it); the key store records the
  location it was given, and that location is the subject's answer.
- :class:`TranslatedLocSubject`: a backend's ``get_swa_out_cache_loc``, fed per-forward
  metadata by a producer that follows SGLang's metadata-init rules.
- :class:`RingSubject` and :class:`RingMergeSubject`: ``get_unified_swa_loc`` with ring-row
  metadata, and with the real merge of that metadata before graph replay.

Backends (the metadata holders) live on ``batch.backend``, one per role and draft step, as
SGLang keeps one backend per model and one per step of a multi-step draft.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, ClassVar

import torch

from ...api import ForwardBatch, ForwardMode, Subject, Truth, tokens_request_slots
from ...reference.truth import late_layer_tail_tokens, ring_rows, unchecked_ring_rows, whole_page_ring
from .binding import Binding
from .derived import EngineModel, InitDerivation
from .faults import defined_at, location_fault
from .switches import DECODER_REPLAY_SWITCH, REQUEST_WINDOW_SWITCH
from ...errors import CodeFault, ModelGap, StandInGap


class StandIn:
    """An object that carries the attributes its role models, and those the bound tree's
    own code gives the class (``tree_defaults``: made on first read, fresh per object; and
    ``tree_derivation``: what ``__init__`` derives from the object's engine model)."""

    role: ClassVar[str]
    attributes: ClassVar[frozenset[str]]
    tree_defaults: ClassVar[dict[str, Callable[[], Any]]] = {}
    tree_derivation: ClassVar[InitDerivation | None] = None

    def __init__(self, **values: Any) -> None:
        if set(values) != self.attributes:
            raise TypeError(
                f"stand-in {self.role} takes {sorted(self.attributes)}, got {sorted(values)}"
            )
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        make = type(self).tree_defaults.get(name)
        if make is not None:
            value = self.__dict__[name] = make()
            return value
        derivation = type(self).tree_derivation
        if derivation is not None and derivation.derives(name) and self.__dict__.get("engine_model") is not None:
            for derived, value in derivation.values(self, self.engine_model).items():
                self.__dict__.setdefault(derived, value)
            if name in self.__dict__:  # else this object's __init__ path reads what no model knows
                return self.__dict__[name]
        raise StandInGap(
            f"SGLang code read {name!r} from the stand-in {self.role}, which swafuzz does not model"
        )


class NotModelled:
    """The value of an attribute or name the bound code reads only on a path swafuzz does
    not model (a raw-metadata upgrade, the low-ratio indexer, DSpark); any use of it says
    so instead of answering."""

    def __init__(self, name: str):
        self.name = name

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise StandInGap(f"SGLang code used {self.name}, on a path swafuzz does not model")

    __call__ = __bool__ = __iter__ = _refuse

    def __getattr__(self, attribute: str) -> Any:
        self._refuse()


class PoolStandIn(StandIn):
    role = "pool"
    attributes = frozenset({
        "full_to_swa_index_mapping", "start_layer", "_stage_start", "cached_loc",
        "_should_cache_swa", "swa_kv_pool", "request_window", "swa_req_ring_size",
        "unified_swa_ring_size", "unified_swa_window", "unified_swa_pages",
        "engine_model",  # what __init__ derives the rest from (swafuzz.subjects.sglang.derived)
    })


class BackendStandIn(StandIn):
    role = "backend"
    attributes = frozenset({
        "forward_metadata", "token_to_kv_pool", "pre_kv_store_hook", "topk", "mtp_enabled",
        "speculative_num_steps", "speculative_step_id",
        # the ring producer's fp8 speculative-draft branch (0.5.23), never taken: bf16 ring
        "is_dspark", "_fp8_decode_num_heads", "_fp8_verify_epi",
        "engine_model",  # what __init__ derives the rest from (swafuzz.subjects.sglang.derived)
    })


class ForwardMetadata(StandIn):
    """The backend's per-forward metadata (SGLang's ``DSV4Metadata``)."""

    role = "forward metadata"
    attributes = frozenset({"core_attn_metadata", "late_layer_tail"})


class CoreMetadata(StandIn):
    """The core attention metadata (SGLang's ``DSV4AttnMetadata``): one object per forward,
    which the producer of the ring rows writes and every layer's getter reads. It models the
    forward's locations, its ring metadata, the tokens' positions, and the attention lengths
    and pages (empty: no attention runs); the tree's own field defaults give the rest."""

    role = "attention metadata"
    attributes = frozenset({
        "swa_out_cache_loc", "unified", "positions_casual", "swa_topk_lengths", "c128_topk_lengths_raw",
        "c4_sparse_topk_lengths_raw", "c128_page_indices", "c4_sparse_page_indices",
    })

    @classmethod
    def of(cls, positions: torch.Tensor, swa_out_cache_loc: torch.Tensor | None = None, unified: Any = None):
        n = positions.shape[0]
        lengths = torch.zeros(n, dtype=torch.int32, device=positions.device)
        pages = torch.empty((n, 0), dtype=torch.int32, device=positions.device)
        return cls(
            swa_out_cache_loc=swa_out_cache_loc, unified=unified, positions_casual=positions,
            swa_topk_lengths=lengths, c128_topk_lengths_raw=lengths, c4_sparse_topk_lengths_raw=lengths,
            c128_page_indices=pages, c4_sparse_page_indices=pages,
        )


class LateLayerTailStandIn(StandIn):
    """The rows the late layers run over under decoder SWA bounded replay (SGLang's
    ``LateLayerTail``, 0.5.21+): the tail's indices into the extend, its positions, its
    length per request and the SWA rows its keys are written to."""

    role = "late-layer tail"
    attributes = frozenset({"token_indices", "positions", "extend_seq_lens_cpu", "swa_out_cache_loc"})


class UnifiedStandIn(StandIn):
    role = "unified metadata"
    attributes = frozenset({"swa_loc"})


class BatchStandIn(StandIn):
    role = "forward batch"
    attributes = frozenset({"forward_mode", "positions", "out_cache_loc", "req_pool_indices", "batch_size"})


STAND_IN_ATTRIBUTES = {cls.role: cls.attributes for cls in (PoolStandIn, BackendStandIn)}


class SglangMode:
    """SGLang's forward-mode predicates over swafuzz's modes: a DSpark draft block is the
    draft model's TARGET_VERIFY forward."""

    def __init__(self, mode: ForwardMode):
        self.mode = ForwardMode.TARGET_VERIFY if mode is ForwardMode.DRAFT_BLOCK else mode

    def is_idle(self) -> bool:
        return self.mode.is_idle()

    def is_decode(self) -> bool:
        return self.mode.is_decode()

    def is_decode_or_idle(self) -> bool:
        return self.mode.is_decode_or_idle()

    def is_target_verify(self) -> bool:
        return self.mode is ForwardMode.TARGET_VERIFY

    def is_extend(self) -> bool:
        return self.mode in (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY)

    def is_draft_extend(self) -> bool:
        return self.mode is ForwardMode.DRAFT_EXTEND


class SwaKeyStore:
    """Stands in for the SWA key pool: remembers the location of the latest store.

    ``kv_buffer[layer]`` is the store itself, so a kernel handed a layer's buffer records
    into it too.
    """

    page_size = 1

    def __init__(self) -> None:
        self.last_loc: torch.Tensor | None = None
        self.kv_buffer = self

    def __getitem__(self, local_layer: int) -> "SwaKeyStore":
        return self

    def set_key_buffer_fused(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor) -> None:
        if not isinstance(loc, torch.Tensor):
            raise location_fault("set_key_buffer_fused", loc)
        self.last_loc = loc


def fused_k_norm_rope_flashmla(*, out_loc: torch.Tensor, kvcache: SwaKeyStore, **_: Any) -> None:
    """Stands in for the fused norm-RoPE-store kernel: records where it would write."""
    if not isinstance(out_loc, torch.Tensor):
        raise location_fault("fused_k_norm_rope_flashmla", out_loc)
    kvcache.last_loc = out_loc


def _join_staged_commit_writes() -> None:
    """The DSpark worker's ``pre_kv_store_hook`` (``DeferredContextCommit.join``), which makes
    a draft block's first store wait for the verify's staged commit writes: the engine model
    stages none, so there is nothing to wait for."""


def join_in_graph_metadata_prep() -> None:
    """Stands in for the wait on metadata prepared on a side stream (there is none here)."""


class KernelModule:
    """Stands in for one of SGLang's kernel modules: the calls it models, and a gap (never
    a finding) for any other name the code uses from it."""

    def __init__(self, name: str, **calls: Callable[..., Any]) -> None:
        self._name, self._calls = name, calls

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._calls:
            return self._calls[name]
        raise StandInGap(f"SGLang code used {self._name}.{name}, which swafuzz does not model")


def _no_decode_streams(**_: Any) -> tuple[None, ...]:
    # the attention index streams are read by attention kernels, not by any store
    return (None,) * 6


class EngineEnvironment:
    """Stands in for SGLang's ``envs``: ``envs.NAME.get()`` is the run's value of NAME, the
    value the run's switches set (:class:`.switches.SwitchSettings`, given when the subject
    is configured), else the default the tree's environ.py declares."""

    def __init__(self) -> None:
        self.settings = None

    def __getattr__(self, name: str) -> "_EnvironmentVariable":
        if name.startswith("_"):
            raise AttributeError(name)
        return _EnvironmentVariable(self, name)


class _EnvironmentVariable:
    def __init__(self, environment: EngineEnvironment, name: str):
        self.environment, self.name = environment, name

    def get(self) -> Any:
        try:
            return self.environment.settings.environment_value(self.name)
        except (AttributeError, KeyError):
            raise StandInGap(
                f"SGLang code read envs.{self.name}, which the tree's environ.py does not declare with a "
                f"default swafuzz can read: set it with --sglang-switch {self.name}=0|1 if it is a boolean"
            ) from None

    def is_set(self) -> bool:
        return self.name in self.environment.settings.to_dict()

    def __getattr__(self, attribute: str) -> Any:
        raise StandInGap(f"SGLang code used envs.{self.name}.{attribute}, which swafuzz does not model")


# the global names bound SGLang code gets in place of SGLang's own
STAND_INS: dict[str, Any] = {
    "DSV4Metadata": ForwardMetadata,
    "fused_k_norm_rope_flashmla": fused_k_norm_rope_flashmla,
    "join_in_graph_metadata_prep": join_in_graph_metadata_prep,
    # the unified-KV ring producer's gates and kernels: the ring is on, bf16, ungrouped
    "is_unified_kv_triton": lambda: True,
    "is_unified_kv_fp8": lambda: False,
    "_grouped_asm_enabled": lambda: False,
    "_GROUPED_ASM_MIN_REQS": 0,
    "_GROUPED_ASM_BLOCK_Q": 0,
    # unified_kv_kernels' modules; grouped verify attention is off (_grouped_asm_enabled)
    "runtime": KernelModule("runtime", build_decode_streams=_no_decode_streams),
    "grouped_verify_streams": KernelModule("grouped_verify_streams"),
    # the producer builds metadata only when none is attached; the drivers always attach one
    "UnifiedKvMetadata": lambda: UnifiedStandIn(swa_loc=None),
}
# names the module-level helpers use, from the standard library
STANDARD_NAMES: dict[str, Any] = {"fields": dataclasses.fields, "functools": functools, "warnings": warnings}

# The modes in which SGLang's DeepSeek-V4 model may read get_unified_swa_loc in some release:
# its unified-KV store takes the ring rows from the getter on the decode arm
# (is_decode_or_idle) and, in 0.5.23 with the fp8 ring, for target-verify; prefill and extend
# rows are stored by the backend. A configured subject is given the modes its own tree calls
# the getter in (swafuzz.subjects.sglang.callsites); where that reading is unconfirmed, the merge's
# driver keeps to these, and the getter's own driver calls it in every mode.
RING_GETTER_MODES = frozenset({
    ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY,
})

POOL_CLASS = "DeepSeekV4TokenToKVPool"
# The request window's workspace, sized once for any forward a scenario draws (the pool sizes
# SGLang's for its largest chunk and graph; a graph here may pad past the request slots).
# Its rows hold no bytes here, so the size costs nothing.
WINDOW_WORKSPACE_ROWS = 1 << 24
METADATA_CLASS = "DSV4Metadata"
CORE_METADATA_CLASS = "DSV4AttnMetadata"
UNIFIED_METADATA_CLASS = "UnifiedKvMetadata"
_EMPTY = torch.empty(0)


class DraftBlocks(enum.Enum):
    """How a target's driver makes the metadata of a DSpark draft block (0.5.16+), whose
    stores ``DSparkAttention._store_block_kv`` sends through the target."""

    # the tree's init_forward_metadata_dspark_draft_block (CUDA backend), bound and run, then
    # the block's rows refreshed as eager init's init_forward_metadata_in_graph does
    BUILT_BY_TREE = "built by the tree"
    # as a target-verify forward of the draft model, which is what the HIP backend leaves its
    # getters for a block (0.5.16-0.5.23): under unified KV it builds the block's metadata with
    # init_forward_metadata_target_verify; on paged SWA rows eager init ends in
    # init_forward_metadata_in_graph, which translates the block's locations on a pool with no
    # request window, and a DSpark draft's pool never has one (nor a draft ring on HIP:
    # uses_draft_swa_ring; .configure reads that from each tree)
    AS_VERIFY = "as a verify"


class SglangSubject(Subject):
    """Runs bound SGLang code; subclasses made per target and source set ``binding``."""

    binding: ClassVar[Binding]
    backend_class_name: ClassVar[str | None] = None
    # SGLANG_OPT_CACHE_SWA_TRANSLATION: the pool's cache is on (as the releases that read
    # the switch default it) unless a run sets the switch off
    cache_swa_translation: ClassVar[bool] = True
    # lifecycle features the realistic profile does not draw for this release (swafuzz.subjects.sglang.configure)
    realistic_exclusions: ClassVar[frozenset[str]] = frozenset()
    # the forward modes in which the tree calls the target, read from its call sites
    # (swafuzz.subjects.sglang.configure); None: those the driver models, modelled_modes
    target_modes: ClassVar[frozenset[ForwardMode] | None] = None
    modelled_modes: ClassVar[frozenset[ForwardMode]] = frozenset(ForwardMode)
    call_sites: ClassVar[Any] = None  # the reading target_modes comes from (callsites.Reading)
    environment: ClassVar[EngineEnvironment]  # what the bound code's envs reads (Target.subject)
    answer_verb: ClassVar[str]  # how the target's entry method gives its answer, for answered_by
    # per lifecycle method, the bound SGLang methods it calls (the store call: the target's
    # entry method), which findings name for it
    runs: ClassVar[dict[str, tuple[str, ...]]] = {"register_mapping": ("register_mapping",)}
    # the tree's request window (.request_window.WindowCode; None where the target's code has
    # no branch for it, and window_absent says why)
    window_code: ClassVar[Any] = None
    window_absent: ClassVar[str] = ""
    # the tree's late_layer_tail_layout (.late_layer_tail.TailLayout; None where the target's
    # code has no branch for the tail, and tail_absent says why)
    tail_code: ClassVar[Any] = None
    tail_absent: ClassVar[str] = ""
    # whether a forward with no rows on this rank reaches the layers' SWA stores, read from the
    # tree (.engine_features.ZeroRowReading, set by .configure; None: not read)
    zero_rows: ClassVar[Any] = None
    # how a DSpark draft block's metadata is made (set by .configure; None: the driver runs
    # none on this tree, and draft_block_absent says why), and for BUILT_BY_TREE the tree's
    # draft-block metadata init (.producers.DraftBlockCode)
    draft_blocks: ClassVar[DraftBlocks | None] = None
    draft_block_code: ClassVar[Any] = None
    draft_block_absent: ClassVar[str] = "this target's driver runs no DSpark draft blocks"

    @classmethod
    def zero_rows_stored(cls) -> bool | None:
        """Whether the tree's layers store a forward with no rows (None: not read, or unreadable)."""
        return None if cls.zero_rows is None else cls.zero_rows.reaches_store

    def __init__(self, spec):
        super().__init__(spec)
        self.pool = self._new_pool(request_window=self._new_request_window(), role="target")
        # SGLang's draft worker keeps a pool of its own, which never holds a request window
        self.draft_pool = self._new_pool(request_window=None, role="draft") if self.pool.request_window is not None else self.pool
        if self.backend_class_name is not None:
            self.backend_class = self.binding.classes[self.backend_class_name].build(BackendStandIn)
        # the tree's own metadata records where it declares them: a field a tree adds is there
        self.metadata_class = self._record(METADATA_CLASS, ForwardMetadata)
        self.core_class = self._record(CORE_METADATA_CLASS, CoreMetadata)

    def _new_pool(self, request_window: Any, role: str) -> PoolStandIn:
        spec = self.spec
        pool_code = self.binding.classes.get(POOL_CLASS)
        pool_class = pool_code.build(PoolStandIn) if pool_code else PoolStandIn
        return pool_class(
            full_to_swa_index_mapping=None, start_layer=spec.start_layer,
            _stage_start=spec.start_layer, cached_loc=None,
            _should_cache_swa=self.cache_swa_translation,
            swa_kv_pool=SwaKeyStore(), request_window=request_window, swa_req_ring_size=None,
            unified_swa_ring_size=spec.ring, unified_swa_window=spec.sliding_window, unified_swa_pages=0,
            engine_model=EngineModel(role, spec.speculative, spec.num_draft_tokens, self.environment, spec.dspark),
        )

    @classmethod
    def request_window_on(cls) -> bool:
        """Whether the run sets encoder SWA bounded replay (DeepSeek-V4.1's request window)."""
        settings = cls.environment.settings
        return bool(settings is not None and settings.get(REQUEST_WINDOW_SWITCH))

    def _new_request_window(self) -> Any:
        """The tree's ``RequestWindow`` as ``DeepSeekV4TokenToKVPool.__init__`` (0.5.21+) makes
        it for the target model under the switch; None for a draft model, another setting, or
        a target whose code has no branch for it."""
        if self.window_code is None or not self.request_window_on() or self.spec.model != "target":
            return None
        return self.window_code.new_window(self.spec.num_req_slots, self._draft_tokens(), WINDOW_WORKSPACE_ROWS)

    def _draft_tokens(self) -> int:
        return self.spec.num_draft_tokens if self.spec.speculative else 0

    @classmethod
    def not_checked(cls) -> tuple[str, ...]:
        """The target's branches this run does not check, each with the reason."""
        return tuple(cls._draft_block_notes())

    @classmethod
    def _draft_block_notes(cls, reads: tuple[str, ...] = ()) -> list[str]:
        """What this run leaves out of DSpark's draft blocks, where the tree's DSpark model
        stores them through the target (``reads``: the names the entry method reads)."""
        modes = cls.target_modes
        if modes is not None and ForwardMode.DRAFT_BLOCK not in modes:
            return []
        if cls.draft_blocks is None:
            return [f"DSpark draft blocks: not drawn: {cls.draft_block_absent}"]
        if cls.draft_blocks is DraftBlocks.AS_VERIFY:
            return ["DSpark draft blocks: each on the metadata of a target-verify forward of the "
                    "draft model, which the HIP backend leaves its getters for a block (under unified KV "
                    "init_forward_metadata_target_verify builds it; on paged SWA rows init_forward_metadata_in_graph "
                    "translates the block's locations last); init_forward_metadata_dspark_draft_block, where the "
                    "tree has one, is not run"]
        notes = ["DSpark draft blocks: a DSpark draft graph's refresh of the block's rows on the draft ring "
                 "(init_forward_metadata_in_graph) is checked among the producers (\"init_forward_metadata_in_graph "
                 "for a DSpark draft block\")"]
        if "pre_kv_store_hook" in reads and cls.draft_block_code.store_hook:
            notes.append("pre_kv_store_hook: the DSpark worker's hook is handed to the draft backends and called "
                         "by this getter, with no staged commit writes to wait for (nothing here stages them); "
                         "that every draft block store calls it is checked among the producers "
                         "(\"get_swa_out_cache_loc for a DSpark draft block\")")
        return notes

    def _record(self, name: str, stand_in: type[StandIn]) -> type[StandIn]:
        bound = self.binding.classes.get(name)
        return bound.on_stand_in(stand_in) if bound is not None else stand_in

    def register_mapping(self, mapping: torch.Tensor) -> None:
        super().register_mapping(mapping)
        if hasattr(type(self.pool), "register_mapping"):
            for pool in {id(self.pool): self.pool, id(self.draft_pool): self.draft_pool}.values():
                pool.register_mapping(mapping)

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        if batch.num_tokens == 0 and self.zero_rows_stored() is False:
            # the tree's layer returns before its store on a rank with no rows: nothing is stored
            return torch.empty(0, dtype=torch.int32, device=batch.positions.device)
        modes = self.modelled_modes if self.target_modes is None else self.target_modes
        if batch.mode not in modes:
            return self._stored_elsewhere(batch)
        return self._target_location(batch, layer_id)

    def _target_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def _stored_elsewhere(self, batch: ForwardBatch) -> torch.Tensor:
        """The rows of a forward whose mode the tree stores through another path than the
        target (the backend's own store): the truth, so that findings are the target's."""
        if self.truth is Truth.RING:
            ring = self.pool.unified_swa_ring_size
            slots = tokens_request_slots(batch).to(torch.int64)
            return (slots * ring + batch.positions.to(torch.int64) % ring).to(torch.int32)
        return self.mapping[batch.out_cache_loc.to(torch.int64)].to(torch.int32)

    def forward_batch(self, batch: ForwardBatch) -> BatchStandIn:
        return BatchStandIn(
            forward_mode=SglangMode(batch.mode), positions=batch.positions,
            out_cache_loc=batch.out_cache_loc, req_pool_indices=batch.req_pool_indices,
            batch_size=int(batch.req_pool_indices.shape[0]),
        )


# ---- pool-level cache ----------------------------------------------------------------------


def _fused_store_arguments(batch: ForwardBatch) -> dict[str, Any]:
    return {"cache_k": _EMPTY}


def _norm_rope_store_arguments(batch: ForwardBatch) -> dict[str, Any]:
    return {"kv": _EMPTY, "kv_weight": _EMPTY, "eps": 1e-6, "freqs_cis": _EMPTY, "positions": batch.positions}


STORE_ARGUMENTS = {
    "set_swa_key_buffer_radix_fused": _fused_store_arguments,
    "set_swa_key_buffer_radix_fused_norm_rope": _norm_rope_store_arguments,
}


class PoolStoreSubject(SglangSubject):
    """A pool store function is called for every SWA layer with the forward's full-pool
    locations; the location it hands the key store is its answer."""

    truth = Truth.POOL
    store: ClassVar[str]
    answer_verb = "handed the key store"

    def _target_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        key_store = self.pool.swa_kv_pool
        key_store.last_loc = None
        getattr(self.pool, self.store)(
            layer_id=layer_id, raw_loc=batch.out_cache_loc, **STORE_ARGUMENTS[self.store](batch)
        )
        if key_store.last_loc is None:
            raise CodeFault(*defined_at(getattr(type(self.pool), self.store)),
                            "returned without storing this layer's keys")
        return key_store.last_loc


# ---- metadata-level caches -----------------------------------------------------------------


@dataclass
class _BackendSlot:
    """What the engine keeps per micro-batch: one backend per role and draft step."""

    backends: dict[tuple[str, int], Any] = field(default_factory=dict)
    # per backend: the forward id of the batch whose metadata init set its metadata last
    built_for: dict[tuple[str, int], int] = field(default_factory=dict)
    initialised_forward: int | None = None
    # per captured graph (ForwardBatch.graph_key): its metadata
    captured: dict[tuple[str, int], ForwardMetadata] = field(default_factory=dict)
    # per captured graph: the reference's workspace rows, read before the capture (which
    # refuses host reads)
    window_rows: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    # the late-layer tail metadata the target model's backend holds (SGLang's
    # tail_forward_metadata), and the forward whose metadata init built it
    tail: ForwardMetadata | None = None
    tail_for: int | None = None


def _role(mode: ForwardMode) -> str:
    # SGLang runs multi-step draft decode and draft extend on backends of their own
    if mode is ForwardMode.DRAFT_DECODE:
        return "draft decode"
    if mode is ForwardMode.DRAFT_EXTEND:
        return "draft extend"
    return "model"


class _MetadataSubject(SglangSubject):
    """Shared lifecycle of the backend getters: metadata built per forward by a producer,
    read by the real getter in every layer."""

    getter: ClassVar[str]
    answer_verb = "returned"
    # the metadata fields the getter may return as they are, from the backend's forward_metadata down
    answer_fields: ClassVar[tuple[str, ...]] = ()

    def _set_metadata(self, batch: ForwardBatch, step: int, metadata: ForwardMetadata) -> None:
        """Hand the backend of ``batch``'s role and draft ``step`` the metadata its init built."""
        self._backend(batch, step).forward_metadata = metadata
        self._set_by(batch, step)

    def _set_by(self, batch: ForwardBatch, step: int) -> None:
        self._slot(batch).built_for[(_role(batch.mode), step)] = batch.forward_id

    def answer_origin(self, batch: ForwardBatch, answer: torch.Tensor) -> tuple[str, int] | None:
        """The metadata field the getter returned ``answer`` from (the tensor itself or a view
        of its memory, read after the call, so the getter computes as before), and the
        forward whose metadata init set it; None where ``answer`` is none of them."""
        key = (_role(batch.mode), batch.draft_step)
        slot = self._slot(batch)
        backend = slot.backends.get(key)
        if backend is None or key not in slot.built_for or type(answer) is not torch.Tensor:
            return None
        for path in self.answer_fields:
            held = backend.forward_metadata
            for name in path.split("."):
                held = getattr(held, name, None)
            if type(held) is torch.Tensor and held.untyped_storage().data_ptr() == answer.untyped_storage().data_ptr():
                return f"forward_metadata.{path}", slot.built_for[key]
        return None

    def _slot(self, batch: ForwardBatch) -> _BackendSlot:
        return batch.backend.__dict__.setdefault("sglang", _BackendSlot())

    def _backend(self, batch: ForwardBatch, step: int):
        slot = self._slot(batch)
        key = (_role(batch.mode), step)
        backend = slot.backends.get(key)
        if backend is None:
            pool = self.pool if key[0] == "model" else self.draft_pool
            backend = slot.backends[key] = self.backend_class(
                forward_metadata=None, token_to_kv_pool=pool, pre_kv_store_hook=self._store_hook(),
                topk=1 if self.spec.speculative else 0, mtp_enabled=self.spec.speculative,
                speculative_num_steps=0, speculative_step_id=step,
                is_dspark=self.spec.dspark, _fp8_decode_num_heads=None, _fp8_verify_epi=None,
                engine_model=EngineModel(self.spec.model, self.spec.speculative, self.spec.num_draft_tokens,
                                         self.environment, self.spec.dspark),
            )
        if batch.mode is ForwardMode.DRAFT_DECODE:
            backend.speculative_num_steps = batch.num_draft_steps
        return backend

    def _store_hook(self) -> Callable[[], None] | None:
        """What the engine hands a new backend as its ``pre_kv_store_hook``: SGLang's DSpark
        worker sets one on its draft model's backends (0.5.23, under
        ``SGLANG_DSPARK_DEFER_CONTEXT_KV``), every other worker none."""
        code = self.draft_block_code
        dspark_draft = self.spec.dspark and self.spec.model == "draft"
        return _join_staged_commit_writes if dspark_draft and code is not None and code.store_hook else None

    def _skips_init(self, batch: ForwardBatch) -> bool:
        # SGLang's init_forward_metadata returns at once for idle forwards under MTP
        return self._backend(batch, 0).mtp_enabled and batch.mode.is_idle()

    def _metadata(self, batch: ForwardBatch, swa_out_cache_loc=None, unified=None) -> ForwardMetadata:
        return self._wrap(self.core_class.of(batch.positions, swa_out_cache_loc, unified))

    def _wrap(self, core: CoreMetadata) -> ForwardMetadata:
        return self.metadata_class(core_attn_metadata=core, late_layer_tail=None)

    def _target_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        backend = self._backend(batch, batch.draft_step)
        self._before_store(batch, backend)
        return getattr(backend, self.getter)(self.forward_batch(batch))

    def _before_store(self, batch: ForwardBatch, backend) -> None:
        pass


class TranslatedLocSubject(_MetadataSubject):
    """``get_swa_out_cache_loc``: metadata holds ``out_cache_loc`` translated by the pool.

    The producer follows SGLang's rules: eager init translates the forward's locations
    (every mode; idle under MTP is skipped); each step of a multi-step draft has its own
    backend holding that step's locations, built when the step's locations are known;
    under graphs the translation is recorded inside the captured graph, so each replay
    recomputes it from the static buffers and replay prep leaves it alone.

    Under the request window (``--enable-encoder-swa-bounded-replay``, 0.5.21+, where the
    getter has a branch for it) the target model's pool holds the tree's ``RequestWindow``
    and the metadata the layout the tree's ``window_layout`` builds for the forward's tokens
    (one history group per request row, as ``make_core_attn_metadata`` passes), so the
    getter returns workspace rows. Each is read back through the reference's layout of the
    forward (:func:`swafuzz.reference.truth.request_window_rows`, one empty history group
    for an idle forward) to the row of the batch whose key belongs there, and answered as
    that row's SWA slot; a workspace row that belongs to no row of this forward (a previous
    forward's layout) is answered -1, which no slot is. The draft model's pool has no
    window (SGLang builds one only for the target worker).

    Under decoder SWA bounded replay (``--enable-decoder-swa-bounded-replay``, 0.5.21+, where
    the getter has a branch for the late-layer tail) an extend's metadata init also builds
    the tail metadata (``DeepseekV4AttnBackend.init_forward_metadata`` calls
    ``_build_late_layer_tail_metadata`` for extends without speculation; the HIP backend the
    same, 0.5.22+): the tree's ``late_layer_tail_layout`` picks each request's last
    ``sliding_window`` tokens (SGLang passes its ``SWA_WINDOW``, the model's window; here the
    engine model's), and the tail's ``swa_out_cache_loc`` is the pool's translation of those
    rows' locations. The layers from :attr:`late_layer_start` on read the getter with that
    metadata as the backend's ``forward_metadata`` (``enter_late_layer_tail`` swaps it in,
    ``exit_late_layer_tail`` back). A tail layer stores the tail's rows only: the answer must
    hold one row per tail row (:func:`swafuzz.reference.truth.late_layer_tail_tokens`), else
    the getter is at fault; each is answered at its extend row, and the rows the layer does
    not store as the reference has them, so that findings are the getter's.
    """

    truth = Truth.POOL
    getter = "get_swa_out_cache_loc"
    answer_fields = ("core_attn_metadata.swa_out_cache_loc",)
    runs = {**SglangSubject.runs, "init_forward_metadata": ("translate_loc_from_full_to_swa",),
            "init_graph_metadata": ("translate_loc_from_full_to_swa",)}

    def _metadata(self, batch: ForwardBatch, swa_out_cache_loc=None, unified=None) -> ForwardMetadata:
        metadata = super()._metadata(batch, swa_out_cache_loc, unified)
        window = self._request_window(batch)
        if window is not None and batch.num_tokens:
            metadata.core_attn_metadata.request_window_layout = self._window_layout(batch, window)
        return metadata

    def _request_window(self, batch: ForwardBatch) -> Any:
        return self.pool.request_window if _role(batch.mode) == "model" else None

    @classmethod
    def late_layer_tail_on(cls) -> bool:
        """Whether the run sets decoder SWA bounded replay (DeepSeek-V4.1's late-layer tail)."""
        settings = cls.environment.settings
        return bool(settings is not None and settings.get(DECODER_REPLAY_SWITCH))

    @property
    def late_layer_start(self) -> int | None:
        """The first layer that runs on the tail. SGLang's ``DeepseekV4Model.__init__`` sets
        ``late_layer_start`` from the model config's KV-source layers: the last of them in
        0.5.23 (its compressed keys are written for every row first), the layer after it in
        0.5.21 and 0.5.22. The engine model has no KV-source layers, so the middle SWA layer
        of the stage stands for it, leaving layers before it that store every row."""
        layers = self.spec.swa_layers
        return layers[len(layers) // 2] if layers else None

    def _builds_tail(self, batch: ForwardBatch) -> bool:
        """Whether metadata init builds a late-layer tail for ``batch``: the switch is on, the
        getter has the branch, and the forward is an extend without speculation on the target
        model."""
        return (self.tail_code is not None and self.late_layer_tail_on() and batch.mode is ForwardMode.EXTEND
                and self.spec.model == "target" and self.late_layer_start is not None)

    def _tail_metadata(self, batch: ForwardBatch) -> ForwardMetadata:
        """The tail metadata as ``_build_late_layer_tail_metadata`` makes it for the getter:
        the tree's layout of the tail rows, their locations translated by the pool, or under
        the request window the rows of the window's layout of the tail (its prefill metadata
        init lays the tail rows out with one history group per request)."""
        token_indices, tail_lens, _floor = self.tail_code.function(
            extend_lens_cpu=[int(n) for n in batch.extend_seq_lens.tolist()],
            seq_lens_cpu=[int(n) for n in batch.seq_lens_cpu.tolist()],
            tail_len=self.spec.sliding_window, device=batch.out_cache_loc.device,
        )
        positions = batch.positions[token_indices]
        window = self._request_window(batch)
        if window is None:
            swa_out_cache_loc = self.pool.translate_loc_from_full_to_swa(
                batch.out_cache_loc[token_indices]).to(torch.int32)
            core = self.core_class.of(positions, swa_out_cache_loc)
        else:
            live = int(batch.extend_seq_lens.sum())
            slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens, output_size=live)
            layout = self.window_code.layout(window, slots[token_indices], positions, batch.batch_size)
            swa_out_cache_loc = layout.write_loc
            core = self.core_class.of(positions, swa_out_cache_loc)
            core.request_window_layout = layout
        tail = LateLayerTailStandIn(token_indices=token_indices, positions=positions,
                                    extend_seq_lens_cpu=list(tail_lens), swa_out_cache_loc=swa_out_cache_loc)
        return self.metadata_class(core_attn_metadata=core, late_layer_tail=tail)

    @classmethod
    def not_checked(cls) -> tuple[str, ...]:
        """The getter's branches this run does not check, each with the reason."""
        reads = cls.binding.classes[cls.backend_class_name].methods[cls.getter].__code__.co_names
        notes = []
        if "request_window" in reads and cls.request_window_on():
            if cls.zero_rows_stored() is None:
                read = "not read" if cls.zero_rows is None else cls.zero_rows.says
                notes.append(f"request window: an idle forward with no rows is not checked, since whether the "
                             f"layers store it is {read}")
        elif cls.request_window_on():
            notes.append(f"request window: {cls.window_absent}")
        if "late_layer_tail" in reads:
            notes.append(cls._tail_note())
        notes += cls._draft_block_notes(reads)
        return tuple(notes)

    @classmethod
    def _tail_note(cls) -> str:
        if not cls.late_layer_tail_on():
            return (f"late-layer tail: {DECODER_REPLAY_SWITCH} is off in this run, so no extend builds one "
                    f"(set {DECODER_REPLAY_SWITCH.removeprefix('--')}=1 to check it)")
        if cls.tail_code is None:
            return f"late-layer tail: {cls.tail_absent}"
        return ("late-layer tail: this lifecycle runs eager tails only; the prefill CUDA graph's tail blocks and "
                "context-parallel tails are built by _build_late_layer_tail_metadata, whose rows are checked among "
                "the producers, and the getter's tail branch is the same for them; whole-extend tails (prompt "
                "logprobs, every hidden state) likewise; an extend whose metadata init is skipped is not modelled "
                "(it runs every layer over every row here); an extend split into micro-batches runs a tail per "
                "micro-batch, which SGLang's tail path never does (it refuses two-batch overlap)")

    def _window_layout(self, batch: ForwardBatch, window: Any) -> Any:
        if batch.mode.is_idle():
            # an idle rank's batch comes padded to the synced size (ForwardBatch's
            # _pad_inputs_to_size): a request row at slot 0 per row, which the decode
            # metadata builder lays out like any other
            rows = batch.num_tokens
            slots = torch.zeros(rows, dtype=torch.int64, device=batch.positions.device)
            return self.window_code.layout(window, slots, batch.positions, rows)
        live = int(batch.extend_seq_lens.sum())
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens, output_size=live)
        padded = batch.num_tokens if batch.num_tokens > live else None
        return self.window_code.layout(window, slots, batch.positions[:live], batch.batch_size, padded)

    def _target_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        slot = self._slot(batch)
        if batch.mode is ForwardMode.DRAFT_BLOCK and self._draft_ring() is not None:
            return self._ring_rows_read_back(batch, super()._target_location(batch, layer_id))
        if slot.tail_for == batch.forward_id and layer_id >= self.late_layer_start:
            return self._tail_rows_read_back(batch, self._in_tail(batch, layer_id, slot.tail))
        if self._request_window(batch) is None:
            return super()._target_location(batch, layer_id)
        if batch.num_tokens == 0 and self.zero_rows_stored() is None:
            # whether SGLang's layers store a forward with no rows is unread (its layouts
            # refuse to lay out none): not checked, as the subject's notes say
            return torch.empty(0, dtype=torch.int32, device=batch.positions.device)
        return self._window_rows_read_back(batch, super()._target_location(batch, layer_id))

    def _in_tail(self, batch: ForwardBatch, layer_id: int, tail: ForwardMetadata) -> Any:
        """The getter's answer with the backend on the tail metadata, as between SGLang's
        ``enter_late_layer_tail`` and ``exit_late_layer_tail``."""
        backend = self._backend(batch, batch.draft_step)
        saved, backend.forward_metadata = backend.forward_metadata, tail
        try:
            return super()._target_location(batch, layer_id)
        finally:
            backend.forward_metadata = saved

    def _tail_rows_read_back(self, batch: ForwardBatch, answer: Any) -> Any:
        """The answer of a tail layer at the extend rows whose keys it stores (the reference's
        tail rows; under the request window, workspace rows read back through the reference's
        layout of the tail first), the other rows as the reference has them; an answer that is
        not an int32 row per tail row on the batch's device is handed on as it is, for the
        judge to say so, and one of another length is the getter's fault (a full extent's rows
        among them)."""
        tail = late_layer_tail_tokens(batch.extend_seq_lens, self.spec.sliding_window).to(batch.out_cache_loc.device)
        if type(answer) is torch.Tensor and self._request_window(batch) is not None:
            answer = self._window_rows_read_back(batch, answer, tail)
        if type(answer) is not torch.Tensor or answer.dtype != torch.int32 or answer.dim() != 1 \
                or answer.device != batch.out_cache_loc.device:
            return answer
        if answer.shape[0] != tail.shape[0]:
            getter = getattr(self.backend_class, self.getter)
            raise CodeFault(*defined_at(getter),
                            f"returned {answer.shape[0]} rows in a late-layer tail layer of an extend whose tail "
                            f"holds {tail.shape[0]} (decoder SWA bounded replay): the tail's keys are stored "
                            "to the wrong rows")
        rows = self.mapping[batch.out_cache_loc.to(torch.int64)].to(torch.int32)
        rows[tail] = answer
        return rows

    def _window_rows_read_back(self, batch: ForwardBatch, rows: torch.Tensor,
                               tail: torch.Tensor | None = None) -> torch.Tensor:
        """The SWA slot of the batch row whose workspace row each of ``rows`` is, by the
        reference's layout; -1 for a row that is none of this forward's. ``tail``: the
        extend rows a tail layer stores (the reference's), laid out on their own. Tensor
        operations only, so that a captured graph redoes the reading at each replay.

        An eager idle forward whose metadata init ran also owns the rows of the layout that
        init built from its padded batch (0.5.21 and 0.5.22 store there): an idle forward
        never commits, so its rows of either layout are at the dummy slot."""
        locations = batch.out_cache_loc.to(torch.int64)
        if tail is not None:
            want, locations = self._tail_window_truth(batch, tail).write_loc, locations[tail]
        elif batch.in_graph:
            want = self._slot(batch).window_rows[batch.graph_key]
        else:
            want = self._window_truth(batch).write_loc
            own = self._own_idle_layout(batch)
            if own is not None:
                want = torch.cat([want.to(own.write_loc.device, torch.int64), own.write_loc.to(torch.int64)])
                locations = torch.cat([locations, locations])
        return _read_back(want, rows, self.mapping[locations].to(torch.int32))

    def _draft_ring(self) -> int | None:
        """The rows per request slot of the DSpark draft model's ring, where its pool has one:
        under encoder SWA bounded replay SGLang's CUDA DSpark draft keeps its SWA keys in a
        ring per request slot (``uses_draft_swa_ring``, 0.5.23) of the window and the draft
        tokens in whole pages (``get_draft_swa_ring_size``; here pages of one row, as the
        engine model's SWA pages may be); None: paged SWA rows."""
        code = self.draft_block_code
        if not (self.spec.dspark and self.spec.model == "draft" and code is not None and code.ring
                and self.request_window_on()):
            return None
        return whole_page_ring(self.spec.sliding_window, self._draft_tokens(), 1)

    def _ring_rows_read_back(self, batch: ForwardBatch, answer: Any) -> Any:
        """A DSpark draft block's ring rows, each read back to the SWA slot of the batch row
        whose row of its request's ring it is (-1: no row of this block), as the judge reads
        the translated rows of paged SWA; an answer that is not an int32 row per batch row on
        the batch's device is handed on as it is, for the judge to say so."""
        if type(answer) is not torch.Tensor or answer.dtype != torch.int32 or answer.dim() != 1 \
                or answer.device != batch.out_cache_loc.device:
            return answer
        slots = tokens_request_slots(batch)
        # a graph's static inputs hold what the engine copied in, checked when it did
        want = unchecked_ring_rows(slots, batch.positions, self._draft_ring()) if batch.in_graph else \
            ring_rows(slots, batch.positions, self._draft_ring(), self.spec.num_req_slots)
        return _read_back(want, answer, self.mapping[batch.out_cache_loc.to(torch.int64)].to(torch.int32))

    def _own_idle_layout(self, batch: ForwardBatch) -> Any:
        """The window layout the metadata init of this idle forward built, or None (not idle,
        or its init was skipped and the backend holds an earlier forward's)."""
        if not batch.mode.is_idle() or self._slot(batch).built_for.get(("model", 0)) != batch.forward_id:
            return None
        return self._backend(batch, 0).forward_metadata.core_attn_metadata.request_window_layout

    def _tail_window_truth(self, batch: ForwardBatch, tail: torch.Tensor):
        """The reference's window layout of a forward whose requests add only their tail rows
        (after the rows before them): the layout the tail metadata carries."""
        counts = batch.extend_seq_lens.cpu()
        kept = torch.bincount(torch.arange(batch.batch_size).repeat_interleave(counts)[tail.cpu()],
                              minlength=batch.batch_size)
        capacity = self.window_code.capacity(self._draft_tokens())
        return self.window_code.truth(batch.req_pool_indices, batch.extend_prefix_lens.cpu() + counts - kept, kept,
                                      capacity, batch.batch_size)

    def _window_truth(self, batch: ForwardBatch):
        capacity = self.window_code.capacity(self._draft_tokens())
        if batch.mode.is_idle():
            none = torch.empty(0, dtype=torch.int64)
            return self.window_code.truth(none, none, none, capacity, None, padding=batch.num_tokens)
        live = int(batch.extend_seq_lens.sum())
        return self.window_code.truth(batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens,
                                      capacity, batch.batch_size, padding=batch.num_tokens - live)

    def _translated(self, batch: ForwardBatch) -> torch.Tensor:
        return self.pool.translate_loc_from_full_to_swa(batch.out_cache_loc).to(torch.int32)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self._skips_init(batch):
            return
        slot = self._slot(batch)
        slot.initialised_forward = batch.forward_id
        self._build_step(batch, 0)
        if _role(batch.mode) == "model":
            # SGLang's init sets the tail metadata on every forward: None but for extends
            builds = self._builds_tail(batch)
            slot.tail = self._tail_metadata(batch) if builds else None
            slot.tail_for = batch.forward_id if builds else None

    def _build_step(self, batch: ForwardBatch, step: int) -> None:
        if batch.mode is ForwardMode.DRAFT_BLOCK and self.draft_blocks is not DraftBlocks.AS_VERIFY:
            metadata = self._draft_block_metadata(batch)
        else:
            metadata = self._metadata(batch, swa_out_cache_loc=self._translated(batch))
        self._set_metadata(batch, step, metadata)

    def _draft_block_metadata(self, batch: ForwardBatch) -> Any:
        """What the tree's ``init_forward_metadata_dspark_draft_block`` builds for a DSpark
        draft block (the DSpark worker's draft forward), on the draft worker's pool: its ring,
        or paged SWA rows under the model's mapping. Eager init then refreshes the block's
        rows in ``init_forward_metadata_in_graph`` (0.5.16+), which on paged rows translates
        its locations, as for every mode here, and on the ring writes the rows the builder
        wrote (``_dspark_swa_ring_out_cache_loc``, 0.5.23)."""
        code = self.draft_block_code
        if code is None:
            raise ModelGap(f"a DSpark draft block stores through {self.backend_class_name}.{self.getter} "
                           f"here, but {self.draft_block_absent}")
        ring = self._draft_ring()
        pool = code.new_pool(ring, self.spec.num_req_slots)
        if ring is None:
            pool.register_mapping(self.mapping)
        metadata = code.metadata(pool, batch.req_pool_indices, batch.extend_prefix_lens, batch.out_cache_loc,
                                 int(batch.extend_seq_lens[0]), self.spec.num_req_slots)
        if ring is None:
            metadata.core_attn_metadata.swa_out_cache_loc = self._translated(batch)
        return metadata

    def _before_store(self, batch: ForwardBatch, backend) -> None:
        slot = self._slot(batch)
        key = (_role(batch.mode), batch.draft_step)
        if (
            batch.draft_step > 0
            and slot.initialised_forward == batch.forward_id
            and slot.built_for.get(key) != batch.forward_id
        ):
            self._build_step(batch, batch.draft_step)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self._set_metadata(batch, 0, self._metadata(batch))
        if self._request_window(batch) is not None:
            rows = self._window_truth(batch).write_loc
            self._slot(batch).window_rows[batch.graph_key] = rows.to(device=batch.positions.device,
                                                                       dtype=torch.int64)

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        # init_forward_metadata_in_graph: warm-ups run it eagerly, the capture records it; on
        # the DSpark draft's ring it writes the block's ring rows (0.5.23), elsewhere it
        # translates the locations
        metadata = self._backend(batch, 0).forward_metadata
        ring = self._draft_ring() if batch.mode is ForwardMode.DRAFT_BLOCK else None
        metadata.core_attn_metadata.swa_out_cache_loc = self._translated(batch) if ring is None else \
            self.draft_block_code.ring_out_cache_loc(ring, tokens_request_slots(batch), batch.positions)
        self._set_by(batch, 0)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        # replay prep re-points swa_out_cache_loc (an assign-listed field), but the captured
        # layers read the tensor the recorded in-graph init writes: nothing to do here
        pass


def _read_back(want: torch.Tensor, got: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Each row of ``got`` as the entry of ``slots`` at the place ``want`` holds that row, -1
    where ``want`` holds it nowhere. Tensor operations only, so that a captured graph redoes
    the reading at each replay."""
    want = want.to(device=got.device, dtype=torch.int64)
    got = got.to(torch.int64)
    if want.numel() == 0:
        return torch.full_like(got, -1, dtype=torch.int32)
    order = torch.argsort(want)
    place = order[torch.searchsorted(want[order], got).clamp(max=want.numel() - 1)]
    slots = slots.to(got.device)
    return torch.where(want[place] == got, slots[place], torch.full_like(slots[place], -1))


class RingSubject(_MetadataSubject):
    """``get_unified_swa_loc``: decode metadata holds the ring rows.

    The rows are SGLang's own: decode (and idle) metadata runs the release's
    ``_attach_unified_kv_decode_streams`` on the forward's request slots and positions, and
    so does the metadata of a target-verify forward or DSpark draft block where the tree
    calls the getter in it; other modes leave the rows unset; idle under MTP is skipped.
    Every step of a multi-step draft gets metadata built once, from the positions at init.
    Before a graph replay (of any bucket: decode and idle, or target-verify and DSpark draft
    blocks) fresh metadata is built and merged into the captured one; this subject copies the
    rows in place, which is what a replay rebuilding them in the graph leaves too, so that
    only the getter is under test (see :class:`RingMergeSubject`).
    """

    truth = Truth.RING
    getter = "get_unified_swa_loc"
    answer_fields = ("core_attn_metadata.unified.swa_loc",)
    runs = {**SglangSubject.runs, **{method: ("_attach_unified_kv_decode_streams",) for method in (
        "init_forward_metadata", "init_capture_metadata", "init_replay_metadata")}}

    def _unified(self) -> Any:
        return UnifiedStandIn(swa_loc=None)

    def _build(self, batch: ForwardBatch) -> ForwardMetadata:
        # the producer writes into the metadata the getter reads, as in SGLang: a field
        # a tree adds to it reaches the getter
        core = self.core_class.of(batch.positions, unified=self._unified())
        if batch.mode.is_decode_or_idle():
            # decode passes one request slot per token, as SGLang's decode metadata does
            state_slot = batch.req_pool_indices[: batch.positions.shape[0]]
            self._backend(batch, 0)._attach_unified_kv_decode_streams(core, state_slot)
        elif batch.mode in _VERIFY_INITS and self.target_modes and batch.mode in self.target_modes:
            # where a verify-shaped forward stores through the getter (0.5.23's fp8 ring; a
            # DSpark draft block), its metadata gets the decode streams over the per-token
            # request slots (req_pool_indices_repeated), as the HIP verify init attaches them
            # (attach_decode_streams, 0.5.18+)
            self._backend(batch, 0)._attach_unified_kv_decode_streams(core, tokens_request_slots(batch))
        return self._wrap(core)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self._skips_init(batch):
            return
        steps = batch.num_draft_steps if batch.mode is ForwardMode.DRAFT_DECODE else 1
        for step in range(steps):
            self._set_metadata(batch, step, self._build(batch))

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        metadata = self._build(batch)
        self._slot(batch).captured[batch.graph_key] = metadata
        self._set_metadata(batch, 0, metadata)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        # replay prep builds metadata for idle too (request slots and positions zeroed)
        captured = self._slot(batch).captured[batch.graph_key]
        fresh = self._build(batch)
        self._merge(batch, captured.core_attn_metadata.unified, fresh.core_attn_metadata.unified)
        _copy_written(captured.core_attn_metadata, fresh.core_attn_metadata)
        self._set_metadata(batch, 0, captured)

    def _merge(self, batch: ForwardBatch, captured: Any, fresh: Any) -> None:
        if captured.swa_loc is not None and fresh.swa_loc is not None:
            captured.swa_loc.copy_(fresh.swa_loc)
        else:
            captured.swa_loc = fresh.swa_loc


# a speculative engine's drafter, as the HIP backend's target-verify init tells them apart
# (its is_dspark)
DSPARK, OTHER_DRAFTER = "DSpark", "another drafter"

# the forwards whose metadata the HIP backend builds with its target-verify init: a DSpark
# draft block is a TARGET_VERIFY forward of the draft model, and under unified KV the HIP
# backend keeps it on that path (_uses_dspark_draft_window)
_VERIFY_INITS = frozenset({ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_BLOCK})


def _copy_written(captured: CoreMetadata, fresh: CoreMetadata) -> None:
    """Bring into the captured metadata what the producer wrote beyond the modelled fields
    (a field a tree adds), in place where the tensor fits, so that the getter reads it."""
    for name, value in vars(fresh).items():
        if name in CoreMetadata.attributes:
            continue
        old = vars(captured).get(name)
        if isinstance(old, torch.Tensor) and isinstance(value, torch.Tensor) and old.shape == value.shape \
                and old.dtype == value.dtype:
            old.copy_(value)
        else:
            setattr(captured, name, value)


class RingMergeSubject(RingSubject):
    """:class:`RingSubject` whose ring metadata is SGLang's ``UnifiedKvMetadata`` and whose
    pre-replay merge is its real ``copy_`` (fields in the copy list are written in place,
    fields in the assign list are re-pointed).

    Only stores that the tree's model routes through the getter read the merged metadata;
    the others are answered with per-token ring rows, as the backend's own store writes
    them, so that findings are about the merge.
    """

    modelled_modes = RING_GETTER_MODES
    runs = {**RingSubject.runs, "init_replay_metadata": ("_attach_unified_kv_decode_streams", "copy_")}
    # the drafters (DSPARK, OTHER_DRAFTER) whose target-verify bucket (verify forwards, and
    # DSpark draft blocks) the tree's replay prep hands raw inputs (DSV4RawVerifyMetadata),
    # from which the graph rebuilds the ring rows: UnifiedKvMetadata.copy_ is not on that
    # path (set by .configure from init_forward_metadata_target_verify)
    raw_verify_drafters: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec):
        super().__init__(spec)
        self.unified_class = self.binding.classes[UNIFIED_METADATA_CLASS].build(SimpleNamespace)

    def _unified(self) -> Any:
        return self.unified_class()

    def _merge(self, batch: ForwardBatch, captured: Any, fresh: Any) -> None:
        drafter = DSPARK if self.spec.dspark else OTHER_DRAFTER
        if batch.mode in _VERIFY_INITS and drafter in self.raw_verify_drafters:
            super()._merge(batch, captured, fresh)
        else:
            captured.copy_(fresh)
