"""Replay files: one divergence, self-contained and versioned, re-runnable without Hypothesis.

A replay file is JSON::

    {"format": "swafuzz-replay", "schema_version": 1, "harness_version": "0.1.0",
     "subject": "pool-start-layer", "profile": "realistic", "settings": "dev", "seed": 7,
     "device": "cpu", "scenario": {...}, "diagnosis": {...}}

``subject`` is the spec as given on the command line (a built-in name or ``module:attr``), so
the same spec resolves the subject again when the file is replayed or turned into a test.
Replaying runs the recorded scenario once through the executor; the engine model is
deterministic, so the same subject gives the same answer every time.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import textwrap
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from reference import Scenario, ScenarioError

from . import __version__
from .diagnosis import Divergence
from .executor import DEFAULT_TIMEOUT_S, RunResult, run_scenario
from .registry import resolve_subject
from .reports import write_atomically

FORMAT = "swafuzz-replay"
SCHEMA_VERSION = 1


class ReplayError(ValueError):
    """A replay file that cannot be read: missing, not JSON, another format or version."""


@dataclass(frozen=True)
class Replay:
    subject: str
    profile: str
    scenario: Scenario
    divergence: Divergence
    seed: int | None = None
    settings: str | None = None
    device: str = "cpu"
    harness_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "harness_version": self.harness_version,
            "subject": self.subject,
            "profile": self.profile,
            "settings": self.settings,
            "seed": self.seed,
            "device": self.device,
            "scenario": self.scenario.to_dict(),
            "diagnosis": self.divergence.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Replay":
        if not isinstance(data, dict):
            raise ReplayError(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ReplayError(
                f"not a swafuzz replay file: its 'format' is {data.get('format')!r}, expected {FORMAT!r}"
            )
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            written_by = data.get("harness_version", "an unknown version")
            raise ReplayError(
                f"replay schema version {version!r} (written by swafuzz {written_by}) is not supported: "
                f"swafuzz {__version__} reads schema version {SCHEMA_VERSION}; replay it with the "
                "swafuzz that wrote it, or fuzz again to record a new file"
            )
        for name, kinds in (("subject", str), ("profile", str), ("device", str), ("harness_version", str),
                            ("settings", (str, type(None))), ("seed", (int, type(None)))):
            if not isinstance(data.get(name), kinds) or isinstance(data.get(name), bool):
                raise ReplayError(f"field '{name}' is missing or has the wrong type: {data.get(name)!r}")
        try:
            scenario = Scenario.from_dict(data.get("scenario"))
        except ScenarioError as exc:
            raise ReplayError(f"field 'scenario' is invalid: {exc}") from None
        return cls(
            subject=data["subject"], profile=data["profile"], scenario=scenario,
            divergence=divergence_from(data.get("diagnosis")), seed=data["seed"],
            settings=data["settings"], device=data["device"], harness_version=data["harness_version"],
        )


def divergence_from(data: Any) -> Divergence:
    if not isinstance(data, dict):
        raise ReplayError(f"field 'diagnosis' must be an object, got {type(data).__name__}")
    known = {f.name for f in fields(Divergence)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ReplayError(f"field 'diagnosis' has unknown key(s) {', '.join(map(repr, unknown))}")
    for name in ("kind", "sentence"):
        if not isinstance(data.get(name), str):
            raise ReplayError(f"field 'diagnosis.{name}' must be a string, got {data.get(name)!r}")
    try:
        return Divergence.from_dict(data)
    except TypeError as exc:
        raise ReplayError(f"field 'diagnosis' is incomplete: {exc}") from None


def load_replay(path: str | os.PathLike) -> Replay:
    """Read and check a replay file; every problem is a :class:`ReplayError` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReplayError(f"{path}: no such replay file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: cannot read it: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    try:
        return Replay.from_dict(data)
    except ReplayError as exc:
        raise ReplayError(f"{path}: {exc}") from None


def replay_file_name(replay: Replay, run: str | None = None) -> str:
    """``run`` names the run (default: its seed, else its settings). Every divergence one run
    reports goes to the same file, so a later, further-shrunk one replaces the first."""
    if run is None:
        run = f"seed{replay.seed}" if replay.seed is not None else replay.settings or "unseeded"
    return f"{_slug(replay.subject)}-{_slug(replay.profile)}-{_slug(run)}.json"


def write_replay(replay: Replay, directory: str | os.PathLike, run: str | None = None) -> Path:
    path = Path(directory) / replay_file_name(replay, run)
    return write_atomically(path, json.dumps(replay.to_dict(), indent=2) + "\n")


def run_replay(replay: Replay, *, subject: str | None = None, device: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> RunResult:
    """Run the recorded scenario once against ``subject`` (default: the recorded one)."""
    info = resolve_subject(subject or replay.subject)
    return run_scenario(info.subject, replay.scenario, device=device or replay.device, timeout_s=timeout_s)


def same_divergence(a: Divergence, b: Divergence) -> bool:
    """The same failure at the same store (the sentence may word it differently)."""
    where = ("kind", "forward", "draft_step", "micro_batch", "layer_id", "model")
    return all(getattr(a, name) == getattr(b, name) for name in where)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "subject"


# ---- emitted regression tests --------------------------------------------------------------

_TEST_TEMPLATE = '''\
"""Regression test for a divergence swafuzz found: it runs the shrunk scenario once, without
Hypothesis, and fails while the divergence is there. A subject given as module:attr must be
importable where this test runs."""

# Recorded by swafuzz {harness_version} (profile {profile}, seed {seed}, device {device})
# from {source}:
{sentence}

import pytest
import torch

from harness import run_scenario
from harness.registry import resolve_subject
from reference import Scenario

SUBJECT = {subject!r}
DEVICE = {device!r}
SCENARIO = Scenario.from_dict(
{scenario}
)


def test_{name}():
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("this divergence was recorded on a CUDA device and none is available")
    result = run_scenario(resolve_subject(SUBJECT).subject, SCENARIO, device=DEVICE)
    assert result.divergence is None, result.divergence.sentence
'''


def render_pytest(replay: Replay, source: str) -> str:
    # comments hold the free text: a sentence quoting an exception may contain anything
    sentence = "\n".join(textwrap.wrap(replay.divergence.sentence, 88, initial_indent="#   ",
                                        subsequent_indent="#   "))
    return _TEST_TEMPLATE.format(
        subject=replay.subject, harness_version=replay.harness_version, profile=replay.profile,
        seed=replay.seed, device=replay.device, source=" ".join(source.split()), sentence=sentence,
        scenario=textwrap.indent(pprint.pformat(replay.scenario.to_dict(), width=92, sort_dicts=False), "    "),
        name=_slug(f"{replay.subject}-{replay.divergence.kind}").replace("-", "_") + "_is_fixed",
    )


def emit_pytest(replay: Replay, path: str | os.PathLike, source: str) -> Path:
    """Write a standalone pytest file that fails while ``replay``'s divergence is present."""
    return write_atomically(path, render_pytest(replay, source))
