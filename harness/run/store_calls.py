"""The store calls of one draft step, made while the engine state stands still, and their
answers handed to the judge: on the host each checked as it returns, on a device once the
streams have settled, or (stress mode) made from a thread per micro-batch."""

from __future__ import annotations

import sys
import threading
import time
from time import monotonic
from typing import Any, Iterator

import torch

from ..api import ForwardBatch, Subject
from ..quantities import Quantity
from ..reference import ForwardPlan, StepInputs

from .calls import SubjectCalls
from .devices import HostTimeline
from .guard import SubjectFailure, SubjectTimeout, cancel_interrupt, failure_of, interrupt, timed_out, withdraw_interrupt
from .judge import Judge, matches
from .progress import DeadlinePassed, Progress, Where


class StoreCalls:
    """Makes a step's ``swa_write_location`` calls through ``calls`` and has ``judge`` check
    the answers. :attr:`schedules`: per forward event index, the order in which threaded
    micro-batches' calls entered the subject. ``timeout_s``: each call's limit, which
    bounds the wait for the threads."""

    def __init__(self, progress: Progress, calls: SubjectCalls, judge: Judge, timeline: HostTimeline,
                 timeout_s: float, value_reads: dict[int, tuple[Quantity, ...]] | None = None):
        self.progress = progress
        self.calls = calls
        self.judge = judge
        self.timeline = timeline
        self.timeout_s = timeout_s
        self.schedules: dict[int, tuple[int, ...]] = {}
        # per layer, the per-step values the subject answers that the layer reads
        self.value_reads = value_reads or {}

    def make(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
             calls: tuple[tuple[int, int], ...], subject: Subject | None = None) -> None:
        """Make ``calls`` of one draft step, during which the engine state stands still, and
        check every answer. On the host an answer is checked as it returns, before the next
        call could overwrite it; on a device, once the streams have settled, in call order
        (the answers are what the streams read). A layer that reads per-step values the
        ``subject`` answers is asked for them right after its store, and each is checked."""
        if self.value_reads:
            for call in calls:
                self._make(plan, step, batches, store, (call,))
                self._values(plan, step, batches, subject, *call)
            return
        self._make(plan, step, batches, store, calls)

    def _values(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], subject: Subject,
                mb: int, layer_id: int) -> None:
        """Ask ``subject`` for each per-step value ``layer_id`` reads and check it."""
        for quantity in self.value_reads.get(layer_id, ()):
            out = self.calls.method(Where(plan, step, mb, layer_id), subject, "per_step_value", batches[mb], layer_id,
                                    quantity.name, about=quantity.name)
            self.timeline.settle()
            self.judge.check_value(plan, step, mb, layer_id, quantity, out, self.progress.call - 1)

    def _make(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
              calls: tuple[tuple[int, int], ...]) -> None:
        if self.timeline.deferred:
            answers = list(self._answers(plan, step, batches, store, calls))
            self.timeline.settle()
            self.judge.check_answers(plan, step, answers)
        else:
            self._call_and_check(plan, step, batches, store, calls)

    def _answers(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
                 calls: tuple[tuple[int, int], ...]) -> Iterator[tuple[int, int, Any, int]]:
        """Each call's answer, the call made when the previous answer has been taken."""
        guarded, progress, what = self.calls.guard.call, self.progress, self.calls.named("swa_write_location")
        inputs = self.calls.inputs
        for mb, layer_id in calls:
            progress.call += 1
            try:
                out = guarded(what, store, batches[mb], layer_id)
            except SubjectFailure as failure:
                raise self.calls.failed(Where(plan, step, mb, layer_id), failure) from None
            if inputs.after_each_call:
                inputs.stop_if_written_by(Where(plan, step, mb, layer_id))
            progress.stop_if_past_deadline()
            yield mb, layer_id, out, progress.call - 1

    def _call_and_check(self, plan: ForwardPlan, step: int, batches: list[ForwardBatch], store,
                        calls: tuple[tuple[int, int], ...]) -> None:
        """:meth:`Judge.check_answers` with the calls made in the same loop, each answer
        checked before the next call: the host's path, where a call costs about as much as
        its check. The guard is marked in flight once for the calls (and cleared while a
        store that the fast comparison did not settle is judged); each call still has its
        own serial, so a hang or exception is attributed to it."""
        progress, judge = self.progress, self.judge
        guard, on_device, every_store, right = self.calls.guard, judge.on_device, judge.on_store is not None, matches
        modes_kept = guard.torch_state.modes_kept
        deadline = progress.deadline
        truths: list[torch.Tensor | None] = [None] * plan.num_micro_batches
        first, checks, serial = progress.call, progress.checks, guard.serial
        what = self.calls.named("swa_write_location")
        inputs = self.calls.inputs
        watch_inputs = inputs.after_each_call
        call = first
        guard.in_call = True
        try:
            for call, (mb, layer_id) in enumerate(calls, first):
                guard.serial = serial = serial + 1
                try:
                    out = store(batches[mb], layer_id)
                    if guard.fired_serial == serial:  # the subject swallowed the alarm
                        raise SubjectTimeout()
                except BaseException as exc:
                    raise guard.failure(what, exc) from None
                if watch_inputs and inputs.moved():
                    guard.in_call = False
                    guard.restore_harness_state()
                    progress.call, progress.checks = call + 1, checks + call - first
                    inputs.stop_if_written_by(Where(plan, step, mb, layer_id))
                    guard.in_call = True
                if not modes_kept():  # a mode the subject left could answer the comparison
                    guard.torch_state.restore()
                # between calls the harness only compares (a lowered recursion limit lets the
                # subject's own call run deeper than that, and no other torch setting changes
                # a comparison); its other work restores the harness's state
                expected = truths[mb]
                if expected is None:
                    guard.in_call = False
                    guard.restore_harness_state()
                    expected = truths[mb] = judge.truth(plan, step, mb)
                    guard.in_call = True
                matched = right(out, expected, on_device)
                if not matched or every_store:
                    guard.in_call = False
                    guard.restore_harness_state()
                    progress.call, progress.checks = call + 1, checks + call + 1 - first
                    judge.verdict(plan, step, mb, layer_id, out, expected, matched, call)
                    serial = guard.serial  # the verdict may ask the subject where a stale answer sat
                    guard.in_call = True
                if deadline is not None and monotonic() >= deadline:
                    progress.call, progress.checks = call + 1, checks + call + 1 - first
                    raise DeadlinePassed(progress.checks)
        except (SubjectFailure, SubjectTimeout) as exc:
            # the call that failed is the latest to start (an alarm may also land in its check)
            started = call + 1 - first
            progress.call, progress.checks = first + started, checks + started - 1
            failure = exc if isinstance(exc, SubjectFailure) else guard.failure(what, exc)
            mb, layer_id = calls[started - 1]
            raise self.calls.failed(Where(plan, step, mb, layer_id), failure) from None
        finally:
            guard.in_call = False
            guard.restore_harness_state()
        progress.call, progress.checks = first + len(calls), checks + len(calls)

    def threaded(self, plan: ForwardPlan, batches: list[ForwardBatch],
                 step_inputs: tuple[StepInputs, ...], store) -> None:
        """Each micro-batch runs its layers on its own thread, as on concurrent streams.

        Answers are cloned as they return (what the layer would write at that moment) and
        checked afterwards in the order the calls ran. A call still running past the timeout
        is interrupted in its thread, so that a hang is told as on the main thread: at the
        function of the code under test it was running, where the subject tells that.
        """
        count, what = plan.num_micro_batches, self.calls.named("swa_write_location")
        layers = [[layer for mb, layer in plan.calls if mb == m] for m in range(count)]
        rows = [inputs.num_rows for inputs in step_inputs]
        entered: list[int] = []
        answers: list[list[Any]] = [[] for _ in range(count)]
        turns = _Turns(self.timeout_s)
        start = threading.Barrier(count)

        def run_micro_batch(mb: int) -> None:
            try:
                start.wait()
                for layer_id in layers[mb]:
                    # one call at a time, so the recorded order is the order that happened
                    # and replays exactly; the threads decide which micro-batch goes next
                    with turns.lock:
                        entered.append(mb)
                        out, failure = turns.call(what, store, batches[mb], layer_id)
                        if failure is not None:
                            answers[mb].append(failure)
                            return
                        answers[mb].append(_snapshot(out, rows[mb]))
                    time.sleep(0)  # let another micro-batch take the next turn: the lock is not fair
            finally:
                turns.moved.set()

        workers = [threading.Thread(target=run_micro_batch, args=(mb,), daemon=True) for mb in range(count)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often, so interleavings actually vary
        try:
            for worker in workers:
                worker.start()
            turns.wait_for(workers)
        finally:
            sys.setswitchinterval(interval)
        self.calls.guard.restore_harness_state()
        self.schedules[plan.index] = tuple(entered)

        def in_call_order() -> Iterator[tuple[int, int, Any, int]]:
            taken = [0] * count
            progress = self.progress
            for mb in entered:
                index = taken[mb]
                taken[mb] += 1
                progress.call += 1
                where = Where(plan, 0, mb, layers[mb][index])
                if index == len(answers[mb]):  # the call that an interruption did not end
                    raise self.calls.failed(where, timed_out(what, None, self.timeout_s))
                answer = answers[mb][index]
                if isinstance(answer, SubjectFailure):
                    raise self.calls.failed(where, answer)
                yield mb, layers[mb][index], answer, progress.call - 1

        self.judge.check_answers(plan, 0, in_call_order())


class _Turns:
    """The threaded micro-batches' calls, one in flight at a time under :attr:`lock`, and
    the main thread's watch over them: a call in flight past ``timeout_s`` is interrupted
    (:func:`interrupt`); a thread that has not ended a timeout after that is left running,
    its interruption cancelled.

    An interruption is raised in the thread at its next Python instruction, so it is made
    only while the call is still marked in flight, and :meth:`call` catches it anywhere
    from marking the call to unmarking it, where the interruption still pending is
    cleared: it can never land in the thread's next call."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self.moved = threading.Event()  # a call or a thread ended
        self._flight = threading.Lock()  # guards the marks below against the watch
        self._serial = 0
        self._in_flight: tuple[int, float, threading.Thread] | None = None  # serial, start, thread
        self._interrupted = -1  # the serial of the call interrupted last

    def call(self, what: str, fn, *args: Any) -> tuple[Any, SubjectFailure | None]:
        """``fn(*args)``, a call of ``what``, as the call in flight: its answer, or its
        failure (a timeout where it was interrupted, whatever it made of that)."""
        out, raised = None, None
        try:
            try:
                with self._flight:
                    self._serial += 1
                    self._in_flight = (self._serial, monotonic(), threading.current_thread())
                out = fn(*args)
            finally:
                with self._flight:
                    self._in_flight = None
                    if self._interrupted == self._serial:
                        withdraw_interrupt()
                self.moved.set()
        except BaseException as exc:  # noqa: BLE001 - the subject's, reported as its failure
            raised = exc
        if isinstance(raised, SubjectTimeout):
            return None, timed_out(what, raised, self.timeout_s)
        if self._interrupted == self._serial:
            return None, timed_out(what, None, self.timeout_s)
        return (out, None) if raised is None else (None, failure_of(what, raised))

    def wait_for(self, workers: list[threading.Thread]) -> None:
        """Until every worker has ended, or one did not end a timeout after its call was
        interrupted (a call blocked in C sees the interruption only when it returns)."""
        interrupted: tuple[threading.Thread, float] | None = None  # the thread, and when
        while any(worker.is_alive() for worker in workers):
            self.moved.clear()  # before looking, so that a change after the look wakes the wait
            now = monotonic()
            with self._flight:
                flight = self._in_flight
                if flight is not None and flight[0] != self._interrupted and now - flight[1] > self.timeout_s:
                    self._interrupted = flight[0]
                    interrupt(flight[2])
                    interrupted = flight[2], now
            if interrupted is not None and not interrupted[0].is_alive():
                interrupted = None
            if interrupted is not None:
                if now - interrupted[1] > self.timeout_s:
                    cancel_interrupt(interrupted[0])
                    return
                wait = interrupted[1] + self.timeout_s - now
            elif flight is not None:
                wait = flight[1] + self.timeout_s - now
            else:
                wait = self.timeout_s
            self.moved.wait(max(wait, 0.0) + 1e-3)


def _snapshot(out: Any, rows: int) -> Any:
    """What an answer held when it returned, copied if it is a plain dense tensor that a
    batch of ``rows`` rows could have (any other answer is wrong by its type or shape,
    which later calls cannot change)."""
    if type(out) is torch.Tensor and out.layout is torch.strided and not out.is_nested and out.numel() <= rows:
        return out.clone()
    return out
