"""The readers of the compressed-KV values, run on the tree's own metadata and checked
against the truth.

:mod:`.compressed` checks what ``DSV4AttnMetadata.init_compression_metadata`` makes; this
module checks what the code downstream of it takes from that metadata:

- ``CompressorBackendMixin._get_out_loc`` (``dsv4/compressor_v2.py``, 0.5.12 to 0.5.23, the
  same in every release): the compressed write locations a C4 / C128 compressor stores at,
  ``core_metadata.c{ratio}_out_loc`` of the forward's metadata. Every compressor store reads
  it: ``forward_unified``, the HIP fallback ``_forward_unified_hip`` and (0.5.23) the
  uniform-fp8 ``forward_compress_uniform_fp8``.
- ``CompressorBackendMixin.forward_unified``: which rows a C4 main, C4 indexer and C128
  compressor hand their store, on the CUDA metadata and on the HIP metadata; where the HIP
  metadata makes unified-KV locations (0.5.14+), a non-indexer store under the unified
  Triton layout (``is_unified_kv_triton``) reads ``core_metadata.unified.c{ratio}_out_loc``
  instead, the locations offset by the unified SWA region.

Each reader runs on metadata the tree's own ``init_compression_metadata`` made (bound as
:mod:`.compressed` binds it, under Triton's interpreter) for a live decode batch, a batch
padded as a CUDA graph bucket pads it, and a draft batch of several consecutive rows per
request; the rows it returns or stores must be the truth's
(:func:`~swafuzz.reference.compressed.compressed_out_loc`,
:func:`~swafuzz.reference.compressed.unified_compressed_out_loc`).

Each draft step's metadata is checked the same way. A multi-step draft decode (0.5.13+)
bakes each step's C4 / C128 write locations into that step's metadata, from its own slice
of the shared ``out_cache_loc`` (``per_step_draft_out_cache_loc``, SGLang #26239). The
eager build of one step, ``_build_forward_metadata`` (CUDA 0.5.13+, HIP 0.5.21+) or the HIP
``init_forward_metadata`` (0.5.13 to 0.5.20), runs for every step on a stand-in backend with
the tree's own slicing; its ``init_forward_metadata_decode`` is modelled as handing the rows
to the tree's ``init_compression_metadata`` (what its chain does: 0.5.23 through the raw
decode metadata it upgrades). Two checks per backend: the slots each step hands over, by
value (:func:`~swafuzz.reference.truth.draft_step_slots`), and the ``c4_out_loc`` /
``c128_out_loc`` the tree's kernel makes of them, against the truth of that step's slots.
"""

from __future__ import annotations

import ast
import enum
import functools
import random
import traceback
import typing
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ...api import ForwardMode
from ...reference import compressed as truth
from ...reference.truth import draft_step_slots
from . import compressed
from .binding import BindError, ClassCode, FunctionCode, bind
from .compressed import CompressionBatch, CompressionMetadataCode, first_wrong_row
from .drivers import NotModelled, SglangMode, StandIn, StandInGap
from .interpreted import TRITON_MISSING, triton_available
from .locate import SourceTree
from .producers import DRAFT_STEP_LOCS, EAGLE_UTILS_FILE
from .reachability import draft_layers_store_no_compressed_kv
from .targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE

DRAFT_DECODE = "multi-step draft decode"
COMPRESSOR_FILE = "sglang/srt/layers/attention/dsv4/compressor_v2.py"
MIXIN = "CompressorBackendMixin"
OUT_LOC_READER = f"{MIXIN}._get_out_loc"
STORE_PATH = f"{MIXIN}.forward_unified"
# the compressors of a DeepSeek-V4 stage: (ratio, whether it is the C4 indexer's)
COMPRESSORS = ((4, False), (4, True), (128, False))
LAYER_ID = 0


def reader_batches(seed: int = 0) -> list[tuple[str, CompressionBatch]]:
    """(kind, batch): a live decode batch, the same kind padded as a CUDA graph bucket pads
    it, a draft batch of four consecutive rows per request (a verify or draft window), and
    the requests of a multi-step draft decode, each of whose rows completes a ratio-4 group
    and every other one a ratio-128 group too (so that each step's slots show in its
    compressed locations). Eight rows or fewer each: the interpreter runs a kernel row in
    milliseconds."""
    rng = random.Random(seed)
    batches = [("live", compressed.generated_batch(rng, 8, tokens_per_request=1, padding=0)),
               ("padded", compressed.generated_batch(rng, 5, tokens_per_request=1, padding=3)),
               ("draft", compressed.generated_batch(rng, 8, tokens_per_request=4, padding=0))]
    decode = compressed.generated_batch(rng, 4, tokens_per_request=1, padding=0)
    completing = torch.tensor([3, 127]).repeat(decode.positions.numel())[: decode.positions.numel()]
    return batches + [(DRAFT_DECODE, replace(decode, positions=decode.positions | completing))]


def describe(kind: str, batch: CompressionBatch) -> str:
    return (f"{kind} batch: positions {batch.positions.tolist()}, write locations {batch.out_loc.tolist()}"
            + (f", unified_swa_pages {batch.unified_swa_pages}" if batch.unified_swa_pages else ""))


@dataclass(frozen=True)
class ReaderCheck:
    """What running one reader of one tree found: ``wrong`` the first wrong rows, in the
    first batch with any (``batch`` names it); ``reason`` why it was not run."""

    name: str
    ran: bool
    wrong: tuple[str, ...] = ()
    batch: str = ""
    reason: str = ""
    raised: bool = False  # the tree's code raised: wrong whether or not any layer reads the values


def _metadatas(code: CompressionMetadataCode, batch: CompressionBatch) -> list[tuple[str, Any, bool]]:
    """(label, attention metadata, whether it has unified-KV locations) for each backend's
    metadata the tree has, made by its own ``init_compression_metadata``."""
    made = [(compressed.METADATA_CLASS, code.metadata(batch), False)]
    if code.hip_metadata_class is not None:
        made.append((compressed.HIP_METADATA, code.metadata(batch, hip=True), code.hip_unified))
    return made


def _want(batch: CompressionBatch, ratio: int, unified: bool) -> torch.Tensor:
    if unified:
        return truth.unified_compressed_out_loc(batch.positions, batch.out_loc, ratio, batch.unified_swa_pages)
    return truth.compressed_out_loc(batch.positions, batch.out_loc, ratio)


@functools.lru_cache(maxsize=4)
def _compression_code(tree: SourceTree) -> CompressionMetadataCode:
    """The tree's compression metadata code, bound once for all its readers (binding the
    Triton kernels takes a second or two)."""
    return compressed.bind_compression_metadata(tree)


def _run_reader(name: str, bind_it: Callable[[SourceTree], Any],
                run: Callable[[Any, CompressionMetadataCode, CompressionBatch], list[str]],
                tree: SourceTree, batches: list[tuple[str, CompressionBatch]] | None) -> ReaderCheck:
    """Bind the reader (:class:`BindError` where the tree lacks it) and the tree's
    compression metadata, and run it on ``batches`` until the first with a wrong row."""
    reader = bind_it(tree)
    if not triton_available():
        return ReaderCheck(name, ran=False, reason=f"the metadata it reads is {TRITON_MISSING}")
    code = _compression_code(tree)
    for kind, batch in batches if batches is not None else reader_batches():
        try:
            wrong = [w for w in run(reader, code, batch) if w is not None]
        except StandInGap as exc:
            return ReaderCheck(name, ran=False, reason=f"{exc} ({describe(kind, batch)})")
        except Exception as exc:  # noqa: BLE001 - the tree's code may raise anything: that is its answer
            return ReaderCheck(name, ran=True, wrong=(f"{name} raised {_raised(exc)}",), batch=describe(kind, batch),
                               raised=True)
        if wrong:
            return ReaderCheck(name, ran=True, wrong=tuple(wrong), batch=describe(kind, batch))
    return ReaderCheck(name, ran=True)


def _raised(exc: Exception) -> str:
    """An exception as the checks name it; a bare ``assert`` by its statement and file."""
    if str(exc):
        return f"{type(exc).__name__}: {exc}"
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at {where.filename.rsplit('/', 1)[-1]} line {where.lineno}: {where.line}"


# ---- _get_out_loc ---------------------------------------------------------------------------


def _bind_out_loc_reader(tree: SourceTree) -> Callable[..., Any]:
    binding = bind(tree, (ClassCode(COMPRESSOR_FILE, MIXIN, ("_get_out_loc",)),), {}, {})
    return binding.classes[MIXIN].methods["_get_out_loc"]


def _run_out_loc_reader(get_out_loc: Callable[..., Any], code: CompressionMetadataCode,
                        batch: CompressionBatch) -> list[str]:
    wrong = []
    for label, metadata, _ in _metadatas(code, batch):
        backend = SimpleNamespace(forward_metadata=SimpleNamespace(core_metadata=metadata))
        for ratio in truth.COMPRESS_RATIOS:
            name = f"c{ratio}_out_loc, the rows a C{ratio} layer stores, as {OUT_LOC_READER}({ratio}) reads it from the {label}"
            wrong.append(first_wrong_row(name, get_out_loc(backend, ratio), _want(batch, ratio, unified=False)))
    return wrong


# ---- forward_unified: the rows each compressor hands its store ---------------------------------


class KVLayout(str, enum.Enum):
    """The compressed cache's page format (SGLang's ``KVLayout``, 0.5.21+); only its
    default is read on the paths run here."""

    V4 = "v4"


class _Modelled(SimpleNamespace):
    """An engine object of which swafuzz models the attributes it is given: reading any other
    is a gap of swafuzz's, never an answer of the tree's code."""

    role = "engine object"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInGap(f"SGLang code read {name!r} from the stand-in {self.role}, which swafuzz does not model")


class _StoreBackend(_Modelled):
    """The backend a compressor runs on: the forward's metadata, a pool, and the store,
    which records the rows it is handed instead of writing a cache."""

    role = "attention backend"

    def __init__(self, metadata: Any, pool: Any):
        super().__init__()
        self.forward_metadata = SimpleNamespace(core_metadata=metadata)
        self.token_to_kv_pool = pool
        self.enable_deepseek_v4_fp4_indexer = False
        self.online_c128_mtp = None
        self.stored: list[torch.Tensor] = []

    def _forward_compress_all_in_one(self, **arguments: Any) -> None:
        self.stored.append(arguments["out_loc"])

    def _forward_unified_hip(self, **_: Any) -> None:
        raise AssertionError("the HIP fallback store runs only on HIP, which is off here")


class _Pool(_Modelled):
    """The compressed-KV pool a compressor stores into."""

    role = "compressed-KV pool"


def _pool() -> _Pool:
    """A compressed-KV pool with one layer of every buffer, its compressed pool without
    hisparse translation."""
    def buffer(*_: Any) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.uint8)

    def page_size(*_: Any) -> int:
        return compressed.PAGE_SIZE

    return _Pool(
        uniform_fp8=False, layer_mapping={LAYER_ID: (None, None, SimpleNamespace())},
        get_extra_key_buffer=buffer, get_extra_key_page_size=page_size, get_extra_key_layout=lambda _: KVLayout.V4,
        get_index_k_with_scale_buffer=buffer, get_index_k_page_size=page_size, get_unified_kv=buffer,
        get_unified_kv_rope=buffer,
    )


def _compressor(ratio: int, indexer: bool) -> SimpleNamespace:
    state_pool = SimpleNamespace(kv_score_buffer=SimpleNamespace(kv_score=torch.zeros(1)))
    return SimpleNamespace(ratio=ratio, is_in_indexer=indexer, head_dim=128 if indexer else 512, rotate=indexer,
                           ape=None, norm=None, freqs_cis=None, compute_kv_score=lambda x, _: x,
                           get_state_pool=lambda _: state_pool)


def _bind_store_path(tree: SourceTree) -> dict[bool, type]:
    """The tree's ``forward_unified`` on :class:`_StoreBackend`, with the unified Triton
    layout off and on."""
    def on(unified: bool) -> type:
        gates = {"is_unified_kv_triton": lambda: unified, "is_unified_kv_fp8": lambda: False}
        stand_ins = {**gates, "_is_hip": False, "cast": typing.cast, "envs": NotModelled("envs"), "KVLayout": KVLayout,
                     "forward_compress_uniform_fp8": NotModelled("forward_compress_uniform_fp8")}
        binding = bind(tree, (ClassCode(COMPRESSOR_FILE, MIXIN, ("_get_out_loc", "forward_unified")),), stand_ins, {})
        return binding.classes[MIXIN].build(_StoreBackend)
    return {unified: on(unified) for unified in (False, True)}


def _run_store_path(backends: dict[bool, type], code: CompressionMetadataCode,
                    batch: CompressionBatch) -> list[str]:
    wrong = []
    decode = SimpleNamespace(forward_mode=SglangMode(ForwardMode.DECODE))
    for label, metadata, has_unified in _metadatas(code, batch):
        for unified in (False, True) if has_unified else (False,):
            layout = " under the unified Triton layout" if unified else ""
            for ratio, indexer in COMPRESSORS:
                backend = backends[unified](metadata, _pool())
                backend.forward_unified(torch.zeros(1), decode, LAYER_ID, _compressor(ratio, indexer))
                # the indexer's cache has no unified region: it keeps the plain locations
                offset = unified and not indexer
                field = f"{'unified.' if offset else ''}c{ratio}_out_loc"
                store = f"C{ratio} {'indexer ' if indexer else ''}store"
                name = f"{field}, the rows the {store} writes, as {STORE_PATH} hands them over from the {label}{layout}"
                if len(backend.stored) != 1:
                    wrong.append(f"{name}: the store ran {len(backend.stored)} times, not once")
                    continue
                wrong.append(first_wrong_row(name, backend.stored[0], _want(batch, ratio, offset)))
    return wrong


# ---- each draft step's compressed write locations (0.5.13+) ------------------------------------


STEP_BUILDS = "_build_forward_metadata", "init_forward_metadata"  # where the eager build is, newest first
DRAFT_STEPS = 3


class _LogicalForwardMode:
    """SGLang's ``ForwardMode`` as ``_get_logical_forward_mode`` compares a batch's mode
    with it: the draft batches here are never an extend."""

    EXTEND = ForwardMode.EXTEND


class _OnlineC128State:
    """The online C128 compressor's per-forward state (0.5.14+): a draft decode asks it for
    no state slot offset."""

    def prepare_forward(self, *_: Any, **__: Any) -> None:
        return None


def _step_build(path: str, owner: str) -> Callable[[SourceTree], Any]:
    """The backend method that builds one step's metadata (``_build_forward_metadata``,
    else ``init_forward_metadata``), bound on a stand-in that carries exactly what it reads
    of the backend, and the tree's own ``per_step_draft_out_cache_loc``; bound once per
    tree for both draft-step checks."""
    @functools.lru_cache(maxsize=4)
    def bind_it(tree: SourceTree) -> Any:
        text = tree.read(path)
        if text is None:
            raise BindError(f"{tree.label}: has no file {path}")
        node = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        methods = {n.name: n for n in (node.body if node is not None else []) if isinstance(n, ast.FunctionDef)}
        method = next((name for name in STEP_BUILDS if name in methods), None)
        if method is None:
            raise BindError(f"{tree.label}: {path} has no {owner} with {' or '.join(STEP_BUILDS)}")
        read = frozenset(n.attr for n in ast.walk(methods[method]) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "self")
        role = f"{owner} building a draft step's metadata"
        stand_ins = {"ForwardMode": _LogicalForwardMode,
                     "resolve_ragged_verify_layout": NotModelled("resolve_ragged_verify_layout")}
        code = (FunctionCode(EAGLE_UTILS_FILE, DRAFT_STEP_LOCS), ClassCode(path, owner, (method,), role=role))
        bound = bind(tree, code, stand_ins, {role: read}).classes[owner]
        backend = type("DraftStepBackend", (StandIn,), {"role": role, "attributes": read})
        return SimpleNamespace(name=f"{owner}.{method}", build=bound.build(backend), method=method,
                               hip=path == HIP_BACKEND_FILE)
    return bind_it


def _draft(batch: CompressionBatch, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The write slots of a ``steps``-step draft of one branch per request of ``batch``'s
    rows, as the EAGLE allocator lays them out ([requests, 1, steps]), and each step's."""
    taken = set(batch.out_loc.tolist())
    spare = [slot for slot in range(1, 16 * batch.out_loc.numel() * steps + 1) if slot not in taken]
    allocated = torch.tensor(spare[: batch.out_loc.numel() * steps]).reshape(-1, 1, steps)
    allocated[:, 0, 0] = batch.out_loc  # step 0 writes where the batch does
    return allocated, draft_step_slots(allocated)


def _run_step_build(bound: Any, code: CompressionMetadataCode, batch: CompressionBatch, locations: bool) -> list[str]:
    """Each step of a multi-step draft decode over ``batch``'s requests (one row each, no
    padding) must hand the metadata build its own step's write slots (by value), and, where
    ``locations``, the metadata the tree's ``init_compression_metadata`` makes of what it
    hands must hold that step's C4 / C128 locations. The positions are those the forward
    hands every step (its ``seq_lens``)."""
    allocated, by_step = _draft(batch, DRAFT_STEPS)
    requests = batch.positions.numel()
    wrong = []
    for step in range(DRAFT_STEPS):
        handed: list[tuple[torch.Tensor, Any]] = []

        def init_forward_metadata_decode(*, max_seq_len: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                                         out_cache_loc: torch.Tensor) -> Any:
            rows = replace(batch, positions=seq_lens.to(torch.int64) - 1, req_slots=req_pool_indices,
                           out_loc=out_cache_loc.to(torch.int64))
            handed.append((out_cache_loc, code.metadata(rows, hip=bound.hip) if locations else None))
            return handed[-1][1]

        offered = {
            "topk": 1, "speculative_num_steps": DRAFT_STEPS, "speculative_step_id": step, "page_size": batch.page_size,
            "swa_page_size": truth.SWA_WINDOW, "req_to_token": batch.req_to_token,
            "req_to_token_pool": SimpleNamespace(req_to_token=batch.req_to_token), "online_c128_mtp": _OnlineC128State(),
            "is_dspark_draft": False, "is_draft_worker": True, "mtp_enabled": True, "encoder_replay": None,
            "encoder_row_floor": None, "init_forward_metadata_decode": init_forward_metadata_decode,
            # the HIP init (0.5.13-0.5.20) then refreshes the SWA rows in place, checked as a producer
            "init_forward_metadata_in_graph": lambda _: None,
        }
        backend = bound.build(**{name: offered.get(name, NotModelled(f"self.{name}")) for name in bound.build.attributes})
        seq_lens = batch.positions + 1
        forward_batch = SimpleNamespace(
            forward_mode=SglangMode(ForwardMode.DECODE), batch_size=requests, req_pool_indices=batch.req_slots,
            seq_lens=seq_lens, seq_lens_cpu=seq_lens, out_cache_loc=allocated.reshape(-1), spec_info=None,
            encoder_swa_replay=None, encoder_swa_row_floor=None, max_seq_len_override=None,
        )
        getattr(backend, bound.method)(forward_batch)
        label = f"step {step} of {DRAFT_STEPS}"
        if len(handed) != 1:
            wrong.append(f"{bound.name}: {label} built its decode metadata {len(handed)} times, not once")
            continue
        slots, metadata = handed[0]
        if not locations:
            wrong.append(first_wrong_row(f"out_cache_loc, the write slots {bound.name} hands {label}'s decode "
                                         "metadata", slots, by_step[step]))
            continue
        found = None
        for ratio in truth.COMPRESS_RATIOS:
            found = found or first_wrong_row(f"c{ratio}_out_loc of {label}'s metadata, built from the slots "
                                             f"{bound.name} hands it", getattr(metadata, f"c{ratio}_out_loc"),
                                             truth.compressed_out_loc(batch.positions, by_step[step], ratio))
        if found is not None and not slots.is_contiguous():
            # a Triton kernel indexes a tensor's memory from its first element, ignoring strides
            found += (f" (the slots are a view with stride {slots.stride()[0]}, and the compression metadata "
                      "kernel reads them as contiguous)")
        wrong.append(found)
    return wrong


@dataclass(frozen=True)
class Reader:
    name: str
    bind: Callable[[SourceTree], Any]
    run: Callable[[Any, CompressionMetadataCode, CompressionBatch], list[str]]
    kinds: tuple[str, ...] = ("live", "padded", "draft")  # the reader batches it runs on
    # why no layer of a tree reads what this reader takes (None: some may), for a wrong value
    unread: Callable[[SourceTree], str | None] | None = None


DRAFT_STEP_SLOTS = "draft-step write slots"
DRAFT_STEP_LOCATIONS = "draft-step compressed locations"

_STEP_BUILDS = {owner: _step_build(path, owner) for path, owner in ((CUDA_BACKEND_FILE, CUDA_BACKEND),
                                                                    (HIP_BACKEND_FILE, HIP_BACKEND))}

READERS = (
    Reader(OUT_LOC_READER, _bind_out_loc_reader, _run_out_loc_reader),
    Reader(STORE_PATH, _bind_store_path, _run_store_path),
    *(Reader(f"{owner} {judged}", bind_it, functools.partial(_run_step_build, locations=locations),
             kinds=(DRAFT_DECODE,), unread=draft_layers_store_no_compressed_kv if locations else None)
      for owner, bind_it in _STEP_BUILDS.items()
      for judged, locations in ((DRAFT_STEP_SLOTS, False), (DRAFT_STEP_LOCATIONS, True))),
)


def check_reader(reader: Reader, tree: SourceTree,
                 batches: list[tuple[str, CompressionBatch]] | None = None) -> ReaderCheck:
    """``reader`` of ``tree`` on ``batches`` (:func:`reader_batches` when not given);
    :class:`BindError` where the tree lacks it."""
    batches = [(kind, batch) for kind, batch in (batches if batches is not None else reader_batches())
               if kind in reader.kinds]
    return _run_reader(reader.name, reader.bind, reader.run, tree, batches)
