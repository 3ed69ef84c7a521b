"""The two write-location quantities, computed from live inputs and nothing else.

Both functions take the values exactly as they are at the moment of the write and return
int32 rows; every check that could hide a wrong answer raises :class:`TruthError` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

INT32_MAX = 2**31 - 1
DUMMY_SLOT = 0


class TruthError(ValueError):
    """The inputs do not describe a valid write (the reference refuses to guess)."""


def ring_size(sliding_window: int, speculative: bool, num_draft_tokens: int) -> int:
    """Rows one request slot owns in the unified ring.

    Speculative decoding writes up to ``num_draft_tokens - 1`` tokens beyond the window
    before verification, so the ring is that much longer.
    """
    if sliding_window <= 0:
        raise TruthError(f"sliding_window must be positive, got {sliding_window}")
    if num_draft_tokens < 1:
        raise TruthError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    return sliding_window + (num_draft_tokens - 1 if speculative else 0)


def translate_pool(mapping: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
    """SWA slots for ``out_cache_loc``: ``mapping[out_cache_loc]`` read now, as int32.

    Location 0 is the dummy full slot (padding) and translates to the dummy SWA slot; any
    other location must be mapped, since a live token without an SWA slot has nowhere to go.
    """
    # numpy views of the host values: the reference runs once per forward and micro-batch,
    # beside every checked answer, and numpy's operations cost a fraction of torch's there
    loc = _host_int64(out_cache_loc).numpy()
    table = _host_int64(mapping).numpy()
    if loc.size == 0:
        return torch.empty(0, dtype=torch.int32)
    # read unsigned, a negative location is past the end too
    if loc.view(np.uint64).max() >= table.size:
        first = int(loc[(loc < 0) | (loc >= table.size)][0])
        raise TruthError(f"out_cache_loc {first} is outside the full pool [0, {table.size})")
    if table[DUMMY_SLOT] != DUMMY_SLOT:
        raise TruthError(f"mapping[0] is {int(table[DUMMY_SLOT])}: the dummy full slot must map to the dummy SWA slot 0")
    swa = table[loc]
    # the dummy location translates to the dummy slot (checked above), so a live location
    # that translates to it too is the only way to have fewer non-dummy slots than locations
    if np.count_nonzero(swa) != np.count_nonzero(loc):
        first = int(loc[(loc != DUMMY_SLOT) & (swa == DUMMY_SLOT)][0])
        raise TruthError(f"live full slot {first} has no SWA slot (mapping[{first}] == 0)")
    if swa.view(np.uint64).max() > INT32_MAX:  # negative slots included, read unsigned
        raise TruthError("SWA slot does not fit in int32")
    return torch.from_numpy(swa.astype(np.int32))


def _host_int64(values: torch.Tensor) -> torch.Tensor:
    """``values`` as int64 on the host (itself when it is already)."""
    if values.dtype is torch.int64 and values.is_cpu:
        return values
    return values.to(device="cpu", dtype=torch.int64)


def ring_rows(
    req_slots: torch.Tensor, positions: torch.Tensor, ring: int, num_req_slots: int
) -> torch.Tensor:
    """Unified-ring rows ``req_slot * ring + position % ring`` per token, as int32.

    ``req_slots`` holds one request slot per token (already expanded), so ragged batches
    need no guess about how many tokens each request has.
    """
    slots = _host_int64(req_slots)
    pos = _host_int64(positions)
    if slots.shape != pos.shape:
        raise TruthError(f"{slots.numel()} request slots for {pos.numel()} positions")
    if ring <= 0:
        raise TruthError(f"ring must be positive, got {ring}")
    if num_req_slots * ring - 1 > INT32_MAX:
        raise TruthError(f"{num_req_slots} request slots x ring {ring} overflows int32 rows")
    if slots.numel() == 0:
        return torch.empty(0, dtype=torch.int32)
    lowest, highest = (int(bound) for bound in torch.aminmax(slots))
    if lowest < 0 or highest >= num_req_slots:
        raise TruthError(f"request slot outside [0, {num_req_slots})")
    if int(pos.min()) < 0:
        raise TruthError("negative position")
    return unchecked_ring_rows(slots, pos, ring)


def unchecked_ring_rows(req_slots: torch.Tensor, positions: torch.Tensor, ring: int) -> torch.Tensor:
    """:func:`ring_rows` of inputs already checked, where they are: tensor operations only, so
    that a captured graph redoes them at each replay."""
    return (req_slots.to(torch.int64) * ring + positions.to(torch.int64) % ring).int()


def _per_request_counts(req_pool_indices: torch.Tensor, counts: torch.Tensor, what: str) -> list[int]:
    requests = req_pool_indices.reshape(-1).numel()
    values = [int(c) for c in counts.to(device="cpu", dtype=torch.int64).reshape(-1)]
    if len(values) != requests:
        raise TruthError(f"{len(values)} {what} for {requests} requests")
    if any(c < 0 for c in values):
        raise TruthError(f"negative {what}")
    return values


def token_state_slots(req_pool_indices: torch.Tensor, extend_seq_lens: torch.Tensor) -> torch.Tensor:
    """The request slot of every token a forward adds, in batch order (int64).

    SGLang's target-verify ``req_pool_indices_repeated`` and ``verify_store_state_slot`` and
    its prefill ``pf_state_slot`` are this, for the live tokens; each request adds
    ``extend_seq_lens`` tokens, so ragged batches need no assumption about equal counts.
    """
    slots = [int(s) for s in req_pool_indices.to(device="cpu", dtype=torch.int64).reshape(-1)]
    counts = _per_request_counts(req_pool_indices, extend_seq_lens, "token counts")
    return torch.tensor([slot for slot, count in zip(slots, counts) for _ in range(count)], dtype=torch.int64)


@dataclass(frozen=True)
class PrefillRows:
    """Per-token rows the unified-KV prefill store reads (int64, live tokens only)."""

    state_slot: torch.Tensor  # the token's request slot
    chunk_start: torch.Tensor  # tokens its request had cached before this forward
    cu_q: torch.Tensor  # where its request's tokens start in the batch
    final_pos: torch.Tensor  # the position of its request's last token after this forward


def prefill_rows(
    req_pool_indices: torch.Tensor, extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor
) -> PrefillRows:
    """The rows of :class:`PrefillRows` for a forward whose request ``r`` had
    ``extend_prefix_lens[r]`` tokens cached and adds ``extend_seq_lens[r]``."""
    counts = _per_request_counts(req_pool_indices, extend_seq_lens, "token counts")
    prefixes = _per_request_counts(req_pool_indices, extend_prefix_lens, "prefix lengths")
    starts = [sum(counts[:r]) for r in range(len(counts))]
    per_token = [r for r, count in enumerate(counts) for _ in range(count)]

    def rows(per_request: list[int]) -> torch.Tensor:
        return torch.tensor([per_request[r] for r in per_token], dtype=torch.int64)

    return PrefillRows(
        state_slot=token_state_slots(req_pool_indices, extend_seq_lens),
        chunk_start=rows(prefixes),
        cu_q=rows(starts),
        final_pos=rows([p + c - 1 for p, c in zip(prefixes, counts)]),
    )


def whole_page_ring(sliding_window: int, max_draft_tokens: int, page_size: int) -> int:
    """Rows one request slot owns in a page-aligned SWA ring: the window plus the draft
    tokens a verify writes past it, rounded up to whole pages.

    SGLang 0.5.21+ sizes the request window this way (``RequestWindow.__init__`` rounds its
    capacity, ``sliding_window + online_mtp_max_draft_tokens``, up to pages) and 0.5.23's
    draft ring the same (``get_draft_swa_ring_size``), so that a page of either ring pairs
    with a page of the paged SWA pool.
    """
    if sliding_window <= 0 or page_size <= 0:
        raise TruthError(f"sliding_window and page_size must be positive, got {sliding_window}, {page_size}")
    if max_draft_tokens < 0:
        raise TruthError(f"max_draft_tokens must be >= 0, got {max_draft_tokens}")
    pages = -(-(sliding_window + max_draft_tokens) // page_size)
    return pages * page_size


@dataclass(frozen=True)
class RequestWindowRows:
    """Where a forward's SWA keys go under the request window (SGLang 0.5.21+).

    Each forward stages its keys in a workspace: ``history_groups * window`` history rows
    (each request's last ``window`` committed keys, copied in), then one row per query row
    in batch order, padding rows last. After attention each live row is committed to its
    request's ring row ``slot * capacity + position % capacity`` unless a later row of the
    same request in this forward lands on that ring row too (more than ``capacity`` rows):
    only the newest ``capacity`` rows of a request commit, so no ring row is written twice.
    Padding rows and idle forwards commit nothing.
    """

    write_loc: torch.Tensor  # int32 [rows]: workspace row of each query row, padding included
    commit_row: torch.Tensor  # int64 [live rows]: ring row it commits to, -1 when it does not


def request_window_rows(
    req_pool_indices: torch.Tensor, extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, *,
    window: int, capacity: int, history_groups: int | None = None, padding: int = 0,
) -> RequestWindowRows:
    """:class:`RequestWindowRows` of a forward whose request ``r`` (slot
    ``req_pool_indices[r]``) had ``extend_prefix_lens[r]`` tokens and adds
    ``extend_seq_lens[r]``, padded by ``padding`` rows. ``history_groups`` is how many
    requests the workspace keeps history for (SGLang's ``num_groups``; one per query row
    when not given). An idle forward is one with no requests: its rows follow one empty
    history group (``RequestWindow.activate_idle``, 0.5.23) and commit nothing."""
    counts = _per_request_counts(req_pool_indices, extend_seq_lens, "token counts")
    prefixes = _per_request_counts(req_pool_indices, extend_prefix_lens, "prefix lengths")
    if window <= 0 or capacity < window:
        raise TruthError(f"the window ({window}) must be positive and fit in the capacity ({capacity})")
    if padding < 0:
        raise TruthError(f"negative padding {padding}")
    live = sum(counts)
    groups = (live if history_groups is None else history_groups) if counts else 1
    if groups < len([c for c in counts if c]):
        raise TruthError(f"{groups} history groups for {len(counts)} requests")
    slots = [int(s) for s in req_pool_indices.to(device="cpu", dtype=torch.int64).reshape(-1)]
    commit = [
        slot * capacity + (prefix + i) % capacity if count - 1 - i < capacity else -1
        for slot, prefix, count in zip(slots, prefixes, counts) for i in range(count)
    ]
    first = groups * window
    return RequestWindowRows(
        write_loc=torch.arange(first, first + live + padding, dtype=torch.int32),
        commit_row=torch.tensor(commit, dtype=torch.int64),
    )


def late_layer_tail_tokens(
    extend_seq_lens: torch.Tensor, tail_len: int, whole_extend: list[bool] | None = None
) -> torch.Tensor:
    """The rows of an extend whose keys the late layers store under decoder SWA bounded
    replay (SGLang 0.5.21+, ``late_layer_tail_layout``), as indices into the extend (int64).

    Only a request's last ``tail_len`` tokens (the SWA window) are ever read again, so the
    layers from the late-layer start run over those rows only: request ``r`` keeps its last
    ``min(tail_len, extend_seq_lens[r])`` tokens, or all of them where ``whole_extend[r]``
    (a request that reads its prompt rows). Each such row's SWA write target is then the pool
    translation of its own ``out_cache_loc``.
    """
    counts = [int(c) for c in extend_seq_lens.to(device="cpu", dtype=torch.int64).reshape(-1)]
    if any(c < 0 for c in counts):
        raise TruthError("negative token counts")
    if tail_len <= 0:
        raise TruthError(f"tail_len must be positive, got {tail_len}")
    whole = whole_extend if whole_extend is not None else [False] * len(counts)
    if len(whole) != len(counts):
        raise TruthError(f"{len(whole)} whole-extend flags for {len(counts)} requests")
    rows: list[int] = []
    start = 0
    for count, keep_all in zip(counts, whole):
        kept = count if keep_all else min(tail_len, count)
        rows.extend(range(start + count - kept, start + count))
        start += count
    return torch.tensor(rows, dtype=torch.int64)


def draft_step_slots(allocated: torch.Tensor) -> torch.Tensor:
    """The full-pool slots each step of a multi-step draft decode writes, ``[steps, requests
    * topk]`` (int64).

    ``allocated[r, k, s]`` is the slot the allocator gave step ``s`` of draft branch ``k`` of
    request ``r`` (SGLang's EAGLE workers lay a forward's draft slots out request-major, then
    branch, then step: ``eagle_worker_common``). Step ``s`` runs one token per branch of every
    request, request-major, and writes each its own step-``s`` slot.
    """
    if allocated.dim() != 3:
        raise TruthError(f"allocated slots must be [requests, topk, steps], got shape {tuple(allocated.shape)}")
    requests, topk, steps = allocated.shape
    table = allocated.to(device="cpu", dtype=torch.int64).tolist()
    return torch.tensor(
        [[table[r][k][s] for r in range(requests) for k in range(topk)] for s in range(steps)], dtype=torch.int64,
    ).reshape(steps, requests * topk)


def injected_context_rows(
    rows: torch.Tensor,
    positions: torch.Tensor,
    committed: torch.Tensor | None = None,
    final_positions: torch.Tensor | None = None,
    ring_window: int | None = None,
) -> torch.Tensor:
    """The rows a draft model's SWA store gets for the target's context tokens whose keys
    it copies in (DSpark's target-hidden injection), int64, -1 for a token it must skip.

    ``rows`` holds each token's own row (its translated SWA slot, or on a ring per request
    its ring row). A token the verify rejected (``committed`` False) is skipped. On a ring
    (``ring_window``: the sliding window), a token at least a window behind its request's
    final position (``final_positions``, per token) is skipped too: no later query reads
    it, and its ring row is shared with a newer token of the same request that the same
    store writes, so storing both would race. Paged SWA rows give every token a slot of its
    own, so nothing is skipped there for its age.
    """
    rows = _host_int64(rows)
    keep = torch.ones_like(rows, dtype=torch.bool)
    if committed is not None:
        keep &= committed.to(device="cpu", dtype=torch.bool).reshape(-1)
    if ring_window is not None and final_positions is not None:
        keep &= _host_int64(positions) > _host_int64(final_positions) - ring_window
    return torch.where(keep, rows, torch.full_like(rows, -1))
