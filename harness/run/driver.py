"""The lifecycle of one run: the subject built per model, the scenario's events applied to
the engine model, and each forward handed to the subject, eagerly or as a graph replay.

The driver owns the order of everything and hands each job to a collaborator: the store
calls of a step (:mod:`~swafuzz.run.store_calls`), the judge of their answers, the input
guard, the mapping sync and the graph forwards.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from ..api import CodeNames, ForwardBatch, ModelSpec, Subject
from ..quantities import answered, reads_per_layer
from ..reference import EngineState, ForwardPlan, Scenario, StepInputs, request_length_bound

from . import diagnosis as dx
from .arena import ALTERNATING_SLOTS, Arena
from .calls import SubjectCalls, call_method
from .devices import HostTimeline
from .graph_forwards import MODES, GraphForwards
from .guard import MAX_NAME_CHARS, CallGuard, SubjectFailure, quoted
from .inputs import BATCH_INPUTS, Handed, InputGuard
from .judge import Judge, StoreOutcome
from .mappings import MappingSync
from .progress import Progress, Stop, Where
from .store_calls import StoreCalls


class Driver:
    """Runs ``scenario`` through ``subject_cls`` and the engine model. ``threads``:
    micro-batches of single-step forwards call the subject from their own threads, and
    :attr:`StoreCalls.schedules <swafuzz.run.store_calls.StoreCalls.schedules>` records the
    order their calls entered it."""

    def __init__(self, subject_cls: type[Subject], scenario: Scenario, device: torch.device,
                 timeout_s: float, threads: bool, timeline: HostTimeline,
                 on_store: Callable[[StoreOutcome], None] | None, keep_going: bool, deadline: float | None):
        self.subject_cls = subject_cls
        self.timeline = timeline
        self.threads = threads
        self.scenario = scenario
        self.config = scenario.config
        self.device = device
        self.on_host = device.type == "cpu"
        self.state = EngineState(scenario.config)
        self.history = dx.History()
        self.arena = Arena(device)
        self.progress = Progress(deadline)
        self.subjects: dict[str, Subject] = {}
        self.mappings = MappingSync(self.state, self.history, self.arena, self.progress, device, self._register)
        names = code_names(subject_cls)
        self.inputs = InputGuard(self.progress, self.mappings, self.on_host, names)
        self.calls = SubjectCalls(self.progress, self.inputs, names)
        answered_by = getattr(subject_cls, "answered_by", None)
        self.judge = Judge(self.state, self.history, self.progress, self.inputs, subject_cls.truth.value, device,
                           on_store, keep_going, quoted(answered_by) if type(answered_by) is str else None)
        # per layer, the per-step values the subject answers that the layer reads
        quantities = answered(getattr(subject_cls, "answers", ()))
        value_reads = reads_per_layer(quantities, self.config.stage_layers, self.config.compress_ratio)
        self.req_to_token = _req_to_token(scenario, device) if any(q.reads_req_to_token for q in quantities) else None
        self.specs = {model: ModelSpec.of(self.config, model, device, self.req_to_token) for model in self.config.models}
        # a table value's columns in a graph's static buffers (its widest)
        value_columns = {q.name: q.graph_columns(self.specs["target"]) for q in quantities if q.graph_columns}
        self.store_calls = StoreCalls(self.progress, self.calls, self.judge, timeline, timeout_s, value_reads)
        self.graph_forwards = GraphForwards(self.config, device, self.subjects, self.progress, self.calls,
                                            self.inputs, self.judge, self.arena, timeline, self.history,
                                            self._new_forward_id, self._backend, value_reads, value_columns)
        self.backends: dict[tuple[str, int], SimpleNamespace] = {}
        self.eager_forwards: dict[str, int] = {}  # per model: eager forwards so far (picks the slot)
        self.next_forward_id = 0
        # per ForwardBatch.forward_id: the forward it was made in (its count, and its mode)
        self.forward_of_id: dict[int, tuple[int, str]] = {}
        self.judge.held_in = self._held_in

    def run(self, guard: CallGuard) -> None:
        """Set the subject up and run the events, every call through ``guard``; a
        divergence that ends the run is the judge's first."""
        self.calls.guard = guard
        try:
            self.setup()
            self.events()
        except Stop as stop:
            self.judge.first_divergence = self.judge.first_divergence or stop.divergence

    def setup(self) -> None:
        for model, spec in self.specs.items():
            where = Where(model=model)
            name = quoted(self.subject_cls.__name__, MAX_NAME_CHARS)
            self.subjects[model] = self.calls.invoke(where, f"{name}(spec)", self.subject_cls, spec)
        self._sync("setup")

    def events(self) -> None:
        progress = self.progress
        for index, event in enumerate(self.scenario.events):
            where = f"events[{index}]"
            if event.op != "forward":
                self.state.apply(event, where)
                self._sync(f"event {index} ({event.op})")
                continue
            plan = progress.plan = self.state.plan_forward(event, index, where, self.scenario.events)
            progress.forward += 1
            self._sync(f"the allocation for forward {progress.forward}")
            if self.req_to_token is not None:
                _write_req_to_token(self.req_to_token, plan)
            if plan.graph_batch_size is None:
                self._eager_forward(plan)
            else:
                self.graph_forwards.forward(plan)
            self.state.finish_forward()
            self._sync(f"the eviction after forward {progress.forward}", until_called=True)
        self.inputs.check_mappings("the end of the run")

    def _eager_forward(self, plan: ForwardPlan) -> None:
        event = plan.event
        subject = self.subjects[plan.model]
        step_tensors = self._eager_inputs(plan)
        batches = [self._batch(plan, mb, plan.steps[0][mb], step_tensors[0][mb]) for mb in range(plan.num_micro_batches)]
        handed = self.inputs.handed
        handed.batches = batches
        timeline = self.timeline
        timeline.begin_forward()
        if not event.skip_init:
            timeline.delay_side_stream()
            for mb, batch in enumerate(batches):
                where = Where(plan, micro_batch=mb)
                self.calls.method(where, subject, "init_forward_metadata", batch)
        store = timeline.on_streams(self.calls.looked_up(Where(plan), subject, "swa_write_location"))
        self.inputs.ran("swa_write_location")
        calls, mutation = plan.calls, event.mutation
        for step, step_inputs in enumerate(plan.steps):
            if step:
                if not self.inputs.fields_named():  # checked before the fields are pointed at the step's tensors
                    raise Stop(self.inputs.input_written())
                for batch, tensors in zip(batches, step_tensors[step]):
                    for name, tensor in tensors.items():
                        setattr(batch, name, tensor)
                    batch.draft_step = step
                handed.step = step
                timeline.begin_forward()  # the step's new inputs were copied on the current stream
            if (self.threads and plan.num_micro_batches > 1 and len(plan.steps) == 1 and mutation is None
                    and not self.store_calls.value_reads):
                self.store_calls.threaded(plan, batches, step_inputs, timeline.consumed(
                    self.calls.looked_up(Where(plan), subject, "swa_write_location")))
                continue
            # the mutation lands before the call it counts to
            cut = mutation.after_calls - step * len(calls) if mutation is not None else -1
            if 0 <= cut < len(calls):
                self.store_calls.make(plan, step, batches, store, calls[:cut], subject)
                self._mutate(plan)
                self.store_calls.make(plan, step, batches, store, calls[cut:], subject)
            else:
                self.store_calls.make(plan, step, batches, store, calls, subject)
        self.inputs.check_inputs(plan)
        if mutation is not None and mutation.after_calls == len(calls) * len(plan.steps):
            self._mutate(plan)  # after the last store: it shows in the next forward

    def _mutate(self, plan: ForwardPlan) -> None:
        mutation = plan.event.mutation
        self.state.apply(mutation, f"events[{plan.index}].mutation")
        self._sync(f"the {mutation.op} inside forward {self.progress.forward}")

    def _sync(self, what: str, until_called: bool = False) -> None:
        """Bring the subject's mappings in line with the engine state (:meth:`MappingSync.sync`),
        once a subject that wrote into one since the last check has been stopped."""
        if self.progress.call != self.inputs.mappings_checked_at:
            self.inputs.check_mappings(what)
        self.mappings.sync(what, until_called)

    def _register(self, model: str, mapping: torch.Tensor) -> None:
        """Hand ``model``'s newly placed mapping to its subject; graphs captured before it
        go, as the engine captures again after a pool is rebuilt."""
        self.graph_forwards.forget(model)
        self.calls.method(Where(model=model), self.subjects[model], "register_mapping", mapping)

    def _batch(self, plan: ForwardPlan, mb: int, inputs: StepInputs, tensors: dict[str, torch.Tensor]) -> ForwardBatch:
        return ForwardBatch(
            forward_id=self._new_forward_id(),
            mode=MODES[plan.event.mode],
            micro_batch=mb,
            backend=self._backend(plan.model, mb),
            num_live_tokens=inputs.num_live,
            num_draft_steps=len(plan.steps),
            stream=self.timeline.stream_for(mb),
            side_stream=self.timeline.side_stream,
            **tensors,
        )

    def _eager_inputs(self, plan: ForwardPlan) -> list[list[dict[str, torch.Tensor]]]:
        """Per draft step and micro-batch, the input tensors, placed in the arena slot of this
        forward (copies: a subject that writes into its inputs must not touch the truth's),
        and the host copy of the lengths. Every step's locations and positions exist from
        the start, as the engine allocates a multi-step draft's locations at once. Each step
        input's tensors are packed one after another, the host copy of the lengths last, so
        the placed ones are views of one copy, in the same order; the input guard's
        :attr:`~InputGuard.handed` keeps it to check them with one comparison. On a device
        the host copy stays on the host."""
        count = self.eager_forwards.get(plan.model, 0)
        self.eager_forwards[plan.model] = count + 1
        on_host = self.on_host
        sources, sizes = [], []
        for step, step_inputs in enumerate(plan.steps):
            for inputs in step_inputs:
                packed, packed_sizes = inputs.packed, inputs.packed_sizes
                # later steps: the fields after the requests' slots and token counts
                skip = packed_sizes[0] + packed_sizes[1] if step else 0
                if on_host:
                    sources.append(packed[skip:] if skip else packed)
                    sizes += packed_sizes[2:] if step else packed_sizes
                else:  # all but the host copy of the lengths, last
                    sources.append(packed[skip:packed.shape[0] - packed_sizes[-1]])
                    sizes += packed_sizes[2 if step else 0:-1]
        block, views = self.arena.place_split(("eager", plan.model, count % ALTERNATING_SLOTS), sources, sizes)
        placed = iter(views)
        fields = []
        for step, step_inputs in enumerate(plan.steps):
            names = BATCH_INPUTS[2:] if step else BATCH_INPUTS
            if not on_host:
                names = names[:-1]
            step_fields = []
            for inputs in step_inputs:
                tensors = dict(zip(names, placed))
                if not on_host:
                    tensors["seq_lens_cpu"] = inputs.host_seq_lens.clone()
                step_fields.append(tensors)
            fields.append(step_fields)
        self.inputs.handed = Handed(plan, [], fields, block=block, block_held=sources, block_version=block._version)
        return fields

    def _backend(self, model: str, mb: int) -> SimpleNamespace:
        backend = self.backends.get((model, mb))
        if backend is None:
            backend = self.backends[model, mb] = SimpleNamespace()
        return backend

    def _new_forward_id(self) -> int:
        self.next_forward_id += 1
        plan = self.progress.plan
        self.forward_of_id[self.next_forward_id] = (self.progress.forward, plan.event.mode if plan else "setup")
        return self.next_forward_id

    def _held_in(self, plan: ForwardPlan, step: int, mb: int, out) -> str | None:
        """Where the subject says ``out``, a stale eager answer of micro-batch ``mb``, sat in
        its state: "FIELD, as forward 1 (decode) set it"; None where it does not say (a
        replay's answers are what the capture recorded, not what the subject holds)."""
        handed = self.inputs.handed
        if plan.graph_batch_size is not None or handed is None or handed.plan is not plan:
            return None
        try:
            origin = self.calls.guard.call("answer_origin", call_method, self.subjects[plan.model], "answer_origin",
                                           handed.batches[mb], out)
        except SubjectFailure:
            return None  # the question is the harness's: a subject that cannot answer it has told nothing
        if type(origin) is not tuple or len(origin) != 2 or type(origin[0]) is not str or type(origin[1]) is not int:
            return None
        field, forward_id = origin
        if forward_id not in self.forward_of_id:
            return None
        forward, mode = self.forward_of_id[forward_id]
        return f"{quoted(field, MAX_NAME_CHARS)}, as forward {forward} ({mode}) set it"


def code_names(subject_cls: type[Subject]) -> CodeNames:
    """The subject's :class:`~swafuzz.api.CodeNames`, as plain text a sentence can show: read
    only from plain dicts of ``str`` (anything else is the subject's code, and names nothing)."""
    names = getattr(subject_cls, "code_names", None)
    if type(names) is not CodeNames:
        return CodeNames({}, {})
    return CodeNames(*({key: quoted(value) for key, value in part.items() if type(key) is str and type(value) is str}
                       if type(part) is dict else {} for part in (names.calls, names.inputs)))


def _req_to_token(scenario: Scenario, device: torch.device) -> torch.Tensor:
    """SGLang's ``req_to_token`` for ``scenario``: a row per request slot, as many columns
    as any of its requests can hold tokens (a multiple of the page size), zeros."""
    config = scenario.config
    page = config.full_page_size
    context = min(max(1, request_length_bound(scenario)), config.full_pool_size)
    return torch.zeros(config.num_req_slots, -(-context // page) * page, dtype=torch.int32, device=device)


def _write_req_to_token(req_to_token: torch.Tensor, plan: ForwardPlan) -> None:
    """Each live token of the forward's steps at its request slot and position, before the
    forward runs (as the scheduler writes the tokens it allocates)."""
    for step_inputs in plan.steps:
        for inputs in step_inputs:
            live = slice(0, inputs.num_live)
            where = (inputs.token_slots[live], inputs.positions[live])
            req_to_token.index_put_(tuple(i.to(req_to_token.device) for i in where),
                                    inputs.out_cache_loc[live].to(req_to_token.device, torch.int32))
