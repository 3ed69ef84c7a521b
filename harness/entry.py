"""The program's entry point (the ``swafuzz`` console script and ``python -m swafuzz``).

It takes SIGINT and SIGTERM over before anything heavy is imported, so that an interrupt
at any moment ends the program with its documented exit code and one line, never a
traceback:

- before a run starts (start-up, option checks, a replay), the first signal ends the
  program: 130 for SIGINT, 143 for SIGTERM, nothing written;
- while a run goes, the run's own watch (:class:`swafuzz.search.campaign.InterruptWatch`) stops it and
  the reports say what it found: 1 when that is a divergence;
- once the command has its result, signals are ignored: the exit code says what was found
  and written, whatever signal follows.

The commands that run a subject (fuzz, gate, exhaustive, replay) run it in a child process
that this one supervises (:mod:`swafuzz.supervisor`): a signal reaches the supervisor, which
passes it on, and the child's exit code is the program's.

A closed stdout (``swafuzz replay FILE | head -1``) is not an error: output the reader no
longer wants goes to the null device and the command exits with its own result code, which
is what a script in the pipeline asks for (``set -o pipefail``).

This module imports nothing but the standard library at load time.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, TextIO

from .process import channel
from .process.signals import Signals, note_signal

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum: int, frame: Any) -> None:
    first = Signals.first is None
    note_signal(signum)
    if first and not Signals.run_started:
        Signals.before_run = signum
        raise KeyboardInterrupt


class _ClosedPipeProof:
    """stdout that, once its reader has gone, writes to the null device instead of failing."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        # the buffered bytes the pipe refused are flushed to the null device
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def entry() -> None:
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    sys.stdout = _ClosedPipeProof(sys.stdout)
    try:
        from . import supervisor

        # a command that runs a subject runs in a child this process supervises; in the
        # child, the pipe to the supervisor is taken before anything else
        supervising = supervisor.wanted(sys.argv[1:]) and channel.CHANNEL_ENV not in os.environ
        if not supervising:
            channel.claim_channel()
            from .search import workers

            workers.start_early(sys.argv[1:])  # its imports overlap this process's own
        if supervising:
            code = supervisor.supervise(sys.argv[1:])
        else:
            from .cli import main

            code = main()
    except KeyboardInterrupt:
        signum = Signals.first or signal.SIGINT
        print(f"swafuzz: interrupted by {signal.Signals(signum).name} with no result; nothing was written",
              file=sys.stderr)
        code = 128 + signum
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    channel.announce_exit(code)
    if Signals.first is not None:
        # an interrupt that passed through library code can leave CPython flagged to end
        # the process by SIGINT at exit, which would replace the exit code
        os._exit(code)
    raise SystemExit(code)
