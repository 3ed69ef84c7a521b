"""Progress of long runs: a live line on a terminal, a plain line now and then in a log.

On a terminal the line is redrawn in place (carriage return), at most every
``min_interval_s``, so a fast fuzzer does not spend its time printing. Redirected output (a
CI log, a pipe) gets the same line as a line of its own every ``log_interval_s``, so that a
gate running for minutes in CI shows it is alive while a short run prints nothing; ``--json``
gets none.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from ..strategies.features import ALL_FEATURES

from .fuzz import Progress

_BAR_WIDTH = 20


def format_progress(progress: Progress, total_features: int = len(ALL_FEATURES)) -> str:
    rate = progress.examples / progress.elapsed_s if progress.elapsed_s > 0 else 0.0
    parts = [
        f"{progress.examples} examples",
        f"{rate:.1f}/s",
        f"features {progress.features_covered}/{total_features}",
        f"divergences {progress.divergences}",
    ]
    if progress.budget_s:
        left = max(0.0, progress.budget_s - progress.elapsed_s)
        done = min(1.0, progress.elapsed_s / progress.budget_s)
        filled = round(done * _BAR_WIDTH)
        bar = "[" + "#" * filled + "-" * (_BAR_WIDTH - filled) + "]"
        parts.insert(0, bar)
        parts.append(f"{left:.0f}s left")
    else:
        parts.append(f"{progress.elapsed_s:.0f}s")
    return "swafuzz " + "  ".join(parts)


class ProgressLine:
    """Feed it :class:`~swafuzz.search.fuzz.Progress` updates; call :meth:`close` at the end."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True,
                 min_interval_s: float = 0.2, log_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = _is_terminal(self.stream)
        self.interval_s = min_interval_s if self.live else log_interval_s
        self.clock = clock
        # a log's first line comes one interval into the run
        self._last_draw = float("-inf") if self.live else clock()
        self._width = 0

    def update(self, progress: Progress) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last_draw < self.interval_s:
            return
        self._last_draw = now
        if self.live:
            self._draw(format_progress(progress))
        else:
            self.stream.write(format_progress(progress) + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """Print a line of its own above the live line (a divergence was found, ...); a log
        gets the finding in the run's summary instead."""
        if not (self.enabled and self.live):
            return
        self._erase()
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last_draw = float("-inf")

    def close(self) -> None:
        if self.enabled and self.live:
            self._erase()

    def _draw(self, line: str) -> None:
        padding = " " * max(0, self._width - len(line))
        self.stream.write("\r" + line + padding)
        self.stream.flush()
        self._width = len(line)

    def _erase(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
