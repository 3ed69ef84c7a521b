"""Forwards run as graph replays: each batch size captured as the decode graph runner
captures it, at its first replay, and replayed on the static inputs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch

from ..api import ForwardBatch, ForwardMode, Subject
from ..quantities import Quantity
from ..reference import EngineConfig, ForwardPlan

from . import diagnosis as dx
from .arena import Arena
from .calls import SubjectCalls
from .devices import HostTimeline
from .graphs import make_graph
from .guard import TorchState
from .inputs import PACKED_FIELD, Handed, InputGuard
from .judge import Judge
from .progress import Progress, Stop, Where

# The graph inputs a subject sees and what capture leaves in them: the decode graph runner
# allocates them zeroed at the largest captured size (DecodeInputBuffers in SGLang). The
# per-request token counts are a request's tokens in the graph's mode (one in decode).
STATIC_INPUTS = {
    "req_pool_indices": 0, "extend_seq_lens": None, "positions": 0, "out_cache_loc": 0,
    # padded requests have length 1, as the runner's seq_len fill value; capture has no prefix
    "seq_lens": 1, "extend_prefix_lens": 0,
}
TOKEN_INPUTS = frozenset({"positions", "out_cache_loc"})  # one row per token, the others per request

MODES = {mode.value: mode for mode in ForwardMode}  # a dict reads faster than Enum's lookup

# a captured batch size: the graph, its static batch, the SWA answers' sinks, the static
# inputs, and per per-step value a layer read, the (micro-batch, layer), value and sink
_Captured = tuple[Any, ForwardBatch, list[torch.Tensor], dict[str, torch.Tensor],
                  list[tuple[tuple[int, int], Quantity, torch.Tensor]]]


class GraphForwards:
    """The run's captured graphs, per model, batch size and store schedule, and their
    static inputs. ``forward_id()`` numbers a new batch; ``backend(model, mb)`` is the
    backend object a batch of that model and micro-batch carries."""

    def __init__(self, config: EngineConfig, device: torch.device, subjects: dict[str, Subject],
                 progress: Progress, calls: SubjectCalls, inputs: InputGuard, judge: Judge, arena: Arena,
                 timeline: HostTimeline, history: dx.History, forward_id: Callable[[], int],
                 backend: Callable[[str, int], SimpleNamespace],
                 value_reads: dict[int, tuple[Quantity, ...]] | None = None,
                 value_columns: dict[str, int] | None = None):
        self.config = config
        self.device = device
        self.subjects = subjects
        self.progress = progress
        self.calls = calls
        self.inputs = inputs
        self.judge = judge
        self.arena = arena
        self.timeline = timeline
        self.history = history
        self.forward_id = forward_id
        self.backend = backend
        self.value_reads = value_reads or {}
        self.value_columns = value_columns or {}  # a table value's columns in the static buffers
        # the subject methods whose work a graph records, and its replay named as the code
        # they run
        self.recorded = ("init_graph_metadata", "swa_write_location", *(("per_step_value",) if self.value_reads else ()))
        self.replay_named = "the graph replay of " + " and ".join(dict.fromkeys(calls.named(m) for m in self.recorded))
        self.graphs: dict[tuple, _Captured] = {}
        self.static_buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.static_seq_lens_cpu: dict[str, torch.Tensor] = {}

    def forget(self, model: str) -> None:
        """Drop ``model``'s graphs: a new mapping was registered, which capture would see."""
        self.graphs = {k: v for k, v in self.graphs.items() if k[0] != model}

    def forward(self, plan: ForwardPlan) -> None:
        key = (plan.model, MODES[plan.event.mode].graph_bucket, plan.graph_batch_size, plan.calls)
        if key not in self.graphs:
            self.graphs[key] = self._capture(plan)
        graph, static, sinks, fields, value_sinks = self.graphs[key]
        inputs = plan.steps[0][0]
        # the harness's own references to the static inputs: the batch's may be re-pointed
        held = {name: getattr(inputs, PACKED_FIELD[name]) for name in fields}
        for name, tensor in fields.items():
            tensor.copy_(held[name])
        static.forward_id = self.forward_id()
        static.mode = MODES[plan.event.mode]
        static.num_live_tokens = inputs.num_live
        self.inputs.handed = Handed(plan, [static], [[fields]], held)
        subject = self.subjects[plan.model]
        if not plan.event.skip_init:
            self.calls.method(Where(plan), subject, "init_replay_metadata", static)
        self._replay(plan, graph)
        replay = self.progress.call - 1
        self.judge.check_answers(plan, 0, ((mb, layer_id, sink, replay)
                                           for (mb, layer_id), sink in zip(plan.calls, sinks)))
        for (mb, layer_id), quantity, sink in value_sinks:
            self.judge.check_value(plan, 0, mb, layer_id, quantity, sink, replay)

    def _capture(self, plan: ForwardPlan) -> "_Captured":
        """Capture one batch size as the decode graph runner does: metadata for capture once,
        the forward run eagerly ``graph_warmups`` times on the static inputs, then once more
        inside the capture. The harness captures a size at its first replay, on inputs
        reset to what capture at start-up would see."""
        size, rows = plan.graph_batch_size, plan.graph_rows
        subject = self.subjects[plan.model]
        buffers = self._static_buffers(plan.model)
        fills = {**STATIC_INPUTS, "extend_seq_lens": rows // size, "seq_lens_cpu": STATIC_INPUTS["seq_lens"]}
        fields = {name: buffer[:rows if name in TOKEN_INPUTS else size] for name, buffer in buffers.items()}
        fields["seq_lens_cpu"] = self.static_seq_lens_cpu[plan.model][:size]
        for name, tensor in fields.items():
            tensor.fill_(fills[name])
        # decode and idle share the decode graph: capture runs it as decode
        mode = ForwardMode.DECODE if plan.event.mode == "idle" else MODES[plan.event.mode]
        static = ForwardBatch(
            forward_id=self.forward_id(), mode=mode, micro_batch=0,
            backend=self.backend(plan.model, 0), num_live_tokens=0, **fields,
        )
        held = {name: torch.full((tensor.shape[0],), fills[name]) for name, tensor in fields.items()}
        self.inputs.handed = Handed(plan, [static], [[fields]], held, phase="the graph capture for")
        self.calls.method(Where(plan), subject, "init_capture_metadata", static)
        for _ in range(self.config.graph_warmups):
            self._run_graph_forward(plan, static, "graph warm-up")
        graph = make_graph(self.device)
        sinks = [torch.empty(rows, dtype=torch.int32, device=self.device) for _ in plan.calls]
        value_sinks = [(call, quantity, torch.empty(self._value_shape(quantity, rows), dtype=quantity.dtype,
                                                    device=self.device))
                       for call in plan.calls for quantity in self.value_reads.get(call[1], ())]
        static.in_graph = self.progress.capturing = True
        guard = self.calls.guard
        outer = guard.torch_state
        try:
            with graph.capture():
                guard.torch_state = TorchState()  # the capture's own mode is the harness's
                self._run_graph_forward(plan, static, "graph capture", sinks, iter(value_sinks))
        finally:
            self.progress.capturing = False
            guard.torch_state = outer
        static.in_graph = False
        # what the captured work yields for the capture inputs (a GPU capture runs nothing)
        self._replay(plan, graph)
        if sinks:
            self.history.record_capture(self.progress.forward, sinks[0].to("cpu", copy=True), 0)
        recorded: set[str] = set()
        for _, quantity, sink in value_sinks:
            if quantity.name not in recorded:
                recorded.add(quantity.name)
                self.judge.value_history(quantity).record_capture(self.progress.forward, sink.to("cpu", copy=True), 0)
        return graph, static, sinks, fields, value_sinks

    def _replay(self, plan: ForwardPlan, graph: Any) -> None:
        """Replay ``graph``, the recorded work of the subject's graph metadata and stores,
        and check the inputs once it has run."""
        for method in self.recorded:
            self.inputs.ran(method)
        self.calls.invoke(Where(plan), self.replay_named, graph.replay)
        self.timeline.settle()
        self.inputs.check_inputs(plan)

    def _run_graph_forward(self, plan: ForwardPlan, static: ForwardBatch, phase: str,
                           sinks: list[torch.Tensor] | None = None,
                           value_sinks: Iterator[tuple[tuple[int, int], Quantity, torch.Tensor]] | None = None) -> None:
        """One run of the forward on the static inputs: a warm-up, or with ``sinks`` (and
        ``value_sinks`` for the per-step values, in call order) the captured run, where each
        layer's answers are consumed before the next layer runs."""
        subject = self.subjects[plan.model]
        method = self.calls.method
        method(Where(plan), subject, "init_graph_metadata", static, phase=phase)
        for index, (mb, layer_id) in enumerate(plan.calls):
            where = Where(plan, 0, mb, layer_id)
            out = method(where, subject, "swa_write_location", static, layer_id, phase=phase)
            problem = self.judge.shape_problem(self.progress.site(where), out, plan.graph_rows)
            if problem is not None:
                raise Stop(problem)
            if sinks is not None:
                # the consumer a store kernel would be: it reads the returned tensor by address
                sinks[index].copy_(out)
            for quantity in self.value_reads.get(layer_id, ()):
                value = method(where, subject, "per_step_value", static, layer_id, quantity.name,
                               phase=phase, about=quantity.name)
                columns = self.value_columns.get(quantity.name)
                problem = self.judge.shape_problem(self.progress.site(where), value, plan.graph_rows, quantity,
                                                   None if columns is None else (columns, columns))
                if problem is not None:
                    raise Stop(problem)
                if value_sinks is not None:
                    next(value_sinks)[2].copy_(value)

    def _value_shape(self, quantity: Quantity, rows: int) -> tuple[int, ...]:
        """A value's shape in a graph of ``rows`` rows: a table has its static columns."""
        columns = self.value_columns.get(quantity.name)
        return (rows,) if columns is None else (rows, columns)

    def _static_buffers(self, model: str) -> dict[str, torch.Tensor]:
        """The graph inputs of ``model``, allocated at its first capture (a scenario may
        have graph sizes and never replay one)."""
        if model not in self.static_buffers:
            largest = max(self.config.graph_batch_sizes)
            # token rows as a target-verify graph of the largest size has them
            tokens = largest * max(1, self.config.num_draft_tokens)
            self.static_buffers[model] = {
                name: self.arena.buffer(("graph", model, name), tokens if name in TOKEN_INPUTS else largest,
                                        torch.int64)
                for name in STATIC_INPUTS
            }
            # the runner keeps a host copy of the lengths beside the device buffer
            self.static_seq_lens_cpu[model] = torch.ones(largest, dtype=torch.int64)
        return self.static_buffers[model]
