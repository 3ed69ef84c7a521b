"""SGLang's producers of the rows its SWA stores write, checked row by row against the truth.

A producer is SGLang code that turns a forward's live inputs into rows a store writes or
reads its write target from: the target-verify and prefill state slots
(``expand_extend_with_same_length``, ``expand_prefill_casually``,
``_attach_unified_kv_prefill_meta``), the HIP decode and target-verify ring rows
(``_attach_unified_kv_decode_streams``: ``swa_loc``, ``verify_store_state_slot``), the
0.5.21+ request window (``window_layout``, ``RequestWindow.activate_idle``, ``commit`` and
``row_loc``, the backends' ``get_swa_out_cache_loc`` over it), the late-layer tail
(``late_layer_tail_layout``), multi-step draft decode (``per_step_draft_out_cache_loc`` and
the backends' ``init_forward_metadata_in_graph``, which refreshes each step's rows
inside the graph), the CUDA graph buffer of translated locations
(``_fill_cuda_graph_swa_out_cache_loc``), the 0.5.23 DSpark draft blocks (the draft SWA
ring (``get_draft_swa_ring_size``, ``_dspark_swa_ring_out_cache_loc``), the rows a block's
stores write on the metadata ``init_forward_metadata_dspark_draft_block`` builds, and a
draft graph's in-graph refresh of them), and the rows DSpark's injection stores the target's
context keys to (``TargetHiddenKvInjector._inject_mla``).

:data:`PRODUCERS` is the table: one row per producer, with how to bind it from a release
and how to run it on a :class:`Batch`. :func:`bind_producers` binds every row a release has
and says why each other is absent; :func:`check` runs one on a batch and names every row
that differs from :mod:`swafuzz.reference.truth` (empty when all match). SGLang's own code runs
as the release has it, SGLang's records (``WindowLayout``, ``UnifiedKvMetadata``) are
rebuilt from the release's field lists, and stand-ins remain only for what the scheduler
and the allocator hand in (batch tensors, pools, metadata holders); each names the SGLang
class it replaces, so a test holds its attributes to that class's in every release.
"""
from __future__ import annotations

import ast
import types
import typing
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ...reference.truth import (
    DUMMY_SLOT,
    draft_step_slots,
    injected_context_rows,
    late_layer_tail_tokens,
    prefill_rows,
    ring_rows,
    ring_size,
    token_state_slots,
    translate_pool,
    whole_page_ring,
)

from ...api import ForwardMode
from . import compressed
from .binding import Binding, BindError, ClassCode, FunctionCode, bind
from .drivers import CoreMetadata, EngineEnvironment, NotModelled, SglangMode, StandIn, StandInGap
from .interpreted import defines, record as record_of
from .late_layer_tail import ATTN_METADATA_FILES, LATE_LAYER_TAIL, bind_tail_layout
from .locate import SourceTree
from .faults import defined_at
from .real_classes import RealClass
from .request_window import (
    V4_ROWS, WINDOW_FILE, WINDOW_LAYOUT, WINDOW_PAGE, WINDOW_STAND_INS, PackedRowFormat, PagedRows, bind_request_window, build_layout, parameters, window_layout_code, window_truth,
)
from .statements_run import StatementsRun
from .tables import TABLE_FILES
from .targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE, POOL_FILE

VERIFY_EXPANSION = "expand_extend_with_same_length"
PREFILL_EXPANSION = "expand_prefill_casually"
PREFILL_ROWS = "_attach_unified_kv_prefill_meta"
WINDOW_IDLE = "RequestWindow.activate_idle"
WINDOW_COMMIT = "RequestWindow.commit"
WINDOW_ROW = "RequestWindow.row_loc"
DECODE_STREAMS = "_attach_unified_kv_decode_streams"
DRAFT_STEP_LOCS = "per_step_draft_out_cache_loc"
IN_GRAPH_INIT = "init_forward_metadata_in_graph"
CUDA_IN_GRAPH_INIT = f"{CUDA_BACKEND}.{IN_GRAPH_INIT}"
HIP_IN_GRAPH_INIT = f"{HIP_BACKEND}.{IN_GRAPH_INIT}"
CUDA_IN_GRAPH_DSPARK = f"{CUDA_IN_GRAPH_INIT} for a DSpark draft block"
CUDA_WINDOW_GETTER = f"{CUDA_BACKEND}.get_swa_out_cache_loc"
HIP_WINDOW_GETTER = f"{HIP_BACKEND}.get_swa_out_cache_loc"
GRAPH_LOC_BUFFER = "_fill_cuda_graph_swa_out_cache_loc"
DRAFT_RING_SIZE = "get_draft_swa_ring_size"
DRAFT_RING_ROWS = "_dspark_swa_ring_out_cache_loc"
CUDA_DRAFT_BLOCK_GETTER = f"{CUDA_BACKEND}.get_swa_out_cache_loc for a DSpark draft block"
DRAFT_BLOCK_METADATA = "init_forward_metadata_dspark_draft_block"
STORE_HOOK = "pre_kv_store_hook"
TAIL_METADATA = "_build_late_layer_tail_metadata"
PREFILL_FIELDS = ("state_slot", "chunk_start", "cu_q", "final_pos")
UNIFIED_RECORD = "UnifiedKvMetadata"  # the per-forward record of unified-KV rows

UTILS_FILE = "sglang/srt/utils/common.py"
EAGLE_UTILS_FILE = "sglang/srt/speculative/eagle_utils.py"
DSPARK_METADATA_FILE = "sglang/kernels/ops/speculative/dspark/dspark_attn_metadata.py"
# where the DSpark kernels live: 0.5.17+, then 0.5.16
DSPARK_KERNEL_DIRS = ("sglang/kernels/ops/speculative/dspark", "sglang/srt/speculative/dspark_components/kernels")
DSPARK_WORKER_FILE = "sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
RAGGED_VERIFY_FILE = "sglang/srt/speculative/ragged_verify.py"
# the request window's shape in the checks: DeepSeek-V4's 128-token window and a verify of
# up to three draft tokens past it (in WINDOW_PAGE pages, so the capacity is rounded up)
SLIDING_WINDOW = 128
DRAFT_TOKENS = 3
MIN_REQ_SLOTS = 16
PAGE_SIZE = 256  # DeepseekV4AttnBackend asserts it


# ---- stand-ins: what the scheduler and the allocator hand SGLang's code --------------------


class ExpansionBackend(StandIn):
    role = "expansion backend"
    attributes = frozenset({"cuda_int32_kwargs"})


class PrefillRowsBackend(StandIn):
    role = "prefill-rows backend"
    attributes = frozenset({"cuda_int32_kwargs", "token_to_kv_pool"})


class RingPool(StandIn):
    role = "unified pool"
    attributes = frozenset({"unified_swa_window"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class DecodeStreamsBackend(StandIn):
    role = "decode-streams backend"
    attributes = frozenset({"token_to_kv_pool"})


class DsparkDecodeStreamsBackend(DecodeStreamsBackend):
    """A backend that may build DSpark's grouped fp8 verify streams (0.5.23; it is not a
    DSpark backend here, so it never does)."""

    attributes = DecodeStreamsBackend.attributes | {"is_dspark", "_fp8_decode_num_heads", "_fp8_verify_epi"}


class UnifiedRingPool(StandIn):
    role = "unified ring pool"
    attributes = frozenset({"unified_swa_window", "unified_swa_ring_size", "unified_swa_pages"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class PrefillCoreMetadata(StandIn):
    """The attention metadata the prefill rows are attached to."""

    role = "attention metadata"
    attributes = frozenset({"unified", "positions_casual"})


class StoreBatch(StandIn):
    """What a store reads of the forward batch: its mode and its full-pool locations."""

    role = "forward batch"
    attributes = frozenset({"forward_mode", "out_cache_loc"})
    replaces = (RealClass("sglang/srt/model_executor/forward_batch_info.py", "ForwardBatch"),)


class WindowBackend(StandIn):
    role = "request-window backend"
    attributes = frozenset({"forward_metadata", "token_to_kv_pool"})


class HookedWindowBackend(WindowBackend):
    """A backend whose stores first run a hook (0.5.23's CUDA backend; none is set here)."""

    attributes = WindowBackend.attributes | {"pre_kv_store_hook"}


class RequestWindowPool(StandIn):
    role = "request-window pool"
    attributes = frozenset({"request_window"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class StoreMetadata(StandIn):
    role = "forward metadata"
    attributes = frozenset({"core_attn_metadata", "late_layer_tail"})


class WindowCoreMetadata(StandIn):
    role = "attention metadata"
    attributes = frozenset({"request_window_layout"})


class GraphBackend(StandIn):
    role = "graph-buffer backend"
    attributes = frozenset({"cuda_graph_swa_out_cache_loc", "token_to_kv_pool"})


class TranslatingPool(StandIn):
    role = "translating pool"
    attributes = frozenset({"full_to_swa_index_mapping"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class DraftRingBackend(StandIn):
    role = "draft-ring backend"
    attributes = frozenset({"token_to_kv_pool"})


class DraftRingPool(StandIn):
    role = "draft-ring pool"
    attributes = frozenset({"swa_req_ring_size"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class DraftBlockPool(StandIn):
    """The DSpark draft worker's pool (CUDA): paged SWA rows with a full-to-SWA mapping, or
    (0.5.23, under encoder replay) a ring per request slot, whose stores address the ring,
    never paged SWA rows, so it is given no mapping (a getter that falls back to translating
    fails on it). ``swa_valid_from`` is each slot's first position the draft window may read
    (0.5.23); a pool has no request window for the draft. :func:`_draft_block_pool` keeps
    those of these attributes a tree's pool has."""

    role = "draft-block pool"
    attributes = frozenset({"request_window", "swa_req_ring_size", "full_to_swa_index_mapping", "swa_valid_from"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


def _draft_block_pool(tree: SourceTree) -> type[StandIn]:
    # the mapping is registered, not set by __init__
    has = _instance_attributes(tree, POOL_FILE, "DeepSeekV4TokenToKVPool") | {"full_to_swa_index_mapping"}
    return type("DraftBlockPool", (DraftBlockPool,), {"attributes": DraftBlockPool.attributes & has})


def _as_the_tree_has(tree: SourceTree, stand_in: type[StandIn]) -> type[StandIn]:
    """``stand_in`` (for the CUDA backend) carrying only the attributes the tree's backend
    has: a release before the one it was written for lacks some."""
    has = _instance_attributes(tree, CUDA_BACKEND_FILE, CUDA_BACKEND, with_methods=True)
    return type(stand_in.__name__, (stand_in,), {"attributes": stand_in.attributes & has})


class TailBackend(StandIn):
    """The CUDA backend as its late-layer tail builder reads it. The builder's own metadata
    init (``init_forward_metadata_prefill``, the attention kernels' plans) is stood in for:
    it makes no tail rows, and the rows are what is checked."""

    role = "tail-metadata backend"
    attributes = frozenset({"token_to_kv_pool", "encoder_row_floor", "model_runner", "low_ratios",
                            "forward_metadata", "init_forward_metadata_prefill", "_bcg_tail_buffers",
                            "_bcg_tail_capacity"})


class TailPool(StandIn):
    role = "tail pool"
    attributes = frozenset({"request_window", "full_to_swa_index_mapping"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4TokenToKVPool"),)


class TailBatch(StandIn):
    role = "forward batch"
    attributes = frozenset({"extend_seq_lens_cpu", "seq_lens_cpu", "seq_lens", "out_cache_loc", "positions",
                            "req_pool_indices", "return_logprob", "extend_logprob_start_lens_cpu",
                            "capture_hidden_mode", "attn_cp_metadata", "batch_size"})
    replaces = (RealClass("sglang/srt/model_executor/forward_batch_info.py", "ForwardBatch"),)


class TailMetadata(StandIn):
    role = "forward metadata"
    attributes = frozenset({"core_attn_metadata", "late_layer_tail", "low_ratio_req_indices", "low_ratio_pos_i64"})


class RingCoreMetadata(StandIn):
    role = "attention metadata"
    attributes = frozenset({"request_window_layout", "swa_out_cache_loc"})


def _unified_kv_on() -> bool:
    """Stands in for SGLang's unified-KV gate: the rows are built only when it is on."""
    return True


# Global names the producers use besides the request window's: the unified-KV gate.
PRODUCER_STAND_INS: dict[str, Any] = {
    **WINDOW_STAND_INS, "DSV4Metadata": StoreMetadata, "is_unified_kv_triton": _unified_kv_on,
}


# ---- the batch ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """The live inputs of one forward: request ``r`` (slot ``req_pool_indices[r]``) had
    ``extend_prefix_lens[r]`` tokens and adds ``extend_seq_lens[r]`` (target-verify has
    equal counts, decode one each). ``padding`` rows follow the live ones (a graph pads the
    batch to a captured size); a batch of padding rows only is idle. ``previous`` is the
    forward whose metadata the backend still holds when this one skips metadata init."""

    req_pool_indices: torch.Tensor  # int64 [requests]
    extend_prefix_lens: torch.Tensor  # int64 [requests]
    extend_seq_lens: torch.Tensor  # int64 [requests]
    padding: int = 0
    previous: "Batch | None" = None

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.extend_prefix_lens + self.extend_seq_lens

    @property
    def num_tokens(self) -> int:
        return int(self.extend_seq_lens.sum())

    @property
    def rows(self) -> int:
        return self.num_tokens + self.padding

    @property
    def is_idle(self) -> bool:
        return self.num_tokens == 0

    @property
    def token_slots(self) -> torch.Tensor:
        return token_state_slots(self.req_pool_indices, self.extend_seq_lens)

    @property
    def positions(self) -> torch.Tensor:
        """The position of every live token: its request's prefix plus its place after it."""
        return torch.cat([
            torch.arange(int(p), int(p) + int(c), dtype=torch.int64)
            for p, c in zip(self.extend_prefix_lens, self.extend_seq_lens)
        ] or [torch.empty(0, dtype=torch.int64)])

    def token_request_index(self) -> list[int]:
        """Which request (its place in the batch) each live token belongs to."""
        return [r for r, count in enumerate(self.extend_seq_lens.tolist()) for _ in range(count)]

    @property
    def num_req_slots(self) -> int:
        return max([MIN_REQ_SLOTS, *(int(s) + 1 for s in self.req_pool_indices)])


def idle(rows: int, previous: Batch | None = None) -> Batch:
    """An idle forward of ``rows`` padding rows (a data-parallel rank with no requests)."""
    empty = torch.empty(0, dtype=torch.int64)
    return Batch(empty, empty, empty, padding=rows, previous=previous)


# ---- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StandInUse:
    """A stand-in a producer runs on and the SGLang classes whose attributes it must have."""

    stand_in: type[StandIn]
    replaces: tuple[RealClass, ...]


@dataclass
class Producer:
    """One producer bound from one release."""

    backend: str  # the class it belongs to, or its module for a module-level function
    method: str
    function: Any
    info: "ProducerInfo" = field(repr=False, default=None)
    binding: Binding | None = field(repr=False, default=None)
    stand_ins: tuple[StandInUse, ...] = ()
    parts: dict[str, Any] = field(repr=False, default_factory=dict)  # SGLang code it runs with
    statements: StatementsRun | None = field(repr=False, default=None)  # what its checks ran of its function

    @property
    def name(self) -> str:
        return self.info.name if self.info is not None else self.method


@dataclass(frozen=True)
class ProducerInfo:
    """A row of :data:`PRODUCERS`: how to bind the producer and how to check it.

    ``bind`` raises :class:`BindError` naming what a release lacks; ``run`` returns the
    rows that differ from the truth (given the unified ring's window), and ``applies`` says
    which batches the producer is fed in SGLang (the others are not checked)."""

    name: str
    summary: str
    bind: Callable[[SourceTree, str], Producer]
    run: Callable[[Producer, Batch, int], list[str]]
    applies: Callable[[Batch], bool] = lambda batch: not batch.is_idle and batch.padding == 0


def _bind_method(
    tree: SourceTree, mode: str, method: str, sites: tuple[tuple[str, str], ...],
    owner_stand_ins: tuple[type[StandIn], ...], *, extra: tuple[ClassCode | FunctionCode, ...] = (),
    uses: str | None = None, more_stand_ins: tuple[StandInUse, ...] = (),
    site_stand_ins: tuple[tuple[type[StandIn], str], ...] = (), records: tuple[str, ...] = (),
    names: dict[str, Any] | None = None,
) -> Producer:
    """``method`` from the first of ``sites`` (file, class) that has it, run on the first of
    ``owner_stand_ins`` that carries what the release's code reads of the class.

    ``uses`` is a name the code must read for the producer to be there; ``site_stand_ins``
    pair a stand-in with the class of the site's file it replaces; ``records`` are SGLang
    dataclasses of that file the code builds, rebuilt from the release's field lists;
    ``names`` are further global names the code gets."""
    reasons = []
    for path, owner in sites:
        try:
            stand_ins = {**PRODUCER_STAND_INS, **(names or {}), **_records(tree, mode, path, records)}
            binding, owner_stand_in = _bind_on_fitting_stand_in(
                tree, mode, (*extra, ClassCode(path, owner, (method,))), stand_ins, owner_stand_ins)
        except BindError as exc:
            reasons.append(str(exc))
            continue
        function = binding.classes[owner].methods[method]
        if uses is not None and uses not in function.__code__.co_names:
            reasons.append(f"{binding.label}: {owner}.{method} does not read {uses}")
            continue
        uses_here = tuple(StandInUse(stand_in, (RealClass(path, name),)) for stand_in, name in site_stand_ins)
        return Producer(owner, method, function, binding=binding,
                        stand_ins=(StandInUse(owner_stand_in, (RealClass(path, owner),)), *uses_here, *more_stand_ins))
    raise BindError("; ".join(reasons))


def _bind_on_fitting_stand_in(
    tree: SourceTree, mode: str, code: tuple[ClassCode | FunctionCode, ...], stand_ins: dict[str, Any],
    owner_stand_ins: tuple[type[StandIn], ...],
) -> tuple[Binding, type[StandIn]]:
    *helpers, owned = code
    for owner_stand_in in owner_stand_ins:
        role_code = (*helpers, replace(owned, role=owner_stand_in.role))
        try:
            attributes_by_role = {owner_stand_in.role: owner_stand_in.attributes}
            return bind(tree, role_code, stand_ins, attributes_by_role, mode), owner_stand_in
        except BindError as exc:
            failure = exc
            if "does not provide" not in str(exc):
                break  # the method itself is missing or unbindable: no richer stand-in helps
    raise failure


def _records(tree: SourceTree, mode: str, path: str, names: tuple[str, ...]) -> dict[str, type]:
    if not names:
        return {}
    code = tuple(ClassCode(path, name, dataclass_fields=True) for name in names)
    binding = bind(tree, code, PRODUCER_STAND_INS, {}, mode)
    return {name: binding.classes[name].build(object) for name in names}


def bind_producers(tree: SourceTree, mode: str = "source") -> tuple[list[Producer], dict[str, str]]:
    """The producers ``tree`` has, in table order, and why each other is absent."""
    found: list[Producer] = []
    absent: dict[str, str] = {}
    for info in PRODUCERS:
        try:
            producer = info.bind(tree, mode)
        except BindError as exc:
            absent[info.name] = str(exc)
            continue
        found.append(_marked(replace(producer, info=info)))
    return found, absent


def _marked(producer: Producer) -> Producer:
    """``producer`` running its function with each statement's run tallied (where the binder
    kept its source), named as a target's entry method is, so that the gate can say which
    statements of a target's code its checks ran."""
    if getattr(producer.function, "swafuzz_source", None) is None:
        return producer
    statements, function = StatementsRun.marking(producer.function, "{} ({})".format(*defined_at(producer.function)))
    return replace(producer, function=function, statements=statements)


def check(producer: Producer, batch: Batch, window: int = 128) -> list[str]:
    """Every row ``producer`` gets wrong on ``batch`` (empty when all match the truth), with
    ``window`` the unified ring's sliding window. A producer SGLang never feeds such a batch
    returns no mismatch; one that raises is a mismatch of its own, named with the exception."""
    if not producer.info.applies(batch):
        return []
    try:
        return producer.info.run(producer, batch, window)
    except StandInGap:
        raise  # swafuzz does not model what the code read: a gap of the harness, not a finding
    except Exception as exc:  # noqa: BLE001 - any failure of SGLang's code is a finding
        return [f"{producer.name} raised {type(exc).__name__}: {exc}"]


def _owner(producer: Producer, **offered: Any) -> StandIn:
    """The stand-in for the producer's own class, carrying those of ``offered`` that the
    release's code reads (the stand-in it was bound on), with the methods the producer
    reaches and the attribute values the class's own code gives."""
    stand_in = producer.stand_ins[0].stand_in
    owner = producer.binding.classes[producer.backend].build(stand_in)
    return owner(**{name: offered[name] for name in stand_in.attributes})


def _differences(name: str, got: Any, want: torch.Tensor) -> list[str]:
    if not isinstance(got, torch.Tensor):
        return [f"{name}: got {type(got).__name__}, want {want.tolist()}"]
    got = got.to(device="cpu", dtype=torch.int64).reshape(-1)
    if got.shape != want.shape or not torch.equal(got, want.to(torch.int64)):
        return [f"{name}: got {got.tolist()}, want {want.tolist()}"]
    return []


# ---- target-verify and prefill state slots --------------------------------------------------


_BACKEND_SITES = ((HIP_BACKEND_FILE, HIP_BACKEND), (CUDA_BACKEND_FILE, CUDA_BACKEND))
_INT32_ON_CPU = {"dtype": torch.int32, "device": "cpu"}


def _bind_expansion(method: str) -> Callable[[SourceTree, str], Producer]:
    def bind_one(tree: SourceTree, mode: str) -> Producer:
        return _bind_method(tree, mode, method, _BACKEND_SITES, (ExpansionBackend,),
                            names=_prefill_expansion_kernel(tree, mode))
    return bind_one


class CpuDispatch:
    """Stands in for one of SGLang's kernel dispatchers (``ExpandPrefillCausally``), whose
    ``execute`` runs its Triton kernel on CUDA tensors and its torch implementation
    otherwise: here always the release's own torch implementation."""

    def __init__(self, torch_implementation: Callable[..., Any]):
        self.torch_implementation = torch_implementation

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self.torch_implementation(*args, **kwargs)


def _prefill_expansion_kernel(tree: SourceTree, mode: str) -> dict[str, Any]:
    """``ExpandPrefillCausally`` over the release's ``expand_prefill_causally`` (the CUDA
    backend expands prefill batches through it from 0.5.18), where the release has it."""
    for path in ATTN_METADATA_FILES:
        text = tree.read(path)
        if text is not None and "def expand_prefill_causally(" in text:
            records = _records(tree, mode, path, ("ExpandPrefillCausallyResult",))
            binding = bind(tree, (FunctionCode(path, "expand_prefill_causally"),),
                           {**PRODUCER_STAND_INS, **records}, {}, mode)
            return {"ExpandPrefillCausally": CpuDispatch(binding.functions["expand_prefill_causally"])}
    return {}


def _run_verify_expansion(producer: Producer, batch: Batch, _: int) -> list[str]:
    counts = {int(c) for c in batch.extend_seq_lens}
    if len(counts) != 1:
        return []  # SGLang expands only target-verify batches, whose counts are equal, this way
    _, repeated = producer.function(
        ExpansionBackend(cuda_int32_kwargs=_INT32_ON_CPU), bs=len(batch.req_pool_indices), qo_len=counts.pop(),
        seq_lens=batch.seq_lens.to(torch.int32), req_pool_indices=batch.req_pool_indices,
    )
    return _differences("req_pool_indices_repeated", repeated, batch.token_slots)


def _run_prefill_expansion(producer: Producer, batch: Batch, _: int) -> list[str]:
    """Each token's request slot, through the host-list path and, where the release has it
    (``extend_start_loc``), the vectorized path."""
    arguments = {
        "num_tokens": batch.num_tokens, "seq_lens": [int(s) for s in batch.seq_lens],
        "extend_seq_lens": [int(c) for c in batch.extend_seq_lens], "req_pool_indices": batch.req_pool_indices,
        "padded_num_tokens": None, "seq_lens_tensor": batch.seq_lens, "extend_seq_lens_tensor": batch.extend_seq_lens,
    }
    taken = parameters(producer.function)
    variants = {"req_pool_indices_repeated": {}}
    if "extend_start_loc" in taken:
        starts = torch.cumsum(batch.extend_seq_lens, 0) - batch.extend_seq_lens
        variants["req_pool_indices_repeated (vectorized)"] = {"extend_start_loc": starts}
    problems = []
    for label, more in variants.items():
        offered = {**arguments, **more}
        _, repeated = producer.function(ExpansionBackend(cuda_int32_kwargs=_INT32_ON_CPU),
                                        **{k: v for k, v in offered.items() if k in taken})
        problems += _differences(label, repeated, batch.token_slots)
    return problems


def _bind_prefill_rows(tree: SourceTree, mode: str) -> Producer:
    return _bind_method(
        tree, mode, PREFILL_ROWS, _BACKEND_SITES, (PrefillRowsBackend,), records=(UNIFIED_RECORD,),
        site_stand_ins=((PrefillCoreMetadata, "DSV4AttnMetadata"),),
        more_stand_ins=(StandInUse(RingPool, RingPool.replaces),),
    )


def _run_prefill_rows(producer: Producer, batch: Batch, window: int) -> list[str]:
    backend = PrefillRowsBackend(cuda_int32_kwargs=_INT32_ON_CPU, token_to_kv_pool=RingPool(unified_swa_window=window))
    core = PrefillCoreMetadata(unified=None, positions_casual=torch.zeros(batch.num_tokens))
    offered = {"core": core, "req_pool_indices": batch.req_pool_indices, "seq_lens": batch.seq_lens,
               "extend_seq_lens": batch.extend_seq_lens, "num_tokens": batch.num_tokens,
               "req_pool_indices_repeated": batch.token_slots}
    # releases differ in which of these the producer takes (num_tokens from 0.5.18)
    producer.function(backend, **{k: v for k, v in offered.items() if k in parameters(producer.function)})
    truth = prefill_rows(batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens)
    problems = []
    for name in PREFILL_FIELDS:
        problems += _differences(f"pf_{name}", getattr(core.unified, f"pf_{name}", None), getattr(truth, name))
    return problems


# ---- decode and target-verify ring rows (HIP, 0.5.14+) ---------------------------------------


def _bind_decode_streams(tree: SourceTree, mode: str) -> Producer:
    return _bind_method(
        tree, mode, DECODE_STREAMS, ((HIP_BACKEND_FILE, HIP_BACKEND),),
        (DecodeStreamsBackend, DsparkDecodeStreamsBackend), records=(UNIFIED_RECORD,),
        site_stand_ins=((CoreMetadata, "DSV4AttnMetadata"),),
        more_stand_ins=(StandInUse(UnifiedRingPool, UnifiedRingPool.replaces),),
    )


def _one_row_per_request_or_verify(batch: Batch) -> bool:
    return not batch.is_idle and batch.padding == 0 and len({int(c) for c in batch.extend_seq_lens}) == 1


def _run_decode_streams(producer: Producer, batch: Batch, window: int) -> list[str]:
    """The ring rows of a decode (one token per request) or a target-verify (``n`` draft
    tokens per request, ring ``window + n - 1``) and the verify store's state slots."""
    draft = int(batch.extend_seq_lens[0])
    slot_parameter = parameters(producer.function)[2]
    if draft > 1 and slot_parameter == "req_pool_indices":
        return []  # before 0.5.18 only decode builds these rows (one slot per request)
    ring = ring_size(window, speculative=draft > 1, num_draft_tokens=draft)
    pool = UnifiedRingPool(unified_swa_window=window, unified_swa_ring_size=ring, unified_swa_pages=0)
    backend = _owner(producer, token_to_kv_pool=pool, is_dspark=False, _fp8_decode_num_heads=None,
                     _fp8_verify_epi=None)
    core = CoreMetadata.of(batch.positions)
    arguments = {"num_draft": draft} if "num_draft" in parameters(producer.function) else {}
    producer.function(backend, core, batch.token_slots, **arguments)
    want = ring_rows(batch.token_slots, batch.positions, ring, batch.num_req_slots)
    rows = core.unified.swa_loc
    problems = _differences("swa_loc", rows, want.to(torch.int64)) + _dtype("swa_loc", rows)
    if "verify_store_state_slot" in producer.function.__code__.co_names:
        problems += _differences("verify_store_state_slot", core.unified.verify_store_state_slot, batch.token_slots)
    return problems


# ---- the request window (0.5.21+) -----------------------------------------------------------


def _bind_window_layout(tree: SourceTree, mode: str) -> Producer:
    binding, function = window_layout_code(tree, mode)
    return Producer("dsv41_request_window", WINDOW_LAYOUT, function, binding=binding)


def _bind_request_window(
    methods: tuple[str, ...], extra: tuple[FunctionCode, ...] = (),
) -> Callable[[SourceTree, str], tuple[type, Binding, Any]]:
    return lambda tree, mode: bind_request_window(tree, mode, methods, extra)


_PAGED_ROWS_USE = StandInUse(PagedRows, PagedRows.replaces)
_ROW_FORMAT_USE = StandInUse(PackedRowFormat, PackedRowFormat.replaces)


def _bind_window_method(
    method: str, extra: tuple[str, ...] = (), helpers: tuple[str, ...] = (),
) -> Callable[[SourceTree, str], Producer]:
    binder = _bind_request_window((*extra, method), tuple(FunctionCode(WINDOW_FILE, h) for h in helpers))

    def bind_one(tree: SourceTree, mode: str) -> Producer:
        window_class, binding, layout_function = binder(tree, mode)
        return Producer("RequestWindow", method, window_class, binding=binding,
                        stand_ins=(_PAGED_ROWS_USE, _ROW_FORMAT_USE), parts={WINDOW_LAYOUT: layout_function})
    return bind_one


def _new_window(window_class: type, batch: Batch) -> tuple[Any, int]:
    """SGLang's ``RequestWindow`` as the pool makes it (capacity: the window plus the draft
    tokens), and the capacity the truth gives it."""
    window = window_class(PagedRows.factory(WINDOW_PAGE), num_slots=batch.num_req_slots, layers=1,
                          page_size=WINDOW_PAGE, capacity=SLIDING_WINDOW + DRAFT_TOKENS)
    return window, whole_page_ring(SLIDING_WINDOW, DRAFT_TOKENS, WINDOW_PAGE)


def _layout(layout_function: Any, batch: Batch, capacity: int, zero_row: int, per_request: bool = True) -> Any:
    groups = len(batch.req_pool_indices) if per_request else None
    return build_layout(layout_function, batch.token_slots, batch.positions, capacity, zero_row, groups,
                        batch.rows if batch.padding else None)


def _window_truth(layout_function: Any, batch: Batch, capacity: int, per_request: bool = True):
    groups = len(batch.req_pool_indices) if per_request and not batch.is_idle else None
    return window_truth(layout_function, batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens,
                        capacity, groups, batch.padding)


def _run_window_layout(producer: Producer, batch: Batch, _: int) -> list[str]:
    if batch.padding and "padded_rows" not in parameters(producer.function):
        return []  # this release never pads a layout (0.5.23 pads under a prefill graph)
    capacity = whole_page_ring(SLIDING_WINDOW, DRAFT_TOKENS, WINDOW_PAGE)
    live = batch.num_tokens
    problems = []
    for per_request, groups in ((True, "a history group per request"), (False, "a history group per row")):
        layout = _layout(producer.function, batch, capacity, batch.num_req_slots * capacity, per_request)
        truth = _window_truth(producer.function, batch, capacity, per_request)
        commits = torch.cat([truth.commit_row >= 0, torch.zeros(batch.padding, dtype=torch.bool)])
        problems += [f"{problem} ({groups})" for problem in (
            _differences("write_loc", layout.write_loc, truth.write_loc.to(torch.int64))
            + _differences("req", layout.req[:live], batch.token_slots)
            + _differences("pos", layout.pos[:live], batch.positions)
            + _differences("commit_mask", layout.commit_mask, commits.to(torch.int64))
            + _dtype("write_loc", layout.write_loc)
        )]
    return problems


def _dtype(name: str, rows: torch.Tensor) -> list[str]:
    return [] if rows.dtype == torch.int32 else [f"{name}: dtype {rows.dtype}, want torch.int32"]


def _run_window_idle(producer: Producer, batch: Batch, _: int) -> list[str]:
    window, capacity = _new_window(producer.function, batch)
    rows = window.activate_idle(batch.rows)
    truth = _window_truth(producer.parts[WINDOW_LAYOUT], batch, capacity)
    problems = _differences("idle write_loc", rows, truth.write_loc.to(torch.int64)) + _dtype("idle write_loc", rows)
    if window.layout is None or not torch.equal(window.layout.write_loc, rows):
        problems.append("activate_idle left another layout active than the rows it returned")
    return problems + _capacity(window, capacity)


def _run_window_row(producer: Producer, batch: Batch, _: int) -> list[str]:
    window, capacity = _new_window(producer.function, batch)
    rows = window.row_loc(batch.token_slots, batch.positions)
    want = ring_rows(batch.token_slots, batch.positions, capacity, batch.num_req_slots)
    return _differences("row_loc", rows, want.to(torch.int64)) + _capacity(window, capacity)


def _capacity(window: Any, capacity: int) -> list[str]:
    if window.capacity != capacity:
        return [f"capacity: got {window.capacity}, want {capacity} (window plus draft tokens, whole pages)"]
    return []


def _data_bytes(rows: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the data bytes of ``rows`` sit in a paged byte buffer, as (page, byte) indices:
    a page holds its rows' data bytes first, then their scale bytes."""
    width = V4_ROWS.data_bytes
    rows = rows.to(torch.int64)
    return (rows // page_size)[:, None], (rows % page_size)[:, None] * width + torch.arange(width)


def _run_window_commit(producer: Producer, batch: Batch, _: int) -> list[str]:
    """Stages every query row's key in the workspace as the store does (a byte pattern
    naming the row), commits layer 0, and reads the ring back: each committed row must hold
    its key and its position tag, and no other ring row may change."""
    window, capacity = _new_window(producer.function, batch)
    layout = _layout(producer.parts[WINDOW_LAYOUT], batch, window.capacity, zero_row=window.rows)
    window.activate(layout)
    window.initialize_dummy_history()
    workspace = window.buffer(0)
    live = batch.num_tokens
    marks = (torch.arange(live, dtype=torch.int64) % 255 + 1).to(torch.uint8)
    workspace[_data_bytes(layout.write_loc[:live], WINDOW_PAGE)] = marks[:, None]
    tags_before = window.tags[0, : window.rows].clone()
    window.commit(0)
    truth = _window_truth(producer.parts[WINDOW_LAYOUT], batch, capacity)
    committed = truth.commit_row >= 0
    ring_rows_hit = truth.commit_row[committed]
    problems = _capacity(window, capacity)
    problems += _differences("committed tags", window.tags[0, ring_rows_hit], batch.positions[committed])
    stored = window.state.kv_buffer[0][_data_bytes(ring_rows_hit, WINDOW_PAGE)]
    if not torch.equal(stored, marks[committed][:, None].expand_as(stored)):
        got = stored[:, 0].tolist()
        want = marks[committed].tolist()
        problems.append(f"committed keys: ring rows {ring_rows_hit.tolist()} hold {got}, want {want}")
    untouched = torch.ones(window.rows, dtype=torch.bool)
    untouched[ring_rows_hit] = False
    changed = (window.tags[0, : window.rows] != tags_before) & untouched
    if bool(changed.any()):
        problems.append(f"ring rows {changed.nonzero().flatten().tolist()} changed, which no row commits to")
    return problems


# ---- the backends' store target under the request window ------------------------------------


def _bind_window_getter(path: str, owner: str) -> Callable[[SourceTree, str], Producer]:
    window_binder = _bind_request_window(("activate_idle",))
    plain_window_binder = _bind_request_window(())

    def bind_one(tree: SourceTree, mode: str) -> Producer:
        producer = _bind_method(
            tree, mode, "get_swa_out_cache_loc", ((path, owner),), (WindowBackend, HookedWindowBackend),
            uses="request_window",
            site_stand_ins=((StoreMetadata, "DSV4Metadata"), (WindowCoreMetadata, "DSV4AttnMetadata")),
            more_stand_ins=(
                StandInUse(RequestWindowPool, RequestWindowPool.replaces), StandInUse(StoreBatch, StoreBatch.replaces),
                _PAGED_ROWS_USE, _ROW_FORMAT_USE,
            ),
        )
        try:
            window_class, _, layout_function = window_binder(tree, mode)
        except BindError:
            # releases before 0.5.23 have no activate_idle; their getter never calls it
            window_class, _, layout_function = plain_window_binder(tree, mode)
        producer.parts.update({"RequestWindow": window_class, WINDOW_LAYOUT: layout_function})
        return producer
    return bind_one


def _store_batch(batch: Batch) -> StoreBatch:
    mode = ForwardMode.IDLE if batch.is_idle else ForwardMode.EXTEND
    return StoreBatch(forward_mode=SglangMode(mode), out_cache_loc=torch.zeros(batch.rows, dtype=torch.int64))


def _run_window_getter(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The backend's store target for ``batch``: live forwards build their metadata first
    (as ``init_forward_metadata`` does); idle forwards skip it, keeping ``previous``'s."""
    layout_function = producer.parts[WINDOW_LAYOUT]
    if not batch.is_idle and batch.padding and "padded_rows" not in parameters(layout_function):
        return []  # this release never pads a layout
    built_for = batch.previous if batch.is_idle else batch
    window, capacity = _new_window(producer.parts["RequestWindow"], built_for or batch)
    metadata = None
    if built_for is not None:
        layout = _layout(layout_function, built_for, window.capacity, zero_row=window.rows)
        core = WindowCoreMetadata(request_window_layout=layout)
        metadata = StoreMetadata(core_attn_metadata=core, late_layer_tail=None)
    backend = _owner(producer, forward_metadata=metadata, token_to_kv_pool=RequestWindowPool(request_window=window),
                     pre_kv_store_hook=None)
    rows = producer.function(backend, _store_batch(batch))
    truth = _window_truth(layout_function, batch, capacity)
    problems = _differences("store write_loc", rows, truth.write_loc.to(torch.int64))
    if window.layout is None or not torch.equal(window.layout.write_loc.to(torch.int64), rows.to(torch.int64)):
        problems.append("the active request-window layout is not the one whose rows the store got")
    return problems


def _live_or_idle_after_live(batch: Batch) -> bool:
    return not batch.is_idle or batch.previous is not None


# ---- the graph buffer of translated locations (CUDA, 0.5.18+) -------------------------------


_POOL_TRANSLATION = ClassCode(
    POOL_FILE, "DeepSeekV4TokenToKVPool", ("register_mapping", "translate_loc_from_full_to_swa"),
    role=TranslatingPool.role,
)


def _pool_as_read(name: str, role: str, read: frozenset[str]) -> type[StandIn]:
    """A pool stand-in carrying what a release's code reads of the pool (``read``), the
    translation methods aside: :func:`_translating_pool` gives it the tree's own."""
    return type(name, (TranslatingPool,), {
        "role": role, "replaces": TranslatingPool.replaces,
        "attributes": TranslatingPool.attributes | (read - set(_POOL_TRANSLATION.methods)),
    })


def _translating_pool(tree: SourceTree, mode: str, stand_in: type[StandIn]) -> type[StandIn]:
    """``stand_in`` with the tree's own ``register_mapping`` and ``translate_loc_from_full_to_swa``."""
    binding = bind(tree, (replace(_POOL_TRANSLATION, role=stand_in.role),), PRODUCER_STAND_INS,
                   {stand_in.role: stand_in.attributes}, mode)
    return binding.classes["DeepSeekV4TokenToKVPool"].build(stand_in)


def _bind_graph_buffer(tree: SourceTree, mode: str) -> Producer:
    producer = _bind_method(
        tree, mode, GRAPH_LOC_BUFFER, ((CUDA_BACKEND_FILE, CUDA_BACKEND),), (GraphBackend,),
        more_stand_ins=(StandInUse(TranslatingPool, TranslatingPool.replaces),),
    )
    producer.parts["DeepSeekV4TokenToKVPool"] = _translating_pool(tree, mode, TranslatingPool)
    return producer


def _locations(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-pool locations for the live tokens (padding rows at the dummy slot) and a mapping
    that gives each a distinct SWA slot, both drawn from the batch itself."""
    live = batch.num_tokens
    seed = int(batch.extend_seq_lens.sum()) * 31 + int(batch.extend_prefix_lens.sum())
    generator = torch.Generator().manual_seed(seed)
    full = torch.randperm(4 * live + 8, generator=generator)[:live] + 1
    mapping = torch.zeros(4 * live + 9, dtype=torch.int64)
    mapping[full] = torch.randperm(2 * live + 4, generator=generator)[:live] + 1
    return torch.cat([full, torch.zeros(batch.padding, dtype=torch.int64)]), mapping


def _run_graph_buffer(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The buffer the graph's stores read: the live locations translated, every row past
    them (the captured size's padding) at the dummy slot."""
    out_cache_loc, mapping = _locations(batch)
    pool = producer.parts["DeepSeekV4TokenToKVPool"](full_to_swa_index_mapping=None)
    pool.register_mapping(mapping)
    captured_rows = batch.rows + 3
    buffer = torch.full((captured_rows,), -7, dtype=torch.int32)  # stale rows of an earlier replay
    backend = GraphBackend(cuda_graph_swa_out_cache_loc=buffer, token_to_kv_pool=pool)
    rows = producer.function(backend, out_cache_loc)
    want = translate_pool(mapping, out_cache_loc)
    problems = _differences("swa_out_cache_loc", rows, want.to(torch.int64))
    if rows is not None and rows.data_ptr() != buffer.data_ptr():
        problems.append("swa_out_cache_loc is not a view of the graph buffer (captured stores read it by address)")
    problems += _differences("graph buffer past the batch", buffer[batch.rows:],
                             torch.full((captured_rows - batch.rows,), DUMMY_SLOT, dtype=torch.int64))
    return problems + _dtype("swa_out_cache_loc", rows)


# ---- the draft SWA ring (0.5.23) --------------------------------------------------------------


def _bind_draft_ring_size(tree: SourceTree, mode: str) -> Producer:
    binding = bind(tree, (FunctionCode(UTILS_FILE, "ceil_div"), FunctionCode(POOL_FILE, DRAFT_RING_SIZE)),
                   PRODUCER_STAND_INS, {}, mode)
    return Producer("deepseek_v4_memory_pool", DRAFT_RING_SIZE, binding.functions[DRAFT_RING_SIZE], binding=binding)


def _ring_shape(batch: Batch) -> tuple[int, int]:
    """Draft tokens and page size drawn from the batch, so that drawn batches vary both."""
    return int(batch.extend_seq_lens.sum()) % 8, (1, 2, 64, 256)[len(batch.req_pool_indices) % 4]


def _run_draft_ring_size(producer: Producer, batch: Batch, _: int) -> list[str]:
    draft, page = _ring_shape(batch)
    got = producer.function(SLIDING_WINDOW, draft, page)
    want = whole_page_ring(SLIDING_WINDOW, draft, page)
    if got == want:
        return []
    return [f"draft ring size for {draft} draft tokens, {page}-row pages: got {got}, want {want}"]


def _bind_draft_ring_rows(tree: SourceTree, mode: str) -> Producer:
    return _bind_method(
        tree, mode, DRAFT_RING_ROWS, ((CUDA_BACKEND_FILE, CUDA_BACKEND),), (DraftRingBackend,),
        extra=(FunctionCode(DSPARK_METADATA_FILE, "swa_ring_rows"),),
        more_stand_ins=(StandInUse(DraftRingPool, DraftRingPool.replaces),),
    )


def draft_ring_rows(producer: Producer, ring: int, token_slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """What the tree's ``_dspark_swa_ring_out_cache_loc`` (``producer``) returns for draft-block
    tokens of request slots ``token_slots`` at ``positions``, on rings of ``ring`` rows: each
    token at ``seq_lens_casual - 1``, which is its position."""
    backend = DraftRingBackend(token_to_kv_pool=DraftRingPool(swa_req_ring_size=ring))
    return producer.function(backend, seq_lens_casual=(positions + 1).to(torch.int32),
                             req_pool_indices_repeated=token_slots)


def _run_draft_ring_rows(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The rows a draft block writes: token ``i`` sits at position ``seq_lens_casual[i] - 1``
    of its request, in its slot's ring."""
    draft, page = _ring_shape(batch)
    ring = whole_page_ring(SLIDING_WINDOW, draft, page)
    rows = draft_ring_rows(producer, ring, batch.token_slots, batch.positions)
    want = ring_rows(batch.token_slots, batch.positions, ring, batch.num_req_slots)
    return _differences("draft ring rows", rows, want.to(torch.int64)) + _dtype("draft ring rows", rows)


def _bind_draft_block_getter(tree: SourceTree, mode: str) -> Producer:
    code = bind_draft_block_code(tree, mode)
    producer = _bind_method(
        tree, mode, "get_swa_out_cache_loc", ((CUDA_BACKEND_FILE, CUDA_BACKEND),), (WindowBackend, HookedWindowBackend),
        uses="swa_out_cache_loc", names=code.record,
        more_stand_ins=(StandInUse(code.pool_class, DraftBlockPool.replaces), StandInUse(StoreBatch, StoreBatch.replaces),
                        *code.init.stand_ins),
    )
    producer.parts[DRAFT_BLOCK_METADATA] = code
    return producer


@dataclass(frozen=True)
class DraftBlockCode:
    """A tree's DSpark draft-block metadata init (CUDA), bound with what it runs
    (:func:`_bind_draft_block_metadata`), and what the tree's DSpark code does around it:
    the one mechanism the producers' draft-block checks and the lifecycle's draft blocks
    (:class:`swafuzz.subjects.sglang.drivers.TranslatedLocSubject`) both run."""

    init: Producer
    record: dict[str, type]  # the tree's DSV4Metadata, which the getter's isinstance check knows
    # the draft worker's pool as the init reads it, translating as the tree's pool does
    pool_class: type[StandIn]
    # the backend's _dspark_swa_ring_out_cache_loc, where it writes draft blocks to a ring per
    # request slot (0.5.23), not only to paged rows
    ring_rows: Producer | None
    store_hook: bool  # the DSpark worker hands the draft backend a pre_kv_store_hook (0.5.23)

    @property
    def ring(self) -> bool:
        return self.ring_rows is not None

    def ring_out_cache_loc(self, ring: int, token_slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ring rows the tree's in-graph refresh writes for a draft block's tokens (see
        :func:`draft_ring_rows`)."""
        return draft_ring_rows(self.ring_rows, ring, token_slots, positions)

    def new_pool(self, ring: int | None, num_req_slots: int) -> StandIn:
        """The draft worker's pool: a ring of ``ring`` rows per request slot, or (None) paged
        SWA rows, whose mapping the caller registers."""
        return _draft_pool(self.pool_class, ring, num_req_slots)

    def metadata(self, pool: Any, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                 out_cache_loc: torch.Tensor, block_size: int, num_req_slots: int) -> Any:
        """The metadata the tree's ``init_forward_metadata_dspark_draft_block`` builds for a
        DSpark draft block: each request's context before its block (``prefix_lens``), its
        slot and the block's full-pool locations, on a draft backend of SWA-only layers."""
        make = self.init
        context = int(prefix_lens.max()) + block_size if len(prefix_lens) else 1
        req_to_token = _page_wide_req_to_token(num_req_slots, context)
        offered = {"token_to_kv_pool": pool, "is_dspark_draft": True, "speculative_num_draft_tokens": block_size + 1,
                   "low_ratios": (), "present_ratios": (), "has_c4": False, "has_c128": False,  # SWA-only layers
                   "page_size": PAGE_SIZE, "swa_page_size": SLIDING_WINDOW,
                   "cuda_int32_kwargs": {"device": "cpu", "dtype": torch.int32}, "device": "cpu",
                   "index_topk": 512, "c4_topk": 512, "trtllm_attn": False, "encoder_replay": False,
                   "encoder_row_floor": None, "req_to_token": req_to_token, "draft_metadata_glued": False,
                   "prefill_candidates": None, "enable_deepseek_v4_fp4_indexer": False}
        stand_in = make.stand_ins[0].stand_in
        backend = make.binding.classes[make.backend].build(stand_in)(
            **{name: offered.get(name, NotModelled(f"self.{name}")) for name in stand_in.attributes})
        # the host-to-device copy goes through pinned memory, which needs an accelerator
        backend._move_to_device = lambda values: torch.tensor(values, dtype=torch.int32)
        prefix = prefix_lens.to(torch.int64)
        return make.function(backend, max_seq_len=PAGE_SIZE, req_pool_indices=req_pool_indices,
                             seq_lens=prefix.to(torch.int32), seq_lens_cpu=prefix.cpu(), out_cache_loc=out_cache_loc,
                             block_size=block_size)


def bind_draft_block_code(tree: SourceTree, mode: str = "source") -> DraftBlockCode:
    """The tree's :class:`DraftBlockCode`; :class:`BindError` where the tree has no DSpark
    draft-block metadata init or what it runs does not bind."""
    # the getter's isinstance check must know the block metadata for the record it is
    record = _records(tree, mode, CUDA_BACKEND_FILE, ("DSV4Metadata",))
    init = _bind_draft_block_metadata(tree, mode, record)
    ring_rows = _bind_draft_ring_rows(tree, mode) if _has_draft_ring(tree) else None
    return DraftBlockCode(init, record, _translating_pool(tree, mode, _draft_block_pool(tree)), ring_rows,
                          _sets_store_hook(tree.read(DSPARK_WORKER_FILE) or ""))


def _bind_draft_block_metadata(tree: SourceTree, mode: str, record: dict[str, type]) -> Producer:
    """The CUDA backend's ``init_forward_metadata_dspark_draft_block`` with what it runs for
    a draft block: ``compute_uniform_extend_lengths``, ``init_forward_metadata_prefill``
    without compression, its ``expand_prefill_casually`` and ``make_core_attn_metadata``
    with the torch twins of the builders SGLang runs for CPU inputs, and the tree's
    ``DSV4AttnMetadata`` and ``DSV4Metadata`` (``record``). What a draft block never
    reaches (the request window, the causal SWA indices, compression and indexer metadata,
    context parallelism, the small-batch and FlashMLA CUDA kernels) gets stand-ins that
    refuse any use."""
    names = {
        **_dspark_kernels(tree, mode), **record, **_prefill_expansion_kernel(tree, mode),
        "DSV4AttnMetadata": compressed.metadata_class(tree, CUDA_BACKEND_FILE, {}, methods=()),
        "VerifyExtendLengths": record_of(tree, RAGGED_VERIFY_FILE, "VerifyExtendLengths"),
        "get_parallel": lambda: types.SimpleNamespace(attn_cp_size=1),
        "_create_flashmla_metadata": lambda: None,  # FlashMLA's schedule comes from a CUDA extension
        "Literal": typing.Literal, "envs": EngineEnvironment(),
        "SparseTableBackend": type("SparseTableBackend", (), {}),  # no draft block's candidates are one
        **{name: NotModelled(name) for name in (
            "window_layout", "_pad_last_dim", "BuildCausalSwaPageIndices", "build_page_table_positions_small",
            "build_low_ratio_metadata", "is_cp_active", "create_paged_compressor_data", "PagedIndexerMetadata",
            "_is_xpu", "expand_index_page_table", "get_platform",
            # 0.5.21 and 0.5.22's low-ratio prefill graph, which a draft of SWA-only layers never takes
            "_prefill_graph_max_seq_len", "has_dense_fp4_indexer", "is_sm100_or_newer",
            # 0.5.18 to 0.5.20's context-parallel and SM120 paths, likewise
            "is_cp_v2_active", "_is_sm120")},
    }
    # the backend as the tree's draft-block code reads it: bound first on everything its
    # __init__ sets, then run on a stand-in carrying exactly what the bound methods read
    everything = type("DraftBlockBackend", (StandIn,), {
        "role": "draft-block backend", "attributes": _instance_attributes(tree, CUDA_BACKEND_FILE, CUDA_BACKEND)})
    producer = _bind_method(tree, mode, DRAFT_BLOCK_METADATA, ((CUDA_BACKEND_FILE, CUDA_BACKEND),), (everything,),
                            extra=(*_dspark_helpers(tree),
                                   FunctionCode(RAGGED_VERIFY_FILE, "compute_uniform_extend_lengths")),
                            names=names)
    bound = producer.binding.classes[CUDA_BACKEND]
    functions = (getattr(method, "fget", getattr(method, "__func__", method)) for method in bound.methods.values())
    read = frozenset().union(*map(_reads, functions)) - set(bound.methods)
    backend = type("DraftBlockBackend", (StandIn,), {
        "role": everything.role, "attributes": read & everything.attributes,
        "__doc__": "The DSpark draft worker's CUDA backend as its draft-block metadata init reads it."})
    return replace(producer, stand_ins=(StandInUse(backend, producer.stand_ins[0].replaces), *producer.stand_ins[1:]))


def _instance_attributes(tree: SourceTree, path: str, owner: str, with_methods: bool = False) -> frozenset[str]:
    """The attributes ``owner`` in ``path`` gives its instances: those its ``__init__`` sets
    on ``self`` and those its class body assigns, and its methods ``with_methods``."""
    module = ast.parse(tree.read(path) or "")
    cls = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
    if cls is None:
        return frozenset()
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    set_in_init = {node.attr for node in ast.walk(init) if isinstance(node, ast.Attribute)
                   and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self"} if init else set()
    in_body = {target.id for node in cls.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name)}
    methods = {node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(set_in_init | in_body | (methods if with_methods else set()))


def _sets_store_hook(worker: str) -> bool:
    """Whether the DSpark worker's code hands the draft backends a ``pre_kv_store_hook``
    (0.5.23 does under ``SGLANG_DSPARK_DEFER_CONTEXT_KV``)."""
    return any(isinstance(node, ast.Attribute) and node.attr == STORE_HOOK and isinstance(node.ctx, ast.Store)
               for node in ast.walk(ast.parse(worker)))


def _uniform_blocks(batch: Batch) -> bool:
    """Whether ``batch`` is a DSpark draft forward: one block of the same token count per
    request (the speculative draft tokens less one), no padding."""
    return not batch.is_idle and batch.padding == 0 and len(set(batch.extend_seq_lens.tolist())) == 1


def _dspark_kernels(tree: SourceTree, mode: str) -> dict[str, type]:
    """The tree's DSpark draft-block builders and page-table builder, by name, each running
    its torch twin (what SGLang runs for CPU inputs)."""
    kernels_dir = _dspark_kernel_dir(tree)
    if kernels_dir is None:
        raise BindError(f"{tree.label} ({mode} mode): has no dspark_attn_metadata.py (looked in "
                        f"{', '.join(DSPARK_KERNEL_DIRS)}), so no DSpark draft block metadata")
    metadata_file = f"{kernels_dir}/dspark_attn_metadata.py"
    table_kernels = next((path for path in TABLE_FILES if "class BuildPageTablePositions" in (tree.read(path) or "")),
                         None)
    if table_kernels is None:
        raise BindError(f"{tree.label} ({mode} mode): has no BuildPageTablePositions (looked in "
                        f"{', '.join(TABLE_FILES)}), so no DSpark draft block metadata")
    kernel_classes = ("BuildDsparkSwaRingIndices", "BuildDsparkSwaPageIndices", "ComputeDsparkWindowGather",
                      "BuildBlockSeqLensCausal")
    defined = tuple(name for name in kernel_classes if defines(tree, metadata_file, name))
    kernels = bind(tree, (
        FunctionCode(UTILS_FILE, "ceil_align"), FunctionCode(f"{kernels_dir}/dispatch.py", "inputs_on_cuda"),
        *_dspark_helpers(tree),
        *(ClassCode(metadata_file, name, methods=("execute", "torch")) for name in defined),
        ClassCode(table_kernels, "BuildPageTablePositions", methods=("execute", "torch")),
    ), {"DsparkWindowGather": record_of(tree, metadata_file, "DsparkWindowGather"),
        "PageTablePositionsResult": record_of(tree, table_kernels, "PageTablePositionsResult")}, {}, mode)
    return {**{name: NotModelled(name) for name in kernel_classes},  # a tree without a draft ring has no ring builder
            **{name: bound.build(object) for name, bound in kernels.classes.items()}}


def _dspark_helpers(tree: SourceTree) -> tuple[FunctionCode, ...]:
    """The module-level DSpark helper the backends call, where the tree has it: the draft
    ring's rows (0.5.23)."""
    kernels_dir = _dspark_kernel_dir(tree)
    return tuple(FunctionCode(f"{kernels_dir}/dspark_attn_metadata.py", name) for name in ("swa_ring_rows",)
                 if kernels_dir is not None and defines(tree, f"{kernels_dir}/dspark_attn_metadata.py", name))


def _dspark_kernel_dir(tree: SourceTree) -> str | None:
    return next((d for d in DSPARK_KERNEL_DIRS if tree.read(f"{d}/dspark_attn_metadata.py") is not None), None)


def _has_draft_ring(tree: SourceTree) -> bool:
    """Whether the tree's CUDA backend writes DSpark draft blocks to a ring per request slot
    (0.5.23), besides paged SWA rows."""
    return f"def {DRAFT_RING_ROWS}(" in (tree.read(CUDA_BACKEND_FILE) or "")


class _StoreJoin:
    """The DSpark worker's ``pre_kv_store_hook`` (``DeferredContextCommit.join``, under
    ``SGLANG_DSPARK_DEFER_CONTEXT_KV``): a draft block's first KV store waits there for the
    verify's staged commit writes, which a draft graph forks at its head. Counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _draft_block_rings(has_ring: bool, batch: Batch) -> tuple[int | None, ...]:
    """The rings a DSpark draft block is checked on: first the draft ring where the tree has
    one, then paged SWA rows (None)."""
    draft, page = _ring_shape(batch)
    return (whole_page_ring(SLIDING_WINDOW, draft, page), None) if has_ring else (None,)


def _page_wide_req_to_token(num_req_slots: int, context: int) -> torch.Tensor:
    """A request-to-token table of whole pages covering ``context`` tokens; the draft blocks
    read only its shape (their page table is a placeholder)."""
    return torch.zeros((num_req_slots, -(-context // PAGE_SIZE) * PAGE_SIZE), dtype=torch.int32)


def _draft_pool(pool_class: type[StandIn], ring: int | None, num_req_slots: int) -> StandIn:
    """The DSpark draft worker's pool as ``pool_class`` models it: a ring of ``ring`` rows
    per request slot, or (None) paged SWA rows, whose mapping the caller registers."""
    values = {"request_window": None, "swa_req_ring_size": ring, "full_to_swa_index_mapping": None,
              "swa_valid_from": torch.zeros(num_req_slots, dtype=torch.int64)}
    return pool_class(**{name: values.get(name) for name in pool_class.attributes})


def _run_draft_block_getter(producer: Producer, batch: Batch, _: int) -> list[str]:
    """What a DSpark draft block's stores write (``DSparkAttention._store_block_kv`` asks
    the getter) on the metadata the tree's ``init_forward_metadata_dspark_draft_block``
    builds for the block:
    on a ring per request slot, each row's slot in its request's ring; on paged SWA rows (no
    ring), the pool's translation of the block's locations. The backend first serves the
    same requests' block one position earlier, so that an answer kept from it shows, and
    each store must first join the staged commit writes (``pre_kv_store_hook``)."""
    block_size = int(batch.extend_seq_lens[0])
    earlier = replace(batch, extend_prefix_lens=(batch.extend_prefix_lens - 1).clamp(min=0))
    code = producer.parts[DRAFT_BLOCK_METADATA]
    hooked = code.store_hook
    problems = []
    for ring in _draft_block_rings(code.ring, batch):
        pool = code.new_pool(ring, batch.num_req_slots)
        join = _StoreJoin()
        backend = _owner(producer, forward_metadata=None, token_to_kv_pool=pool)
        if hooked:
            backend.pre_kv_store_hook = join  # set after __init__, as the worker does
        where = "on the draft ring" if ring else "on paged SWA rows"
        for block in (earlier, batch):
            out_cache_loc, mapping = _locations(block)
            if ring is None:
                pool.register_mapping(mapping)
            backend.forward_metadata = code.metadata(pool, block.req_pool_indices, block.extend_prefix_lens,
                                                     out_cache_loc, block_size, batch.num_req_slots)
            joined = join.calls
            rows = producer.function(backend, StoreBatch(forward_mode=SglangMode(ForwardMode.TARGET_VERIFY),
                                                         out_cache_loc=out_cache_loc))
            want = (ring_rows(block.token_slots, block.positions, ring, block.num_req_slots) if ring
                    else translate_pool(mapping, out_cache_loc))
            label = f"draft block store rows {where}" + ("" if block is batch else " (earlier block)")
            problems += _differences(label, rows, want.to(torch.int64)) + _dtype(label, rows)
            if hooked and join.calls == joined:
                problems.append(f"{label}: returned without calling the {STORE_HOOK} the DSpark worker sets, so the "
                                "store would not wait for the verify's staged commit writes (DeferredContextCommit.join)")
    return problems


# ---- the late-layer tail (0.5.21+) ------------------------------------------------------------


def _bind_late_layer_tail(tree: SourceTree, mode: str) -> Producer:
    layout = bind_tail_layout(tree, PRODUCER_STAND_INS, mode)
    return Producer(layout.module, LATE_LAYER_TAIL, layout.function, binding=layout.binding)


def _run_late_layer_tail(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The extend rows the late layers store, plainly and (where the release keeps whole
    extends for requests that read their prompt rows) with the first request whole."""
    counts = [int(c) for c in batch.extend_seq_lens]
    variants: list[list[bool] | None] = [None]
    if "whole_extend" in parameters(producer.function):
        variants.append([r == 0 for r in range(len(counts))])
    problems = []
    for whole in variants:
        arguments = {} if whole is None else {"whole_extend": whole}
        rows, tail_lens, _floor = producer.function(
            extend_lens_cpu=counts, seq_lens_cpu=[int(s) for s in batch.seq_lens], tail_len=SLIDING_WINDOW,
            device=torch.device("cpu"), **arguments,
        )
        want = late_layer_tail_tokens(batch.extend_seq_lens, SLIDING_WINDOW, whole)
        label = "tail rows" if whole is None else "tail rows (first request whole)"
        problems += _differences(label, rows, want)
        kept = torch.bincount(torch.tensor(batch.token_request_index())[want], minlength=len(counts))
        problems += _differences(f"{label} per request", torch.tensor(tail_lens), kept)
    return problems


def _bind_tail_metadata(tree: SourceTree, mode: str) -> Producer:
    layout = bind_tail_layout(tree, PRODUCER_STAND_INS, mode)
    # the context-parallel ranks a run of the builder is on (the check sets them per run)
    parallel = types.SimpleNamespace(attn_cp_rank=0, attn_cp_size=1)
    names = {
        LATE_LAYER_TAIL: layout.function, "get_parallel": lambda: parallel,
        "is_cp_active": lambda forward_batch: forward_batch.attn_cp_metadata is not None,
        "InterleaveContextParallelMetadata": types.SimpleNamespace,
        "CaptureHiddenMode": types.SimpleNamespace(FULL="CaptureHiddenMode.FULL"),
        **_records(tree, mode, CUDA_BACKEND_FILE, ("LateLayerTail",)),
    }
    # the helpers each release's builder calls, where its files define them
    helpers = tuple(FunctionCode(path, name) for path, name in (
        (UTILS_FILE, "async_h2d"), (CUDA_BACKEND_FILE, "_late_layer_whole_extend"),
        (CUDA_BACKEND_FILE, "late_layer_whole_extend"),
    ) if f"def {name}(" in (tree.read(path) or ""))
    producer = _bind_method(
        tree, mode, TAIL_METADATA, ((CUDA_BACKEND_FILE, CUDA_BACKEND),), (_as_the_tree_has(tree, TailBackend),),
        extra=helpers,
        names=names, site_stand_ins=((TailMetadata, "DSV4Metadata"),),
        more_stand_ins=(StandInUse(TailPool, TailPool.replaces), StandInUse(TailBatch, TailBatch.replaces)),
    )
    producer.parts.update({"DeepSeekV4TokenToKVPool": _translating_pool(tree, mode, TailPool), "parallel": parallel})
    return producer


def _prefill_metadata(**_: Any) -> TailMetadata:
    """What the tail builder's metadata init hands back, without the kernels' plans."""
    return TailMetadata(core_attn_metadata=RingCoreMetadata(request_window_layout=None, swa_out_cache_loc=None),
                        late_layer_tail=None, low_ratio_req_indices=None, low_ratio_pos_i64=None)


def _run_tail_metadata(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The late-layer tail an extend's metadata init builds, eagerly and as the prefill CUDA
    graph's block (0.5.22+: persistent buffers of the captured shape's rows, real rows first,
    padding rows gathering row 0, scattering past the extend and storing to the dummy slot).
    One backend builds each form for the extend and then for one a token shorter per request,
    so that rows a block keeps from the longer one show. Then each rank of two and of three
    context-parallel ranks builds the eager form (:func:`_context_parallel_problems`)."""
    out_cache_loc, mapping = _locations(batch)
    pool = producer.parts["DeepSeekV4TokenToKVPool"](request_window=None, full_to_swa_index_mapping=None)
    pool.register_mapping(mapping)
    runner = types.SimpleNamespace(
        spec_algorithm=types.SimpleNamespace(is_dspark=lambda: False),
        server_args=types.SimpleNamespace(max_running_requests=batch.num_req_slots))

    def new_backend() -> StandIn:
        return _owner(producer, token_to_kv_pool=pool, encoder_row_floor=None, model_runner=runner,
                      low_ratios=(), forward_metadata=None, init_forward_metadata_prefill=_prefill_metadata,
                      _bcg_tail_buffers=None, _bcg_tail_capacity=None)

    shorter = replace(batch, extend_seq_lens=(batch.extend_seq_lens - 1).clamp(min=1))
    problems = []
    for for_prefill_graph in (False, True):
        if for_prefill_graph and "for_prefill_graph" not in parameters(producer.function):
            continue  # before 0.5.22 no prefill graph runs the tail
        backend = new_backend()
        for extend, locations, which in ((batch, out_cache_loc, ""),
                                         (shorter, _first_locations(batch, out_cache_loc, shorter),
                                          " (the next, shorter extend)")):
            arguments = {"for_prefill_graph": True} if for_prefill_graph else {}
            if not for_prefill_graph:  # an eager extend is checked on its live rows
                extend, locations = replace(extend, padding=0), locations[: extend.num_tokens]
            metadata = producer.function(backend, _tail_batch(extend, locations), **arguments)
            label = ("prefill-graph tail" if for_prefill_graph else "tail") + which
            problems += _tail_problems(label, metadata, extend, locations, mapping, for_prefill_graph)
    live = replace(batch, padding=0)
    return problems + _context_parallel_problems(producer, live, out_cache_loc[: batch.num_tokens], mapping,
                                                 new_backend)


def _context_parallel_problems(producer: Producer, batch: Batch, out_cache_loc: torch.Tensor,
                               mapping: torch.Tensor, new_backend: Callable[[], StandIn]) -> list[str]:
    """Under interleaved context parallelism extend row ``g`` is rank ``g % size``'s local row
    ``g // size``: each rank's tail holds its own tail rows (in order, then padding to the
    largest rank's count) and their count per request, and stores every tail row's key at the
    same SWA rows as without context parallelism (the keys are gathered across ranks)."""
    parallel = producer.parts["parallel"]
    tail = late_layer_tail_tokens(batch.extend_seq_lens, SLIDING_WINDOW)
    request = torch.tensor(batch.token_request_index(), dtype=torch.int64)
    want_loc = translate_pool(mapping, out_cache_loc[tail]).to(torch.int64)
    problems = []
    for size in (2, 3):
        largest = max(int((tail % size == rank).sum()) for rank in range(size))
        for rank in range(size):
            parallel.attn_cp_size, parallel.attn_cp_rank = size, rank
            try:
                metadata = producer.function(new_backend(), _tail_batch(batch, out_cache_loc, context_parallel=True))
            finally:
                parallel.attn_cp_size, parallel.attn_cp_rank = 1, 0
            got = metadata.late_layer_tail
            mine = tail[tail % size == rank]
            pad = largest - mine.shape[0]
            label = f"tail on context-parallel rank {rank} of {size}"
            problems += (
                _differences(f"{label} local rows", got.token_indices, (mine - rank) // size)
                + _differences(f"{label} positions", got.positions,
                               torch.cat([batch.positions[mine], torch.zeros(pad, dtype=torch.int64)]))
                + _differences(f"{label} padding rows", torch.tensor([got.pad_rows]), torch.tensor([pad]))
                + _differences(f"{label} rows per request", torch.tensor(got.local_lens_cpu),
                               torch.bincount(request[mine], minlength=len(batch.extend_seq_lens)))
                + _differences(f"{label} swa_out_cache_loc", got.swa_out_cache_loc, want_loc)
            )
    return problems


def _first_locations(batch: Batch, out_cache_loc: torch.Tensor, shorter: Batch) -> torch.Tensor:
    """The locations of ``shorter``'s tokens (each request's first ones in ``batch``), then
    ``shorter``'s padding rows at the dummy slot."""
    place = torch.cat([torch.arange(int(n)) for n in batch.extend_seq_lens])
    kept = place < shorter.extend_seq_lens.repeat_interleave(batch.extend_seq_lens)
    return torch.cat([out_cache_loc[: batch.num_tokens][kept], torch.zeros(shorter.padding, dtype=torch.int64)])


def _tail_batch(batch: Batch, out_cache_loc: torch.Tensor, context_parallel: bool = False) -> TailBatch:
    """The extend as the builder reads it; under context parallelism its metadata is there
    (what the tail reads of it is rebuilt by the builder), and its rows are the whole extend's."""
    positions = torch.cat([batch.positions, torch.zeros(batch.padding, dtype=torch.int64)])
    return TailBatch(extend_seq_lens_cpu=[int(n) for n in batch.extend_seq_lens], seq_lens_cpu=batch.seq_lens.clone(),
                     seq_lens=batch.seq_lens.clone(), out_cache_loc=out_cache_loc, positions=positions,
                     req_pool_indices=batch.req_pool_indices.clone(), return_logprob=False,
                     extend_logprob_start_lens_cpu=None, capture_hidden_mode=None,
                     attn_cp_metadata=types.SimpleNamespace() if context_parallel else None,
                     batch_size=len(batch.extend_seq_lens))


def _tail_problems(label: str, metadata: Any, batch: Batch, out_cache_loc: torch.Tensor, mapping: torch.Tensor,
                   block: bool) -> list[str]:
    tail = metadata.late_layer_tail
    want = late_layer_tail_tokens(batch.extend_seq_lens, SLIDING_WINDOW)
    rows = want.shape[0]
    want_loc = translate_pool(mapping, out_cache_loc[want]).to(torch.int64)
    if not block:
        indices = (tail.token_indices if tail.contiguous_start is None
                   else torch.arange(tail.contiguous_start, batch.num_tokens))
        return (_differences(f"{label} rows", indices, want)
                + _differences(f"{label} positions", tail.positions, batch.positions[want])
                + _differences(f"{label} swa_out_cache_loc", tail.swa_out_cache_loc, want_loc)
                + _dtype(f"{label} swa_out_cache_loc", tail.swa_out_cache_loc))
    padding = tail.token_indices.shape[0] - rows
    if tail.real_rows_count != rows or padding < 0:
        return [f"{label}: {tail.real_rows_count} real rows in a block of {tail.token_indices.shape[0]}, "
                f"want {rows} real rows"]
    dummy = torch.full((padding,), DUMMY_SLOT, dtype=torch.int64)
    past_the_extend = torch.full((padding,), out_cache_loc.shape[0], dtype=torch.int64)
    zeros = torch.zeros(padding, dtype=torch.int64)
    return (_differences(f"{label} gather rows", tail.token_indices, torch.cat([want, zeros]))
            + _differences(f"{label} scatter rows", tail.scatter_indices, torch.cat([want, past_the_extend]))
            + _differences(f"{label} positions", tail.positions, torch.cat([batch.positions[want], zeros]))
            + _differences(f"{label} swa_out_cache_loc", tail.swa_out_cache_loc, torch.cat([want_loc, dummy]))
            + _dtype(f"{label} swa_out_cache_loc", tail.swa_out_cache_loc))


# ---- multi-step draft decode: each step's slots (0.5.13+) ----------------------------------------


def _bind_draft_step_locations(tree: SourceTree, mode: str) -> Producer:
    binding = bind(tree, (FunctionCode(EAGLE_UTILS_FILE, DRAFT_STEP_LOCS),), PRODUCER_STAND_INS, {}, mode)
    return Producer("eagle_utils", DRAFT_STEP_LOCS, binding.functions[DRAFT_STEP_LOCS], binding=binding)


def _run_draft_step_locations(producer: Producer, batch: Batch, _: int) -> list[str]:
    """A draft of ``topk`` branches and ``steps`` steps per request, its slots handed out as
    the EAGLE allocator does (request, branch, step); each step must get its own slots."""
    requests = len(batch.req_pool_indices)
    topk, steps = 1 + batch.num_tokens % 2, 1 + int(batch.extend_seq_lens.max()) % 4
    generator = torch.Generator().manual_seed(batch.num_tokens)
    drafted = requests * topk * steps
    allocated = (torch.randperm(4 * drafted, generator=generator)[:drafted] + 1).reshape(requests, topk, steps)
    rows = producer.function(allocated.reshape(-1), requests, topk, steps)
    want = draft_step_slots(allocated)
    if tuple(rows.shape) != tuple(want.shape):
        return [f"draft step slots: shape {tuple(rows.shape)}, want {tuple(want.shape)} (a row per step)"]
    return _differences(f"draft step slots ({topk} branches, {steps} steps)", rows, want.reshape(-1))


# ---- the CUDA backend's in-graph metadata step (0.5.18+) ------------------------------------------


class InGraphMetadata(StandIn):
    """Full (not raw) forward metadata, as the in-graph step finds it after replay prep."""

    role = "forward metadata"
    attributes = frozenset({"core_attn_metadata"})


class LowRatioInGraphMetadata(InGraphMetadata):
    """The same where the step also refreshes the low-ratio indexers (0.5.21+; none here)."""

    attributes = InGraphMetadata.attributes | {"core_metadata"}


class InGraphCore(StandIn):
    role = "attention metadata"
    attributes = frozenset({"swa_out_cache_loc"})


class LowRatioInGraphCore(InGraphCore):
    attributes = InGraphCore.attributes | {"low_ratios"}


class InGraphBatch(StandIn):
    role = "forward batch"
    attributes = frozenset({"forward_mode", "out_cache_loc", "batch_size"})
    replaces = (RealClass("sglang/srt/model_executor/forward_batch_info.py", "ForwardBatch"),)


def _reads(function: types.FunctionType, *chain: str, root: str = "self") -> frozenset[str]:
    """The attributes the bound ``function`` reads from ``<root>.<chain>``."""
    node = function.swafuzz_source
    prefix = ".".join((root, *chain))
    return frozenset(
        n.attr for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and ast.unparse(n.value) == prefix
    )


# methods the in-graph step calls on its own class where the release has them, and those its
# DSpark draft-block branch calls (0.5.23)
IN_GRAPH_HELPERS = ("_fp4_workspaces_enabled", "_fp4_c4_rowgroup_rows")
DSPARK_IN_GRAPH_HELPERS = ("_dspark_seq_lens_casual", "get_dspark_swa_page_indices", DRAFT_RING_ROWS)


def _bind_in_graph_init(path: str, owner: str, dspark: bool = False) -> Callable[[SourceTree, str], Producer]:
    def bind_one(tree: SourceTree, mode: str) -> Producer:
        """The in-graph step bound on stand-ins carrying exactly what the release's code
        reads of the backend and its pool (paths never taken get :class:`NotModelled`);
        with ``dspark``, with the DSpark draft-block builders its DSpark branch runs."""
        names: dict[str, Any] = {name: NotModelled(name) for name in (
            "skip_low_ratio_indexer", "fill_all_compressed_indices", "token_req_indices", "_replan_topk_in_graph",
            "prepare_fp4_k_write_metadata", "prepare_fp4_decode_workspace", "prepare_fp4_rowgroup_decode_workspace",
            # the HIP low-ratio decode workspaces (0.5.23), which no low-ratio-free batch reaches
            "StepMetadata", "build_low_ratio_decode_workspaces", "is_metadata_unread",
            "low_ratio_decode_rows_are_identity", "widen_pair_i64", "C4_ROWGROUP_MIN_VERIFY_ROWS",
            "logits_rows_per_chunk")}
        names["DSV4Metadata"] = InGraphMetadata  # what its isinstance check recognises as full metadata
        text = tree.read(path) or ""
        raw = tuple(name for name in ("DSV4RawVerifyMetadata", "DSV4RawDecodeMetadata", "DSV4RawDSparkDraftMetadata")
                    if f"class {name}" in text)
        records = _records(tree, mode, path, raw)
        helpers = tuple(name for name in (*IN_GRAPH_HELPERS, *(DSPARK_IN_GRAPH_HELPERS if dspark else ()))
                        if f"def {name}(" in text)
        code = (FunctionCode(EAGLE_UTILS_FILE, DRAFT_STEP_LOCS), ClassCode(path, owner, (IN_GRAPH_INIT, *helpers)))
        if dspark:
            names.update(_dspark_kernels(tree, mode))
            code = (*_dspark_helpers(tree), *code)
        binding = bind(tree, code, {**PRODUCER_STAND_INS, **names, **records}, {}, mode)
        bound = binding.classes[owner]
        function = bound.methods[IN_GRAPH_INIT]
        if dspark and "is_dspark_draft" not in function.__code__.co_names:
            raise BindError(f"{binding.label}: {owner}.{IN_GRAPH_INIT} has no DSpark draft-block branch")
        read = frozenset().union(*(_reads(method) for method in bound.methods.values())) - set(bound.methods)
        backend = type("InGraphBackend", (StandIn,), {"role": "in-graph backend", "attributes": read})
        pool = _pool_as_read("InGraphPool", "in-graph pool", (
            _reads(function, "token_to_kv_pool")
            # the DSpark helpers read the pool through a local
            | {"swa_valid_from"} & {name for method in bound.methods.values() for name in method.__code__.co_names}))
        low_ratios = "core_metadata" in function.__code__.co_names
        metadata = LowRatioInGraphMetadata if low_ratios else InGraphMetadata
        core = LowRatioInGraphCore if low_ratios else InGraphCore
        return Producer(owner, IN_GRAPH_INIT, function, binding=binding, stand_ins=(
            StandInUse(backend, (RealClass(path, owner),)), StandInUse(pool, pool.replaces),
            StandInUse(InGraphBatch, InGraphBatch.replaces),
            StandInUse(metadata, (RealClass(path, "DSV4Metadata"),)),
            StandInUse(core, (RealClass(path, "DSV4AttnMetadata"),)),
        ), parts={"backend": bound.build(backend), "metadata": metadata, "core": core,
                  "pool": _translating_pool(tree, mode, pool), DRAFT_RING_ROWS: _has_draft_ring(tree)})
    return bind_one


def _run_in_graph_init(producer: Producer, batch: Batch, _: int) -> list[str]:
    """Each step of a multi-step draft decode (one step: a plain decode) refreshes the rows
    its stores read from the live ``out_cache_loc``: they must be its own step's slots,
    translated."""
    requests = len(batch.req_pool_indices)
    topk, steps = 1 + batch.num_tokens % 2, 1 + int(batch.extend_seq_lens.max()) % 4
    if steps == 1:
        topk = 1
    drafted = requests * topk * steps
    generator = torch.Generator().manual_seed(batch.num_tokens * 7 + requests)
    allocated = (torch.randperm(4 * drafted, generator=generator)[:drafted] + 1).reshape(requests, topk, steps)
    mapping = torch.zeros(4 * drafted + 1, dtype=torch.int64)
    mapping[allocated.reshape(-1)] = torch.randperm(2 * drafted, generator=generator)[:drafted] + 1
    pool_class = producer.parts["pool"]
    pool = pool_class(**{name: None for name in pool_class.attributes})
    pool.register_mapping(mapping)
    mode = ForwardMode.DRAFT_DECODE if steps > 1 else ForwardMode.DECODE
    forward_batch = InGraphBatch(forward_mode=SglangMode(mode), out_cache_loc=allocated.reshape(-1),
                                 batch_size=requests)
    want_by_step = draft_step_slots(allocated)
    problems = []
    core_class, metadata_class = producer.parts["core"], producer.parts["metadata"]
    for step in range(steps):
        core_values = {"swa_out_cache_loc": None, "low_ratios": ()}  # no low-ratio indexer runs
        core = core_class(**{name: core_values[name] for name in core_class.attributes})
        metadata = metadata_class(**{name: core for name in metadata_class.attributes})
        backend_class = producer.parts["backend"]
        offered = {"forward_metadata": metadata, "token_to_kv_pool": pool, "topk": topk if steps > 1 else 0,
                   "speculative_num_steps": steps if steps > 1 else 0, "speculative_step_id": step,
                   "is_dspark_draft": False, "_early_verify_metadata_ids": set(),
                   "enable_deepseek_v4_fp4_indexer": False, "_fp4_c4_rowgroup_columns": None}
        backend = backend_class(**{name: offered.get(name, NotModelled(f"self.{name}"))
                                   for name in backend_class.attributes})
        producer.function(backend, forward_batch)
        want = translate_pool(mapping, want_by_step[step])
        label = f"step {step} of {steps} swa_out_cache_loc" if steps > 1 else "swa_out_cache_loc"
        problems += _differences(label, core.swa_out_cache_loc, want.to(torch.int64))
    return problems


class DsparkInGraphBatch(InGraphBatch):
    """A DSpark draft block's forward batch as the in-graph step reads it: the context each
    request had before its block (``seq_lens``), its slots, and the block size
    (``spec_info.draft_token_num``)."""

    attributes = InGraphBatch.attributes | {"seq_lens", "req_pool_indices", "spec_info"}


def _run_in_graph_dspark_block(producer: Producer, batch: Batch, _: int) -> list[str]:
    """A DSpark draft graph's refresh of the rows its block's stores read, on the draft ring
    (each token's row in its request's ring) and on paged SWA rows (the pool's translation),
    over metadata that still holds the rows of the graph's previous replay."""
    block_size = int(batch.extend_seq_lens[0])
    out_cache_loc, mapping = _locations(batch)
    forward_batch = DsparkInGraphBatch(
        forward_mode=SglangMode(ForwardMode.TARGET_VERIFY), out_cache_loc=out_cache_loc,
        batch_size=len(batch.req_pool_indices), seq_lens=batch.extend_prefix_lens.to(torch.int32),
        req_pool_indices=batch.req_pool_indices, spec_info=types.SimpleNamespace(draft_token_num=block_size))
    req_to_token = _page_wide_req_to_token(batch.num_req_slots, int(batch.positions.max()) + 1)
    core_class, metadata_class = producer.parts["core"], producer.parts["metadata"]
    problems = []
    for ring in _draft_block_rings(producer.parts[DRAFT_RING_ROWS], batch):
        pool = _draft_pool(producer.parts["pool"], ring, batch.num_req_slots)
        if ring is None:
            pool.register_mapping(mapping)
        stale = torch.full((batch.rows,), -7, dtype=torch.int32)  # the previous replay's rows
        core_values = {"swa_out_cache_loc": stale, "low_ratios": (), "swa_page_indices": None,
                       "swa_topk_lengths": None}
        core = core_class(**{name: core_values[name] for name in core_class.attributes})
        metadata = metadata_class(**{name: core for name in metadata_class.attributes})
        offered = {"forward_metadata": metadata, "token_to_kv_pool": pool, "topk": 0, "speculative_num_steps": 0,
                   "speculative_step_id": 0, "is_dspark_draft": True, "_early_verify_metadata_ids": set(),
                   "enable_deepseek_v4_fp4_indexer": False, "trtllm_attn": False, "req_to_token": req_to_token,
                   "cuda_int32_kwargs": {"device": "cpu", "dtype": torch.int32}}
        backend_class = producer.parts["backend"]
        backend = backend_class(**{name: offered.get(name, NotModelled(f"self.{name}"))
                                   for name in backend_class.attributes})
        producer.function(backend, forward_batch)
        want = (ring_rows(batch.token_slots, batch.positions, ring, batch.num_req_slots) if ring
                else translate_pool(mapping, out_cache_loc))
        label = "draft block swa_out_cache_loc " + ("on the draft ring" if ring else "on paged SWA rows")
        problems += _differences(label, core.swa_out_cache_loc, want.to(torch.int64))
    return problems


# ---- DSpark's injection of the target's context keys into the draft's SWA rows (0.5.16+) ---


KV_INJECT_FILE = "sglang/srt/speculative/dspark_components/dspark_kv_inject.py"
KV_INJECTOR = "TargetHiddenKvInjector"
CONTEXT_INJECTION = f"{KV_INJECTOR}._inject_mla"
# the methods the injection computes its rows with, where the release has them: the draft
# ring's (0.5.23, with committed_swa_loc) and the unified ring's (0.5.18-0.5.22)
INJECTION_HELPERS = ("committed_swa_loc", "_ring_inject_loc", "_unified_inject_loc")


class KvInjector(StandIn):
    role = "KV injector"
    attributes = frozenset({"draft_model"})


class _UnifiedGate:
    """SGLang's ``is_unified_kv_triton()`` for the injection, switched per check."""

    on = False

    def __call__(self) -> bool:
        return self.on


class _DraftStore:
    """The DSpark draft model as the injection hands it a store: the rows it was given."""

    rows: Any = None

    def write_target_hidden_kv(self, *, swa_loc: Any, **_: Any) -> None:
        self.rows = swa_loc


def _bind_context_injection(tree: SourceTree, mode: str) -> Producer:
    text = tree.read(KV_INJECT_FILE) or ""
    helpers = tuple(name for name in INJECTION_HELPERS if f"def {name}(" in text)
    gate = _UnifiedGate()
    # the CUDA kernel of the paged rows, behind an is_cuda test that CPU rows never pass
    names = {**PRODUCER_STAND_INS, "is_unified_kv_triton": gate,
             "committed_swa_locations": NotModelled("committed_swa_locations")}
    binding = bind(tree, (*_dspark_helpers(tree),
                          ClassCode(KV_INJECT_FILE, KV_INJECTOR, ("_inject_mla", *helpers), role=KvInjector.role)),
                   names, {KvInjector.role: KvInjector.attributes}, mode)
    methods = binding.classes[KV_INJECTOR].methods
    read = frozenset().union(*(_reads(method, root="pool") for method in methods.values()))
    pool = _pool_as_read("InjectionPool", "injection pool", read)
    producer = Producer(KV_INJECTOR, "_inject_mla", methods["_inject_mla"], binding=binding,
                        stand_ins=(StandInUse(KvInjector, (RealClass(KV_INJECT_FILE, KV_INJECTOR),)),
                                   StandInUse(pool, pool.replaces)))
    producer.parts.update(pool=_translating_pool(tree, mode, pool), gate=gate,
                          injector=binding.classes[KV_INJECTOR].build(KvInjector))
    return producer


def _run_context_injection(producer: Producer, batch: Batch, _: int) -> list[str]:
    """The rows DSpark's injection hands the draft model's SWA store for the target's
    context keys, as its two callers feed it: a prefill's tokens (each with its request's
    final position on a ring, ``place_prefill``), and, where every request verified as many
    tokens, the verify's tokens with each request's accepted count (``commit_lens``). On
    paged SWA rows under the model's mapping, on the draft ring (0.5.23: the pool has
    ``swa_req_ring_size``) and on the unified ring (0.5.18-0.5.22, under unified KV)."""
    locations, mapping = _locations(batch)
    positions, slots = batch.positions, batch.token_slots
    final = prefill_rows(batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens).final_pos
    counts = batch.extend_seq_lens.tolist()
    forms = [("prefill", {"cache_loc_2d": None, "commit_lens": None}, None, final)]
    if len(set(counts)) == 1:
        accepted = torch.tensor([(int(p) + r) % (counts[0] + 1) for r, p in enumerate(batch.extend_prefix_lens)],
                                dtype=torch.int32)
        committed = torch.arange(counts[0]).view(1, -1) < accepted.view(-1, 1)
        forms.append(("verify", {"cache_loc_2d": locations.view(len(counts), counts[0]), "commit_lens": accepted},
                      committed, None))
    pool_class, gate = producer.parts["pool"], producer.parts["gate"]
    ring = SLIDING_WINDOW + 3
    pools = [("paged SWA rows", {}, False)]
    if "swa_req_ring_size" in pool_class.attributes:
        pools.append(("the draft ring", {"swa_req_ring_size": ring, "sliding_window": SLIDING_WINDOW}, False))
    if "unified_swa_ring_size" in pool_class.attributes:
        pools.append(("the unified ring", {"unified_swa_ring_size": ring, "unified_swa_window": SLIDING_WINDOW}, True))
    taken = set(parameters(producer.function))
    problems = []
    for pool_label, values, unified in pools:
        pool = pool_class(**{name: values.get(name) for name in pool_class.attributes})
        on_ring = bool(values)
        if not on_ring:
            pool.register_mapping(mapping)
        rows = ring_rows(slots, positions, ring, batch.num_req_slots) if on_ring else translate_pool(mapping, locations)
        for form, inputs, committed, final_positions in forms:
            store = _DraftStore()
            offered = {"pool": pool, "target_hidden": torch.zeros(batch.num_tokens, 1), "cache_loc": locations,
                       "positions": positions, **inputs,
                       "state_slot": slots if on_ring else None, "final_pos": final_positions if on_ring else None}
            gate.on = unified
            producer.function(producer.parts["injector"](draft_model=store),
                              **{name: value for name, value in offered.items() if name in taken})
            want = injected_context_rows(rows, positions, committed, final_positions,
                                         SLIDING_WINDOW if on_ring else None)
            problems += _differences(f"{form} injection rows on {pool_label}", store.rows, want)
    return problems


PRODUCERS: tuple[ProducerInfo, ...] = (
    ProducerInfo(VERIFY_EXPANSION, "target-verify state slot per token (req_pool_indices_repeated)",
                 _bind_expansion(VERIFY_EXPANSION), _run_verify_expansion),
    ProducerInfo(PREFILL_EXPANSION, "prefill state slot per token (req_pool_indices_repeated)",
                 _bind_expansion(PREFILL_EXPANSION), _run_prefill_expansion),
    ProducerInfo(PREFILL_ROWS, "unified-KV prefill rows pf_state_slot, pf_chunk_start, pf_cu_q, pf_final_pos",
                 _bind_prefill_rows, _run_prefill_rows),
    ProducerInfo(DECODE_STREAMS, "HIP decode and target-verify ring rows (swa_loc, verify_store_state_slot)",
                 _bind_decode_streams, _run_decode_streams, _one_row_per_request_or_verify),
    ProducerInfo(WINDOW_LAYOUT, "request-window layout: workspace write_loc, req, pos, commit_mask",
                 _bind_window_layout, _run_window_layout, lambda batch: not batch.is_idle),
    ProducerInfo(WINDOW_IDLE, "request-window rows of an idle forward",
                 _bind_window_method("activate_idle"), _run_window_idle, lambda batch: batch.is_idle),
    ProducerInfo(WINDOW_COMMIT, "request-window commit of the workspace rows to the request rings",
                 _bind_window_method("commit", extra=("initialize_dummy_history", "_history_src", "buffer"),
                                     helpers=("copy_packed_tokens",)),
                 _run_window_commit, lambda batch: not batch.is_idle and batch.padding == 0),
    ProducerInfo(WINDOW_ROW, "request-window ring row of a request slot and position",
                 _bind_window_method("row_loc"), _run_window_row),
    ProducerInfo(CUDA_WINDOW_GETTER, "CUDA backend store target under the request window",
                 _bind_window_getter(CUDA_BACKEND_FILE, CUDA_BACKEND), _run_window_getter, _live_or_idle_after_live),
    ProducerInfo(HIP_WINDOW_GETTER, "HIP backend store target under the request window",
                 _bind_window_getter(HIP_BACKEND_FILE, HIP_BACKEND), _run_window_getter, _live_or_idle_after_live),
    ProducerInfo(LATE_LAYER_TAIL, "extend rows the late layers store under decoder SWA bounded replay",
                 _bind_late_layer_tail, _run_late_layer_tail),
    ProducerInfo(TAIL_METADATA, "late-layer tail metadata: rows, positions and SWA rows, eager and as the "
                 "prefill CUDA graph's block", _bind_tail_metadata, _run_tail_metadata, lambda batch: not batch.is_idle),
    ProducerInfo(DRAFT_STEP_LOCS, "full-pool slots each step of a multi-step draft decode writes",
                 _bind_draft_step_locations, _run_draft_step_locations),
    ProducerInfo(CUDA_IN_GRAPH_INIT, "CUDA in-graph refresh of the rows each draft step's stores read",
                 _bind_in_graph_init(CUDA_BACKEND_FILE, CUDA_BACKEND), _run_in_graph_init),
    ProducerInfo(CUDA_IN_GRAPH_DSPARK, "CUDA in-graph refresh of the rows a DSpark draft block's stores read, on "
                 "paged SWA rows and on the draft SWA ring", _bind_in_graph_init(CUDA_BACKEND_FILE, CUDA_BACKEND, dspark=True),
                 _run_in_graph_dspark_block, _uniform_blocks),
    ProducerInfo(HIP_IN_GRAPH_INIT, "HIP in-graph refresh of the rows each draft step's stores read",
                 _bind_in_graph_init(HIP_BACKEND_FILE, HIP_BACKEND), _run_in_graph_init),
    ProducerInfo(GRAPH_LOC_BUFFER, "CUDA graph buffer of translated out_cache_loc",
                 _bind_graph_buffer, _run_graph_buffer, lambda batch: not batch.is_idle),
    ProducerInfo(DRAFT_RING_SIZE, "rows per request slot of the draft SWA ring",
                 _bind_draft_ring_size, _run_draft_ring_size),
    ProducerInfo(DRAFT_RING_ROWS, "draft SWA ring rows a draft block writes",
                 _bind_draft_ring_rows, _run_draft_ring_rows),
    ProducerInfo(CUDA_DRAFT_BLOCK_GETTER, "CUDA backend store target of a DSpark draft block, on paged SWA rows and "
                 "on the draft SWA ring", _bind_draft_block_getter, _run_draft_block_getter, applies=_uniform_blocks),
    ProducerInfo(CONTEXT_INJECTION, "draft SWA rows DSpark's injection stores the target's context keys to, after a "
                 "prefill and for a verify's accepted tokens, on paged SWA rows and on the draft or unified ring",
                 _bind_context_injection, _run_context_injection),
)
