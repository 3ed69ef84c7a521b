"""The differential executor: one scenario, reference and subject side by side.

Every store-location request is checked against the reference computed from the engine
state at that moment (values, int32, length, device, padding on the dummy slot). The run
stops at the first divergence and explains it. Whatever the subject does, raising, hanging
or returning garbage, comes back as a :class:`~swafuzz.run.diagnosis.Divergence`; only an
invalid scenario raises (:class:`reference.ScenarioError`).

This module is the entry: it checks the subject and the device, and hands the run to the
:class:`~swafuzz.run.driver.Driver`, which drives the lifecycle with its collaborators
(the judge of answers, the input guard, the mapping sync, the graph forwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Callable, Sequence

import torch

from ..reference import Scenario

from . import diagnosis as dx
from ..api import SUBJECT_API_VERSION, SUPPORTED_API_VERSIONS, Subject, Truth
from ..quantities import UnknownQuantity, answered
from .devices import timeline_for
from .driver import Driver
from .guard import MAX_NAME_CHARS, CallGuard, SubjectFailure, load_subject, quoted, type_name
from .judge import StoreOutcome
from .progress import DeadlinePassed
from ..process.channel import announce_scenario
from ..errors import NotCheckable, SubjectError, UnmodelledPath

# the names callers import from here
__all__ = ["DEFAULT_TIMEOUT_S", "DeadlinePassed", "NotCheckable", "RunResult", "StoreOutcome", "SubjectError",
           "UnmodelledPath", "check_device", "check_subject", "run_scenario"]

DEFAULT_TIMEOUT_S = 10.0


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
    try:
        answered(load_subject(what, getattr, subject, "answers", ()))
    except UnknownQuantity as exc:
        raise SubjectError(f"{name}.{exc}") from None
    return subject


_READ_FIRST = ("__name__", "truth", "api_version", "swa_write_location")
# the class attributes that reports, search settings and device checks read
_READ_LATER = ("requires", "realistic_exclusions", "__doc__", "__module__", "__qualname__", "call_sites",
               "answered_by", "code_names")


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
    run = Driver(subject, scenario, device, timeout_s, threads, timeline, on_store, keep_going, deadline)
    with CallGuard(timeout_s) as guard:
        run.run(guard)
    return RunResult(run.judge.first_divergence, run.progress.checks, run.progress.forward, run.store_calls.schedules,
                     monotonic() - started)
