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

The state is split along its jobs, each a class of its own module: the live requests and
their slots (:mod:`~swafuzz.reference.request_slots`), the pools' pages
(:mod:`~swafuzz.reference.paging`), the mappings and their written rows
(:mod:`~swafuzz.reference.mapping_rows`), forward planning
(:mod:`~swafuzz.reference.planning`) and the packing of step inputs
(:mod:`~swafuzz.reference.packing`). :class:`EngineState` applies the lifecycle events
through them and reads the truth.
"""

from __future__ import annotations

import functools
import random
from typing import Iterator, Sequence

import numpy as np
import torch

from .mapping_rows import MappingRows
from .packing import Block, ForwardPlan, StepInputs, joined
from .paging import INT, Pools, ragged_arange
from .planning import ForwardPlanner
from .request_slots import Request, RequestSlots
from .scenario import EngineConfig, Event, Mutation, ScenarioError
from .truth import DUMMY_SLOT, TruthError, ring_rows, translate_pool

UNREAD_PAGE = -1  # a page-table entry past its row's own pages (EngineState.page_table)


class EngineState:
    def __init__(self, config: EngineConfig):
        _validate(config)
        self.config = config
        c = config
        self.models = c.models
        self.request_slots = RequestSlots(c.num_req_slots)
        self.pools = Pools(c)
        self.full_pages = self.pools.full_pages
        self.swa_pages = self.pools.swa_pages
        # each mapping tensor shares its memory with an array the model writes in place
        self.mapping_rows = MappingRows(c.models, c.full_pool_size)
        self.mappings = self.mapping_rows.tensors
        self.planner = ForwardPlanner(c, self.request_slots, self.pools, self.mapping_rows)
        self.version = 0
        self.mapping_epoch = 0
        self.forwards_run = 0

    @property
    def requests(self) -> dict[int, Request]:
        """The live requests by id, in admission order."""
        return {rid: Request(rid, slot) for rid, slot in self.request_slots.slot_of.items()}

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
        block = self.planner.reading
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

    def _read_chunk(self, block: Block, truth: str) -> None:
        """Read the rows of the block's current forward and of the rest of its chunk of
        plans, under the mapping as it is with the later forwards' rows written: the inputs of
        the chunk read as one, unless that raises, when each is read on its own and keeps
        its own error."""
        first, stop, steps = block.taken - 1, len(block.plans), block.event.steps
        rows = self.mapping_rows.rows[block.model]
        if block.live_tokens and stop - first > 1:  # the later forwards' rows written too
            rows = rows.copy()
            rows[block.full[(first + 1) * steps:stop * steps]] = block.swa[block.model][(first + 1) * steps:stop * steps]
        mapping = torch.from_numpy(rows)
        every = [inputs for plan in block.plans[first:stop] for step_inputs in plan.steps for inputs in step_inputs]
        known = block.expected.setdefault(truth, {})
        try:
            together = self._read(mapping, joined(every, truth), truth)
        except TruthError:
            for inputs in every:
                try:
                    known[id(inputs)] = self._read(mapping, inputs, truth)
                except TruthError as exc:
                    known[id(inputs)] = exc
            return
        known.update(zip(map(id, every), together.split_with_sizes([inputs.num_rows for inputs in every])))

    def page_table(self, token_slots: np.ndarray, positions: np.ndarray) -> torch.Tensor:
        """Per token row, the full-pool pages of its request up to the row's causal length
        ``position + 1``: SGLang's ``page_table``, ``req_to_token[slot, 0:max_len:page_size]
        // page_size`` (int32, ``ceil(max_len / page_size)`` columns). Entries past a row's
        own pages hold :data:`UNREAD_PAGE`: ``req_to_token`` has whatever an earlier request
        left there, and no layer reads them. Padding rows hold the dummy request slot 0,
        whose ``req_to_token`` row is never written: page 0."""
        page = self.config.full_page_size
        pages = -(-(positions + 1) // page)
        if not len(pages):
            return torch.zeros(0, 0, dtype=torch.int32)
        table = np.full((len(pages), int(pages.max())), UNREAD_PAGE, dtype=INT)
        live = token_slots != DUMMY_SLOT
        rows = np.repeat(np.flatnonzero(live), pages[live])
        page_nos = ragged_arange(np.zeros(int(live.sum()), dtype=INT), pages[live])
        # the books keep each page a request holds by page number, as req_to_token's
        # entries at multiples of the page size hold them times the page size
        table[rows, page_nos] = self.pools.full_table.get(token_slots[rows], page_nos)
        table[~live, 0] = DUMMY_SLOT
        return torch.from_numpy(table).to(torch.int32)

    def take_written(self, model: str, joined: bool = True) -> np.ndarray | None:
        """:meth:`MappingRows.take_written <swafuzz.reference.mapping_rows.MappingRows.take_written>`."""
        return self.mapping_rows.take_written(model, joined)

    def live_targets(self, model: str, truth: str) -> set[int]:
        """Every row some live request owns: a padding row must never land on one."""
        if truth == "pool":
            mapping = self.mappings[model]
            return set(mapping[mapping != DUMMY_SLOT].tolist())
        ring = self.config.ring
        return {row for slot in self.request_slots.slot_of.values() for row in range(slot * ring, (slot + 1) * ring)}

    # ---- events ------------------------------------------------------------------------

    def apply(self, event: Event | Mutation, where: str) -> None:
        """Apply a non-forward event (or a mid-forward mutation)."""
        if self.planner.block is not None:
            raise RuntimeError(f"{where}: applied while forwards of a planned block are left")
        self.planner.reading = None
        try:
            if event.op == "admit":
                self.request_slots.admit(event.count)
            elif event.op == "finish":
                self._finish(self.request_slots.live(event.request))
            elif event.op == "relocate":
                self._relocate(self.request_slots.live(event.request))
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
        planner = self.planner
        block = planner.block
        if block is not None:
            if index != block.index + block.taken:
                raise RuntimeError(f"{where}: forward {block.index + block.taken} of a planned block was skipped")
            plan = planner.next_of(block)
        else:
            try:
                plan = planner.plan(event, index, events)
            except ScenarioError as exc:
                raise ScenarioError(f"{where}: {exc}") from None
        self.version += 1
        return plan

    def finish_forward(self) -> None:
        """After a forward the engine evicts tokens that left the sliding window."""
        self.forwards_run += 1
        block, write = self.planner.reading, self.mapping_rows.write
        if block is not None:  # planned with the block: its pages went back then
            forward = block.taken - 1
            start = block.eviction_ends[forward - 1] if forward else 0
            if block.eviction_ends[forward] > start:
                full = block.evicted_full[start:block.eviction_ends[forward]]
                for model in self.models:
                    write(model, full, DUMMY_SLOT)
                self.version += 1
            return
        c, requests = self.config, self.request_slots
        if requests.longest <= c.sliding_window:
            return  # no request ever outgrew the window: nothing changes
        length, evicted = requests.length[:requests.slot_limit], requests.evicted[:requests.slot_limit]
        leaving = np.maximum(evicted, length - c.sliding_window) - evicted
        if leaving.any():
            slots = leaving.nonzero()[0]
            first, counts = evicted[slots], leaving[slots]
            if int(counts.sum()) == len(slots):  # one position each (none of them is 0)
                owners, positions = slots, first
            else:
                owners, positions = slots.repeat(counts), ragged_arange(first, counts)
            full = self.pools.full_slots(owners, positions)
            # the mapping still holds the pages given back
            page, page_ends = c.swa_page_size, self.pools.page_ends(positions)
            for model in self.models:
                rows = self.mapping_rows.rows[model]
                self.swa_pages[model].give_back(rows[full] if page_ends is None else rows[full[page_ends]] // page)
                write(model, full, DUMMY_SLOT)
            evicted[slots] = first + counts
            self.version += 1

    # ---- internals ---------------------------------------------------------------------

    def _tokens(self, slots: np.ndarray, first: np.ndarray, counts: np.ndarray):
        """Per token of positions ``first[i] .. first[i] + counts[i] - 1`` of each slot:
        its request slot, position and full slot."""
        owners = np.repeat(slots, counts)
        positions = ragged_arange(first, counts)
        return owners, positions, self.pools.full_slots(owners, positions)

    def _unmap(self, slots: np.ndarray, first: np.ndarray, counts: np.ndarray) -> None:
        _, _, full = self._tokens(slots, first, counts)
        for model in self.models:
            self.mapping_rows.write(model, full, DUMMY_SLOT)

    def _remap(self, model: str, slots: np.ndarray) -> None:
        """Map the live tokens of ``slots`` to their SWA pages as the page table has them."""
        first = self.request_slots.evicted[slots]
        owners, positions, full = self._tokens(slots, first, self.request_slots.length[slots] - first)
        self.mapping_rows.write(model, full, self.pools.swa_slots(model, owners, positions))

    def _held_swa_pages(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.request_slots.held_pages(slots, self.config.swa_page_size)

    def _finish(self, request: Request) -> None:
        requests = self.request_slots
        slots = np.array([request.slot], dtype=INT)
        first = requests.evicted[slots]
        self._unmap(slots, first, requests.length[slots] - first)
        self.pools.give_back_swa(slots, *self._held_swa_pages(slots))
        full_pages = -(-int(requests.length[request.slot]) // self.config.full_page_size)
        self.full_pages.give_back(self.pools.full_table.get(request.slot, np.arange(full_pages)))
        self._forget(slots)
        del requests.slot_of[request.rid]

    def _forget(self, slots) -> None:
        self.pools.release(slots)
        self.request_slots.forget(slots)

    def _clear(self) -> None:
        """Every request finishes: every page and slot is free again and nothing is mapped."""
        self._forget(np.array(list(self.request_slots.slot_of.values()), dtype=INT))
        self.request_slots.slot_of.clear()
        self.pools.reset()
        for model in self.models:
            self.mapping_rows.clear(model)

    def _relocate(self, request: Request) -> None:
        slots = np.array([request.slot], dtype=INT)
        first, stop = self._held_swa_pages(slots)
        page_nos = np.arange(int(first[0]), int(stop[0]))
        for model in self.models:
            allocator, table = self.swa_pages[model], self.pools.swa_tables[model]
            old = table.get(request.slot, page_nos)
            table.put(np.repeat(slots, len(page_nos)), page_nos, allocator.take_highest(len(page_nos)))
            allocator.give_back(old)
            self._remap(model, slots)

    def _register(self, shuffle: int) -> None:
        rng = random.Random(shuffle)
        slots = np.array(list(self.request_slots.slot_of.values()), dtype=INT)  # in admission order
        first, stop = self._held_swa_pages(slots)
        counts = stop - first
        owners, page_nos = np.repeat(slots, counts), ragged_arange(first, counts)
        for model in self.models:
            allocator = self.swa_pages[model]
            allocator.reset()
            order = list(range(1, allocator.num_pages))
            rng.shuffle(order)
            # each held page, request by request and in page order, takes the last of the
            # shuffled pages left
            relaid = np.array(order[len(order) - len(page_nos):][::-1], dtype=INT)
            allocator.take_pages(relaid)
            self.pools.swa_tables[model].put(owners, page_nos, relaid)
            self.mapping_rows.replace(model)
            self._remap(model, slots)
        self.mapping_epoch += 1


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
