"""Calling code under test without letting it crash or hang the harness.

Arming a timer per call would cost more than a cheap subject call, so a watchdog thread
polls the deadline of the call in flight instead; a call only stores three attributes.
An overrun call is interrupted with a real SIGALRM, which also breaks blocking sleeps. The
handler raises only if the call that overran is still the one in flight, so a late signal
can never hit the next call; a call that swallows the alarm is re-alarmed every timeout
period and reported as timed out when it finally returns. Signals reach the main thread only: a guard entered on
another thread converts exceptions but leaves hangs to its caller (join with a timeout).
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
        self._serial = 0
        self._deadline = 0.0
        self._in_call = False
        self._fired_serial = -1
        self._closed = False
        self._watched = False

    def __enter__(self) -> "CallGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._watched = True
            threading.Thread(target=self._watch, name="swafuzz-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        if self._watched:
            signal.signal(signal.SIGALRM, self._previous_handler)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self._serial += 1
        serial = self._serial
        self._deadline = monotonic() + self.timeout_s
        self._in_call = True
        try:
            result = fn(*args)
            if self._fired_serial == serial:  # the subject swallowed the alarm
                raise SubjectTimeout()
            return result
        except SubjectTimeout:
            raise SubjectFailure("timeout", f"{what} did not return within {self.timeout_s:g} s") from None
        except Exception as exc:  # noqa: BLE001 - any exception is the subject's divergence
            raise failure_of(what, exc) from None
        finally:
            self._in_call = False

    def _on_alarm(self, signum, frame) -> None:
        if self._in_call and self._serial == self._fired_serial:
            raise SubjectTimeout()

    def _watch(self) -> None:
        poll = min(0.05, self.timeout_s / 4)
        main = threading.main_thread().ident
        while not self._closed:
            time.sleep(poll)
            serial = self._serial
            if self._in_call and monotonic() > self._deadline:
                # again every timeout period, in case the subject swallowed the last alarm
                self._fired_serial = serial
                self._deadline = monotonic() + self.timeout_s
                signal.pthread_kill(main, signal.SIGALRM)
