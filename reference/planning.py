"""A small, explicit model of the engine state that decides the truth.

It owns request slots, a paged full pool shared by every model, one paged SWA pool and
``full_to_swa`` mapping per model (target, and draft when configured), and applies the
lifecycle events of a :class:`~swafuzz.reference.scenario.Scenario`. The mapping tensors here are
the truth; callers that hand a mapping to code under test keep their own copy and follow
:attr:`EngineState.mapping_epoch` (a new tensor was registered) and
:attr:`EngineState.version` (something changed in place: the model writes the mappings
through numpy, so a tensor's own ``_version`` does not count those changes).

The model runs beside every checked forward, so its cost per forward must not grow with the
batch in Python: free pages are masks, request lengths and page tables are arrays indexed
by request slot, and each event or forward is a fixed number of array operations over the
tokens it touches (numpy, whose operations cost far less than torch's on the host; torch
only where a tensor leaves the model: the mappings, which numpy writes in place, and the
step inputs).

A run of forwards that repeat one event (strategies emit runs of plain decodes) is
allocated as one block when its first forward is planned. Between two forwards of a run the
engine's only other change is the eviction of positions that left the sliding window, and
that follows from the lengths alone: so the block takes its pages as the forwards ask for
them, with each forward's evicted SWA pages given back before the next forward asks, which
is the order forward-by-forward planning gives. The pools' books and the request lengths run
ahead to the block's end; the mappings and the version follow forward by forward (each
forward's rows are written when it is planned, its evictions when it finishes). Its plans
are built and its rows read by the reference a chunk of forwards at a time, and every plan,
mapping, version and row comes out as forward-by-forward planning gives it.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch

from .scenario import EngineConfig, Event, Mutation, ScenarioError, store_schedule
from .truth import DUMMY_SLOT, TruthError, ring_rows, translate_pool

DRAFT_MODES = ("draft", "draft_extend")
SPECULATIVE_MODES = ("verify", "draft", "draft_extend")

_INT = np.int64
_NO_PAGES = np.zeros(0, dtype=_INT)
_NO_BATCH: tuple[tuple[int, ...] | None, np.ndarray] = (None, _NO_PAGES)
_MIN_SEGMENT = 32  # pages of a request slot's home segment: most requests never outgrow it
_MAX_BLOCK = 64  # forwards allocated as one block (runs of plain forwards are mostly shorter)
_CHUNK = 32  # forwards of a block planned, and read by the reference, together
_TRUTH_READS = {"pool": ("out_cache_loc",), "ring": ("token_slots", "positions")}  # what each truth reads


def _ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i] .. starts[i] + counts[i] - 1`` for every ``i``, concatenated."""
    ends = counts.cumsum()
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=_INT) + (starts - (ends - counts)).repeat(counts)


class _PageAllocator:
    """Pages ``1..num_pages-1``; page 0 is the reserved dummy. Lowest free pages first.

    A free mask, taken from and given back to a batch of pages at a time. No page below
    ``_low`` is free, so the lowest free pages are found by scanning up from there.
    """

    def __init__(self, num_pages: int, what: str):
        self.num_pages = num_pages
        self.what = what
        self.free = np.empty(num_pages, dtype=bool)
        self.reset()

    def reset(self) -> None:
        self.free.fill(True)
        self.free[0] = False
        self.available = self.num_pages - 1
        self._low = 1

    def full(self) -> ScenarioError:
        return ScenarioError(f"the {self.what} is full ({self.num_pages - 1} pages in use)")

    def take_lowest(self, count: int) -> np.ndarray:
        """The ``count`` lowest free pages, ascending (the caller checked ``available``)."""
        if not count:
            return _NO_PAGES
        span = max(64, 2 * count)
        while True:
            found = self.free[self._low:self._low + span].nonzero()[0]
            if len(found) >= count or self._low + span >= self.num_pages:
                break
            span *= 4
        pages = found[:count] + self._low
        self.free[pages] = False
        self.available -= count
        self._low = int(pages[-1]) + 1
        return pages

    def take_highest(self, count: int) -> np.ndarray:
        """The ``count`` highest free pages, highest first."""
        if count > self.available:
            raise self.full()
        pages = np.flatnonzero(self.free)[::-1][:count]
        self.free[pages] = False
        self.available -= count
        return pages

    def take_pages(self, pages: np.ndarray) -> None:
        self.free[pages] = False
        self.available -= len(pages)

    def give_back(self, pages: np.ndarray) -> None:
        if len(pages):
            self.free[pages] = True
            self.available += len(pages)
            self._low = min(self._low, int(pages.min()))


class _PageTables:
    """Per request slot, its pages by page number, so a batch's pages are read or written
    with one indexed operation. Each slot owns a home segment of ``_MIN_SEGMENT`` pages at
    the start of one array; a request that outgrows it moves to a segment twice as large
    after them (the array is compacted when it runs out), and a finished request's slot
    goes back home."""

    def __init__(self, num_slots: int):
        self.home = np.arange(num_slots, dtype=_INT) * _MIN_SEGMENT
        self.start = self.home.copy()
        self.capacity = np.full(num_slots, _MIN_SEGMENT, dtype=_INT)
        self.homes_end = num_slots * _MIN_SEGMENT
        # never zeroed: a page number is read only where one was written
        self.pages = np.empty(2 * self.homes_end, dtype=_INT)
        self.top = self.homes_end

    def get(self, slots, page_nos: np.ndarray) -> np.ndarray:
        return self.pages[self.start[slots] + page_nos]

    def put(self, slots: np.ndarray, page_nos: np.ndarray, pages: np.ndarray, fits: bool = False) -> None:
        """``fits``: every page number is known to be below ``_MIN_SEGMENT``."""
        self.pages[self.entries(slots, page_nos, fits)] = pages

    def entries(self, slots: np.ndarray, page_nos: np.ndarray, fits: bool = False) -> np.ndarray:
        """Where in :attr:`pages` the slots' page numbers are kept, each slot's segment grown
        first to hold them. They stay there until a later call grows a segment."""
        if not fits:
            short = page_nos >= self.capacity[slots]
            if short.any():
                self._grow(slots[short], page_nos[short] + 1)
        return self.start[slots] + page_nos

    def release(self, slots) -> None:
        """The slots' pages are forgotten (grown segments are reclaimed at compaction)."""
        self.start[slots] = self.home[slots]
        self.capacity[slots] = _MIN_SEGMENT

    def _grow(self, slots: np.ndarray, needed: np.ndarray) -> None:
        need = np.zeros(len(self.capacity), dtype=_INT)
        np.maximum.at(need, slots, needed)
        grown = need.nonzero()[0]
        old = self.capacity[grown]
        new = np.maximum(need[grown], 2 * old)
        if self.top + int(new.sum()) > len(self.pages):
            self._compact(int(new.sum()))
        starts = self.top + new.cumsum() - new
        self.pages[_ragged_arange(starts, old)] = self.pages[_ragged_arange(self.start[grown], old)]
        self.start[grown] = starts
        self.capacity[grown] = new
        self.top += int(new.sum())

    def _compact(self, extra: int) -> None:
        away = (self.capacity > _MIN_SEGMENT).nonzero()[0]  # the slots that left home
        sizes = self.capacity[away]
        used = int(sizes.sum())
        pages = np.empty(self.homes_end + 2 * (used + extra), dtype=_INT)
        pages[:self.homes_end] = self.pages[:self.homes_end]
        starts = self.homes_end + sizes.cumsum() - sizes
        pages[_ragged_arange(starts, sizes)] = self.pages[_ragged_arange(self.start[away], sizes)]
        self.pages = pages
        self.start[away] = starts
        self.top = self.homes_end + used


class _Paging:
    """Where a forward's tokens (positions, in allocation order) fall in a pool's pages."""

    def __init__(self, positions: np.ndarray, page_size: int, last_position: int):
        self.page_size = page_size
        self.fits = last_position // page_size < _MIN_SEGMENT  # every page table has room
        if page_size == 1:  # every token starts a page: its slot is the page
            self.page_nos, self.offsets, self.starts = positions, None, None
            self.new_pages = len(positions)
        else:
            self.page_nos, self.offsets = np.divmod(positions, page_size)
            self.starts = (self.offsets == 0).nonzero()[0]  # the tokens that start a page
            self.new_pages = len(self.starts)

    def asking(self, pages_given: int) -> int:
        """The token that asks for a page after ``pages_given`` were given."""
        return pages_given if self.starts is None else int(self.starts[pages_given])

    def place(self, owners: np.ndarray, allocator: _PageAllocator, table: _PageTables,
              returns: Sequence[tuple[int, np.ndarray, np.ndarray]] = ()) -> np.ndarray:
        """Take the tokens' new pages and record them; the tokens' slots in the pool.

        ``returns``: ``(token, owners, page_nos)`` in token order: the pages those hold in
        ``table`` go back to ``allocator`` before token ``token`` asks (they were read
        from the table then, as it holds the pages taken before)."""
        asking = slice(None) if self.starts is None else self.starts
        # where the asking tokens' pages and the returned ones are kept, found once: every
        # segment is grown first, so none moves while pages are taken and given back
        entries = table.entries(owners[asking], self.page_nos[asking], self.fits)
        held = table.entries(np.concatenate([held_owners for _, held_owners, _ in returns]),
                             np.concatenate([held_page_nos for _, _, held_page_nos in returns])) if returns else _NO_PAGES
        held_ends = np.cumsum([len(held_owners) for _, held_owners, _ in returns]).tolist()
        taken: list[np.ndarray] = []
        asked = 0  # tokens that asked for a page so far (only those that start one ask)
        for (token, _, _), held_start, held_end in zip(returns, [0] + held_ends, held_ends):
            asked = self._take(allocator, table, entries, asked, token if self.starts is None else
                               int(self.starts.searchsorted(token)), taken)
            allocator.give_back(table.pages[held[held_start:held_end]])
        self._take(allocator, table, entries, asked, self.new_pages, taken)
        if self.starts is None:  # every token took a page: its slot is the page
            return taken[0] if len(taken) == 1 else np.concatenate(taken or [_NO_PAGES])
        return table.get(owners, self.page_nos) * self.page_size + self.offsets

    @staticmethod
    def _take(allocator: _PageAllocator, table: _PageTables, entries: np.ndarray, first: int, stop: int,
              taken: list[np.ndarray]) -> int:
        """Pages for the asking tokens ``first .. stop - 1``, kept at their ``entries``; ``stop``."""
        if stop > first:
            pages = allocator.take_lowest(stop - first)
            table.pages[entries[first:stop]] = pages
            taken.append(pages)
        return stop


class _Request(NamedTuple):
    """A live request; its length, window and pages are kept per request slot."""

    rid: int
    slot: int


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
    target-verify, where the draft tokens are left out (the backends add
    ``num_draft_tokens`` themselves). Padded request rows have length 1 and no prefix, as
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


class _Block:
    """Forwards of one event planned together: what they share, computed once, and their
    allocation, applied forward by forward (:meth:`EngineState._next_of`)."""

    def __init__(self, event: Event, index: int, model: str, slots: np.ndarray, counts: np.ndarray,
                 live_tokens: int, graph_batch_size: int | None, prefixes: np.ndarray):
        self.event, self.index, self.model = event, index, model
        self.calls: tuple[tuple[int, int], ...] = ()  # (micro-batch, layer) of one step's stores
        self.slots, self.counts, self.live_tokens = slots, counts, live_tokens
        self.graph_batch_size = graph_batch_size
        self.prefixes = prefixes  # [forward * step, request]
        # as SGLang states them: target-verify leaves the draft tokens out
        self.seq_lens = prefixes + counts if event.mode != "verify" else prefixes
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


class EngineState:
    def __init__(self, config: EngineConfig):
        _validate(config)
        self.config = config
        c = config
        self.models = c.models
        self.full_pages = _PageAllocator(c.full_pool_size // c.full_page_size, "full KV pool")
        self.swa_pages = {
            m: _PageAllocator(c.swa_pool_size // c.swa_page_size, f"{m} SWA pool") for m in c.models
        }
        # each mapping tensor shares its memory with an array the model writes in place
        self._rows = {m: np.zeros(c.full_pool_size, dtype=_INT) for m in c.models}
        self.mappings = {m: torch.from_numpy(rows) for m, rows in self._rows.items()}
        # per model, the full slots whose mapping rows were written since the last
        # take_written(), and how many; None: any row may have changed
        self._written: dict[str, list[np.ndarray] | None] = {m: [] for m in c.models}
        self._written_count = dict.fromkeys(c.models, 0)
        self._slot_of: dict[int, int] = {}  # live request id -> its slot, in admission order
        self._last_batch = _NO_BATCH  # (request ids, their slots) of the latest forward
        self._free_slots = _PageAllocator(c.num_req_slots, "request slots")
        # per request slot; a free slot has length 0, so whole-array passes skip it
        self._length = np.zeros(c.num_req_slots, dtype=_INT)
        self._evicted = np.zeros(c.num_req_slots, dtype=_INT)  # positions below left the window
        self._slot_limit = 1  # no slot at or above it was ever used: passes over slots stop there
        self._longest = 0  # no request was ever longer: while it fits the window, none leaves it
        self._full_table = _PageTables(c.num_req_slots)
        self._swa_tables = {m: _PageTables(c.num_req_slots) for m in c.models}
        self.next_request_id = 0
        self.version = 0
        self.mapping_epoch = 0
        self.forwards_run = 0
        self._schedules: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self._block: _Block | None = None  # forwards planned and not yet applied
        self._reading: _Block | None = None  # the block of the forward running now

    @property
    def requests(self) -> dict[int, _Request]:
        """The live requests by id, in admission order."""
        return {rid: _Request(rid, slot) for rid, slot in self._slot_of.items()}

    # ---- truth -------------------------------------------------------------------------

    def expected(self, model: str, inputs: StepInputs, truth: str) -> torch.Tensor:
        """The rows ``inputs`` must be written to, computed from the state as it is now.

        The forwards of a block are read a chunk at a time, when the first of them is asked
        for: between them the block's own fresh full slots change, each once, from unmapped
        to its SWA slot, and evictions unmap positions older than any later forward's
        tokens (full slots are not given back within a block, so none is reused), so each
        forward's rows read under the mapping with the chunk's fresh slots written are the
        rows read at its own moment (a forward's error, too, is raised when that forward
        asks)."""
        block = self._reading
        if block is not None:
            known = block.expected.get(truth)
            rows = known.get(id(inputs)) if known is not None else None
            if rows is None:
                self._read_chunk(block, truth)
                rows = block.expected[truth].get(id(inputs))
            if rows is not None:
                if isinstance(rows, TruthError):
                    raise rows
                return rows
        return self._read(self.mappings.get(model), inputs, truth)

    def _read(self, mapping: torch.Tensor | None, inputs: StepInputs, truth: str) -> torch.Tensor:
        if truth == "pool":
            return translate_pool(mapping, inputs.out_cache_loc)
        return ring_rows(inputs.token_slots, inputs.positions, self.config.ring, self.config.num_req_slots)

    def _read_chunk(self, block: "_Block", truth: str) -> None:
        """Read the rows of the block's current forward and of the rest of its chunk of
        plans, under the mapping as it is with the later forwards' rows written: the inputs of
        the chunk read as one, unless that raises, when each is read on its own and keeps
        its own error."""
        first, stop, steps = block.taken - 1, len(block.plans), block.event.steps
        rows = self._rows[block.model]
        if block.live_tokens and stop - first > 1:  # the later forwards' rows written too
            rows = rows.copy()
            rows[block.full[(first + 1) * steps:stop * steps]] = block.swa[block.model][(first + 1) * steps:stop * steps]
        mapping = torch.from_numpy(rows)
        every = [inputs for plan in block.plans[first:stop] for step_inputs in plan.steps for inputs in step_inputs]
        known = block.expected.setdefault(truth, {})
        try:
            together = self._read(mapping, _joined(every, truth), truth)
        except TruthError:
            for inputs in every:
                try:
                    known[id(inputs)] = self._read(mapping, inputs, truth)
                except TruthError as exc:
                    known[id(inputs)] = exc
            return
        known.update(zip(map(id, every), together.split_with_sizes([inputs.num_rows for inputs in every])))

    def take_written(self, model: str, joined: bool = True) -> np.ndarray | None:
        """The full slots whose rows of ``model``'s mapping changed since the last call (all
        of them, and maybe others: a row may be written with the value it held, or twice);
        None where any row may have, as after ``clear``, a registration, or more writes than
        the pool has slots. For a caller that keeps a copy of the mapping: it is kept in
        line by copying these rows alone. Only the model's own writes are counted.
        ``joined=False``: the caller compares the whole mapping anyway; the count starts
        again and None comes back, without the rows joined."""
        written = self._written[model]
        self._written[model], self._written_count[model] = [], 0
        if written is None or not joined:
            return None
        if len(written) == 1:
            return written[0]
        return np.concatenate(written) if written else _NO_PAGES

    def _write(self, model: str, full: np.ndarray, values) -> None:
        """``model``'s mapping rows ``full`` take ``values``, counted for take_written()."""
        self._rows[model][full] = values
        written = self._written[model]
        if written is not None:
            count = self._written_count[model] = self._written_count[model] + len(full)
            if count > len(self._rows[model]):
                self._written[model] = None  # more slots than the pool has: say "any row" instead
            else:
                written.append(full)

    def _rewritten(self, model: str) -> None:
        """Any row of ``model``'s mapping may have changed."""
        self._written[model] = None

    def live_targets(self, model: str, truth: str) -> set[int]:
        """Every row some live request owns: a padding row must never land on one."""
        if truth == "pool":
            mapping = self.mappings[model]
            return set(mapping[mapping != DUMMY_SLOT].tolist())
        ring = self.config.ring
        return {row for slot in self._slot_of.values() for row in range(slot * ring, (slot + 1) * ring)}

    # ---- events ------------------------------------------------------------------------

    def apply(self, event: Event | Mutation, where: str) -> None:
        """Apply a non-forward event (or a mid-forward mutation)."""
        if self._block is not None:
            raise RuntimeError(f"{where}: applied while forwards of a planned block are left")
        self._reading = None
        try:
            if event.op == "admit":
                self._admit(event.count)
            elif event.op == "finish":
                self._finish(self._live(event.request))
            elif event.op == "relocate":
                self._relocate(self._live(event.request))
            elif event.op == "register_mapping":
                self._register(event.shuffle)
            elif event.op == "clear":
                self._clear()
            else:
                raise ScenarioError(f"'{event.op}' is not a state event")
        except ScenarioError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        self.version += 1

    def plan_forward(self, event: Event, index: int, where: str, events: Sequence[Event] = ()) -> ForwardPlan:
        """Allocate the forward's tokens (all draft steps at once) and fix its schedule.

        ``events``: the scenario's events, ``event`` at ``index``. The forwards right after
        it that repeat it may then be allocated now, as one block whose plans are applied
        one by one as they are asked for: the caller's next calls must plan exactly those
        forwards, each after the previous one's :meth:`finish_forward`. Every plan, mapping,
        length and version comes out as forward-by-forward planning gives them."""
        block = self._block
        if block is not None:
            if index != block.index + block.taken:
                raise RuntimeError(f"{where}: forward {block.index + block.taken} of a planned block was skipped")
            return self._next_of(block)
        try:
            return self._plan_forward(event, index, events)
        except ScenarioError as exc:
            raise ScenarioError(f"{where}: {exc}") from None

    def finish_forward(self) -> None:
        """After a forward the engine evicts tokens that left the sliding window."""
        self.forwards_run += 1
        block = self._reading
        if block is not None:  # planned with the block: its pages went back then
            forward = block.taken - 1
            start = block.eviction_ends[forward - 1] if forward else 0
            if block.eviction_ends[forward] > start:
                full = block.evicted_full[start:block.eviction_ends[forward]]
                for model in self.models:
                    self._write(model, full, DUMMY_SLOT)
                self.version += 1
            return
        c = self.config
        if self._longest <= c.sliding_window:
            return  # no request ever outgrew the window: nothing changes
        length, evicted = self._length[:self._slot_limit], self._evicted[:self._slot_limit]
        leaving = np.maximum(evicted, length - c.sliding_window) - evicted
        if leaving.any():
            slots = leaving.nonzero()[0]
            first, counts = evicted[slots], leaving[slots]
            if int(counts.sum()) == len(slots):  # one position each (none of them is 0)
                owners, positions = slots, first
            else:
                owners, positions = slots.repeat(counts), _ragged_arange(first, counts)
            full = self._full_slots(owners, positions)
            # the mapping still holds the pages given back
            page, page_ends = c.swa_page_size, self._page_ends(positions)
            for model in self.models:
                rows = self._rows[model]
                self.swa_pages[model].give_back(rows[full] if page_ends is None else rows[full[page_ends]] // page)
                self._write(model, full, DUMMY_SLOT)
            evicted[slots] = first + counts
            self.version += 1

    # ---- internals ---------------------------------------------------------------------

    def _live(self, rid: int) -> _Request:
        if rid not in self._slot_of:
            raise self._not_live(rid)
        return _Request(rid, self._slot_of[rid])

    def _not_live(self, rid: int) -> ScenarioError:
        return ScenarioError(f"request {rid} is not live (live requests: {sorted(self._slot_of)})")

    def _slots(self, rids: tuple[int, ...]) -> np.ndarray:
        """The request slots of ``rids``; the first that is not live is the error. A
        request keeps its slot while it lives, so the slots of the last batch hold until a
        request finishes (forwards mostly run the batch before them again)."""
        last_rids, last_slots = self._last_batch
        if rids == last_rids:
            return last_slots
        try:
            slots = np.fromiter(map(self._slot_of.__getitem__, rids), dtype=_INT, count=len(rids))
        except KeyError as missing:
            raise self._not_live(missing.args[0]) from None
        self._last_batch = (tuple(rids), slots)
        return slots

    def _admit(self, count: int) -> None:
        if count > self._free_slots.available:
            raise ScenarioError(f"no free request slot ({self.config.num_req_slots - 1} in use)")
        slots = self._free_slots.take_lowest(count)
        rids = range(self.next_request_id, self.next_request_id + count)
        self.next_request_id += count
        self._slot_of.update(zip(rids, slots.tolist()))
        self._slot_limit = max(self._slot_limit, int(slots[-1]) + 1)

    def _tokens(self, slots: np.ndarray, first: np.ndarray, counts: np.ndarray):
        """Per token of positions ``first[i] .. first[i] + counts[i] - 1`` of each slot:
        its request slot, position and full slot."""
        owners = np.repeat(slots, counts)
        positions = _ragged_arange(first, counts)
        return owners, positions, self._full_slots(owners, positions)

    def _full_slots(self, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return _slots_in(self._full_table, self.config.full_page_size, owners, positions)

    def _swa_slots(self, model: str, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return _slots_in(self._swa_tables[model], self.config.swa_page_size, owners, positions)

    def _unmap(self, slots: np.ndarray, first: np.ndarray, counts: np.ndarray) -> None:
        _, _, full = self._tokens(slots, first, counts)
        for model in self.models:
            self._write(model, full, DUMMY_SLOT)

    def _remap(self, model: str, slots: np.ndarray) -> None:
        """Map the live tokens of ``slots`` to their SWA pages as the page table has them."""
        first = self._evicted[slots]
        owners, positions, full = self._tokens(slots, first, self._length[slots] - first)
        self._write(model, full, self._swa_slots(model, owners, positions))

    def _held_swa_pages(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First held SWA page number and one past the last, per slot: the pages from the
        one holding the window's first position up to the one holding the last token."""
        page = self.config.swa_page_size
        return self._evicted[slots] // page, -(-self._length[slots] // page)

    def _give_back_swa(self, slots: np.ndarray, first: np.ndarray, stop: np.ndarray) -> None:
        counts = stop - first
        if counts.any():
            owners, page_nos = np.repeat(slots, counts), _ragged_arange(first, counts)
            for model in self.models:
                self.swa_pages[model].give_back(self._swa_tables[model].get(owners, page_nos))

    def _finish(self, request: _Request) -> None:
        slots = np.array([request.slot], dtype=_INT)
        first = self._evicted[slots]
        self._unmap(slots, first, self._length[slots] - first)
        self._give_back_swa(slots, *self._held_swa_pages(slots))
        full_pages = -(-int(self._length[request.slot]) // self.config.full_page_size)
        self.full_pages.give_back(self._full_table.get(request.slot, np.arange(full_pages)))
        self._forget(slots)
        del self._slot_of[request.rid]

    def _forget(self, slots) -> None:
        self._last_batch = _NO_BATCH
        self._full_table.release(slots)
        for table in self._swa_tables.values():
            table.release(slots)
        self._length[slots] = 0
        self._evicted[slots] = 0
        self._free_slots.give_back(np.asarray(slots, dtype=_INT))

    def _clear(self) -> None:
        """Every request finishes: every page and slot is free again and nothing is mapped."""
        self._forget(np.array(list(self._slot_of.values()), dtype=_INT))
        self._slot_of.clear()
        self.full_pages.reset()
        for model in self.models:
            self.swa_pages[model].reset()
            self.mappings[model].fill_(DUMMY_SLOT)
            self._rewritten(model)

    def _relocate(self, request: _Request) -> None:
        slots = np.array([request.slot], dtype=_INT)
        first, stop = self._held_swa_pages(slots)
        page_nos = np.arange(int(first[0]), int(stop[0]))
        for model in self.models:
            allocator, table = self.swa_pages[model], self._swa_tables[model]
            old = table.get(request.slot, page_nos)
            table.put(np.repeat(slots, len(page_nos)), page_nos, allocator.take_highest(len(page_nos)))
            allocator.give_back(old)
            self._remap(model, slots)

    def _register(self, shuffle: int) -> None:
        rng = random.Random(shuffle)
        slots = np.array(list(self._slot_of.values()), dtype=_INT)  # in admission order
        first, stop = self._held_swa_pages(slots)
        counts = stop - first
        owners, page_nos = np.repeat(slots, counts), _ragged_arange(first, counts)
        for model in self.models:
            allocator = self.swa_pages[model]
            allocator.reset()
            order = list(range(1, allocator.num_pages))
            rng.shuffle(order)
            # each held page, request by request and in page order, takes the last of the
            # shuffled pages left
            relaid = np.array(order[len(order) - len(page_nos):][::-1], dtype=_INT)
            allocator.take_pages(relaid)
            self._swa_tables[model].put(owners, page_nos, relaid)
            self._rows[model] = np.zeros_like(self._rows[model])
            self.mappings[model] = torch.from_numpy(self._rows[model])
            self._rewritten(model)
            self._remap(model, slots)
        self.mapping_epoch += 1

    def _plan_forward(self, event: Event, index: int, events: Sequence[Event]) -> ForwardPlan:
        c = self.config
        if event.mode in SPECULATIVE_MODES and not c.speculative:
            raise ScenarioError(f"a {event.mode} forward needs speculative decoding on")
        slots = self._slots(event.requests)
        model = "draft" if event.mode in DRAFT_MODES and c.draft_model else "target"
        if event.mode in ("extend", "draft_extend"):
            counts = np.array(event.tokens, dtype=_INT)
            live_tokens = sum(event.tokens)
        else:
            per_request = c.num_draft_tokens if event.mode == "verify" else 1
            counts = np.full(len(slots), per_request, dtype=_INT)
            live_tokens = per_request * len(slots)
        graph_batch_size = self._graph_batch_size(event, live_tokens)
        lengths = self._length[slots]
        forwards = self._block_size(event, index, events) if live_tokens else 1
        # [forward * step, request]: every step of every forward of the block
        prefixes = lengths + np.arange(forwards * event.steps)[:, None] * counts
        block = _Block(event, index, model, slots, counts, live_tokens, graph_batch_size, prefixes)
        if live_tokens:
            try:
                self._allocate(block)
            except ScenarioError:
                if forwards == 1:
                    raise
                # the pools run out inside the run: forward by forward, the one that finds
                # its pool empty says so
                return self._plan_forward(event, index, ())
        block.calls = self._calls(event)
        mutation = event.mutation
        if mutation is not None and mutation.after_calls > len(block.calls) * event.steps:
            raise ScenarioError(
                f"mutation.after_calls {mutation.after_calls} exceeds the forward's "
                f"{len(block.calls) * event.steps} store calls"
            )
        return self._next_of(block)

    def _block_size(self, event: Event, index: int, events: Sequence[Event]) -> int:
        """How many forwards from ``events[index]`` repeat ``event`` (at most the block's
        worth), planned as one block; none with a mid-forward mutation."""
        if event.mutation is not None or len(events) <= index + 1:
            return 1
        most = min(len(events) - index, _MAX_BLOCK)
        forwards = 1
        while forwards < most and (events[index + forwards] is event or events[index + forwards] == event):
            forwards += 1
        return forwards

    def _next_of(self, block: "_Block") -> ForwardPlan:
        """Apply the block's next forward to the state (its tokens' mappings, the version)
        and hand out its plan. Plans are built a chunk of forwards at a time: the same
        work repeated while its code is warm costs a fraction of it done once per forward
        between the subject's calls, and a run cut short wastes at most a chunk."""
        forward = block.taken
        block.taken += 1
        self._block = block if block.taken < block.forwards else None
        if forward == len(block.plans):
            block.plans += self._plan_chunk(block, forward, min(forward + _CHUNK, block.forwards))
        if block.live_tokens:
            steps = block.event.steps
            full = block.full[forward * steps:(forward + 1) * steps]
            for model, swa in block.swa.items():
                self._write(model, full.ravel(), swa[forward * steps:(forward + 1) * steps].ravel())
        self._reading = block if block.forwards > 1 else None
        self.version += 1
        return block.plans[forward]

    def _plan_chunk(self, block: "_Block", first: int, stop: int) -> list[ForwardPlan]:
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
        forwards = stop - first
        # [step][micro-batch][forward]
        cells: list[list[list[StepInputs]]] = []
        for step in range(steps):
            rows = slice(first * steps + step, stop * steps, steps)  # the step's row of each forward
            step_cells = []
            for start, end in block.chunks:
                live_start, live_end = (start, end) if one_token_each else (token_ends[start], token_ends[end])
                padding = event.pad if event.mode == "idle" and not event.graph else 0
                if graph_batch_size is not None:
                    padding = graph_batch_size - (live_end - live_start)
                # padded request rows exist only where every row is one token (decode)
                pad_requests = padding if padding and (one_token_each or (counts[start:end] == 1).all()) else 0
                requests, tokens = end - start + pad_requests, live_end - live_start + padding
                packed = np.empty((forwards, 5 * requests + 2 * tokens), dtype=_INT)
                req_slots, token_counts, positions_of, loc, seq_lens_of, prefix_lens, host_seq_lens = _segments(
                    packed, requests, tokens)
                _fill(req_slots, slots[start:end], DUMMY_SLOT)
                _fill(token_counts, counts[start:end], 1)
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

    def _allocate(self, block: "_Block") -> None:
        """Request slot per token of a step, and positions and full and SWA slots ([forward
        * step, token]) of every step's tokens of every forward of ``block``, allocated as
        the engine does one token after another: forward by forward, step by step, request
        by request, a token taking a new full page and (per model) a new SWA page where its
        position starts one. Only evictions give pages back meanwhile, SWA pages between two
        forwards (:meth:`_plan_evictions`), so each pool hands out its lowest free pages in
        the order the tokens ask with those returned first. The mappings are written
        forward by forward (:meth:`_next_of`, :meth:`finish_forward`)."""
        c = self.config
        slots, counts, prefixes = block.slots, block.counts, block.prefixes
        if block.one_token_each:
            token_slots, positions = slots, prefixes
        else:
            token_slots = slots.repeat(counts)
            ends = counts.cumsum()
            within = np.arange(len(token_slots), dtype=_INT) - (ends - counts).repeat(counts)
            positions = prefixes.repeat(counts, axis=1) + within
        rows = len(prefixes)
        owners = token_slots if rows == 1 else np.tile(token_slots, rows)
        flat = positions.ravel()
        last = int(np.maximum.reduce(flat))
        full_paging = _Paging(flat, c.full_page_size, last)
        swa_paging = full_paging if c.swa_page_size == c.full_page_size else _Paging(flat, c.swa_page_size, last)
        # the first token that finds its pool empty fails, the full pool before the SWA pools
        empty = [
            (paging.asking(allocator.available), rank, allocator)
            for rank, (allocator, paging) in enumerate(
                [(self.full_pages, full_paging)] + [(self.swa_pages[m], swa_paging) for m in self.models]
            )
            if paging.new_pages > allocator.available
        ]
        if empty:
            raise min(empty, key=lambda failure: failure[:2])[2].full()
        self._longest = max(self._longest, last + 1)
        block.full = full_paging.place(owners, self.full_pages, self._full_table).reshape(positions.shape)
        returns = self._plan_evictions(block, len(flat) // block.forwards) if block.forwards > 1 else ()
        block.swa = {
            model: swa_paging.place(owners, self.swa_pages[model], self._swa_tables[model], returns).reshape(positions.shape)
            for model in self.models
        }
        block.token_slots, block.positions = token_slots, positions
        # read only once the block's forwards are applied (nothing else can happen meanwhile)
        self._length[slots] = prefixes[-1] + counts

    def _page_ends(self, positions: np.ndarray) -> np.ndarray | None:
        """Which of the positions leaving the window end their SWA page (None: all, pages of
        one slot): a page goes back once its last position has left."""
        page = self.config.swa_page_size
        return None if page == 1 else (positions % page == page - 1).nonzero()[0]

    def _plan_evictions(self, block: "_Block", tokens_per_forward: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The evictions after each forward of ``block`` (several), as :meth:`finish_forward`
        would find them: only the block's requests grow, so only they leave the window. Sets
        the block's unmapped full slots per forward and the requests' evicted positions at
        its end; returns the SWA pages given back, as :meth:`_Paging.place` takes them:
        before the next forward's first token asks, the pages whose last position left."""
        slots, steps, page = block.slots, block.event.steps, self.config.swa_page_size
        start = self._evicted[slots]
        after = block.prefixes[steps - 1::steps] + block.counts  # [forward, request]: lengths after it
        evicted = np.maximum(start, after - self.config.sliding_window)
        if not (evicted[-1] > start).any():
            block.evicted_full, block.eviction_ends = _NO_PAGES, [0] * block.forwards
            return []
        leaving = np.diff(evicted, axis=0, prepend=start[None]).ravel()
        owners = np.tile(slots, block.forwards).repeat(leaving)
        positions = _ragged_arange(np.concatenate((start[None], evicted[:-1])).ravel(), leaving)
        ends = leaving.reshape(evicted.shape).sum(axis=1).cumsum()
        block.evicted_full, block.eviction_ends = self._full_slots(owners, positions), ends.tolist()
        self._evicted[slots] = evicted[-1]
        page_ends = self._page_ends(positions)
        if page_ends is None:
            page_nos = positions
        else:
            owners, page_nos, ends = owners[page_ends], positions[page_ends] // page, page_ends.searchsorted(ends)
        firsts = np.concatenate(([0], ends[:-1]))
        return [
            ((forward + 1) * tokens_per_forward, owners[first:end], page_nos[first:end])
            for forward, (first, end) in enumerate(zip(firsts.tolist(), ends.tolist()))
            if end > first
        ]

    def _graph_batch_size(self, event: Event, live_tokens: int) -> int | None:
        if not event.graph:
            return None
        need = max(live_tokens, event.pad)
        fitting = [b for b in sorted(self.config.graph_batch_sizes) if b >= need]
        if not fitting:
            raise ScenarioError(f"no graph batch size in {list(self.config.graph_batch_sizes)} holds {need} rows")
        return fitting[0]

    def _calls(self, event: Event) -> tuple[tuple[int, int], ...]:
        """(micro-batch, layer) of one step's stores; the event was checked against the
        configuration when its scenario was built. Forwards mostly repeat a few schedules:
        each is built once."""
        key = (event.layers, event.skip_layers, event.micro_batches, event.order)
        calls = self._schedules.get(key)
        if calls is None:
            calls = self._schedules[key] = self._build_calls(event)
        return calls

    def _build_calls(self, event: Event) -> tuple[tuple[int, int], ...]:
        schedule = store_schedule(event, self.config)
        count = event.micro_batches
        if event.order is None:
            return tuple((mb, layer) for layer in schedule for mb in range(count))
        position = [0] * count
        calls = []
        for mb in event.order:
            calls.append((mb, schedule[position[mb]]))
            position[mb] += 1
        return tuple(calls)


@functools.lru_cache(maxsize=256)
def _validate(config: EngineConfig) -> None:
    """Validate ``config`` once: scenarios of a run mostly share a few configs, and a
    frozen config's values cannot change (an invalid one raises again every time)."""
    config.validate()


def replay_events(state: EngineState, events) -> Iterator[ForwardPlan]:
    """Apply ``events`` to ``state`` as the engine would, yielding each forward's plan.

    For readers of a scenario's shape (benchmarks, reports): no subject is involved, and a
    forward's mid-forward mutation is applied once its plan has been yielded.
    """
    events = tuple(events)
    for index, event in enumerate(events):
        where = f"events[{index}]"
        if event.op != "forward":
            state.apply(event, where)
            continue
        yield state.plan_forward(event, index, where, events)
        if event.mutation is not None:
            state.apply(event.mutation, f"{where}.mutation")
        state.finish_forward()


def _slots_in(table: _PageTables, page_size: int, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The pool slots of tokens (request slot, position) as ``table`` pages them."""
    if page_size == 1:
        return table.get(owners, positions)
    page_nos, offsets = np.divmod(positions, page_size)
    return table.get(owners, page_nos) * page_size + offsets


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


def _joined(every: list[StepInputs], truth: str) -> SimpleNamespace:
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
        rows = np.full(padding, fill, dtype=_INT)
        values = np.concatenate((values, rows)) if len(values) else rows
    return torch.from_numpy(values)
