"""Calling code under test without letting it crash or hang the harness.

Arming a timer per call would cost more than a cheap subject call, and so would reading a
clock: a call only bumps its serial number and marks itself in flight. A watchdog thread
polls instead, and a call whose serial it has seen in flight, unchanged, for the timeout is
overrun. One watchdog serves the whole process (starting a thread per guard, that is per
scenario, cost a few percent of a fuzzing run): it watches the innermost guard entered on
the main thread. An overrun call is interrupted with a real SIGALRM, which also breaks
blocking sleeps. The handler raises only if the call that overran is still the one in
flight, so a late signal can never hit the next call; a call that swallows the alarm is
re-alarmed every timeout period and reported as timed out when it finally returns. Signals
reach the main thread only: a guard entered on another thread converts exceptions but
leaves hangs to its caller, which ends an overrun call with :func:`interrupt`.

A caller that makes many cheap calls in a row may run them itself (:meth:`CallGuard.call`
costs a Python frame and a ``try`` per call): it sets ``in_call`` once for the run of
calls, bumps ``serial`` before each call, raises :class:`SubjectTimeout` after a call whose
serial equals ``fired_serial`` (the subject swallowed the alarm), clears ``in_call`` while
its own work between calls may be slow, and turns what a call raised into a failure with
:meth:`CallGuard.failure`.

Whatever a call raises is the subject's, ``BaseException`` included (``SystemExit``,
``GeneratorExit``, a ``KeyboardInterrupt`` it raised itself), with two exceptions that stop
the harness instead: the watchdog's :class:`SubjectTimeout` for the call in flight, and a
``KeyboardInterrupt`` raised while a SIGINT or SIGTERM arrived (every handler of the process
notes the signal, :func:`swafuzz.entry.note_signal`; under Python's own SIGINT handler, which
notes nothing, a guard puts one in that does). Whatever torch state a call leaves behind
(modes pushed, grad or inference mode, default dtype, deterministic flags, threads) is put
back before the harness's own work (:class:`TorchState`). A subject's text (its exception's
name and message, its traceback) is shown only rendered: cut to a bounded length, and
quoted with control characters escaped unless it is one printable line.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
import traceback
from time import monotonic
from typing import Any, Callable

import torch

from .boundary import printable
from ..process.signals import note_signal, signals_received

MAX_MESSAGE_CHARS = 2000  # of a subject's text in a sentence
MAX_NAME_CHARS = 200  # of a name the subject chose (a class's)
MAX_DETAIL_CHARS = 20_000  # of a traceback kept with a divergence


class SubjectTimeout(BaseException):
    """Raised inside a subject call that ran past its deadline.

    A BaseException so that a subject's own ``except Exception`` cannot swallow it. A subject
    that tells findings in its code's terms may set ``running_in`` as it passes through: the
    function of that code it interrupted, and where (``"Cls.fn (file.py:12)"``).
    """

    running_in: str | None = None


class SubjectFailure(Exception):
    def __init__(self, kind: str, message: str, detail: str = "", exc: BaseException | None = None):
        super().__init__(message)
        self.kind = kind  # "raised" or "timeout"
        self.message = message
        self.detail = detail
        self.exc = exc


def quoted(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A subject's text for one line of a sentence: itself when it is one printable line of
    at most ``limit`` characters, otherwise quoted with control characters escaped and cut
    at about ``limit`` characters (a message may be megabytes, or hold escape sequences
    that rewrite a terminal)."""
    text = "".join((text,))  # a plain str: the methods of a str subclass are the subject's code
    if len(text) <= limit and text.isprintable():
        return text
    shown = repr(text[:limit])
    if len(shown) > limit or len(text) > limit:
        shown = f"{shown[:limit]}... ({len(text)} characters)"
    return shown


def type_name(value: Any) -> str:
    return quoted(type(value).__name__, MAX_NAME_CHARS)


def describe_exception(exc: BaseException) -> str:
    """``Name: message`` of a subject's exception, read without trusting its ``__str__``."""
    name = type_name(exc)
    try:
        message = str(exc)
    except BaseException as failed:  # noqa: BLE001 - the message is the subject's code
        return f"{name} (its message could not be read: str() raised {type_name(failed)})"
    return f"{name}: {quoted(message)}" if message else name


def traceback_text(exc: BaseException) -> str:
    """The traceback of a subject's exception, cut to :data:`MAX_DETAIL_CHARS` (its first
    and last frames kept) with control characters escaped line by line."""
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException as failed:  # noqa: BLE001 - formatting reads the subject's objects
        return f"(no traceback: formatting it raised {type_name(failed)})"
    if len(text) > MAX_DETAIL_CHARS:
        half = MAX_DETAIL_CHARS // 2
        text = f"{text[:half]}\n... ({len(text) - 2 * half} characters cut) ...\n{text[-half:]}"
    return "\n".join(map(printable, text.split("\n")))


def failure_of(what: str, exc: BaseException) -> SubjectFailure:
    return SubjectFailure("raised", f"{what} raised {describe_exception(exc)}", traceback_text(exc), exc)


def timed_out(what: str, timeout: SubjectTimeout | None, timeout_s: float) -> SubjectFailure:
    """The failure of a call of ``what`` that ran past ``timeout_s``, named by the function
    of the code under test that ``timeout`` interrupted where the subject told it."""
    running_in = vars(timeout).get("running_in") if timeout is not None else None
    if type(running_in) is str:
        what = quoted(running_in)
    return SubjectFailure("timeout", f"{what} did not return within {timeout_s:g} s")


def interrupt(thread: threading.Thread) -> None:
    """Raise :class:`SubjectTimeout` in ``thread`` at its next Python instruction: signals
    reach the main thread only. A thread blocked in C (a sleep, a lock) sees it once the
    call returns."""
    _set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(SubjectTimeout))


def withdraw_interrupt() -> None:
    """Drop an :func:`interrupt` of the current thread that has not landed yet.

    Clearing it outright is no way: CPython keeps the interpreter's "exception pending"
    flag set until some thread raises one, and every thread pays for the flag at each
    loop and call. So the pending one is replaced by one that lands here, at once."""
    try:
        _set_async_exc(ctypes.c_ulong(threading.get_ident()), ctypes.py_object(_Withdrawn))
        for _ in range(_LANDS_WITHIN):
            pass
    except _Withdrawn:
        pass


def cancel_interrupt(thread: threading.Thread) -> None:
    """Drop an :func:`interrupt` of ``thread`` that has not landed (it is blocked in C),
    from another thread."""
    _set_async_exc(ctypes.c_ulong(thread.ident), None)
    withdraw_interrupt()  # the flag the dropped one leaves set


class _Withdrawn(BaseException):
    """The interruption that replaces a withdrawn one."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_LANDS_WITHIN = 1_000_000  # loop turns: the eval loop looks at the flag at every one


def _note_and_interrupt(signum: int, frame: Any) -> None:
    """Python's SIGINT handler, noting the signal."""
    note_signal(signum)
    raise KeyboardInterrupt


def from_a_signal(exc: BaseException, signals_before: int) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt raised while a SIGINT or SIGTERM arrived (the
    process had noted ``signals_before`` signals when the code began), not one that the
    code raised itself."""
    return isinstance(exc, KeyboardInterrupt) and signals_received() != signals_before


def load_subject(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: the subject's code run before any scenario (its module imported, its
    class read). Whatever it raises comes back as a :class:`SubjectFailure`, ``BaseException``
    included, but for two that are not the subject's failure to load: ``SystemExit`` (the
    subject ends its process: a supervising process reports that as a divergence) and a
    KeyboardInterrupt raised while a signal arrived (a person's Ctrl-C stops the harness).
    There is no timeout: code that hangs as it loads is for the supervisor to find."""
    signals = signals_received()
    state = TorchState()  # what the code leaves behind is undone: it is no state of the harness's
    handler = None
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        handler = signal.signal(signal.SIGINT, _note_and_interrupt)
    try:
        return fn(*args)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - what loading raised is the subject's
        if from_a_signal(exc, signals):
            raise
        raise failure_of(what, exc) from None
    finally:
        state.restore()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


class TorchState:
    """torch's settings that the harness's own work runs under, as they were when this was
    made (inference mode always off: the harness reads tensors' versions), put back by
    :meth:`restore` whatever the subject's code left behind: the torch function and dispatch
    modes (a mode could answer the harness's own comparisons), grad and inference mode,
    the default dtype, the deterministic-algorithms flags and the number of threads.

    Modes, grad and inference mode are the calling thread's; the rest are the process's."""

    _C = torch._C
    # inference mode can only be left by a guard of its own, which must outlive the subject's:
    # the guards made to leave it are kept for the life of the process
    _leaving_inference: list[Any] = []

    def __init__(self) -> None:
        C = self._C
        self.function_modes = [C._get_function_stack_at(i) for i in range(C._len_torch_function_stack())]
        self.dispatch_modes = [C._get_dispatch_stack_at(i) for i in range(C._len_torch_dispatch_stack())]
        self.settings = self._settings()
        self.restore()

    @staticmethod
    def _settings() -> tuple:
        return (torch.get_default_dtype(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads())

    def modes_kept(self) -> bool:
        """Whether the mode stacks are as deep as they were (the cheap check, made between a
        subject's calls in a row: a mode is what could subvert a comparison)."""
        C = self._C
        return (C._len_torch_function_stack() == len(self.function_modes)
                and C._len_torch_dispatch_stack() == len(self.dispatch_modes))

    def restore(self) -> None:
        C = self._C
        for modes, length, at, pop, push in (
            (self.function_modes, C._len_torch_function_stack, C._get_function_stack_at,
             C._pop_torch_function_stack, C._push_on_torch_function_stack),
            (self.dispatch_modes, C._len_torch_dispatch_stack, C._get_dispatch_stack_at,
             lambda: C._pop_torch_dispatch_stack(None), C._push_on_torch_dispatch_stack),
        ):
            if length() != len(modes) or any(at(i) is not mode for i, mode in enumerate(modes)):
                while length():
                    pop()
                for mode in modes:
                    push(mode)
        if torch.is_inference_mode_enabled():
            self._leaving_inference.append(C._InferenceMode(False))
        if self._settings() != self.settings:
            dtype, grad, deterministic, warn_only, threads = self.settings
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)


class CallGuard:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.serial = 0  # bumped as each call starts
        self.in_call = False
        self.fired_serial = -1  # the call the watchdog alarmed
        self._watched = False
        # the watchdog's view: the call it last saw in flight, and when it first saw it
        self._seen_serial = -1
        self._seen_at = 0.0
        self._interrupt_handler: Any = None  # the SIGINT handler this guard replaced, if it did

    def __enter__(self) -> "CallGuard":
        self._signals = signals_received()
        self._recursion_limit = sys.getrecursionlimit()
        self.torch_state = TorchState()
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._interrupt_handler = signal.signal(signal.SIGINT, _note_and_interrupt)
            self._watched = True
            _WATCHDOG.watch(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._watched:
            _WATCHDOG.unwatch(self)
            signal.signal(signal.SIGALRM, self._previous_handler)
            if self._interrupt_handler is not None:
                signal.signal(signal.SIGINT, self._interrupt_handler)
        sys.setrecursionlimit(self._recursion_limit)
        self.torch_state.restore()

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.serial = serial = self.serial + 1
        self.in_call = True
        try:
            result = fn(*args)
            if self.fired_serial == serial:  # the subject swallowed the alarm
                raise SubjectTimeout()
            return result
        except BaseException as exc:
            raise self.failure(what, exc) from None
        finally:
            self.in_call = False
            self.restore_harness_state()

    def failure(self, what: str, exc: BaseException) -> SubjectFailure:
        """What a call's exception comes to: a timeout for the watchdog's alarm of the call
        in flight, else the subject's failure. A KeyboardInterrupt raised while a signal
        arrived is no failure: it is raised again."""
        self.restore_harness_state()
        if isinstance(exc, SubjectTimeout) and self.fired_serial == self.serial:
            return timed_out(what, exc, self.timeout_s)
        if from_a_signal(exc, self._signals):
            raise exc
        return failure_of(what, exc)

    def restore_harness_state(self) -> None:
        """Undo a subject's lowering of the recursion limit, under which the harness's own
        code would fail (a raised one is left until the guard is left), and put back the
        torch state the guard was entered in (:class:`TorchState`)."""
        if sys.getrecursionlimit() < self._recursion_limit:
            sys.setrecursionlimit(self._recursion_limit)
        self.torch_state.restore()

    def _on_alarm(self, signum, frame) -> None:
        if self.in_call and self.serial == self.fired_serial:
            raise SubjectTimeout()

    def poll_s(self) -> float:
        # a call is first seen up to one poll after it started and found overrun up to one
        # poll after its timeout: it is interrupted within a quarter timeout past it
        return min(0.05, self.timeout_s / 8)

    def alarm_if_overrun(self, main_thread: int) -> None:
        serial = self.serial
        if not self.in_call:
            self._seen_serial = -1
            return
        now = monotonic()
        if serial != self._seen_serial:
            # timed from here, never from before the call began: no call is cut short
            self._seen_serial, self._seen_at = serial, now
        elif now - self._seen_at > self.timeout_s:
            # again every timeout period, in case the subject swallowed the last alarm
            self.fired_serial = serial
            self._seen_at = now
            signal.pthread_kill(main_thread, signal.SIGALRM)


class _Watchdog:
    """The process's one watchdog thread, started by the first guard on the main thread.

    Between the guards of back-to-back scenarios it keeps polling: waking a sleeping thread
    for every guard cost more than the polls. It sleeps only after a second without guards.
    """

    IDLE_AFTER_S = 1.0
    POLL_S = 0.05

    def __init__(self) -> None:
        self._guards: list[CallGuard] = []  # entered and not yet left, innermost last
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._sleeping = False
        self._thread: threading.Thread | None = None

    def watch(self, guard: CallGuard) -> None:
        with self._lock:
            self._guards.append(guard)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="swafuzz-watchdog", daemon=True)
                self._thread.start()
            if self._sleeping:
                self._sleeping = False
                self._wake.set()

    def unwatch(self, guard: CallGuard) -> None:
        with self._lock:
            self._guards.remove(guard)

    def _run(self) -> None:
        main = threading.main_thread().ident
        last_busy = monotonic()
        while True:
            with self._lock:
                guard = self._guards[-1] if self._guards else None
                # decided under the lock, so a guard entered now finds it sleeping and wakes it
                self._sleeping = guard is None and monotonic() - last_busy > self.IDLE_AFTER_S
                if self._sleeping:
                    self._wake.clear()
            if guard is not None:
                last_busy = monotonic()
                time.sleep(guard.poll_s())
                guard.alarm_if_overrun(main)
            elif self._sleeping:
                self._wake.wait()
                last_busy = monotonic()
            else:
                time.sleep(self.POLL_S)


_WATCHDOG = _Watchdog()


def call_in_flight() -> int | None:
    """The serial of the subject call in flight on the main thread, or None between calls:
    a supervising process (:mod:`swafuzz.supervisor`) ends a child whose call stays in flight
    long after its own alarm should have ended it."""
    guards = _WATCHDOG._guards
    guard = guards[-1] if guards else None
    return guard.serial if guard is not None and guard.in_call else None
