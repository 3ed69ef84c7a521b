"""What this process knows of the SIGINT and SIGTERM it has received: the entry's handlers and
a run's watch note each one here, and the guard asks whether an interrupt came from a
signal or from the code that was running. Standard library only, so any module may ask."""

from __future__ import annotations


class Signals:
    """The record, on the class: one per process."""

    first: int | None = None  # the first SIGINT or SIGTERM this process received
    before_run: int | None = None  # the first one, when it came before a run started
    run_started = False  # a run's own watch took over: a signal no longer ends the program
    received = 0  # SIGINT and SIGTERM signals noted so far


def note_signal(signum: int) -> None:
    """Remember a signal (called by every handler of this process)."""
    Signals.received += 1
    if Signals.first is None:
        Signals.first = signum


def signals_received() -> int:
    """How many SIGINT and SIGTERM signals this process has noted: a KeyboardInterrupt
    raised while the count moved came from a signal, not from the code that was running."""
    return Signals.received


def signal_before_run() -> int | None:
    """A signal that came before the run started, should the interrupt it raised have been
    swallowed on its way (the run then stops at once)."""
    return Signals.before_run


def run_starting() -> None:
    """A run's watch takes over from here: its reports decide the exit code."""
    Signals.run_started = True
