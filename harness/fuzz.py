"""The fuzzing engine: Hypothesis drives scenarios from :mod:`strategies` through the
executor, shrinks the first divergence, and reports coverage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from reference import Scenario

from .diagnosis import Divergence
from .registry import SubjectInfo

PROFILES = ("realistic", "adversarial")
SETTINGS_PROFILES = ("dev", "ci", "nightly", "repro")


@dataclass
class Progress:
    examples: int
    elapsed_s: float
    budget_s: float | None
    features_covered: int
    divergences: int


@dataclass
class FuzzResult:
    subject: str
    profile: str  # the scenario profile asked for
    settings: str  # the settings profile used
    examples: int
    elapsed_s: float
    divergence: Divergence | None = None
    scenario: Scenario | None = None  # shrunk scenario of the divergence
    weakest_profile: str | None = None  # weakest scenario profile that reproduces it
    seed: int | None = None
    coverage: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def verdict(self) -> str:
        return "divergence" if self.divergence is not None else "no divergence"


def fuzz(
    info: SubjectInfo,
    *,
    profile: str = "realistic",
    settings: str = "dev",
    max_examples: int | None = None,
    budget_s: float | None = None,
    seed: int | None = None,
    device: str = "cpu",
    database_dir: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_divergence: Callable[[FuzzResult], None] | None = None,
) -> FuzzResult:
    raise NotImplementedError
