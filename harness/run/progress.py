"""Where a run stands: its forward, subject calls and checked stores, and when it must stop.

Every part of a run reads it: the driver moves it on, the judge counts its checks, and a
divergence is dated by it (:meth:`Progress.site`).
"""

from __future__ import annotations

from time import monotonic
from typing import NamedTuple

from ..reference import ForwardPlan

from . import diagnosis as dx


class DeadlinePassed(KeyboardInterrupt):
    """A run's deadline passed. A KeyboardInterrupt, so that neither a subject's nor
    Hypothesis's ``except Exception`` takes it for a failure: Hypothesis stops at once."""

    def __init__(self, checks: int):
        super().__init__(f"the deadline passed after {checks} checked stores")
        self.checks = checks  # stores compared before it passed, the cut-short example's included


class Stop(Exception):
    """Ends a run at its divergence."""

    def __init__(self, divergence: dx.Divergence):
        self.divergence = divergence


class Where(NamedTuple):
    """Where a call happens; turned into a :class:`~swafuzz.run.diagnosis.Site` only when needed."""

    plan: ForwardPlan | None = None
    step: int = 0
    micro_batch: int = 0
    layer_id: int | None = None
    model: str | None = None


class Progress:
    """The run's counts: forwards begun, subject calls begun, stores checked; the current
    (or latest) forward's plan; whether a graph records what runs; the run's deadline (a
    ``time.monotonic()`` reading, or None)."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.forward = 0
        self.call = 0
        self.checks = 0
        self.plan: ForwardPlan | None = None
        self.capturing = False

    def stop_if_past_deadline(self) -> None:
        if self.deadline is not None and monotonic() >= self.deadline:
            raise DeadlinePassed(self.checks)

    def site(self, where: Where, call: int | None = None) -> dx.Site:
        """``call``: the call's index, when it is not the latest call."""
        plan = where.plan
        return dx.Site(
            forward=self.forward,
            event=plan.index if plan else -1,
            mode=plan.event.mode if plan else "setup",
            model=plan.model if plan else where.model,
            draft_step=where.step,
            micro_batch=where.micro_batch,
            layer_id=where.layer_id,
            call=self.call - 1 if call is None else call,  # calls are counted as they start
            num_draft_steps=len(plan.steps) if plan else 1,
            num_micro_batches=plan.num_micro_batches if plan else 1,
        )
