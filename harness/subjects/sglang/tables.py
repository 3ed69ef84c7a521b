"""SGLang's per-step index tables, run on CPU and checked row by row against the truth.

Beside the compressed-KV values (:mod:`.compressed`), every forward builds the tables a
DeepSeek-V4 layer reads through: the full-pool ``page_table``, the SWA read indices
``swa_page_indices`` and lengths ``swa_topk_lengths``, the C4 indexer's top-k table before
any layer fills it (``c4_sparse_page_indices``), and, per compressor, the compress-state
ring rows. Each builder below is bound from the tree as it is and run on
:func:`compressed.generated_batches` (requests crossing the ratio-4, ratio-128 and 256-token
page boundaries, some padded as a CUDA graph bucket pads them):

- ``build_page_table_positions`` and ``build_causal_swa_page_indices``, the torch twins of
  ``BuildPageTablePositions`` and ``BuildCausalSwaPageIndices`` (SGLang runs them for CPU
  inputs), and their Triton twins ``build_page_table_positions_triton`` and
  ``build_causal_swa_page_indices_triton`` (what a CUDA forward runs), in
  ``dsv4_attn_metadata_kernels.py`` 0.5.16 to 0.5.22 and ``dsv4/attn_metadata_kernels.py``
  0.5.23; ``build_page_table_positions_small``, the Triton kernel small V4.1 decode batches
  use (0.5.21+). The Triton ones run under Triton's interpreter.
- ``DeepseekV4AttnBackend.make_core_attn_metadata``, which builds the page table and
  lengths inline and the SWA indices through ``get_swa_page_indices`` and the pool's
  ``translate_loc_from_full_to_swa`` up to 0.5.15.
- ``DSV4AttnMetadata.init_flashmla_related`` (the C4 top-k lengths and empty top-k table),
  after the tree's own ``init_compression_metadata``. FlashMLA's schedule objects it also
  makes come from a CUDA extension (``get_mla_metadata``); they are left None and not
  checked.
- ``CompressStatePool.translate_from_req_position_to_state_loc`` (0.5.15+), on the ring
  sizes of every compressor, positions before a request's first token included.
- ``page_table_from_req_to_token``, the HIP backend's Triton page-table kernel
  (``attn_glue_hip.py``, 0.5.21+), and ``DeepseekV4HipRadixBackend.get_swa_page_indices``,
  its plain causal SWA indices (0.5.13+).

A builder a tree lacks is *absent*, with where it was looked for; one the tree has but that
needs triton where triton is not installed is *not checked*, never passed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ...errors import BindError
from ...reference import compressed as truth
from . import compressed
from .binding import ClassCode, FunctionCode, bind
from .compressed import INDEX_TOPK, CompressionBatch, first_wrong_row
from .interpreted import TRITON_MISSING, defines, record, triton_available, triton_stand_ins
from .locate import SourceTree
from .targets import CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE, POOL_FILE

# where the table builders live: 0.5.23, then 0.5.16 to 0.5.22
TABLE_FILES = ("sglang/kernels/ops/attention/dsv4/attn_metadata_kernels.py",
               "sglang/kernels/ops/attention/dsv4_attn_metadata_kernels.py")
COMPRESS_STATE_FILE = "sglang/srt/mem_cache/deepseek_v4_compress_state.py"
PAGE_TABLE_RECORD = "PageTablePositionsResult"
CUDA_BACKEND = "DeepseekV4AttnBackend"
POOL = "DeepSeekV4TokenToKVPool"
STATE_POOL = "CompressStatePool"
# every compress-state ring a compressor keeps: C4 and C128 with and without speculation
# (three draft tokens), the online C128 state, and the V4.1 ratio-2 pair
STATE_RINGS = tuple(sorted({
    truth.compress_state_ring_size(ratio, drafts, online)
    for ratio, drafts, online in ((4, 0, False), (4, 3, False), (128, 0, False), (128, 3, False),
                                  (128, 0, True), (2, 0, False), (2, 3, False))
}))


@dataclass(frozen=True)
class TableBuilder:
    """One SGLang function that builds a per-step table: how to bind it from a tree, and
    what its output must hold for a batch (the first wrong row of each value it makes)."""

    name: str  # the SGLang function, as the checks name it
    bind: Callable[[SourceTree], Callable[..., Any]]  # raises BindError where the tree lacks it
    check: Callable[[Callable[..., Any], CompressionBatch], list[str]]
    needs_triton: bool


def _table_file(tree: SourceTree, name: str) -> str:
    path = next((p for p in TABLE_FILES if defines(tree, p, name)), None)
    if path is None:
        raise BindError(f"{tree.label}: has no {name} (looked in {', '.join(TABLE_FILES)})")
    return path


def _kernel_file_function(name: str, triton: bool) -> Callable[[SourceTree], Callable[..., Any]]:
    """Bind ``name`` from the tree's table file, against its own interpreted kernels where
    ``triton`` and its own result record."""
    def bind_it(tree: SourceTree) -> Callable[..., Any]:
        path = _table_file(tree, name)
        stand_ins = triton_stand_ins(tree, path) if triton else {}
        result = record(tree, path, PAGE_TABLE_RECORD)
        if result is not None:
            stand_ins[PAGE_TABLE_RECORD] = result
        return bind(tree, (FunctionCode(path, name),), stand_ins, {}).functions[name]
    return bind_it


def _causal(batch: CompressionBatch) -> dict[str, Any]:
    """The inputs every table builder takes, as SGLang hands them in: one row per token."""
    return {"req_to_token": batch.req_to_token, "req_pool_indices_repeated": batch.req_slots,
            "seq_lens_casual": (batch.positions + 1).to(torch.int32)}


def _page_table_rows(name: str, result: Any, batch: CompressionBatch) -> list[str]:
    """The first wrong row of each table a page-table builder makes."""
    wanted = {"page_table": batch.pages, "swa_topk_lengths": truth.swa_topk_lengths(batch.positions),
              "positions_casual": batch.positions, "seq_lens_casual": batch.positions + 1}
    return [first_wrong_row(f"{name}: {field}", getattr(result, field, None), want) for field, want in wanted.items()]


def _check_page_table(name: str) -> Callable[[Callable[..., Any], CompressionBatch], list[str]]:
    def check(build: Callable[..., Any], batch: CompressionBatch) -> list[str]:
        result = build(**_causal(batch), max_seq_len=batch.max_seq_len, page_size=batch.page_size,
                       swa_window=truth.SWA_WINDOW)
        return _page_table_rows(name, result, batch)
    return check


def _check_swa_indices(name: str) -> Callable[[Callable[..., Any], CompressionBatch], list[str]]:
    def check(build: Callable[..., Any], batch: CompressionBatch) -> list[str]:
        indices = build(**_causal(batch), full_to_swa_mapping=batch.mapping, swa_window=truth.SWA_WINDOW,
                        page_index_aligned_size=truth.PAGE_INDEX_ALIGN)
        return [first_wrong_row(f"{name}: swa_page_indices", indices, batch.swa_page_indices)]
    return check


def _no_flashmla_schedule() -> None:
    """FlashMLA's scheduling metadata is made by a CUDA extension; on CPU there is none."""
    return None


def _backend(tree: SourceTree, path: str, name: str, methods: tuple[str, ...],
             stand_ins: dict[str, Any]) -> Callable[[CompressionBatch], Any]:
    """A maker of ``path``'s backend class ``name`` with ``methods`` bound, on an object that
    carries a batch's tables and a pool with the tree's own ``translate_loc_from_full_to_swa``."""
    code = (FunctionCode(compressed.UTILS_FILE, "ceil_align"), ClassCode(path, name, methods=methods))
    backend = bind(tree, code, stand_ins, {}).classes[name].build(object)
    pool = bind(tree, (ClassCode(POOL_FILE, POOL, methods=("translate_loc_from_full_to_swa",)),), {}, {}).classes[POOL].build(object)

    def on(batch: CompressionBatch) -> Any:
        made = backend()
        made.__dict__.update(req_to_token=batch.req_to_token, page_size=batch.page_size, swa_page_size=truth.SWA_WINDOW,
                             cuda_int32_kwargs={"device": "cpu", "dtype": torch.int32}, c4_topk=INDEX_TOPK)
        made.token_to_kv_pool = pool()
        made.token_to_kv_pool.full_to_swa_index_mapping = batch.mapping
        return made
    return on


def _bind_inline_tables(tree: SourceTree) -> Callable[..., Any]:
    """``make_core_attn_metadata`` of a tree that builds its tables inline (up to 0.5.15)."""
    if any(tree.read(path) is not None for path in TABLE_FILES):
        raise BindError(f"{tree.label}: builds its page table and SWA indices in {_table_file(tree, 'build_page_table_positions')}, "
                        "checked there")
    stand_ins = {"DSV4AttnMetadata": compressed.metadata_class(tree, CUDA_BACKEND_FILE, {}, methods=()),
                 "F": torch.nn.functional, "_create_flashmla_metadata": _no_flashmla_schedule}
    backend = _backend(tree, CUDA_BACKEND_FILE, CUDA_BACKEND, ("make_core_attn_metadata", "get_swa_page_indices"), stand_ins)

    def make(batch: CompressionBatch) -> Any:
        return backend(batch).make_core_attn_metadata(**_causal(batch), max_seq_len=batch.max_seq_len,
                                                      out_loc=batch.out_loc, need_compress=False)
    return make


def _check_inline_tables(make: Callable[..., Any], batch: CompressionBatch) -> list[str]:
    metadata = make(batch)
    name = f"{CUDA_BACKEND}.make_core_attn_metadata"
    return [*_page_table_rows(name, metadata, batch),
            first_wrong_row(f"{name}: swa_page_indices", metadata.swa_page_indices, batch.swa_page_indices)]


def _bind_flashmla_related(tree: SourceTree) -> Callable[..., Any]:
    """The tree's ``DSV4AttnMetadata`` after its ``init_compression_metadata`` and then its
    ``init_flashmla_related``, for a batch."""
    code = compressed.bind_compression_metadata(tree)
    stand_ins = {**compressed.backend_stand_ins(code.kernel), "_create_flashmla_metadata": _no_flashmla_schedule}
    with_flashmla = replace(code, metadata_class=compressed.metadata_class(
        tree, CUDA_BACKEND_FILE, stand_ins, methods=("init_compression_metadata", "init_flashmla_related")))

    def make(batch: CompressionBatch) -> Any:
        metadata = with_flashmla.metadata(batch)
        metadata.init_flashmla_related()
        return metadata
    return make


def _check_flashmla_related(make: Callable[..., Any], batch: CompressionBatch) -> list[str]:
    metadata = make(batch)
    name = "DSV4AttnMetadata.init_flashmla_related"
    return [first_wrong_row(f"{name}: c4_sparse_topk_lengths", metadata.c4_sparse_topk_lengths,
                            truth.sparse_topk_lengths(batch.positions, INDEX_TOPK)),
            first_wrong_row(f"{name}: c4_sparse_page_indices", metadata.c4_sparse_page_indices,
                            truth.empty_sparse_page_indices(batch.positions.numel(), INDEX_TOPK))]


def _bind_state_slots(tree: SourceTree) -> Callable[..., Any]:
    if not defines(tree, COMPRESS_STATE_FILE, STATE_POOL):
        raise BindError(f"{tree.label}: has no {STATE_POOL} (looked in {COMPRESS_STATE_FILE})")
    method = "translate_from_req_position_to_state_loc"
    state_pool = bind(tree, (ClassCode(COMPRESS_STATE_FILE, STATE_POOL, methods=(method,)),), {}, {}).classes[STATE_POOL]
    return state_pool.methods[method]


def _bind_hip_swa_indices(tree: SourceTree) -> Callable[..., Any]:
    if not defines(tree, HIP_BACKEND_FILE, HIP_BACKEND):
        raise BindError(f"{tree.label}: has no {HIP_BACKEND} (looked in {HIP_BACKEND_FILE})")
    backend = _backend(tree, HIP_BACKEND_FILE, HIP_BACKEND, ("get_swa_page_indices",), {})

    def make(batch: CompressionBatch) -> Any:
        causal = _causal(batch)
        return backend(batch).get_swa_page_indices(seq_lens_casual=causal["seq_lens_casual"],
                                                   req_pool_indices_repeated=causal["req_pool_indices_repeated"])
    return make


def _check_hip_swa_indices(make: Callable[..., Any], batch: CompressionBatch) -> list[str]:
    # the backend pads the table to the index alignment after this call; the window's 128
    # columns are already a multiple of it
    return [first_wrong_row(f"{HIP_BACKEND}.get_swa_page_indices: swa_page_indices", make(batch), batch.swa_page_indices)]


def _bind_hip_page_table(tree: SourceTree) -> Callable[..., Any]:
    name = "page_table_from_req_to_token"
    if not defines(tree, compressed.HIP_GLUE_FILE, name):
        raise BindError(f"{tree.label}: has no {name} (looked in {compressed.HIP_GLUE_FILE})")
    stand_ins = triton_stand_ins(tree, compressed.HIP_GLUE_FILE)
    return bind(tree, (FunctionCode(compressed.HIP_GLUE_FILE, name),), stand_ins, {}).functions[name]


def _check_hip_page_table(build: Callable[..., Any], batch: CompressionBatch) -> list[str]:
    table = build(batch.req_to_token, batch.req_slots, batch.max_seq_len, batch.page_size)
    return [first_wrong_row("page_table_from_req_to_token: page_table", table, batch.pages)]


def _check_state_slots(translate: Callable[..., Any], batch: CompressionBatch) -> list[str]:
    wrong = []
    for ring in STATE_RINGS:
        # a compressor also reads the states of positions before the row's own, down to
        # ones before the request's first token
        positions = torch.cat([batch.positions, batch.positions - ring // 2 - 1])
        slots = batch.req_slots.repeat(2)
        got = translate(SimpleNamespace(ring_size=ring), slots.clone(), positions.clone())
        wrong.append(first_wrong_row(f"{STATE_POOL}.translate_from_req_position_to_state_loc (ring of {ring})",
                                     got, truth.compress_state_slots(slots, positions, ring)))
    return wrong


BUILDERS = (
    TableBuilder("build_page_table_positions", _kernel_file_function("build_page_table_positions", False),
                 _check_page_table("build_page_table_positions"), needs_triton=False),
    TableBuilder("build_page_table_positions_triton", _kernel_file_function("build_page_table_positions_triton", True),
                 _check_page_table("build_page_table_positions_triton"), needs_triton=True),
    TableBuilder("build_page_table_positions_small", _kernel_file_function("build_page_table_positions_small", True),
                 _check_page_table("build_page_table_positions_small"), needs_triton=True),
    TableBuilder("build_causal_swa_page_indices", _kernel_file_function("build_causal_swa_page_indices", False),
                 _check_swa_indices("build_causal_swa_page_indices"), needs_triton=False),
    TableBuilder("build_causal_swa_page_indices_triton", _kernel_file_function("build_causal_swa_page_indices_triton", True),
                 _check_swa_indices("build_causal_swa_page_indices_triton"), needs_triton=True),
    TableBuilder(f"{CUDA_BACKEND}.make_core_attn_metadata", _bind_inline_tables, _check_inline_tables, needs_triton=False),
    TableBuilder("DSV4AttnMetadata.init_flashmla_related", _bind_flashmla_related, _check_flashmla_related,
                 needs_triton=True),
    TableBuilder(f"{STATE_POOL}.translate_from_req_position_to_state_loc", _bind_state_slots, _check_state_slots,
                 needs_triton=False),
    TableBuilder("page_table_from_req_to_token", _bind_hip_page_table, _check_hip_page_table, needs_triton=True),
    TableBuilder(f"{HIP_BACKEND}.get_swa_page_indices", _bind_hip_swa_indices, _check_hip_swa_indices, needs_triton=False),
)


@dataclass(frozen=True)
class BuilderCheck:
    """What checking one builder of one tree found."""

    name: str
    bound: bool  # False: the tree lacks it, or it needs triton and triton is missing
    reason: str = ""  # why it is not bound
    wrong: tuple[str, ...] = ()  # the first wrong row of each value, in the first batch with any
    batch: CompressionBatch | None = None

    @property
    def passed(self) -> bool:
        return self.bound and not self.wrong


def check_builder(builder: TableBuilder, tree: SourceTree, batches: list[CompressionBatch] | None = None) -> BuilderCheck:
    """Bind ``builder`` from ``tree`` and run it on ``batches`` (a few generated ones when
    not given) until the first batch with a wrong row. A builder the tree lacks raises
    :class:`BindError`; one needing triton where triton is missing is not bound."""
    if builder.needs_triton and not triton_available():
        try:
            builder.bind(tree)  # a builder the tree lacks is absent, whether or not triton is there
        except BindError:
            raise
        except Exception:  # noqa: BLE001 - what binding a Triton kernel needs of triton is not the question here
            pass
        return BuilderCheck(builder.name, bound=False, reason=TRITON_MISSING)
    build = builder.bind(tree)
    for batch in batches if batches is not None else compressed.generated_batches(4):
        try:
            wrong = [w for w in builder.check(build, batch) if w is not None]
        except Exception as exc:  # noqa: BLE001 - the tree's code may raise anything: that is its answer
            wrong = [f"{builder.name} raised {type(exc).__name__}: {exc}"]
        if wrong:
            return BuilderCheck(builder.name, bound=True, wrong=tuple(wrong), batch=batch)
    return BuilderCheck(builder.name, bound=True)


def describe(batch: CompressionBatch) -> str:
    """A batch as the checks name it: each row's request slot and position."""
    return (f"request slots {batch.req_slots.tolist()}, positions {batch.positions.tolist()}, "
            f"page size {batch.page_size}")

