"""The differential executor: one scenario, reference and subject side by side.

Every store-location request is checked against the reference computed from the engine
state at that moment (values, int32, length, device, padding on the dummy slot). The run
stops at the first divergence and explains it. Whatever the subject does, raising, hanging
or returning garbage, comes back as a :class:`~swafuzz.run.diagnosis.Divergence`; only an
invalid scenario raises (:class:`reference.ScenarioError`).
"""

from __future__ import annotations

import operator
import sys
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from time import monotonic
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import torch
from torch.autograd.graph import increment_version

from ..reference import PACKED_INPUTS, EngineState, ForwardPlan, Scenario, StepInputs

from . import diagnosis as dx
from ..api import SUBJECT_API_VERSION, SUPPORTED_API_VERSIONS, ForwardBatch, ForwardMode, ModelSpec, Subject, Truth
from .arena import ALTERNATING_SLOTS, Arena
from .graphs import GraphCaptureError, make_graph
from .devices import HostTimeline, timeline_for
from .guard import (MAX_NAME_CHARS, CallGuard, SubjectFailure, SubjectTimeout, TorchState, failure_of, load_subject,
                    quoted, type_name)
from ..process.channel import announce_scenario
from ..errors import ModelGap, NotCheckable, SubjectError, UnmodelledPath

DEFAULT_TIMEOUT_S = 10.0

# The graph inputs a subject sees and what capture leaves in them: the decode graph runner
# allocates them zeroed at the largest captured size (DecodeInputBuffers in SGLang); decode
# has one token per request, so the per-request token counts are ones.
STATIC_INPUTS = {
    "req_pool_indices": 0, "extend_seq_lens": 1, "positions": 0, "out_cache_loc": 0,
    # padded requests have length 1, as the runner's seq_len fill value; decode has no prefix
    "seq_lens": 1, "extend_prefix_lens": 0,
}


def model_gap(exc: BaseException | None) -> ModelGap | None:
    """The :class:`ModelGap` behind ``exc``, also where the subject's code wrapped it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ModelGap):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@dataclass(frozen=True)
class RunResult:
    divergence: dx.Divergence | None
    checks: int  # store-location answers compared
    forwards: int
    # threaded runs: per forward event index, the micro-batch of each call in the order the
    # calls entered the subject (an Event.order that replays the run without threads)
    schedules: dict[int, tuple[int, ...]] = field(default_factory=dict)
    elapsed_s: float = field(default=0.0, compare=False)  # the run's own time, setup included: not its outcome

    @property
    def passed(self) -> bool:
        return self.divergence is None


@dataclass(frozen=True)
class StoreOutcome:
    """One checked store: where it ran and its divergence (None: it matched the reference)."""

    forward: int
    draft_step: int
    micro_batch: int
    layer_id: int | None
    divergence: dx.Divergence | None


class DeadlinePassed(KeyboardInterrupt):
    """A run's deadline passed. A KeyboardInterrupt, so that neither a subject's nor
    Hypothesis's ``except Exception`` takes it for a failure: Hypothesis stops at once."""

    def __init__(self, checks: int):
        super().__init__(f"the deadline passed after {checks} checked stores")
        self.checks = checks  # stores compared before it passed, the cut-short example's included


class _Stop(Exception):
    def __init__(self, divergence: dx.Divergence):
        self.divergence = divergence


def check_subject(subject: Any) -> type[Subject]:
    """Reject things that are not subjects with a message that says what to fix. What the
    harness reads of the class is read here, where a metaclass or a ``__class__`` makes it
    the subject's code: what that raises is the subject's error."""
    try:
        return _checked(subject)
    except SubjectFailure as failure:
        raise SubjectError(failure.message) from None


def _checked(subject: Any) -> type[Subject]:
    what = "reading the subject's class"
    if not load_subject(what, isinstance, subject, type):
        raise SubjectError(f"a subject is a class, got {type_name(subject)} {_shown(subject)}")
    name, truth, version, store = load_subject(what, _read_class, subject, _READ_FIRST)
    load_subject(what, _read_class, subject, _READ_LATER)
    name = quoted(name, MAX_NAME_CHARS) if type(name) is str else type_name(subject)
    if not load_subject(what, isinstance, truth, Truth):
        raise SubjectError(
            f"{name}.truth must be Truth.POOL or Truth.RING, got {_shown(truth)}"
        )
    if type(version) is not int or version not in SUPPORTED_API_VERSIONS:
        newer = type(version) is int and version > SUBJECT_API_VERSION
        raise SubjectError(
            f"{name} targets subject API version {_shown(version)}; this harness runs "
            f"versions {', '.join(map(str, SUPPORTED_API_VERSIONS))} (version {SUBJECT_API_VERSION} is current)"
            + ("; a newer swafuzz is needed" if newer else "")
        )
    if not callable(store):
        raise SubjectError(f"{name} has no swa_write_location method")
    return subject


_READ_FIRST = ("__name__", "truth", "api_version", "swa_write_location")
# the class attributes that reports, search settings and device checks read
_READ_LATER = ("requires", "realistic_exclusions", "__doc__", "__module__", "__qualname__", "call_sites")


def _read_class(subject: type, names: Sequence[str]) -> list[Any]:
    return [getattr(subject, name, None) for name in names]


def _shown(value: Any) -> str:
    """A value of the subject's for a one-line message, read without trusting its ``repr``."""
    try:
        return quoted(load_subject("repr()", repr, value), MAX_NAME_CHARS)
    except SubjectFailure as failure:
        return f"(whose {failure.message})"


def check_device(subject: type[Subject], device: torch.device) -> None:
    if "gpu_streams" in getattr(subject, "requires", ()) and device.type != "cuda":
        raise NotCheckable(
            f"{subject.__name__} orders its work with GPU streams, which are not real on "
            f"{device.type}: it is not checkable there (run with --device cuda)"
        )


def run_scenario(
    subject: type[Subject],
    scenario: Scenario,
    *,
    device: str | torch.device = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: bool = False,
    stream_delay_cycles: int = 0,
    on_store: Callable[[StoreOutcome], None] | None = None,
    keep_going: bool = False,
    deadline: float | None = None,
) -> RunResult:
    """Run ``scenario`` through ``subject`` and the reference; stop at the first divergence.

    ``threads``: micro-batches of single-step forwards call the subject from their own
    threads (a stress mode: interleavings vary from run to run; the result's ``schedules``
    replay the one that happened).

    ``stream_delay_cycles`` (GPU only): a sleep kernel of that many cycles is queued on the
    engine's side stream before each metadata init, widening race windows.

    ``on_store`` sees every checked store. ``keep_going`` keeps running after wrong values
    (rows, padding, dtype, length, device), so a report can draw every stale store; the
    result holds the first divergence. A subject that raises or hangs still ends the run.

    ``deadline`` (a ``time.monotonic()`` reading): once it has passed, the run does not
    start, or stops after the subject call that passed it, graph warm-ups and captures included, by raising
    :class:`DeadlinePassed` (where streams defer the checks, after the draft step's calls).
    """
    started = monotonic()
    if deadline is not None and started >= deadline:
        raise DeadlinePassed(0)
    announce_scenario(scenario)  # to a supervising process, which reports it should this one die
    device = torch.device(device)
    check_device(check_subject(subject), device)
    timeline = timeline_for(device, stream_delay_cycles)
    run = _Run(subject, scenario, device, timeout_s, threads, timeline, on_store, keep_going, deadline)
    with CallGuard(timeout_s) as guard:
        run.guard = guard
        try:
            run.setup()
            run.events()
        except _Stop as stop:
            run.first_divergence = run.first_divergence or stop.divergence
    return RunResult(run.first_divergence, run.checks, run.forward, run.schedules, monotonic() - started)


class _Run:
    def __init__(self, subject_cls: type[Subject], scenario: Scenario, device: torch.device,
                 timeout_s: float, threads: bool, timeline: HostTimeline,
                 on_store: Callable[[StoreOutcome], None] | None, keep_going: bool, deadline: float | None):
        self.subject_cls = subject_cls
        self.deadline = deadline
        self.on_store = on_store
        self.keep_going = keep_going
        self.timeline = timeline
        self.timeout_s = timeout_s
        self.threads = threads
        self.schedules: dict[int, tuple[int, ...]] = {}
        self.scenario = scenario
        self.config = scenario.config
        self.device = device
        self.on_host = device.type == "cpu"
        if self.on_host:
            self.on_device = operator.attrgetter("is_cpu")
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.on_device = lambda t: t.device.type == device.type and t.get_device() == index
        self.truth = subject_cls.truth.value
        self.state = EngineState(scenario.config)
        self.history = dx.History()
        self.guard: CallGuard
        self.subjects: dict[str, Subject] = {}
        self.mappings: dict[str, torch.Tensor] = {}
        self.mapping_versions: dict[str, int] = {}  # each registered tensor's version after the last sync
        # per model, the mappings registered before the current one that the harness no longer
        # writes, and what each held when the next was registered: the subject may keep them
        self.earlier_mappings: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
        self.mappings_checked_at = -1  # the call count when the mappings were last checked
        self.handed: _Handed | None = None  # the current forward's inputs
        self.plan: ForwardPlan | None = None  # the current (or latest) forward
        self.capturing = False  # a graph records what runs
        self.backends: dict[tuple[str, int], SimpleNamespace] = {}
        self.graphs: dict[tuple, tuple[Any, ForwardBatch, list[torch.Tensor]]] = {}
        self.arena = Arena(device)
        self.static_buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.static_seq_lens_cpu: dict[str, torch.Tensor] = {}
        self.eager_forwards: dict[str, int] = {}  # per model: eager forwards so far (picks the slot)
        self.seen_epoch = 0
        self.seen_version = -1
        self.unsynced_since: str | None = None  # the first change a deferred sync has yet to write
        self.forward = 0
        self.next_forward_id = 0
        self.checks = 0
        self.call = 0
        self.first_divergence: dx.Divergence | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def setup(self) -> None:
        c = self.config
        for model in c.models:
            spec = ModelSpec.of(c, model, self.device)
            where = _Where(model=model)
            name = quoted(self.subject_cls.__name__, MAX_NAME_CHARS)
            self.subjects[model] = self._invoke(where, f"{name}(spec)", self.subject_cls, spec)
        self._sync("setup")

    def events(self) -> None:
        for index, event in enumerate(self.scenario.events):
            where = f"events[{index}]"
            if event.op != "forward":
                self.state.apply(event, where)
                self._sync(f"event {index} ({event.op})")
                continue
            plan = self.plan = self.state.plan_forward(event, index, where, self.scenario.events)
            self.forward += 1
            self._sync(f"the allocation for forward {self.forward}")
            if plan.graph_batch_size is None:
                self._eager_forward(plan)
            else:
                self._graph_forward(plan)
            self.state.finish_forward()
            self._sync(f"the eviction after forward {self.forward}", until_called=True)
        self._check_mappings("the end of the run")

    def _eager_forward(self, plan: ForwardPlan) -> None:
        event = plan.event
        subject = self.subjects[plan.model]
        step_tensors = self._eager_inputs(plan)
        batches = [self._batch(plan, mb, plan.steps[0][mb], step_tensors[0][mb]) for mb in range(plan.num_micro_batches)]
        self.handed.batches = batches
        timeline = self.timeline
        timeline.begin_forward()
        if not event.skip_init:
            timeline.delay_side_stream()
            for mb, batch in enumerate(batches):
                where = _Where(plan, micro_batch=mb)
                self._invoke(where, "init_forward_metadata", _method, subject, "init_forward_metadata", batch)
        store = timeline.on_streams(self._looked_up(_Where(plan), subject, "swa_write_location"))
        calls, mutation = plan.calls, event.mutation
        for step, step_inputs in enumerate(plan.steps):
            if step:
                if not self._fields_named():  # checked before the fields are pointed at the step's tensors
                    raise _Stop(self._input_written())
                for batch, tensors in zip(batches, step_tensors[step]):
                    for name, tensor in tensors.items():
                        setattr(batch, name, tensor)
                    batch.draft_step = step
                self.handed.step = step
                timeline.begin_forward()  # the step's new inputs were copied on the current stream
            if self.threads and plan.num_micro_batches > 1 and len(plan.steps) == 1 and mutation is None:
                self._threaded_calls(plan, batches, step_inputs, timeline.consumed(self._looked_up(_Where(plan), subject, "swa_write_location")))
                continue
            # the mutation lands before the call it counts to
            cut = mutation.after_calls - step * len(calls) if mutation is not None else -1
            if 0 <= cut < len(calls):
                self._store_calls(plan, step, batches, store, calls[:cut])
                self._mutate(plan)
                self._store_calls(plan, step, batches, store, calls[cut:])
            else:
                self._store_calls(plan, step, batches, store, calls)
        self._check_inputs(plan)
        if mutation is not None and mutation.after_calls == len(calls) * len(plan.steps):
            self._mutate(plan)  # after the last store: it shows in the next forward

    def _store_calls(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
                     calls: tuple[tuple[int, int], ...]) -> None:
        """Make ``calls`` of one draft step, during which the engine state stands still, and
        check every answer. On the host an answer is checked as it returns, before the next
        call could overwrite it; on a device, once the streams have settled, in call order
        (the answers are what the streams read)."""
        if self.timeline.deferred:
            answers = list(self._answers(plan, step, batches, store, calls))
            self.timeline.settle()
            self._check_answers(plan, step, answers)
        else:
            self._call_and_check(plan, step, batches, store, calls)

    def _answers(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
                 calls: tuple[tuple[int, int], ...]) -> Iterator[tuple[int, int, Any, int]]:
        """Each call's answer, the call made when the previous answer has been taken."""
        guarded = self.guard.call
        for mb, layer_id in calls:
            self.call += 1
            try:
                out = guarded("swa_write_location", store, batches[mb], layer_id)
            except SubjectFailure as failure:
                raise self._failed(_Where(plan, step, mb, layer_id), failure) from None
            self._stop_if_past_deadline()
            yield mb, layer_id, out, self.call - 1

    def _call_and_check(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
                        calls: tuple[tuple[int, int], ...]) -> None:
        """:meth:`_check_answers` with the calls made in the same loop, each answer checked
        before the next call: the host's path, where a call costs about as much as its check.
        The guard is marked in flight once for the calls (and cleared while a store that the
        fast comparison did not settle is judged); each call still has its own serial, so a
        hang or exception is attributed to it."""
        guard, on_device, every_store, right = self.guard, self.on_device, self.on_store is not None, _right
        modes_kept = guard.torch_state.modes_kept
        deadline = self.deadline
        truths: list[torch.Tensor | None] = [None] * plan.num_micro_batches
        first, checks, serial = self.call, self.checks, guard.serial
        before = serial
        guard.in_call = True
        try:
            for call, (mb, layer_id) in enumerate(calls, first):
                guard.serial = serial = serial + 1
                try:
                    out = store(batches[mb], layer_id)
                    if guard.fired_serial == serial:  # the subject swallowed the alarm
                        raise SubjectTimeout()
                except BaseException as exc:
                    raise guard.failure("swa_write_location", exc) from None
                if not modes_kept():  # a mode the subject left could answer the comparison
                    guard.torch_state.restore()
                # between calls the harness only compares (a lowered recursion limit lets the
                # subject's own call run deeper than that, and no other torch setting changes
                # a comparison); its other work restores the harness's state
                expected = truths[mb]
                if expected is None:
                    guard.in_call = False
                    guard.restore_harness_state()
                    expected = truths[mb] = self._truth(plan, step, mb)
                    guard.in_call = True
                matched = right(out, expected, on_device)
                if not matched or every_store:
                    guard.in_call = False
                    guard.restore_harness_state()
                    self.call, self.checks = call + 1, checks + call + 1 - first
                    self._verdict(plan, step, mb, layer_id, out, expected, matched, call)
                    guard.in_call = True
                if deadline is not None and monotonic() >= deadline:
                    self.call, self.checks = call + 1, checks + call + 1 - first
                    raise DeadlinePassed(self.checks)
        except (SubjectFailure, SubjectTimeout) as exc:
            # the call that failed is the latest to start (an alarm may also land in its check)
            started = guard.serial - before
            self.call, self.checks = first + started, checks + started - 1
            failure = exc if isinstance(exc, SubjectFailure) else guard.failure("swa_write_location", exc)
            mb, layer_id = calls[started - 1]
            raise self._failed(_Where(plan, step, mb, layer_id), failure) from None
        finally:
            guard.in_call = False
            guard.restore_harness_state()
        self.call, self.checks = first + len(calls), checks + len(calls)

    def _threaded_calls(self, plan: ForwardPlan, batches: list[ForwardBatch],
                        step_inputs: tuple[StepInputs, ...], store) -> None:
        """Each micro-batch runs its layers on its own thread, as on concurrent streams.

        Answers are cloned as they return (what the layer would write at that moment) and
        checked afterwards in the order the calls ran.
        """
        count = plan.num_micro_batches
        layers = [[layer for mb, layer in plan.calls if mb == m] for m in range(count)]
        rows = [inputs.num_rows for inputs in step_inputs]
        entered: list[int] = []
        answers: list[list[Any]] = [[] for _ in range(count)]
        lock = threading.Lock()
        start = threading.Barrier(count)

        def run_micro_batch(mb: int) -> None:
            start.wait()
            for layer_id in layers[mb]:
                # one call at a time, so the recorded order is the order that happened and
                # replays exactly; the threads decide which micro-batch goes next
                with lock:
                    entered.append(mb)
                    try:
                        out = store(batches[mb], layer_id)
                    except BaseException as exc:  # noqa: BLE001 - reported as the subject's failure
                        answers[mb].append(failure_of("swa_write_location", exc))
                        return
                    answers[mb].append(_snapshot(out, rows[mb]))
                time.sleep(0)  # let another micro-batch take the next turn: the lock is not fair

        workers = [threading.Thread(target=run_micro_batch, args=(mb,), daemon=True) for mb in range(count)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often, so interleavings actually vary
        try:
            for worker in workers:
                worker.start()
            budget = self.timeout_s * len(plan.calls)
            for worker in workers:
                worker.join(budget)
        finally:
            sys.setswitchinterval(interval)
        self.guard.restore_harness_state()
        self.schedules[plan.index] = tuple(entered)
        if any(worker.is_alive() for worker in workers):
            failure = SubjectFailure("timeout", f"micro-batch threads did not finish within {budget:g} s")
            raise self._failed(_Where(plan), failure)

        def in_call_order() -> Iterator[tuple[int, int, Any, int]]:
            taken = [0] * count
            for mb in entered:
                index = taken[mb]
                taken[mb] += 1
                answer = answers[mb][index]
                self.call += 1
                if isinstance(answer, SubjectFailure):
                    raise self._failed(_Where(plan, 0, mb, layers[mb][index]), answer)
                yield mb, layers[mb][index], answer, self.call - 1

        self._check_answers(plan, 0, in_call_order())

    def _graph_forward(self, plan: ForwardPlan) -> None:
        key = (plan.model, plan.graph_batch_size, plan.calls)
        if key not in self.graphs:
            self.graphs[key] = self._capture(plan)
        graph, static, sinks, fields = self.graphs[key]
        inputs = plan.steps[0][0]
        # the harness's own references to the static inputs: the batch's may be re-pointed
        held = {name: getattr(inputs, _PACKED_FIELD[name]) for name in fields}
        for name, tensor in fields.items():
            tensor.copy_(held[name])
        static.forward_id = self._new_forward_id()
        static.mode = _MODES[plan.event.mode]
        static.num_live_tokens = inputs.num_live
        self.handed = _Handed(plan, [static], [[fields]], held)
        subject = self.subjects[plan.model]
        if not plan.event.skip_init:
            self._invoke(_Where(plan), "init_replay_metadata", _method, subject, "init_replay_metadata", static)
        self._invoke(_Where(plan), "graph replay", graph.replay)
        self.timeline.settle()
        self._check_inputs(plan)
        replay = self.call - 1
        self._check_answers(plan, 0, ((mb, layer_id, sink, replay) for (mb, layer_id), sink in zip(plan.calls, sinks)))

    def _capture(self, plan: ForwardPlan) -> tuple[Any, ForwardBatch, list[torch.Tensor], dict[str, torch.Tensor]]:
        """Capture one batch size as the decode graph runner does: metadata for capture once,
        the forward run eagerly ``graph_warmups`` times on the static inputs, then once more
        inside the capture. The harness captures a size at its first replay, on inputs
        reset to what capture at start-up would see."""
        size = plan.graph_batch_size
        subject = self.subjects[plan.model]
        buffers = self._static_buffers(plan.model)
        for name, fill in STATIC_INPUTS.items():
            buffers[name][:size].fill_(fill)
        self.static_seq_lens_cpu[plan.model][:size].fill_(STATIC_INPUTS["seq_lens"])
        fields = {name: buffer[:size] for name, buffer in buffers.items()}
        fields["seq_lens_cpu"] = self.static_seq_lens_cpu[plan.model][:size]
        static = ForwardBatch(
            forward_id=self._new_forward_id(), mode=ForwardMode.DECODE, micro_batch=0,
            backend=self._backend(plan.model, 0), num_live_tokens=0, **fields,
        )
        fills = {**STATIC_INPUTS, "seq_lens_cpu": STATIC_INPUTS["seq_lens"]}
        held = {name: torch.full((size,), fills[name]) for name in fields}
        self.handed = _Handed(plan, [static], [[fields]], held, phase="the graph capture for")
        self._invoke(_Where(plan), "init_capture_metadata", _method, subject, "init_capture_metadata", static)
        for _ in range(self.config.graph_warmups):
            self._run_graph_forward(plan, static, "graph warm-up")
        graph = make_graph(self.device)
        sinks = [torch.empty(size, dtype=torch.int32, device=self.device) for _ in plan.calls]
        static.in_graph = self.capturing = True
        outer = self.guard.torch_state
        try:
            with graph.capture():
                self.guard.torch_state = TorchState()  # the capture's own mode is the harness's
                self._run_graph_forward(plan, static, "graph capture", sinks)
        finally:
            self.capturing = False
            self.guard.torch_state = outer
        static.in_graph = False
        # what the captured work yields for the capture inputs (a GPU capture runs nothing)
        self._invoke(_Where(plan), "graph replay", graph.replay)
        self.timeline.settle()
        self._check_inputs(plan)
        if sinks:
            self.history.record_capture(self.forward, sinks[0].to("cpu", copy=True), 0)
        return graph, static, sinks, fields

    def _run_graph_forward(self, plan: ForwardPlan, static: ForwardBatch, phase: str,
                           sinks: list[torch.Tensor] | None = None) -> None:
        """One run of the forward on the static inputs: a warm-up, or with ``sinks`` the
        captured run, where each layer's answer is consumed before the next layer runs."""
        subject = self.subjects[plan.model]
        self._invoke(_Where(plan), f"init_graph_metadata ({phase})", _method, subject, "init_graph_metadata", static)
        for index, (mb, layer_id) in enumerate(plan.calls):
            where = _Where(plan, 0, mb, layer_id)
            out = self._invoke(where, f"swa_write_location ({phase})", _method, subject, "swa_write_location", static,
                               layer_id)
            problem = self._shape_problem(self._site(where), out, plan.graph_batch_size)
            if problem is not None:
                raise _Stop(problem)
            if sinks is not None:
                # the consumer a store kernel would be: it reads the returned tensor by address
                sinks[index].copy_(out)

    def _static_buffers(self, model: str) -> dict[str, torch.Tensor]:
        """The graph inputs of ``model``, allocated at its first capture (a scenario may
        have graph sizes and never replay one)."""
        if model not in self.static_buffers:
            largest = max(self.config.graph_batch_sizes)
            self.static_buffers[model] = {
                name: self.arena.buffer(("graph", model, name), largest, torch.int64) for name in STATIC_INPUTS
            }
            # the runner keeps a host copy of the lengths beside the device buffer
            self.static_seq_lens_cpu[model] = torch.ones(largest, dtype=torch.int64)
        return self.static_buffers[model]

    def _mutate(self, plan: ForwardPlan) -> None:
        mutation = plan.event.mutation
        self.state.apply(mutation, f"events[{plan.index}].mutation")
        self._sync(f"the {mutation.op} inside forward {self.forward}")

    # ---- checking ----------------------------------------------------------------------

    def _check_answers(self, plan: ForwardPlan, step: int, answers: Iterable[tuple[int, int, Any, int]]) -> None:
        """Check each (micro-batch, layer, answer, call index) of one draft step against the
        reference's rows for its micro-batch, computed at its first answer: the engine state
        stands still while ``answers`` are made."""
        truths: list[torch.Tensor | None] = [None] * plan.num_micro_batches
        on_device, every_store = self.on_device, self.on_store is not None
        for mb, layer_id, out, call in answers:
            expected = truths[mb]
            if expected is None:
                expected = truths[mb] = self._truth(plan, step, mb)
            self.checks += 1
            matched = _right(out, expected, on_device)
            if not matched or every_store:
                self._verdict(plan, step, mb, layer_id, out, expected, matched, call)
            self._stop_if_past_deadline()

    def _truth(self, plan: ForwardPlan, step: int, mb: int) -> torch.Tensor:
        inputs = plan.steps[step][mb]
        expected = self.state.expected(plan.model, inputs, self.truth)
        n = inputs.num_live
        self.history.record_answer(self.forward, plan.event.mode, plan.model, step, mb,
                                   expected if n == expected.shape[0] else expected[:n])
        return expected if self.on_host else expected.to(self.device)

    def _verdict(self, plan: ForwardPlan, step: int, mb: int, layer_id: int, out: Any,
                 expected: torch.Tensor, matched: bool, call: int) -> None:
        """What a store the fast comparison did not settle comes to: its divergence, shown to
        ``on_store``. A wrong answer given after the subject wrote into its inputs is put
        down to the write."""
        divergence = None
        if not matched:
            where = _Where(plan, step, mb, layer_id)
            divergence = self._input_written(where) or self._diagnose(
                self._site(where, call), plan.model, plan.steps[step][mb], out, expected.cpu()
            )
        if self.on_store is not None:
            self.on_store(StoreOutcome(self.forward, step, mb, layer_id, divergence))
        if divergence is not None:
            if not self.keep_going:
                raise _Stop(divergence)
            self.first_divergence = self.first_divergence or divergence

    def _shape_problem(self, site: dx.Site, out: Any, rows: int) -> dx.Divergence | None:
        where = f"At {site.describe()}, swa_write_location"
        # an answer is read only as a plain tensor: a subclass's methods are the subject's code
        if type(out) is not torch.Tensor:
            if isinstance(out, torch.Tensor):
                return site.divergence(
                    dx.NON_TENSOR, f"{where} returned a {type_name(out)} (a tensor subclass), not a torch.Tensor."
                )
            return site.divergence(dx.NON_TENSOR, f"{where} returned {type_name(out)}, not a tensor.")
        if out.is_nested or out.layout is not torch.strided:
            layout = "nested" if out.is_nested else str(out.layout).removeprefix("torch.")
            return site.divergence(dx.NON_TENSOR, f"{where} returned a {layout} tensor, not a dense one.")
        if not self.on_device(out):
            return site.divergence(
                dx.WRONG_DEVICE, f"{where} returned a tensor on {out.device}, not on {self.device}."
            )
        if out.dtype != torch.int32:
            nan = " containing NaN" if (
                out.is_floating_point() and not self.capturing and out.numel() <= _MAX_SCANNED
                and bool(torch.isnan(out).any())
            ) else ""
            return site.divergence(dx.WRONG_DTYPE, f"{where} returned {out.dtype}{nan}, not torch.int32.")
        if out.dim() != 1 or out.shape[0] != rows:
            return site.divergence(
                dx.WRONG_LENGTH, f"{where} returned shape {tuple(out.shape)} for {rows} rows.",
                actual=dx.stored_values(out),
            )
        return None

    def _diagnose(self, site: dx.Site, model: str, inputs: StepInputs, out: Any,
                  expected: torch.Tensor) -> dx.Divergence | None:
        problem = self._shape_problem(site, out, expected.shape[0])
        if problem is not None:
            if problem.kind == dx.WRONG_LENGTH and out.dim() == 1:
                return self._explain_length(site, inputs, out, expected, problem)
            return problem
        actual = out.to("cpu")
        n = inputs.num_live
        live, want = actual[:n], expected[:n]
        if not torch.equal(live, want):
            source = dx.explain(self.history, site, self.truth, inputs, self.config, live, want)
            n_wrong = int((live != want).sum())
            return site.divergence(
                dx.WRONG_ROWS, dx.wrong_rows_sentence(site, source, n_wrong, n),
                expected=dx.stored_values(want), actual=dx.stored_values(live), source=_source_dict(source),
            )
        padding = actual[n:]
        wrong = (padding != expected[n:]).nonzero().flatten().tolist()
        if not wrong:
            return None
        owned = self.state.live_targets(model, self.truth)
        aliased = [i for i in wrong if int(padding[i]) in owned]
        row = (aliased or wrong)[0]
        value = int(padding[row])
        explained = dx.explain_padding(self.history, site, n, actual, expected)
        sentence = dx.padding_sentence(site, n + row, value, bool(aliased), explained)
        source = explained or (
            dx.Source(dx.ALIASES_LIVE, f"row {value}, which a live request owns",
                      "the padding write would corrupt that request's keys")
            if aliased else dx.Source(dx.UNKNOWN, f"row {value}", "padding must write to the dummy slot")
        )
        return site.divergence(
            dx.PADDING, sentence, expected=dx.stored_values(expected), actual=dx.stored_values(actual),
            source=_source_dict(source),
        )

    def _explain_length(self, site, inputs, out, expected, problem) -> dx.Divergence:
        """A 1-D answer of the wrong length, read only when a candidate has its length (it
        may claim 2**40 rows through a stride of 0)."""
        stored = {"expected": dx.stored_values(expected), "actual": problem.actual}
        for source, rows in self.history.candidates(site, self.truth, inputs, self.config):
            if source.kind != dx.DUMMY and rows.shape == out.shape and torch.equal(rows, out.cpu()):
                sentence = (f"Stale cache: at {site.describe()}, {out.shape[0]} rows came back for "
                            f"{expected.shape[0]}: they are {source.phrase}: {source.consequence}.")
                return site.divergence(dx.WRONG_LENGTH, sentence, source=_source_dict(source), **stored)
        return site.divergence(problem.kind, problem.sentence, **stored)

    # ---- plumbing ----------------------------------------------------------------------

    def _invoke(self, where: "_Where", what: str, fn, *args):
        self.call += 1
        try:
            result = self.guard.call(what, fn, *args)
        except SubjectFailure as failure:
            raise self._failed(where, failure) from None
        self._stop_if_past_deadline()
        return result

    def _looked_up(self, where: "_Where", subject: Subject, name: str) -> Callable[..., Any]:
        """The subject's method ``name``, looked up as a call: the lookup runs the subject's
        ``__getattribute__``, if it has one."""
        try:
            return self.guard.call(name, getattr, subject, name)
        except SubjectFailure as failure:
            raise self._failed(where, failure) from None

    def _stop_if_past_deadline(self) -> None:
        if self.deadline is not None and monotonic() >= self.deadline:
            raise DeadlinePassed(self.checks)

    def _failed(self, where: "_Where", failure: SubjectFailure) -> _Stop:
        """The divergence of a failed call: the subject's write into its inputs, if it made
        one (a failure on inputs it corrupted follows from it), else the failure. A call
        that failed on a gap of swafuzz's models raises :class:`UnmodelledPath` instead."""
        gap = model_gap(failure.exc)
        if gap is not None:
            raise UnmodelledPath(f"{self._site(where).describe()}: {gap}")
        # nothing is read while a graph records: the reads would be captured
        written = None if self.capturing else self._input_written(where)
        if written is not None:
            return _Stop(written)
        site = self._site(where)
        kind = dx.TIMEOUT if failure.kind == "timeout" else dx.RAISED
        if isinstance(failure.exc, GraphCaptureError):
            kind = dx.CAPTURE
        elif type(failure.exc).__name__ == "CUDASanitizerErrors":
            kind = dx.RACE
        hint = None
        if kind == dx.RAISED and where.plan is not None:
            hint = dx.ragged_expansion_hint(where.plan.steps[where.step][where.micro_batch], failure.message)
        sentence = dx.raised_sentence(site, failure.message, hint)
        return _Stop(site.divergence(kind, sentence, detail=failure.detail,
                                     source=_source_dict(hint) if hint is not None else None))

    def _sync(self, what: str, until_called: bool = False) -> None:
        """Bring the subject's mapping tensors in line with the engine state: the rows the
        engine wrote since the last sync where it says which, the whole mapping where it
        does not (a registration, a clear), at a cost that follows what changed rather than
        the pool's size (below a few thousand rows, comparing and copying it whole costs
        less than picking rows out). A registered tensor is written only where values
        differ, as a subject may key a cache on its in-place version. A subject that wrote
        into a mapping is stopped first (:meth:`_check_mappings`): the sync never hides it.
        ``until_called``: the change may wait for the next sync, as nothing calls the
        subject before it (an eviction, then the next forward's allocation): a state that
        no call sees is no state a cache could have kept, and the two are written as one."""
        if self.call != self.mappings_checked_at:
            self._check_mappings(what)
        if self.state.version == self.seen_version:
            return
        if self.unsynced_since is None:
            self.unsynced_since = what
        if until_called:
            return
        what, self.unsynced_since = self.unsynced_since, None
        self.seen_version = self.state.version
        registered = self.state.mapping_epoch != self.seen_epoch or not self.mappings
        self.seen_epoch = self.state.mapping_epoch
        if registered and self.mappings:
            self.history.registrations.append(self.forward)
        label = f"the mapping before {what}"
        synced = self.history.mappings
        for model, truth in self.state.mappings.items():
            old = synced.get(model)
            whole = old is None or registered or truth.shape[0] < _ROWS_COPIED_WHOLE_BELOW
            written = self.state.take_written(model, joined=not whole)
            rows = None  # the rows that changed; None: the whole mapping is compared
            if whole or written is None:
                changed = old is None or not torch.equal(old, truth)
                if changed:
                    if old is not None:
                        self.history.record_old_mapping(model, label, None, old)  # replaced, never written
                    synced[model] = truth.clone()
            else:  # through numpy: a few rows cost a fraction of torch's indexing
                kept = old.numpy()
                old_rows, new_rows = kept[written], truth.numpy()[written]
                changed = bool((old_rows != new_rows).any())
                if changed:
                    rows = torch.from_numpy(written)
                    self.history.record_old_mapping(model, label, rows, torch.from_numpy(old_rows))
                    kept[written] = new_rows
            if registered:
                # a rebuilt pool's mapping is allocated while the old one is still registered
                earlier = self.mappings.get(model)
                self.mappings[model] = placed = self.arena.place(("mapping", model, self.seen_epoch % ALTERNATING_SLOTS),
                                                                 [truth])
                self._retire_mapping(model, earlier, old, placed)
                self.graphs = {k: v for k, v in self.graphs.items() if k[0] != model}
                self.mapping_versions[model] = self.mappings[model]._version
                self._invoke(_Where(model=model), "register_mapping", _method, self.subjects[model], "register_mapping",
                             self.mappings[model])
            else:
                mapping = self.mappings[model]
                if changed:
                    if rows is None:
                        mapping.copy_(truth)
                    elif self.on_host:  # through numpy, and the version moves as a torch write moves it
                        mapping.numpy()[written] = new_rows
                        increment_version(mapping)
                    else:
                        mapping.index_put_((rows.to(self.device),), torch.from_numpy(new_rows).to(self.device))
                self.mapping_versions[model] = mapping._version

    def _batch(self, plan: ForwardPlan, mb: int, inputs: StepInputs, tensors: dict[str, torch.Tensor]) -> ForwardBatch:
        return ForwardBatch(
            forward_id=self._new_forward_id(),
            mode=_MODES[plan.event.mode],
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
        the placed ones are views of one copy, in the same order; :attr:`handed` keeps it to
        check them with one comparison. On a device the host copy stays on the host."""
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
            names = _BATCH_INPUTS[2:] if step else _BATCH_INPUTS
            if not on_host:
                names = names[:-1]
            step_fields = []
            for inputs in step_inputs:
                tensors = dict(zip(names, placed))
                if not on_host:
                    tensors["seq_lens_cpu"] = inputs.host_seq_lens.clone()
                step_fields.append(tensors)
            fields.append(step_fields)
        self.handed = _Handed(plan, [], fields, block=block, block_held=sources, block_version=block._version)
        return fields

    # ---- what the subject was handed -----------------------------------------------------

    def _check_inputs(self, plan: ForwardPlan) -> None:
        """At the end of a forward (graph replay, capture): every tensor handed to the subject
        still holds what it was handed, and every batch field still names it. One
        comparison covers an eager forward's device inputs; what it finds is explained only
        when something changed."""
        handed, holds = self.handed, self._holds
        if handed.block is not None:
            held = handed.block_held
            # a view resized or re-pointed in place moves the version its block shares
            intact = handed.block._version == handed.block_version and holds(
                handed.block, held[0] if len(held) == 1 else torch.cat(held)
            )
            if not self.on_host:  # the host lengths are not in the block
                for step_fields, step_inputs in zip(handed.fields, plan.steps):
                    for fields, inputs in zip(step_fields, step_inputs):
                        intact = intact and _equal(fields["seq_lens_cpu"], inputs.host_seq_lens)
        else:
            intact = all(holds(tensor, handed.values[name]) for name, tensor in handed.fields[0][0].items())
        if not intact or not self._fields_named():
            written = self._input_written()
            if written is not None:
                raise _Stop(written)

    def _holds(self, tensor: torch.Tensor, held: torch.Tensor) -> bool:
        return _equal(tensor, held) if self.on_host else _equal(tensor.cpu(), held)

    def _fields_named(self) -> bool:
        """Whether the batches' fields still name the tensors handed for the current step."""
        handed = self.handed
        for mb, batch in enumerate(handed.batches):
            found = vars(batch)
            for name, tensor in handed.named(mb).items():
                if found.get(name) is not tensor:
                    return False
        return True

    def _input_written(self, where: "_Where | None" = None) -> dx.Divergence | None:
        """The first change the subject made to what it was handed (``where``: the call by
        which it was made, if known): a batch field re-pointed, a tensor written or
        resized, a mapping written."""
        handed = self.handed
        if handed is not None:
            for mb, batch in enumerate(handed.batches):
                for name, tensor in handed.named(mb).items():
                    found = vars(batch).get(name, _MISSING)
                    if found is not tensor:
                        what = ("another tensor" if type(found) is torch.Tensor else "nothing" if found is _MISSING
                                else "None" if found is None else f"a {type_name(found)}")
                        return self._wrote(where, _Where(handed.plan, handed.step, mb), name,
                                           f"replaced the batch's {name} with {what}")
            for step, step_fields in enumerate(handed.fields):
                for mb, fields in enumerate(step_fields):
                    for name, tensor in fields.items():
                        change = dx.input_change(name, tensor, handed.held(step, mb, name))
                        if change is not None:
                            return self._wrote(where, _Where(handed.plan, step, mb), name, change)
        return self._mapping_written(None, where)

    def _wrote(self, by: "_Where | None", found: "_Where", name: str, change: str) -> dx.Divergence:
        """The divergence of a write found by the call ``by`` (None: after the forward's
        calls, in the batch of ``found``)."""
        at = by or found
        return self._site(at).divergence(dx.WROTE_INPUT, dx.wrote_input_sentence(self._when(at, by is not None), name, change))

    def _when(self, where: "_Where", by_call: bool) -> str:
        described = self._site(where).describe()
        if by_call:
            return described
        return f"{self.handed.phase if self.handed is not None else 'the end of'} {described}"

    def _check_mappings(self, what: str) -> None:
        """Before the harness writes into the registered mappings (``what`` names the sync;
        a sync checks only after subject calls), the subject has left them as the last sync
        did. On the host a small mapping is compared whole (an in-place write through
        numpy leaves the version alone); a large one, or one on a device, when its version
        moved."""
        self.mappings_checked_at = self.call
        written = self._mapping_written(what)
        if written is not None:
            raise _Stop(written)

    def _mapping_written(self, when: str | None, by: "_Where | None" = None) -> dx.Divergence | None:
        """A write into a registered mapping, found at the sync ``when`` names, by the call
        ``by``, or (neither) after a forward's calls."""
        synced = self.history.mappings
        held = [(model, "mapping", mapping, synced[model], self.mapping_versions[model])
                for model, mapping in self.mappings.items()]
        held += [(model, "earlier mapping", mapping, values, version)
                 for model, earlier in self.earlier_mappings.items() for mapping, values, version in earlier]
        for model, which, mapping, values, version in held:
            # on the host compared whole: a write through numpy or .data leaves the version alone
            if (_equal(mapping, values) if self.on_host else mapping._version == version):
                continue
            change = dx.input_change(f"the {model} model's {which}", mapping, values)
            if change is not None:
                at = by or (_Where(self.plan) if self.plan is not None and self.plan.model == model
                            else _Where(model=model))
                sentence = dx.wrote_input_sentence(when or self._when(at, by is not None), "mapping", change)
                return self._site(at).divergence(dx.WROTE_INPUT, sentence)
        return None

    def _retire_mapping(self, model: str, earlier: torch.Tensor | None, held: torch.Tensor | None,
                        placed: torch.Tensor) -> None:
        """Keep the mapping ``earlier`` (holding ``held``), replaced by ``placed``, to check that
        the subject leaves it alone; one whose memory the harness has just written ``placed``
        into is no longer the subject's to keep."""
        memory = placed.untyped_storage().data_ptr()
        kept = [entry for entry in self.earlier_mappings.get(model, ())
                if entry[0].untyped_storage().data_ptr() != memory]
        if earlier is not None and held is not None and earlier.untyped_storage().data_ptr() != memory:
            kept.append((earlier, held.clone(), earlier._version))
        self.earlier_mappings[model] = kept

    def _backend(self, model: str, mb: int) -> SimpleNamespace:
        backend = self.backends.get((model, mb))
        if backend is None:
            backend = self.backends[model, mb] = SimpleNamespace()
        return backend

    def _new_forward_id(self) -> int:
        self.next_forward_id += 1
        return self.next_forward_id

    def _site(self, where: "_Where", call: int | None = None) -> dx.Site:
        """``call``: the call's index, when it is not the latest call."""
        plan = where.plan
        return dx.Site(
            forward=self.forward,
            event=plan.index if plan else -1,
            mode=plan.event.mode if plan else "setup",
            model=plan.model if plan else where.model,
            draft_step=where.step,
            micro_batch=where.micro_batch,
            layer_id=where.layer_id,
            call=self.call - 1 if call is None else call,  # calls are counted as they start
            num_draft_steps=len(plan.steps) if plan else 1,
            num_micro_batches=plan.num_micro_batches if plan else 1,
        )


# mappings shorter than this are synced whole: below it, three passes over the whole
# tensor (compare, keep, copy) cost less than picking out and writing the changed rows
_ROWS_COPIED_WHOLE_BELOW = 4096
# the most values of a wrong-dtype answer scanned for NaN (an expanded one may claim 2**40)
_MAX_SCANNED = 1 << 20
_MODES = {mode.value: mode for mode in ForwardMode}  # a dict reads faster than Enum's lookup

# the batch field of each of PACKED_INPUTS, in its order; every draft step's locations,
# positions and lengths are new, the requests' slots and token counts (the first two) are not
_BATCH_INPUTS = tuple({
    "req_slots": "req_pool_indices", "token_counts": "extend_seq_lens", "positions": "positions",
    "out_cache_loc": "out_cache_loc", "seq_lens": "seq_lens", "prefix_lens": "extend_prefix_lens",
    "host_seq_lens": "seq_lens_cpu",
}[name] for name in PACKED_INPUTS)


@dataclass(eq=False)
class _Handed:
    """The inputs of one forward (or graph capture) as handed to the subject: per draft
    step and micro-batch, each batch field's tensor; the batch objects; and what the
    tensors must hold, read from the plan or (graphs) given as ``values``. ``block``
    (eager forwards): the tensors of every step, one after another (the host lengths only
    on the host), and ``block_held`` what it was copied from."""

    plan: ForwardPlan
    batches: list[ForwardBatch]
    fields: list[list[dict[str, torch.Tensor]]]
    values: dict[str, torch.Tensor] | None = None
    block: torch.Tensor | None = None
    block_held: Sequence[torch.Tensor] = ()
    block_version: int = 0
    step: int = 0  # the draft step whose tensors the batch fields name now
    phase: str = "the end of"  # how a write found after the calls is dated

    def named(self, mb: int) -> dict[str, torch.Tensor]:
        """What micro-batch ``mb``'s batch fields name now: the current step's tensors, and
        the first step's for the fields a later step does not replace."""
        first = self.fields[0][mb]
        return first if self.step == 0 else {**first, **self.fields[self.step][mb]}

    def held(self, step: int, mb: int, name: str) -> torch.Tensor:
        if self.values is not None:
            return self.values[name]
        return getattr(self.plan.steps[step][mb], _PACKED_FIELD[name])


_MISSING = object()  # a batch field the subject deleted

# the StepInputs field each batch field is handed from
_PACKED_FIELD = dict(zip(_BATCH_INPUTS, PACKED_INPUTS))


class _Where(NamedTuple):
    """Where a call happens; turned into a :class:`~swafuzz.run.diagnosis.Site` only when needed."""

    plan: ForwardPlan | None = None
    step: int = 0
    micro_batch: int = 0
    layer_id: int | None = None
    model: str | None = None


_equal = torch.Tensor.equal  # torch.equal less its module-function argument parsing


def _method(subject: Subject, name: str, *args: Any) -> Any:
    """A call of the subject's method ``name``, looked up in the call: the lookup is the
    subject's code too (its ``__getattribute__``)."""
    return getattr(subject, name)(*args)


def _right(out: Any, expected: torch.Tensor, on_device: Callable[[torch.Tensor], bool],
           _tensor=torch.Tensor, _int32=torch.int32) -> bool:
    """The fast comparison: a plain int32 tensor on the device with the reference's rows;
    anything else goes to the verdict, which says what is wrong or finds it right after all
    (a tensor subclass). (It runs once per answer: torch's names are bound once.)"""
    try:
        return (
            type(out) is _tensor
            and out.dtype is _int32
            and on_device(out)
            and _equal(out, expected)  # equal sizes included
        )
    except RuntimeError:  # a layout torch.equal cannot compare (sparse, nested): the verdict names it
        return False


def _snapshot(out: Any, rows: int) -> Any:
    """What an answer held when it returned, copied if it is a plain dense tensor that a
    batch of ``rows`` rows could have (any other answer is wrong by its type or shape,
    which later calls cannot change)."""
    if type(out) is torch.Tensor and out.layout is torch.strided and not out.is_nested and out.numel() <= rows:
        return out.clone()
    return out


def _source_dict(source: dx.Source) -> dict[str, Any]:
    return {k: v for k, v in source.__dict__.items() if v is not None}
