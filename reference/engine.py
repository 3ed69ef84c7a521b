"""A small, explicit model of the engine state that decides the truth.

It owns request slots, a paged full pool shared by every model, one paged SWA pool and
``full_to_swa`` mapping per model (target, and draft when configured), and applies the
lifecycle events of a :class:`~reference.scenario.Scenario`. The mapping tensors here are
the truth; callers that hand a mapping to code under test keep their own copy and follow
:attr:`EngineState.mapping_epoch` (a new tensor was registered) and
:attr:`EngineState.version` (something changed in place).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .scenario import EngineConfig, Event, Mutation, ScenarioError, store_schedule
from .truth import DUMMY_SLOT, ring_rows, translate_pool

DRAFT_MODES = ("draft", "draft_extend")
SPECULATIVE_MODES = ("verify", "draft", "draft_extend")


class _PageAllocator:
    """Pages ``1..num_pages-1``; page 0 is the reserved dummy. Lowest free page first.

    A heap gives the lowest page in O(log n) (allocation is the engine model's hot path);
    pages taken out of order are skipped lazily when they reach the top.
    """

    def __init__(self, num_pages: int, what: str):
        self.num_pages = num_pages
        self.what = what
        self.reset()

    def reset(self) -> None:
        self.free = set(range(1, self.num_pages))
        self._heap = sorted(self.free)

    def take(self) -> int:
        while self._heap:
            page = heapq.heappop(self._heap)
            if page in self.free:
                self.free.remove(page)
                return page
        raise ScenarioError(f"the {self.what} is full ({self.num_pages - 1} pages in use)")

    def take_highest(self) -> int:
        if not self.free:
            raise ScenarioError(f"the {self.what} is full ({self.num_pages - 1} pages in use)")
        page = max(self.free)
        self.free.remove(page)
        return page

    def take_page(self, page: int) -> None:
        self.free.remove(page)

    def give_back(self, page: int) -> None:
        self.free.add(page)
        heapq.heappush(self._heap, page)


@dataclass
class _Request:
    rid: int
    slot: int
    length: int = 0
    evicted_upto: int = 0
    full_pages: list[int] = field(default_factory=list)
    swa_pages: dict[str, dict[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepInputs:
    """What one micro-batch of one (draft) step writes, live rows first, then padding.

    Per request row, ``prefix_lens`` counts the request's tokens written before this step
    (the cached prefix an extend continues) and ``seq_lens`` its length as SGLang's
    ``ForwardBatch.seq_lens`` states it: the prefix plus this step's tokens, except in
    target-verify, where the draft tokens are left out (the backends add
    ``num_draft_tokens`` themselves). Padded request rows have length 1 and no prefix, as
    the graph runner fills them.
    """

    request_ids: tuple[int, ...]
    req_slots: torch.Tensor  # int64, one per request row (padded requests use slot 0)
    token_counts: torch.Tensor  # int64, tokens per request row
    prefix_lens: torch.Tensor  # int64, tokens per request row written before this step
    seq_lens: torch.Tensor  # int64, per request row (see above)
    token_slots: torch.Tensor  # int64, request slot per token
    positions: torch.Tensor  # int64
    out_cache_loc: torch.Tensor  # int64, full-pool slot per token
    num_live: int

    @property
    def num_rows(self) -> int:
        return int(self.positions.numel())


@dataclass(frozen=True)
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


class EngineState:
    def __init__(self, config: EngineConfig):
        self.config = config.validate()
        c = config
        self.models = c.models
        self.full_pages = _PageAllocator(c.full_pool_size // c.full_page_size, "full KV pool")
        self.swa_pages = {
            m: _PageAllocator(c.swa_pool_size // c.swa_page_size, f"{m} SWA pool") for m in c.models
        }
        self.mappings = {m: torch.zeros(c.full_pool_size, dtype=torch.int64) for m in c.models}
        self.free_slots = set(range(1, c.num_req_slots))
        self.requests: dict[int, _Request] = {}
        self.next_request_id = 0
        self.version = 0
        self.mapping_epoch = 0
        self.forwards_run = 0
        # mapping writes are gathered per operation and applied in one indexed write each
        self._pending: dict[str, tuple[list[int], list[int]]] = {m: ([], []) for m in c.models}

    # ---- truth -------------------------------------------------------------------------

    def expected(self, model: str, inputs: StepInputs, truth: str) -> torch.Tensor:
        """The rows ``inputs`` must be written to, computed from the state as it is now."""
        if truth == "pool":
            return translate_pool(self.mappings[model], inputs.out_cache_loc)
        return ring_rows(inputs.token_slots, inputs.positions, self.config.ring, self.config.num_req_slots)

    def live_targets(self, model: str, truth: str) -> set[int]:
        """Every row some live request owns: a padding row must never land on one."""
        if truth == "pool":
            mapping = self.mappings[model]
            return set(mapping[mapping != DUMMY_SLOT].tolist())
        ring = self.config.ring
        return {row for r in self.requests.values() for row in range(r.slot * ring, (r.slot + 1) * ring)}

    # ---- events ------------------------------------------------------------------------

    def apply(self, event: Event | Mutation, where: str) -> None:
        """Apply a non-forward event (or a mid-forward mutation)."""
        try:
            if event.op == "admit":
                for _ in range(event.count):
                    self._admit()
            elif event.op == "finish":
                self._finish(self._live(event.request))
            elif event.op == "relocate":
                self._relocate(self._live(event.request))
            elif event.op == "register_mapping":
                self._register(event.shuffle)
            elif event.op == "clear":
                for request in list(self.requests.values()):
                    self._finish(request)
                for mapping in self.mappings.values():
                    mapping.fill_(DUMMY_SLOT)
            else:
                raise ScenarioError(f"'{event.op}' is not a state event")
        except ScenarioError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        finally:
            self._flush()
        self.version += 1

    def plan_forward(self, event: Event, index: int, where: str) -> ForwardPlan:
        """Allocate the forward's tokens (all draft steps at once) and fix its schedule."""
        try:
            return self._plan_forward(event, index)
        except ScenarioError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        finally:
            self._flush()

    def finish_forward(self) -> None:
        """After a forward the engine evicts tokens that left the sliding window."""
        self.forwards_run += 1
        window = self.config.sliding_window
        for request in self.requests.values():
            upto = max(request.evicted_upto, request.length - window)
            for position in range(request.evicted_upto, upto):
                self._unmap(request, position, free_pages=True)
            request.evicted_upto = upto
        self._flush()
        self.version += 1

    # ---- internals ---------------------------------------------------------------------

    def _live(self, rid: int) -> _Request:
        if rid not in self.requests:
            live = sorted(self.requests)
            raise ScenarioError(f"request {rid} is not live (live requests: {live})")
        return self.requests[rid]

    def _admit(self) -> None:
        if not self.free_slots:
            raise ScenarioError(f"no free request slot ({self.config.num_req_slots - 1} in use)")
        slot = min(self.free_slots)
        self.free_slots.remove(slot)
        rid = self.next_request_id
        self.next_request_id += 1
        self.requests[rid] = _Request(rid, slot, swa_pages={m: {} for m in self.config.models})

    def _full_slot(self, request: _Request, position: int) -> int:
        page = self.config.full_page_size
        return request.full_pages[position // page] * page + position % page

    def _swa_slot(self, request: _Request, model: str, position: int) -> int:
        page = self.config.swa_page_size
        return request.swa_pages[model][position // page] * page + position % page

    def _allocate_token(self, request: _Request) -> tuple[int, int]:
        position = request.length
        full_page, swa_page = self.config.full_page_size, self.config.swa_page_size
        page_no, offset = divmod(position, full_page)
        if page_no == len(request.full_pages):
            request.full_pages.append(self.full_pages.take())
        full = request.full_pages[page_no] * full_page + offset
        swa_no, swa_offset = divmod(position, swa_page)
        for model in self.models:
            pages = request.swa_pages[model]
            page = pages.get(swa_no)
            if page is None:
                page = pages[swa_no] = self.swa_pages[model].take()
            self._set(model, full, page * swa_page + swa_offset)
        request.length = position + 1
        return full, position

    def _unmap(self, request: _Request, position: int, free_pages: bool) -> None:
        c = self.config
        full = self._full_slot(request, position)
        for model in self.models:
            self._set(model, full, DUMMY_SLOT)
            page_no = position // c.swa_page_size
            if free_pages and position % c.swa_page_size == c.swa_page_size - 1:
                self.swa_pages[model].give_back(request.swa_pages[model].pop(page_no))

    def _finish(self, request: _Request) -> None:
        for position in range(request.evicted_upto, request.length):
            self._unmap(request, position, free_pages=False)
        for model in self.models:
            for page in request.swa_pages[model].values():
                self.swa_pages[model].give_back(page)
        for page in request.full_pages:
            self.full_pages.give_back(page)
        self.free_slots.add(request.slot)
        del self.requests[request.rid]

    def _remap_pages(self, request: _Request, model: str, new_pages: dict[int, int]) -> None:
        request.swa_pages[model] = new_pages
        for position in range(request.evicted_upto, request.length):
            self._set(model, self._full_slot(request, position), self._swa_slot(request, model, position))

    def _set(self, model: str, full: int, swa: int) -> None:
        slots, values = self._pending[model]
        slots.append(full)
        values.append(swa)

    def _flush(self) -> None:
        for model, (slots, values) in self._pending.items():
            if slots:
                last = dict(zip(slots, values))  # a later write to a slot wins, as one by one
                self.mappings[model].index_put_(
                    (torch.tensor(list(last), dtype=torch.int64),),
                    torch.tensor(list(last.values()), dtype=torch.int64),
                )
                slots.clear()
                values.clear()

    def _relocate(self, request: _Request) -> None:
        for model in self.models:
            allocator = self.swa_pages[model]
            old = request.swa_pages[model]
            moved = {page_no: allocator.take_highest() for page_no in sorted(old)}
            for page in old.values():
                allocator.give_back(page)
            self._remap_pages(request, model, moved)

    def _register(self, shuffle: int) -> None:
        rng = random.Random(shuffle)
        for model in self.models:
            allocator = self.swa_pages[model]
            allocator.reset()
            order = sorted(allocator.free)
            rng.shuffle(order)
            self.mappings[model] = torch.zeros_like(self.mappings[model])
            for request in self.requests.values():
                relaid = {page_no: order.pop() for page_no in sorted(request.swa_pages[model])}
                for page in relaid.values():
                    allocator.take_page(page)
                self._remap_pages(request, model, relaid)
        self.mapping_epoch += 1

    def _plan_forward(self, event: Event, index: int) -> ForwardPlan:
        c = self.config
        if event.mode in SPECULATIVE_MODES and not c.speculative:
            raise ScenarioError(f"a {event.mode} forward needs speculative decoding on")
        requests = [self._live(rid) for rid in event.requests]
        model = "draft" if event.mode in DRAFT_MODES and c.draft_model else "target"
        per_request = {
            "decode": [1] * len(requests),
            "draft": [1] * len(requests),
            "verify": [c.num_draft_tokens] * len(requests),
            "extend": list(event.tokens),
            "draft_extend": list(event.tokens),
            "idle": [],
        }[event.mode]
        graph_batch_size = self._graph_batch_size(event, sum(per_request))
        chunks = _split(list(range(len(requests))), event.micro_batches)
        steps = []
        for _ in range(event.steps):
            tokens = [[self._allocate_token(r) for _ in range(n)] for r, n in zip(requests, per_request)]
            step = []
            for chunk in chunks:
                padding = event.pad if event.mode == "idle" and not event.graph else 0
                if graph_batch_size is not None:
                    padding = graph_batch_size - sum(per_request[i] for i in chunk)
                step.append(_step_inputs(
                    [requests[i] for i in chunk], [tokens[i] for i in chunk], padding,
                    counts_draft_tokens=event.mode != "verify",
                ))
            steps.append(tuple(step))
        calls = self._calls(event)
        mutation = event.mutation
        if mutation is not None and mutation.after_calls > len(calls) * event.steps:
            raise ScenarioError(
                f"mutation.after_calls {mutation.after_calls} exceeds the forward's "
                f"{len(calls) * event.steps} store calls"
            )
        self.version += 1
        return ForwardPlan(index, event, model, tuple(steps), calls, graph_batch_size)

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
        configuration when its scenario was built."""
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


def replay_events(state: EngineState, events) -> Iterator[ForwardPlan]:
    """Apply ``events`` to ``state`` as the engine would, yielding each forward's plan.

    For readers of a scenario's shape (benchmarks, reports): no subject is involved, and a
    forward's mid-forward mutation is applied once its plan has been yielded.
    """
    for index, event in enumerate(events):
        where = f"events[{index}]"
        if event.op != "forward":
            state.apply(event, where)
            continue
        yield state.plan_forward(event, index, where)
        if event.mutation is not None:
            state.apply(event.mutation, f"{where}.mutation")
        state.finish_forward()


def _split(items: list[int], parts: int) -> list[list[int]]:
    """Contiguous, near-equal chunks (two-batch overlap splits a batch the same way)."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def _step_inputs(requests: list[_Request], tokens: list[list[tuple[int, int]]], padding: int,
                 counts_draft_tokens: bool = True) -> StepInputs:
    token_slots, positions, locs, counts, prefixes, lengths = [], [], [], [], [], []
    for request, written in zip(requests, tokens):
        counts.append(len(written))
        # tokens are allocated at consecutive positions from the request's length
        prefix = written[0][1]
        prefixes.append(prefix)
        lengths.append(prefix + len(written) if counts_draft_tokens else prefix)
        for full, position in written:
            token_slots.append(request.slot)
            positions.append(position)
            locs.append(full)
    live = len(locs)
    pad_requests = padding if all(c == 1 for c in counts) else 0
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    return StepInputs(
        request_ids=tuple(r.rid for r in requests),
        req_slots=as_tensor([r.slot for r in requests] + [DUMMY_SLOT] * pad_requests),
        token_counts=as_tensor(counts + [1] * pad_requests),
        prefix_lens=as_tensor(prefixes + [0] * pad_requests),
        seq_lens=as_tensor(lengths + [1] * pad_requests),
        token_slots=as_tensor(token_slots + [DUMMY_SLOT] * padding),
        positions=as_tensor(positions + [0] * padding),
        out_cache_loc=as_tensor(locs + [DUMMY_SLOT] * padding),
        num_live=live,
    )
