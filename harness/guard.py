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
leaves hangs to its caller (join with a timeout).

A caller that makes many cheap calls in a row may run them itself (:meth:`CallGuard.call`
costs a Python frame and a ``try`` per call): it sets ``in_call`` once for the run of
calls, bumps ``serial`` before each call, raises :class:`SubjectTimeout` after a call whose
serial equals ``fired_serial`` (the subject swallowed the alarm), clears ``in_call`` while
its own work between calls may be slow, and turns what a call raised into a failure with
:meth:`CallGuard.failure`.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from time import monotonic
from typing import Any, Callable


class SubjectTimeout(BaseException):
    """Raised inside a subject call that ran past its deadline.

    A BaseException so that a subject's own ``except Exception`` cannot swallow it.
    """


class SubjectFailure(Exception):
    def __init__(self, kind: str, message: str, detail: str = "", exc: BaseException | None = None):
        super().__init__(message)
        self.kind = kind  # "raised" or "timeout"
        self.message = message
        self.detail = detail
        self.exc = exc


def failure_of(what: str, exc: BaseException) -> SubjectFailure:
    detail = "".join(traceback.format_exception(exc))
    return SubjectFailure("raised", f"{what} raised {type(exc).__name__}: {exc}", detail, exc)


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

    def __enter__(self) -> "CallGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._watched = True
            _WATCHDOG.watch(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._watched:
            _WATCHDOG.unwatch(self)
            signal.signal(signal.SIGALRM, self._previous_handler)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.serial = serial = self.serial + 1
        self.in_call = True
        try:
            result = fn(*args)
            if self.fired_serial == serial:  # the subject swallowed the alarm
                raise SubjectTimeout()
            return result
        except (SubjectTimeout, Exception) as exc:
            raise self.failure(what, exc) from None
        finally:
            self.in_call = False

    def failure(self, what: str, exc: BaseException) -> SubjectFailure:
        """What a call's exception (or its :class:`SubjectTimeout`) comes to."""
        if isinstance(exc, SubjectTimeout):
            return SubjectFailure("timeout", f"{what} did not return within {self.timeout_s:g} s")
        return failure_of(what, exc)

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
