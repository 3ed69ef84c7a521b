"""Forward planning: a forward's tokens allocated in the pools, its rows written into the
mappings, and its plan (step inputs and store schedule) fixed before its first layer runs.

A run of forwards that repeat one event is allocated as one block when its first forward
is planned (see :mod:`swafuzz.reference.engine`); its plans are handed out one by one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .mapping_rows import MappingRows
from .packing import Block, ForwardPlan, pack_chunk
from .paging import INT, NO_PAGES, Paging, Pools, ragged_arange
from .request_slots import RequestSlots
from .scenario import EngineConfig, Event, ScenarioError, store_schedule, tokens_per_request

DRAFT_MODES = ("draft", "draft_extend", "draft_block")
SPECULATIVE_MODES = ("verify", *DRAFT_MODES)

_MAX_BLOCK = 64  # forwards allocated as one block (runs of plain forwards are mostly shorter)
_CHUNK = 32  # forwards of a block planned, and read by the reference, together


class ForwardPlanner:
    """Plans forwards against the requests, pools and mappings it is given. :attr:`block`:
    the block whose forwards are planned and not yet all handed out; :attr:`reading`: the
    block of the forward running now (None: a forward planned on its own)."""

    def __init__(self, config: EngineConfig, requests: RequestSlots, pools: Pools, mapping_rows: MappingRows):
        self.config = config
        self.models = config.models
        self.requests = requests
        self.pools = pools
        self.mapping_rows = mapping_rows
        self.schedules: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self.block: Block | None = None  # forwards planned and not yet applied
        self.reading: Block | None = None  # the block of the forward running now

    def plan(self, event: Event, index: int, events: Sequence[Event]) -> ForwardPlan:
        c = self.config
        if event.mode in SPECULATIVE_MODES and not c.speculative:
            raise ScenarioError(f"a {event.mode} forward needs speculative decoding on")
        slots = self.requests.slots(event.requests)
        model = "draft" if event.mode in DRAFT_MODES and c.draft_model else "target"
        if event.mode in ("extend", "draft_extend"):
            counts = np.array(event.tokens, dtype=INT)
            live_tokens = sum(event.tokens)
        else:
            per_request = tokens_per_request(event.mode, c.num_draft_tokens)
            counts = np.full(len(slots), per_request, dtype=INT)
            live_tokens = per_request * len(slots)
        graph_batch_size = self._graph_batch_size(event, len(slots))
        lengths = self.requests.length[slots]
        forwards = self._block_size(event, index, events) if live_tokens else 1
        # [forward * step, request]: every step of every forward of the block
        prefixes = lengths + np.arange(forwards * event.steps)[:, None] * counts
        block = Block(event, index, model, slots, counts, live_tokens, graph_batch_size, prefixes)
        if live_tokens:
            try:
                self._allocate(block)
            except ScenarioError:
                if forwards == 1:
                    raise
                # the pools run out inside the run: forward by forward, the one that finds
                # its pool empty says so
                return self.plan(event, index, ())
        block.calls = self._calls(event)
        mutation = event.mutation
        if mutation is not None and mutation.after_calls > len(block.calls) * event.steps:
            raise ScenarioError(
                f"mutation.after_calls {mutation.after_calls} exceeds the forward's "
                f"{len(block.calls) * event.steps} store calls"
            )
        return self.next_of(block)

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

    def next_of(self, block: Block) -> ForwardPlan:
        """Apply the block's next forward to the state (its tokens' mappings; the engine
        state moves its version) and hand out its plan. Plans are built a chunk of forwards at a time: the same
        work repeated while its code is warm costs a fraction of it done once per forward
        between the subject's calls, and a run cut short wastes at most a chunk."""
        forward = block.taken
        block.taken += 1
        self.block = block if block.taken < block.forwards else None
        if forward == len(block.plans):
            block.plans += pack_chunk(block, forward, min(forward + _CHUNK, block.forwards))
        if block.live_tokens:
            steps = block.event.steps
            full = block.full[forward * steps:(forward + 1) * steps]
            for model, swa in block.swa.items():
                self.mapping_rows.write(model, full.ravel(), swa[forward * steps:(forward + 1) * steps].ravel())
        self.reading = block if block.forwards > 1 else None
        return block.plans[forward]

    def _allocate(self, block: Block) -> None:
        """Request slot per token of a step, and positions and full and SWA slots ([forward
        * step, token]) of every step's tokens of every forward of ``block``, allocated as
        the engine does one token after another: forward by forward, step by step, request
        by request, a token taking a new full page and (per model) a new SWA page where its
        position starts one. Only evictions give pages back meanwhile, SWA pages between two
        forwards (:meth:`_plan_evictions`), so each pool hands out its lowest free pages in
        the order the tokens ask with those returned first. The mappings are written
        forward by forward (:meth:`next_of`, :meth:`EngineState.finish_forward`)."""
        c = self.config
        slots, counts, prefixes = block.slots, block.counts, block.prefixes
        if block.one_token_each:
            token_slots, positions = slots, prefixes
        else:
            token_slots = slots.repeat(counts)
            ends = counts.cumsum()
            within = np.arange(len(token_slots), dtype=INT) - (ends - counts).repeat(counts)
            positions = prefixes.repeat(counts, axis=1) + within
        rows = len(prefixes)
        owners = token_slots if rows == 1 else np.tile(token_slots, rows)
        flat = positions.ravel()
        last = int(np.maximum.reduce(flat))
        full_paging = Paging(flat, c.full_page_size, last)
        swa_paging = full_paging if c.swa_page_size == c.full_page_size else Paging(flat, c.swa_page_size, last)
        # the first token that finds its pool empty fails, the full pool before the SWA pools
        empty = [
            (paging.asking(allocator.available), rank, allocator)
            for rank, (allocator, paging) in enumerate(
                [(self.pools.full_pages, full_paging)] + [(self.pools.swa_pages[m], swa_paging) for m in self.models]
            )
            if paging.new_pages > allocator.available
        ]
        if empty:
            raise min(empty, key=lambda failure: failure[:2])[2].full()
        self.requests.longest = max(self.requests.longest, last + 1)
        block.full = full_paging.place(owners, self.pools.full_pages, self.pools.full_table).reshape(positions.shape)
        returns = self._plan_evictions(block, len(flat) // block.forwards) if block.forwards > 1 else ()
        pools = self.pools
        block.swa = {
            model: swa_paging.place(owners, pools.swa_pages[model], pools.swa_tables[model], returns)
            .reshape(positions.shape)
            for model in self.models
        }
        block.token_slots, block.positions = token_slots, positions
        # read only once the block's forwards are applied (nothing else can happen meanwhile)
        self.requests.length[slots] = prefixes[-1] + counts

    def _plan_evictions(self, block: Block, tokens_per_forward: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The evictions after each forward of ``block`` (several), as
        :meth:`EngineState.finish_forward` would find them: only the block's requests grow, so
        only they leave the window. Sets the block's unmapped full slots per forward and the
        requests' evicted positions at its end; returns the SWA pages given back, as
        :meth:`Paging.place` takes them: before the next forward's first token asks, the pages
        whose last position left."""
        slots, steps, page = block.slots, block.event.steps, self.config.swa_page_size
        start = self.requests.evicted[slots]
        after = block.prefixes[steps - 1::steps] + block.counts  # [forward, request]: lengths after it
        evicted = np.maximum(start, after - self.config.sliding_window)
        if not (evicted[-1] > start).any():
            block.evicted_full, block.eviction_ends = NO_PAGES, [0] * block.forwards
            return []
        leaving = np.diff(evicted, axis=0, prepend=start[None]).ravel()
        owners = np.tile(slots, block.forwards).repeat(leaving)
        positions = ragged_arange(np.concatenate((start[None], evicted[:-1])).ravel(), leaving)
        ends = leaving.reshape(evicted.shape).sum(axis=1).cumsum()
        block.evicted_full, block.eviction_ends = self.pools.full_slots(owners, positions), ends.tolist()
        self.requests.evicted[slots] = evicted[-1]
        page_ends = self.pools.page_ends(positions)
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

    def _graph_batch_size(self, event: Event, requests: int) -> int | None:
        """The smallest captured batch size (request rows) that holds the forward's requests,
        or its padding rows when idle."""
        if not event.graph:
            return None
        need = max(requests, event.pad)
        fitting = [b for b in sorted(self.config.graph_batch_sizes) if b >= need]
        if not fitting:
            what = "rows" if event.mode in ("decode", "idle") else "requests"
            raise ScenarioError(f"no graph batch size in {list(self.config.graph_batch_sizes)} holds {need} {what}")
        return fitting[0]

    def _calls(self, event: Event) -> tuple[tuple[int, int], ...]:
        """(micro-batch, layer) of one step's stores; the event was checked against the
        configuration when its scenario was built. Forwards mostly repeat a few schedules:
        each is built once."""
        key = (event.layers, event.skip_layers, event.micro_batches, event.order)
        calls = self.schedules.get(key)
        if calls is None:
            calls = self.schedules[key] = self._build_calls(event)
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
