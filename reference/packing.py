"""The records a forward is planned into, and the packing of their inputs.

A :class:`ForwardPlan` holds per draft step and micro-batch a :class:`StepInputs`, whose
fields are laid out one after another in one tensor (:data:`PACKED_INPUTS`), so that a
subject's batch is one copy of it. The forwards of a :class:`Block` are packed a chunk at
a time (:func:`pack_chunk`), one row per forward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from .paging import INT
from .scenario import Event
from .truth import DUMMY_SLOT, TruthError

_TRUTH_READS = {"pool": ("out_cache_loc",), "ring": ("token_slots", "positions")}  # what each truth reads


# the StepInputs fields a ForwardBatch carries, in the order StepInputs.packed holds them
PACKED_INPUTS = ("req_slots", "token_counts", "positions", "out_cache_loc", "seq_lens", "prefix_lens",
                 "host_seq_lens")


class _PackedField:
    """One of :data:`PACKED_INPUTS` of a :class:`StepInputs`: a view of its packed tensor,
    made when first read and kept (as ``functools.cached_property`` keeps a value)."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.index = name, PACKED_INPUTS.index(name)

    def __get__(self, inputs: "StepInputs | None", owner: type | None = None):
        if inputs is None:
            return self
        inputs.__dict__[self.name] = view = inputs._field(self.index)
        return view


# Plans and step inputs are records, never changed once made, yet not frozen: a frozen
# dataclass costs four times as much to make, and a forward makes a plan and a step input
# per step and micro-batch.
@dataclass(eq=False)
class StepInputs:
    """What one micro-batch of one (draft) step writes, live rows first, then padding.

    Per request row, ``prefix_lens`` counts the request's tokens written before this step
    (the cached prefix an extend continues) and ``seq_lens`` its length as SGLang's
    ``ForwardBatch.seq_lens`` states it: the prefix plus this step's tokens, except in
    target-verify and DSpark draft blocks, where the draft tokens are left out (the backends
    add them themselves). Padded request rows have length 1 and no prefix, as
    the graph runner fills them.

    The fields and tensors are a record: read them, never write them (those of one plan,
    and the request slots of consecutive plans, may share memory).
    """

    request_ids: tuple[int, ...]
    num_live: int
    # the fields of PACKED_INPUTS laid out one after another in one tensor (request rows,
    # then token rows, as PACKED_INPUTS says): copied to where a subject reads them with one
    # copy; each field is a view of it, made when first read
    packed: torch.Tensor
    packed_values: np.ndarray  # the same memory as numpy sees it, for the reference's reads
    num_requests: int  # request rows, padded ones included
    num_rows: int  # token rows, padded ones included
    # the request slot of each token row, where a request row may hold several tokens
    # (otherwise the token rows are the request rows: req_slots)
    expanded_slots: torch.Tensor | None = None

    req_slots = _PackedField("int64, one per request row (padded requests use slot 0).")
    token_counts = _PackedField("int64, tokens per request row.")
    positions = _PackedField("int64, one per token row.")
    out_cache_loc = _PackedField("int64, full-pool slot per token row.")
    seq_lens = _PackedField("int64, per request row (see above).")
    prefix_lens = _PackedField("int64, tokens per request row written before this step.")
    host_seq_lens = _PackedField("int64, seq_lens once more: the host copy a batch carries beside them, so "
                                 "that a batch's fields on the host are one copy of the packed tensor.")

    @functools.cached_property
    def token_slots(self) -> torch.Tensor:
        """int64, request slot per token row."""
        return self.req_slots if self.expanded_slots is None else self.expanded_slots

    @property
    def packed_sizes(self) -> tuple[int, ...]:
        """The length of each of PACKED_INPUTS in :attr:`packed`."""
        return _packed_sizes(self.num_requests, self.num_rows)

    def values(self, name: str) -> np.ndarray:
        """A field as numpy reads it (no copy): what the reference computes from."""
        if name == "token_slots" and self.expanded_slots is not None:
            return self.expanded_slots.numpy()
        start, stop = _bounds(self.num_requests, self.num_rows)[_FIELD_AT[name]]
        return self.packed_values[start:stop]

    def _field(self, index: int) -> torch.Tensor:
        start, stop = _bounds(self.num_requests, self.num_rows)[index]
        return self.packed[start:stop]


@dataclass(eq=False)
class ForwardPlan:
    """Everything a forward will do, fixed before its first layer runs."""

    index: int
    event: Event
    model: str
    steps: tuple[tuple[StepInputs, ...], ...]  # [draft step][micro-batch]
    calls: tuple[tuple[int, int], ...]  # (micro-batch, layer_id) per store, in order, one step
    graph_batch_size: int | None

    @property
    def num_micro_batches(self) -> int:
        return len(self.steps[0])

    @property
    def graph_rows(self) -> int | None:
        """The token rows of the captured graph the forward replays (its batch size times a
        request's tokens); None for an eager forward."""
        return None if self.graph_batch_size is None else self.steps[0][0].num_rows


class Block:
    """Forwards of one event planned together: what they share, computed once, and their
    allocation, applied forward by forward (:meth:`~swafuzz.reference.planning.ForwardPlanner.next_of`)."""

    def __init__(self, event: Event, index: int, model: str, slots: np.ndarray, counts: np.ndarray,
                 live_tokens: int, graph_batch_size: int | None, prefixes: np.ndarray):
        self.event, self.index, self.model = event, index, model
        self.calls: tuple[tuple[int, int], ...] = ()  # (micro-batch, layer) of one step's stores
        self.slots, self.counts, self.live_tokens = slots, counts, live_tokens
        self.graph_batch_size = graph_batch_size
        self.prefixes = prefixes  # [forward * step, request]
        # as SGLang states them: target-verify leaves the draft tokens out, and so does a
        # DSpark draft block, which runs as a target-verify forward of the draft model
        self.seq_lens = prefixes if event.mode in ("verify", "draft_block") else prefixes + counts
        self.forwards = len(prefixes) // event.steps
        self.one_token_each = live_tokens == len(slots)
        self.token_ends = None if self.one_token_each else [0] + counts.cumsum().tolist()
        self.chunks = _split(len(slots), event.micro_batches)
        self.taken = 0  # forwards applied
        self.plans: list[ForwardPlan] = []  # built a chunk at a time
        # per truth, each planned forward's inputs (by id: the plans hold them) -> their rows,
        # or the error reading them raised
        self.expected: dict[str, dict[int, torch.Tensor | TruthError]] = {}
        # set by the allocation: [forward * step, token]; per token of a step
        self.full: np.ndarray
        self.swa: dict[str, np.ndarray] = {}
        self.token_slots: np.ndarray
        # set by the allocation of a block of several forwards: the full slots of the
        # positions each forward's eviction unmaps, forward f's at [ends[f - 1], ends[f])
        self.evicted_full: np.ndarray | None = None
        self.eviction_ends: list[int] = []
        self.positions: np.ndarray


def pack_chunk(block: Block, first: int, stop: int) -> list[ForwardPlan]:
    """The plans of the block's forwards ``first`` to ``stop - 1``: each step input's
    fields are filled for all of them at once, one row per forward."""
    event, steps = block.event, block.event.steps
    if block.live_tokens:
        token_slots, positions, full = block.token_slots, block.positions, block.full
    else:  # idle: nothing to allocate
        token_slots, positions, full = block.slots, block.prefixes, block.prefixes
    prefixes, counts, slots, seq_lens = block.prefixes, block.counts, block.slots, block.seq_lens
    one_token_each, token_ends = block.one_token_each, block.token_ends
    graph_batch_size = block.graph_batch_size
    # the tokens of a padded request row: a graph's are as many as each live request's
    per_request = int(counts[0]) if graph_batch_size is not None and len(counts) else 1
    forwards = stop - first
    # [step][micro-batch][forward]
    cells: list[list[list[StepInputs]]] = []
    for step in range(steps):
        rows = slice(first * steps + step, stop * steps, steps)  # the step's row of each forward
        step_cells = []
        for start, end in block.chunks:
            live_start, live_end = (start, end) if one_token_each else (token_ends[start], token_ends[end])
            if graph_batch_size is not None:
                # a graph pads to its captured request rows, each with a request's tokens
                pad_requests = graph_batch_size - (end - start)
                padding = pad_requests * per_request
            else:
                padding = event.pad if event.mode == "idle" else 0
                # padded request rows exist only where every row is one token (decode)
                pad_requests = padding if padding and (one_token_each or (counts[start:end] == 1).all()) else 0
            requests, tokens = end - start + pad_requests, live_end - live_start + padding
            packed = np.empty((forwards, 5 * requests + 2 * tokens), dtype=INT)
            req_slots, token_counts, positions_of, loc, seq_lens_of, prefix_lens, host_seq_lens = _segments(
                packed, requests, tokens)
            _fill(req_slots, slots[start:end], DUMMY_SLOT)
            _fill(token_counts, counts[start:end], per_request)
            _fill(seq_lens_of, seq_lens[rows, start:end], 1)
            _fill(prefix_lens, prefixes[rows, start:end], 0)
            host_seq_lens[...] = seq_lens_of
            _fill(positions_of, prefixes[rows, start:end] if one_token_each else positions[rows, live_start:live_end], 0)
            _fill(loc, full[rows, live_start:live_end], DUMMY_SLOT)
            request_ids, num_live = tuple(event.requests[start:end]), live_end - live_start
            # one token per request row: the token rows are the request rows
            expanded = None if one_token_each else _padded(token_slots[live_start:live_end], DUMMY_SLOT, padding)
            cell = [StepInputs(request_ids, num_live, torch.from_numpy(row), row, requests, tokens, expanded)
                    for row in packed]
            step_cells.append(cell)
        cells.append(step_cells)
    # per forward: per step, the micro-batches' inputs
    steps_of = zip(*(zip(*step_cells) for step_cells in cells))
    return [
        ForwardPlan(block.index + forward, event, block.model, steps, block.calls, graph_batch_size)
        for forward, steps in zip(range(first, stop), steps_of)
    ]


def _split(count: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal [start, end) ranges of ``count`` rows (two-batch overlap
    splits a batch the same way)."""
    size, extra = divmod(count, parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append((start, end))
        start = end
    return chunks


def joined(every: list[StepInputs], truth: str) -> SimpleNamespace:
    """The token rows of ``every`` step input that the ``truth`` reads, one after another
    (joined through numpy, which reads a field without making a tensor of it)."""
    return SimpleNamespace(**{
        name: torch.from_numpy(np.concatenate([inputs.values(name) for inputs in every]))
        for name in _TRUTH_READS[truth]
    })


def _packed_sizes(requests: int, tokens: int) -> tuple[int, ...]:
    """The length of each of :data:`PACKED_INPUTS` in a packed tensor: five fields of
    request rows and two of token rows."""
    return requests, requests, tokens, tokens, requests, requests, requests


@functools.lru_cache(maxsize=4096)
def _bounds(requests: int, tokens: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each of :data:`PACKED_INPUTS` in a packed tensor."""
    ends = np.cumsum(_packed_sizes(requests, tokens)).tolist()
    return tuple(zip([0] + ends[:-1], ends))


# where each field a truth reads lies among PACKED_INPUTS (token rows are request rows where
# no request has several tokens)
_FIELD_AT = {**{name: index for index, name in enumerate(PACKED_INPUTS)}, "token_slots": 0}


def _segments(packed: np.ndarray, requests: int, tokens: int) -> list[np.ndarray]:
    """The views of :attr:`StepInputs.packed` (along the last axis), in
    :data:`PACKED_INPUTS` order."""
    return [packed[..., start:stop] for start, stop in _bounds(requests, tokens)]


def _fill(segment: np.ndarray, values: np.ndarray, padding_value: int) -> None:
    """``values``, then ``padding_value`` to the end of ``segment`` (along the last axis)."""
    live = values.shape[-1]
    segment[..., :live] = values
    if live < segment.shape[-1]:
        segment[..., live:] = padding_value


def _padded(values: np.ndarray, fill: int, padding: int) -> torch.Tensor:
    if padding:
        rows = np.full(padding, fill, dtype=INT)
        values = np.concatenate((values, rows)) if len(values) else rows
    return torch.from_numpy(values)
