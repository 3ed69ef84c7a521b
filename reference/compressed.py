"""The per-step values a DeepSeek-V4 layer reads beside its SWA write location, from live
inputs only.

Every value here is computed once per forward into SGLang's ``DSV4AttnMetadata`` and then
read by every layer of one kind (a C4, C128, or V4.1 ratio-1/2 layer). Each function takes
the forward's live inputs, one row per query token: its position ``p`` (its causal length is
``s = p + 1``), its full-pool write location ``L`` (``raw_out_loc``), its request slot ``r``,
and the request-to-token table ``R``; and returns what that row must read, as SGLang 0.5.23
lays it out (dtype, padding, the dummy value of a row that writes nothing).

Padding rows need no rule of their own: a CUDA graph bucket pads the batch with rows of
sequence length 1, request slot 0 and write location 0 (``cuda_graph_buffer_registry``,
0.5.23), and each function gives such a row what SGLang gives it. Where a forward has fewer
write rows than metadata rows (SGLang 0.5.18+ under context parallelism pads the metadata,
not the writes), the write locations have one row per write row only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .truth import TruthError

COMPRESS_RATIOS = (4, 128)  # the ratios of the compressed caches the metadata kernel serves
LOW_RATIOS = (1, 2)  # DeepSeek-V4.1's low-ratio caches
SWA_WINDOW = 128  # the tokens every layer attends to uncompressed (``SWA_WINDOW``)
PAGE_INDEX_ALIGN = 64  # index tables are padded with -1 to a multiple of this (``PAGE_INDEX_ALIGNED_SIZE``)
NO_SLOT = -1  # an index-table entry, or a ratio-2 write, that reads or writes nothing
DUMMY_COMPRESSED_SLOT = 0  # where a C4 / C128 row that completes no group writes


def _int64(values: torch.Tensor, what: str) -> torch.Tensor:
    values = values.to(device="cpu", dtype=torch.int64).reshape(-1)
    if values.numel() and int(values.min()) < 0:
        raise TruthError(f"negative {what}")
    return values


def _positions(positions: torch.Tensor) -> torch.Tensor:
    return _int64(positions, "position")


def _write_rows(positions: torch.Tensor, out_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of the write rows (the first ``len(out_loc)`` rows) and their locations."""
    pos = _positions(positions)
    loc = _int64(out_loc, "write location")
    if loc.numel() > pos.numel():
        raise TruthError(f"{loc.numel()} write locations for {pos.numel()} rows")
    return pos[: loc.numel()], loc


def _ratio(ratio: int, allowed: tuple[int, ...]) -> int:
    if ratio not in allowed:
        raise TruthError(f"compress ratio {ratio} is not one of {allowed}")
    return ratio


def _aligned(width: int, align: int = PAGE_INDEX_ALIGN) -> int:
    return -(-width // align) * align


def compressed_out_loc(positions: torch.Tensor, out_loc: torch.Tensor, ratio: int) -> torch.Tensor:
    """Where each write row stores its compressed entry: ``L // ratio`` where the row
    completes a group of ``ratio`` tokens (``s % ratio == 0``), else the dummy slot 0
    (int64, one per write row).

    SGLang's ``c4_out_loc`` / ``c128_out_loc``: ``_init_compressed_attn_metadata_kernel``
    (``metadata_kernel.py``) through ``DSV4AttnMetadata.init_compression_metadata``,
    0.5.12 to 0.5.23 (int32 in 0.5.12, int64 from 0.5.13; from 0.5.18 only the write rows
    have one). Read by every C4 / C128 layer's compressor store.
    """
    ratio = _ratio(ratio, COMPRESS_RATIOS)
    pos, loc = _write_rows(positions, out_loc)
    completes = (pos + 1) % ratio == 0
    return torch.where(completes, loc // ratio, torch.full_like(loc, DUMMY_COMPRESSED_SLOT))


def low_ratio_out_loc(positions: torch.Tensor, out_loc: torch.Tensor, ratio: int) -> torch.Tensor:
    """The V4.1 low-ratio write location of each write row (int64): ratio 1 stores every
    token at ``L``; ratio 2 stores ``L >> 1`` where ``s`` is even and nothing (-1) where
    it is odd (the dummy is -1 here, not 0).

    SGLang 0.5.21+'s ``c1_out_loc`` / ``c2_out_loc``: ``_low_ratio_compression_metadata``
    (``deepseek_v4_backend.py``) or, for small decode batches, the ``_low_ratio_metadata``
    Triton kernel (``build_low_ratio_metadata``); on HIP (0.5.22+) the
    ``low_ratio_compression_metadata`` kernel (``attn_glue_hip.py``).
    """
    ratio = _ratio(ratio, LOW_RATIOS)
    pos, loc = _write_rows(positions, out_loc)
    completes = (pos + 1) % ratio == 0
    return torch.where(completes, loc // ratio, torch.full_like(loc, NO_SLOT))


def unified_compressed_out_loc(
    positions: torch.Tensor, out_loc: torch.Tensor, ratio: int, unified_swa_pages: int
) -> torch.Tensor:
    """:func:`compressed_out_loc` in the HIP unified-KV layout, whose compressed region
    follows the SWA region's ``unified_swa_pages`` pages: every row, the dummy ones
    included, is offset by that many (int64).

    SGLang's HIP ``DSV4AttnMetadata.init_compression_metadata``
    (``deepseek_v4_backend_hip_radix.py``, 0.5.14 to 0.5.23), ``unified.c4_out_loc`` and
    ``unified.c128_out_loc``, computed once per step when the pool has a unified SWA region
    (``unified_swa_pages`` non-zero).
    """
    if unified_swa_pages < 0:
        raise TruthError(f"negative unified_swa_pages {unified_swa_pages}")
    return compressed_out_loc(positions, out_loc, ratio) + unified_swa_pages


def compressed_positions(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """The first position of each row's compression group, ``p & ~(ratio - 1)`` (int32).

    The ``c4_positions`` / ``c128_positions`` outputs of ``_init_compressed_attn_metadata_kernel``
    (0.5.12 to 0.5.23); ``init_compression_metadata`` does not keep them.
    """
    ratio = _ratio(ratio, COMPRESS_RATIOS)
    return (_positions(positions) & ~(ratio - 1)).int()


@dataclass(frozen=True)
class CompressedLengths:
    """How many compressed entries a row's history holds (int32 per row)."""

    raw: torch.Tensor  # s // ratio
    clamp1: torch.Tensor  # the same, at least 1 (attention never reads an empty history)


def compressed_lengths(positions: torch.Tensor, ratio: int) -> CompressedLengths:
    """``s // ratio`` and its clamp to at least 1, per row.

    SGLang's ``c4_topk_lengths_raw`` / ``c4_topk_lengths_clamp1`` /
    ``c128_topk_lengths_clamp1`` (and the kernel's ``c128_seq_lens_raw``, 0.5.13+) from
    ``_init_compressed_attn_metadata_kernel``, 0.5.12 to 0.5.23; for the V4.1 ratios 1 and 2,
    ``c1_topk_lengths_clamp1`` / ``c2_topk_lengths_clamp1`` (0.5.21+).
    """
    ratio = _ratio(ratio, COMPRESS_RATIOS + LOW_RATIOS)
    raw = (_positions(positions) + 1) // ratio
    return CompressedLengths(raw=raw.int(), clamp1=raw.clamp_min(1).int())


def sparse_topk_lengths(positions: torch.Tensor, index_topk: int, ratio: int = 4) -> torch.Tensor:
    """How many compressed entries a ratio-4 (or V4.1 ratio-1/2) row's indexer selects:
    ``min(clamp1, index_topk)`` (int32).

    SGLang's ``c4_sparse_topk_lengths`` (``DSV4AttnMetadata.init_flashmla_related``,
    0.5.12 to 0.5.23) and ``c1/c2_sparse_topk_lengths`` (0.5.21+).
    """
    if index_topk <= 0:
        raise TruthError(f"index_topk must be positive, got {index_topk}")
    if ratio == 128:
        raise TruthError("ratio-128 layers read every compressed entry, through no indexer")
    return compressed_lengths(positions, ratio).clamp1.clamp_max(index_topk)


def empty_sparse_page_indices(rows: int, index_topk: int) -> torch.Tensor:
    """An indexer's top-k table before any layer fills it: -1 everywhere, ``index_topk``
    columns padded to a multiple of 64 (int32). Each C4 (and V4.1 ratio-1/2) layer then
    rewrites it in place with its own selection, so only this starting state is per step.

    SGLang's ``c4_sparse_page_indices`` as ``DSV4AttnMetadata.init_flashmla_related`` makes
    it (0.5.12 to 0.5.23) and ``c1/c2_page_indices`` of ``build_low_ratio_metadata`` (0.5.21+).
    """
    if rows < 0 or index_topk <= 0:
        raise TruthError(f"{rows} rows of an index_topk of {index_topk}")
    return torch.full((rows, _aligned(index_topk)), NO_SLOT, dtype=torch.int32)


def page_table(
    req_to_token: torch.Tensor, req_slots: torch.Tensor, max_seq_len: int, page_size: int
) -> torch.Tensor:
    """Each row's full-pool pages, ``R[r, 0:max_seq_len:page_size] // page_size`` (int32,
    ``ceil(max_seq_len / page_size)`` columns).

    SGLang's ``page_table``: ``BuildPageTablePositions`` (``build_page_table_positions``
    and its Triton twin, ``attn_metadata_kernels.py``, 0.5.16 to 0.5.23; inline in the
    backend's ``make_core_attn_metadata`` from 0.5.12). Columns past a row's own length hold whatever ``R`` holds there; no
    reader looks at them.
    """
    if page_size <= 0 or max_seq_len <= 0:
        raise TruthError(f"page_size and max_seq_len must be positive, got {page_size}, {max_seq_len}")
    table = req_to_token.to(device="cpu", dtype=torch.int64)
    if table.dim() != 2 or table.shape[1] < max_seq_len:
        raise TruthError(f"req_to_token of shape {tuple(table.shape)} has no {max_seq_len} columns")
    slots = _int64(req_slots, "request slot")
    if slots.numel() and int(slots.max()) >= table.shape[0]:
        raise TruthError(f"request slot outside [0, {table.shape[0]})")
    return (table[slots, 0:max_seq_len:page_size] // page_size).int()


def c128_page_indices(pages: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """The ratio-128 cache slots each row reads: compressed entry ``j < s // 128`` lives at
    ``pages[t, j // per_page] * per_page + j % per_page`` with ``per_page = page_size //
    128``; every other column is -1. ``pages`` is :func:`page_table`'s table; the width is
    ``per_page`` columns per page, padded with -1 to a multiple of 64 (int32).

    SGLang's ``c128_page_indices``: ``_init_compressed_attn_metadata_kernel`` padded by
    ``_pad_last_dim`` in ``DSV4AttnMetadata.init_compression_metadata``, 0.5.12 to 0.5.23
    (0.5.16+ asserts the page size a multiple of 128).
    """
    if page_size < 128 or page_size % 128:
        raise TruthError(f"page_size must be a multiple of 128, got {page_size}")
    per_page = page_size // 128
    table = pages.to(device="cpu", dtype=torch.int64)
    pos = _positions(positions)
    if table.dim() != 2 or table.shape[0] != pos.numel():
        raise TruthError(f"a page table of shape {tuple(table.shape)} for {pos.numel()} rows")
    width = per_page * table.shape[1]
    entry = torch.arange(width, dtype=torch.int64)
    slots = table[:, entry // per_page] * per_page + entry % per_page
    readable = entry.unsqueeze(0) < ((pos + 1) // 128).unsqueeze(1)
    indices = torch.where(readable, slots, torch.full_like(slots, NO_SLOT))
    padded = torch.full((pos.numel(), _aligned(width)), NO_SLOT, dtype=torch.int64)
    padded[:, :width] = indices
    return padded.int()


def swa_page_indices(
    req_to_token: torch.Tensor, mapping: torch.Tensor, req_slots: torch.Tensor, positions: torch.Tensor,
    window: int = SWA_WINDOW,
) -> torch.Tensor:
    """The SWA slots each row attends to, newest first: column ``j`` is
    ``mapping[R[r, p - j]]`` for ``j <= p`` and ``j < window``, else -1; padded with -1 to a
    multiple of 64 columns (int32).

    SGLang's ``swa_page_indices`` for the plain causal window: ``BuildCausalSwaPageIndices``
    (``build_causal_swa_page_indices`` and its Triton twin, ``attn_metadata_kernels.py``,
    0.5.16 to 0.5.23; the backend's ``get_swa_page_indices`` from 0.5.12), read by every
    layer's attention. SGLang's free entries read a trailing -1 of the mapping (its
    ``full_to_swa_index_mapping`` ends in -1) or are masked to -1, the same value. An entry is read through the
    full-to-SWA mapping as it is when the metadata is built.
    """
    if window <= 0:
        raise TruthError(f"window must be positive, got {window}")
    table = req_to_token.to(device="cpu", dtype=torch.int64)
    translate = mapping.to(device="cpu", dtype=torch.int64).reshape(-1)
    slots = _int64(req_slots, "request slot")
    pos = _positions(positions)
    if slots.numel() != pos.numel():
        raise TruthError(f"{slots.numel()} request slots for {pos.numel()} positions")
    if pos.numel() and (int(pos.max()) >= table.shape[1] or int(slots.max()) >= table.shape[0]):
        raise TruthError("a row reads past req_to_token")
    back = torch.arange(window, dtype=torch.int64)
    earlier = pos.unsqueeze(1) - back.unsqueeze(0)
    present = earlier >= 0
    full = table[slots.unsqueeze(1), earlier.clamp_min(0)].masked_fill(~present, 0)
    if full.numel() and int(full.max()) >= translate.numel():
        raise TruthError(f"a full slot is outside the mapping [0, {translate.numel()})")
    swa = torch.where(present, translate[full], torch.full_like(full, NO_SLOT))
    padded = torch.full((pos.numel(), _aligned(window)), NO_SLOT, dtype=torch.int64)
    padded[:, :window] = swa
    return padded.int()


def swa_topk_lengths(positions: torch.Tensor, window: int = SWA_WINDOW) -> torch.Tensor:
    """How many SWA entries a row reads, ``min(s, window)`` (int32).

    SGLang's ``swa_topk_lengths`` (``BuildPageTablePositions``, 0.5.16 to 0.5.23; inline in
    ``make_core_attn_metadata`` from 0.5.12).
    """
    return (_positions(positions) + 1).clamp_max(window).int()


def compress_state_ring_size(ratio: int, num_draft_tokens: int = 0, online_c128: bool = False) -> int:
    """Rows of one request's compress-state ring: C4 8 (16 under speculation), C128 128
    (256 under speculation; 1 for the online C128 compressor, which keeps one running
    state), ratio 2 a pair (under speculation the power of two above ``2 + drafts``).

    SGLang's ``get_compress_state_ring_size`` (``deepseek_v4_memory_pool.py``, 0.5.23).
    """
    if num_draft_tokens < 0:
        raise TruthError(f"negative num_draft_tokens {num_draft_tokens}")
    speculative = num_draft_tokens > 0
    if ratio == 2:
        return 1 << (num_draft_tokens + 1).bit_length() if speculative else 2
    if ratio == 128 and online_c128:
        return 1
    if ratio == 4:
        return 16 if speculative else 8
    if ratio == 128:
        return 256 if speculative else 128
    raise TruthError(f"no compress-state ring for ratio {ratio}")


def compress_state_slots(req_slots: torch.Tensor, positions: torch.Tensor, ring: int) -> torch.Tensor:
    """The compress-state row each token reads or writes, ``r * ring + p % ring``; a
    negative position (no state) gives -1 (int64).

    SGLang's ``translate_from_req_position_to_state_loc``
    (``deepseek_v4_compress_state.py``, 0.5.23).
    """
    if ring <= 0:
        raise TruthError(f"ring must be positive, got {ring}")
    slots = _int64(req_slots, "request slot")
    pos = positions.to(device="cpu", dtype=torch.int64).reshape(-1)
    if slots.numel() != pos.numel():
        raise TruthError(f"{slots.numel()} request slots for {pos.numel()} positions")
    rows = slots * ring + pos % ring
    return torch.where(pos < 0, torch.full_like(rows, NO_SLOT), rows)


@dataclass(frozen=True)
class CompressionMetadata:
    """Every value ``_init_compressed_attn_metadata_kernel`` makes, as the truth has it."""

    c4_out_loc: torch.Tensor
    c4_positions: torch.Tensor
    c4_lengths_raw: torch.Tensor
    c4_lengths_clamp1: torch.Tensor
    c128_out_loc: torch.Tensor
    c128_positions: torch.Tensor
    c128_lengths_raw: torch.Tensor
    c128_lengths_clamp1: torch.Tensor
    c128_page_indices: torch.Tensor | None  # unpadded width, as the kernel returns it


def compression_metadata(
    positions: torch.Tensor, out_loc: torch.Tensor, pages: torch.Tensor | None, page_size: int,
) -> CompressionMetadata:
    """The values of one call of SGLang's compression metadata kernel
    (``init_compression_metadata`` in ``metadata_kernel.py``, 0.5.12 to 0.5.23) whose rows
    have ``positions`` (its ``seq_lens`` being ``positions + 1``), whose first
    ``len(out_loc)`` rows write at ``out_loc``, and whose page table is ``pages``
    (None: the kernel is asked for no ratio-128 index table)."""
    c4, c128 = compressed_lengths(positions, 4), compressed_lengths(positions, 128)
    indices = None
    if pages is not None:
        table = c128_page_indices(pages, positions, page_size)
        indices = table[:, : (page_size // 128) * pages.shape[1]]
    return CompressionMetadata(
        c4_out_loc=compressed_out_loc(positions, out_loc, 4),
        c4_positions=compressed_positions(positions, 4),
        c4_lengths_raw=c4.raw,
        c4_lengths_clamp1=c4.clamp1,
        c128_out_loc=compressed_out_loc(positions, out_loc, 128),
        c128_positions=compressed_positions(positions, 128),
        c128_lengths_raw=c128.raw,
        c128_lengths_clamp1=c128.clamp1,
        c128_page_indices=indices,
    )
