"""The run's calls into its subject, each counted and made through the guard, and what a
failed one comes to."""

from __future__ import annotations

from typing import Any, Callable

from ..api import CodeNames, Subject
from ..errors import CodeFault, ModelGap, UnmodelledPath

from . import diagnosis as dx
from .graphs import GraphCaptureError
from .guard import CallGuard, SubjectFailure, quoted
from .inputs import InputGuard
from .progress import Progress, Stop, Where


def model_gap(exc: BaseException | None) -> ModelGap | None:
    """The :class:`ModelGap` behind ``exc``, also where the subject's code wrapped it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ModelGap):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def call_method(subject: Subject, name: str, *args: Any) -> Any:
    """A call of the subject's method ``name``, looked up in the call: the lookup is the
    subject's code too (its ``__getattribute__``)."""
    return getattr(subject, name)(*args)


def _told_fault(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a :class:`CodeFault` whose parts can be read as plain text."""
    return isinstance(exc, CodeFault) and all(type(part) is str for part in (exc.function, exc.place, exc.what))


class SubjectCalls:
    """Makes the run's calls through :attr:`guard` (set once the run holds it), counting
    each as it starts; a failed call ends the run with its divergence."""

    def __init__(self, progress: Progress, inputs: InputGuard, names: CodeNames):
        self.progress = progress
        self.inputs = inputs
        self.names = names.calls
        self.guard: CallGuard

    def named(self, method: str) -> str:
        """The subject's method ``method`` as sentences name it: by the code under test it
        runs, where the subject names that code."""
        return self.names.get(method, method)

    def method(self, where: Where, subject: Subject, name: str, *args, phase: str = "", about: str = ""):
        """A call of the subject's method ``name`` (``phase``: the graph run it is part of;
        ``about``: the per-step value it is asked for)."""
        self.inputs.ran(name)
        what = self.named(name) + (f" for {about}" if about else "") + (f" ({phase})" if phase else "")
        return self.invoke(where, what, call_method, subject, name, *args)

    def invoke(self, where: Where, what: str, fn, *args):
        self.progress.call += 1
        try:
            result = self.guard.call(what, fn, *args)
        except SubjectFailure as failure:
            raise self.failed(where, failure) from None
        if self.inputs.after_each_call and not self.progress.capturing:  # a capture's reads would be recorded
            self.inputs.stop_if_written_by(where)
        self.progress.stop_if_past_deadline()
        return result

    def looked_up(self, where: Where, subject: Subject, name: str) -> Callable[..., Any]:
        """The subject's method ``name``, looked up as a call: the lookup runs the subject's
        ``__getattribute__``, if it has one."""
        try:
            return self.guard.call(name, getattr, subject, name)
        except SubjectFailure as failure:
            raise self.failed(where, failure) from None

    def failed(self, where: Where, failure: SubjectFailure) -> Stop:
        """The divergence of a failed call: the subject's write into its inputs, if it made
        one (a failure on inputs it corrupted follows from it), else the failure. A call
        that failed on a gap of swafuzz's models raises :class:`UnmodelledPath` instead."""
        progress = self.progress
        gap = model_gap(failure.exc)
        if gap is not None:
            raise UnmodelledPath(f"{progress.site(where).describe()}: {gap}")
        # nothing is read while a graph records: the reads would be captured
        written = None if progress.capturing else self.inputs.input_written(where)
        if written is not None:
            return Stop(written)
        site = progress.site(where)
        kind = dx.TIMEOUT if failure.kind == "timeout" else dx.RAISED
        message, raised = failure.message, failure.exc
        if _told_fault(raised):
            # the code under test names itself: what it did, where, in its own terms
            message = quoted(f"{raised.function} ({raised.place}) {raised.what}")
            raised = raised.__cause__ or raised
        if isinstance(raised, GraphCaptureError):
            kind = dx.CAPTURE
        elif type(raised).__name__ == "CUDASanitizerErrors":
            kind = dx.RACE
        hint = None
        if kind == dx.RAISED and where.plan is not None:
            hint = dx.ragged_expansion_hint(where.plan.steps[where.step][where.micro_batch], message)
        sentence = dx.raised_sentence(site, message, hint)
        return Stop(site.divergence(kind, sentence, detail=failure.detail,
                                    source=dx.source_dict(hint) if hint is not None else None))
