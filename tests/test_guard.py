"""Specification of ``swafuzz.run.guard.CallGuard``: subject calls that raise become failures,
calls that overrun their deadline are interrupted, and nothing of either leaks out of the
call that caused it."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
from conftest import wait_until

import swafuzz.run.guard as guard_module
from swafuzz.process.signals import note_signal
from swafuzz.run.guard import MAX_DETAIL_CHARS, MAX_MESSAGE_CHARS, CallGuard, SubjectFailure, SubjectTimeout

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def _sleep_catching_exception(limit: float = 30.0) -> str:
    end = time.monotonic() + limit  # bounded, so a broken guard cannot hang the suite
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except Exception:  # noqa: BLE001 - the subject hides every ordinary error
            pass
    return "survived"


def test_a_call_that_returns_gives_back_its_value():
    with CallGuard(1.0) as guard:
        assert guard.call("add", lambda a, b: a + b, 2, 3) == 5


def test_an_exception_becomes_a_raised_failure_with_message_detail_and_cause():
    def boom():
        raise ValueError("bad rows")

    with CallGuard(1.0) as guard:
        with pytest.raises(SubjectFailure) as info:
            guard.call("swa_write_location", boom)
    failure = info.value
    assert failure.kind == "raised"
    assert failure.message == "swa_write_location raised ValueError: bad rows"
    assert isinstance(failure.exc, ValueError)
    assert "Traceback" in failure.detail and "boom" in failure.detail


class _Custom(BaseException):
    pass


def _raise(exc: BaseException):
    def call():
        raise exc

    return call


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), _Custom("mine"),
                                 SubjectTimeout()], ids=lambda exc: type(exc).__name__)
def test_a_base_exception_the_subject_raises_itself_is_a_raised_failure(exc):
    with CallGuard(1.0) as guard:
        with pytest.raises(SubjectFailure) as info:
            guard.call("swa_write_location", _raise(exc))
    assert info.value.kind == "raised"
    assert info.value.message.startswith(f"swa_write_location raised {type(exc).__name__}")


def _interrupted_by(signum: int):
    def call():
        os.kill(os.getpid(), signum)
        time.sleep(5)  # bounded: the signal lands before it ends

    return call


def test_a_sigint_under_pythons_own_handler_interrupts_through_the_guard():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with CallGuard(1.0) as guard:
        with pytest.raises(KeyboardInterrupt):
            guard.call("swa_write_location", _interrupted_by(signal.SIGINT))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_raised_by_a_handler_that_notes_the_signal_interrupts_through_the_guard():
    def on_sigterm(signum, frame):
        note_signal(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with CallGuard(1.0) as guard:
            with pytest.raises(KeyboardInterrupt):
                guard.call("swa_write_location", _interrupted_by(signal.SIGTERM))
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_interrupt_the_subject_raises_after_a_signal_of_an_earlier_run_is_still_its_own():
    with CallGuard(1.0) as guard, pytest.raises(KeyboardInterrupt):
        guard.call("swa_write_location", _interrupted_by(signal.SIGINT))
    with CallGuard(1.0) as guard, pytest.raises(SubjectFailure):
        guard.call("swa_write_location", _raise(KeyboardInterrupt()))


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


@pytest.mark.parametrize("exc, shown", [
    (_Unprintable(), "swa_write_location raised _Unprintable (its message could not be read: str() raised "
                     "RuntimeError)"),
    (ValueError("two\nlines \x1b[2J"), "swa_write_location raised ValueError: 'two\\nlines \\x1b[2J'"),
    (ValueError(""), "swa_write_location raised ValueError"),
], ids=["str-raises", "control-characters", "empty"])
def test_a_failure_message_is_one_printable_line(exc, shown):
    with CallGuard(1.0) as guard, pytest.raises(SubjectFailure) as info:
        guard.call("swa_write_location", _raise(exc))
    assert info.value.message == shown


def test_a_megabyte_message_and_its_traceback_are_cut():
    with CallGuard(1.0) as guard, pytest.raises(SubjectFailure) as info:
        guard.call("swa_write_location", _raise(ValueError("x" * 5_000_000)))
    assert len(info.value.message) < MAX_MESSAGE_CHARS + 100
    assert info.value.message.endswith("... (5000000 characters)")
    assert len(info.value.detail) < MAX_DETAIL_CHARS + 100 and "characters cut" in info.value.detail


def test_a_traceback_keeps_newlines_and_escapes_other_control_characters():
    with CallGuard(1.0) as guard, pytest.raises(SubjectFailure) as info:
        guard.call("swa_write_location", _raise(ValueError("\x1b[31mred")))
    assert "\x1b" not in info.value.detail and "\\x1b[31mred" in info.value.detail
    assert info.value.detail.count("\n") > 2


@pytest.mark.parametrize(
    "hang",
    [lambda: time.sleep(30), lambda: _spin(30), _sleep_catching_exception],
    ids=["blocking-sleep", "busy-loop", "catches-Exception"],
)
def test_a_call_past_its_deadline_is_a_timeout_failure(hang):
    with CallGuard(0.2) as guard:
        with pytest.raises(SubjectFailure) as info:
            guard.call("swa_write_location", hang)
    assert info.value.kind == "timeout"
    assert info.value.message == "swa_write_location did not return within 0.2 s"


def test_the_timeout_is_a_base_exception_so_except_exception_cannot_swallow_it():
    assert issubclass(SubjectTimeout, BaseException)
    assert not issubclass(SubjectTimeout, Exception)


def test_a_guard_stays_armed_after_a_timeout():
    with CallGuard(0.2) as guard:
        for _ in range(2):
            with pytest.raises(SubjectFailure, match="did not return"):
                guard.call("hang", _sleep_catching_exception)
        assert guard.call("quick", lambda: 7) == 7


def test_code_after_a_call_that_finished_in_time_runs_past_the_deadline_uninterrupted():
    with CallGuard(0.2) as guard:
        assert guard.call("quick", lambda: 1) == 1
        assert _spin(0.5) == "done"  # the deadline of the finished call passes here
        assert guard.call("quick", lambda: 2) == 2
        time.sleep(0.3)
        assert guard.call("quick", lambda: 3) == 3


def test_calls_finishing_just_before_their_deadline_never_leak_a_late_timeout():
    timeout = 0.04
    rng = random.Random(1234)
    outcomes = set()
    with CallGuard(timeout) as guard:
        for _ in range(40):
            try:
                outcomes.add(guard.call("edge", _spin, timeout * rng.uniform(0.8, 1.3)))
            except SubjectFailure as failure:
                assert failure.kind == "timeout"
                outcomes.add("timeout")
            # later code: a stale interrupt would surface here as a SubjectTimeout, which is
            # a BaseException and fails the test
            _spin(0.005)
            try:
                outcomes.add(guard.call("next", lambda: "next"))
            except SubjectFailure as failure:  # only a preempted machine gets here
                assert failure.kind == "timeout" and "next did not return" in failure.message
    assert outcomes <= {"done", "timeout", "next"}
    assert "next" in outcomes


def test_leaving_the_guard_restores_the_previous_alarm_handler():
    before = signal.getsignal(signal.SIGALRM)
    with CallGuard(0.5) as guard:
        guard.call("quick", lambda: None)
    assert signal.getsignal(signal.SIGALRM) is before


def test_a_guard_on_another_thread_still_turns_exceptions_into_failures():
    seen: dict = {}

    def worker():
        with CallGuard(1.0) as guard:
            seen["value"] = guard.call("quick", lambda: 5)
            try:
                guard.call("boom", lambda: 1 / 0)
            except SubjectFailure as failure:
                seen["failure"] = failure

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert seen["value"] == 5
    assert seen["failure"].kind == "raised"
    assert "ZeroDivisionError" in seen["failure"].message


def _swallows_everything(limit: float = 1.0) -> str:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except BaseException:  # noqa: BLE001 - a subject that hides even the timeout
            pass
    return "late answer"


def test_a_call_that_swallows_the_timeout_is_still_a_timeout():
    with CallGuard(0.1) as guard:
        with pytest.raises(SubjectFailure, match="did not return"):
            guard.call("swa_write_location", _swallows_everything)


def _watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "swafuzz-watchdog"]


def test_one_watchdog_thread_serves_every_guard_of_the_process():
    for _ in range(20):
        with CallGuard(1.0) as guard:
            guard.call("quick", lambda: None)
    assert len(_watchdog_threads()) == 1


def test_an_outer_guard_still_times_out_after_an_inner_guard_was_left():
    with CallGuard(0.2) as outer:
        with CallGuard(5.0) as inner:
            assert inner.call("quick", lambda: 1) == 1
        with pytest.raises(SubjectFailure) as info:
            outer.call("swa_write_location", lambda: time.sleep(30))
    assert info.value.message == "swa_write_location did not return within 0.2 s"


def test_a_guard_entered_after_the_watchdog_went_to_sleep_still_times_out():
    with CallGuard(1.0) as guard:
        guard.call("quick", lambda: None)
    # the watchdog sleeps after a second without guards
    wait_until(lambda: guard_module._WATCHDOG._sleeping, "the watchdog went to sleep")
    with CallGuard(0.2) as guard:
        with pytest.raises(SubjectFailure, match="did not return within 0.2 s"):
            guard.call("swa_write_location", lambda: time.sleep(30))


def test_quick_calls_adding_up_to_more_than_the_timeout_are_never_interrupted():
    # each call is timed on its own, not the stretch of calls the watchdog sees in flight
    timeout = 0.3
    with CallGuard(timeout) as guard:
        start = time.monotonic()
        calls = 0
        while time.monotonic() - start < 4 * timeout:
            assert guard.call("quick", _spin, 0.001) == "done"
            calls += 1
    assert calls > 4
