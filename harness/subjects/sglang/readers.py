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
"""

from __future__ import annotations

import enum
import random
import typing
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ...api import ForwardMode
from ...reference import compressed as truth
from . import compressed
from .binding import ClassCode, bind
from .compressed import CompressionBatch, CompressionMetadataCode, first_wrong_row
from .drivers import NotModelled, SglangMode
from .interpreted import TRITON_MISSING, triton_available
from .locate import SourceTree

COMPRESSOR_FILE = "sglang/srt/layers/attention/dsv4/compressor_v2.py"
MIXIN = "CompressorBackendMixin"
OUT_LOC_READER = f"{MIXIN}._get_out_loc"
STORE_PATH = f"{MIXIN}.forward_unified"
# the compressors of a DeepSeek-V4 stage: (ratio, whether it is the C4 indexer's)
COMPRESSORS = ((4, False), (4, True), (128, False))
LAYER_ID = 0


def reader_batches(seed: int = 0) -> list[tuple[str, CompressionBatch]]:
    """(kind, batch): a live decode batch, the same kind padded as a CUDA graph bucket pads
    it, and a draft batch of four consecutive rows per request (a verify or draft window).
    Eight rows or fewer each: the interpreter runs a kernel row in milliseconds."""
    rng = random.Random(seed)
    return [("live", compressed._batch(rng, 8, tokens_per_request=1, padding=0)),
            ("padded", compressed._batch(rng, 5, tokens_per_request=1, padding=3)),
            ("draft", compressed._batch(rng, 8, tokens_per_request=4, padding=0))]


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


def _run_reader(name: str, bind_it: Callable[[SourceTree], Any],
                run: Callable[[Any, CompressionMetadataCode, CompressionBatch], list[str]],
                tree: SourceTree, batches: list[tuple[str, CompressionBatch]] | None) -> ReaderCheck:
    """Bind the reader (:class:`BindError` where the tree lacks it) and the tree's
    compression metadata, and run it on ``batches`` until the first with a wrong row."""
    reader = bind_it(tree)
    if not triton_available():
        return ReaderCheck(name, ran=False, reason=f"the metadata it reads is {TRITON_MISSING}")
    code = compressed.bind_compression_metadata(tree)
    for kind, batch in batches if batches is not None else reader_batches():
        try:
            wrong = [w for w in run(reader, code, batch) if w is not None]
        except Exception as exc:  # noqa: BLE001 - the tree's code may raise anything: that is its answer
            wrong = [f"{name} raised {type(exc).__name__}: {exc}"]
        if wrong:
            return ReaderCheck(name, ran=True, wrong=tuple(wrong), batch=describe(kind, batch))
    return ReaderCheck(name, ran=True)


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


class _StoreBackend:
    """The backend a compressor runs on: the forward's metadata, a pool, and the store,
    which records the rows it is handed instead of writing a cache."""

    def __init__(self, metadata: Any, pool: Any):
        self.forward_metadata = SimpleNamespace(core_metadata=metadata)
        self.token_to_kv_pool = pool
        self.enable_deepseek_v4_fp4_indexer = False
        self.online_c128_mtp = None
        self.stored: list[torch.Tensor] = []

    def _forward_compress_all_in_one(self, **arguments: Any) -> None:
        self.stored.append(arguments["out_loc"])

    def _forward_unified_hip(self, **_: Any) -> None:
        raise AssertionError("the HIP fallback store runs only on HIP, which is off here")


def _pool() -> SimpleNamespace:
    """A compressed-KV pool with one layer of every buffer, its compressed pool without
    hisparse translation."""
    def buffer(*_: Any) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.uint8)

    def page_size(*_: Any) -> int:
        return compressed.PAGE_SIZE

    return SimpleNamespace(
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


@dataclass(frozen=True)
class Reader:
    name: str
    bind: Callable[[SourceTree], Any]
    run: Callable[[Any, CompressionMetadataCode, CompressionBatch], list[str]]


READERS = (
    Reader(OUT_LOC_READER, _bind_out_loc_reader, _run_out_loc_reader),
    Reader(STORE_PATH, _bind_store_path, _run_store_path),
)


def check_reader(reader: Reader, tree: SourceTree,
                 batches: list[tuple[str, CompressionBatch]] | None = None) -> ReaderCheck:
    """``reader`` of ``tree`` on ``batches`` (:func:`reader_batches` when not given);
    :class:`BindError` where the tree lacks it."""
    return _run_reader(reader.name, reader.bind, reader.run, tree, batches)
