"""Calling code under test without letting it crash or hang the harness.

Arming a timer per call costs more than a cheap subject call, so one watchdog thread per
guard polls a deadline instead; a call only writes two attributes. An overrun call is
interrupted in the thread that made it: the main thread gets a real SIGALRM (which also
breaks blocking sleeps), other threads an asynchronous exception at their next bytecode.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
import traceback
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


class CallGuard:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._deadline = 0.0
        self._thread_id = 0
        self._in_call = False
        self._fired = False
        self._lock = threading.Lock()
        self._closed = False
        self._uses_signal = False

    def __enter__(self) -> "CallGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._uses_signal = True
        threading.Thread(target=self._watch, name="swafuzz-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        if self._uses_signal:
            signal.signal(signal.SIGALRM, self._previous_handler)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            try:
                with self._lock:
                    self._thread_id = threading.get_ident()
                    self._deadline = time.monotonic() + self.timeout_s
                    self._in_call = True
                return fn(*args)
            finally:
                with self._lock:
                    self._in_call = False
                    fired, self._fired = self._fired, False
                if fired and not self._by_signal(self._thread_id):
                    # the exception may still be pending if the call returned first
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)
        except SubjectTimeout:
            raise SubjectFailure("timeout", f"{what} did not return within {self.timeout_s:g} s") from None
        except Exception as exc:  # noqa: BLE001 - any exception is the subject's divergence
            detail = "".join(traceback.format_exception(exc))
            raise SubjectFailure("raised", f"{what} raised {type(exc).__name__}: {exc}", detail, exc) from None

    def _by_signal(self, thread_id: int) -> bool:
        return self._uses_signal and thread_id == threading.main_thread().ident

    def _on_alarm(self, signum, frame) -> None:
        if self._in_call:
            raise SubjectTimeout()

    def _watch(self) -> None:
        poll = min(0.05, self.timeout_s / 4)
        while not self._closed:
            time.sleep(poll)
            with self._lock:
                if not (self._in_call and time.monotonic() > self._deadline) or self._fired:
                    continue
                self._fired = True
                thread_id = self._thread_id
                if self._by_signal(thread_id):
                    signal.pthread_kill(thread_id, signal.SIGALRM)
                else:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(thread_id), ctypes.py_object(SubjectTimeout)
                    )
