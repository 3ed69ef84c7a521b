"""Replay files: one divergence, self-contained and versioned, re-runnable without Hypothesis.

A replay file is JSON::

    {"format": "swafuzz-replay", "schema_version": 1, "harness_version": "0.1.0",
     "subject": "pool-start-layer", "profile": "realistic", "settings": "dev", "seed": 7,
     "device": "cpu", "scenario": {...}, "diagnosis": {...}}

``subject`` is the spec as given on the command line (a built-in name, ``sglang:<target>`` or
``module:attr``). Replaying resolves a built-in name or an ``sglang:`` target from the file;
a ``module:attr`` is never imported because a file says so: the person replaying passes
``--subject module:attr`` to load that code.
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

from ..reference import Scenario, ScenarioError

from .. import __version__
from ..run.boundary import InputError, describe_path, parse_json, read_regular_file, show
from ..run.diagnosis import Divergence
from ..run.executor import DEFAULT_TIMEOUT_S, RunResult, SubjectError, run_scenario
from ..subjects.registry import SubjectInfo, resolve_subject
from .reports import write_atomically
from ..errors import BindError, ReplayError

FORMAT = "swafuzz-replay"
SCHEMA_VERSION = 1
MAX_NAME_LENGTH = 200  # subject, profile, settings, device, harness version, switch names
MAX_ENGINE_SWITCHES = 16


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
    engine_switches: dict[str, bool] | None = None  # SGLang switch -> value of the run
    # the SGLang tree an sglang:<target> subject was bound from (swafuzz.subjects.sglang.tree_record)
    sglang_tree: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        switches = {} if self.engine_switches is None else {"engine_switches": dict(self.engine_switches)}
        if self.sglang_tree is not None:
            switches["sglang_tree"] = dict(self.sglang_tree)
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
            **switches,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Replay":
        if not isinstance(data, dict):
            raise ReplayError(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ReplayError(
                f"not a swafuzz replay file: its 'format' is {show(data.get('format'))}, expected {FORMAT!r}"
            )
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            written_by = data.get("harness_version")
            if not (isinstance(written_by, str) and len(written_by) <= 40 and written_by.isprintable()):
                written_by = "an unknown version"
            raise ReplayError(
                f"replay schema version {show(version)} (written by swafuzz {written_by}) is not supported: "
                f"swafuzz {__version__} reads schema version {SCHEMA_VERSION}; replay it with the "
                "swafuzz that wrote it, or fuzz again to record a new file"
            )
        for name, kinds in (("subject", str), ("profile", str), ("device", str), ("harness_version", str),
                            ("settings", (str, type(None))), ("seed", (int, type(None)))):
            value = data.get(name)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise ReplayError(f"field '{name}' is missing or has the wrong type: {show(value)}")
            # these end up in file names, terminals and the comments of an emitted test file,
            # where a line break would turn the rest of the text into code
            if isinstance(value, str) and not (len(value) <= MAX_NAME_LENGTH and value.isprintable()):
                raise ReplayError(f"field '{name}' must be printable text of at most {MAX_NAME_LENGTH} "
                                  f"characters (the limit MAX_NAME_LENGTH), got {show(value)}")
        try:
            scenario = Scenario.from_dict(data.get("scenario"))
        except ScenarioError as exc:
            raise ReplayError(f"field 'scenario' is invalid: {exc}") from None
        return cls(
            subject=data["subject"], profile=data["profile"], scenario=scenario,
            divergence=divergence_from(data.get("diagnosis")), seed=data.get("seed"),
            settings=data.get("settings"), device=data["device"], harness_version=data["harness_version"],
            engine_switches=_engine_switches(data.get("engine_switches")),
            sglang_tree=_sglang_tree(data.get("sglang_tree")),
        )


def _engine_switches(data: Any) -> dict[str, bool] | None:
    if data is None:
        return None
    if not isinstance(data, dict) or len(data) > MAX_ENGINE_SWITCHES:
        raise ReplayError(f"field 'engine_switches' must be an object of at most {MAX_ENGINE_SWITCHES} "
                          f"switches, got {show(data)}")
    for name, value in data.items():
        if not (len(name) <= MAX_NAME_LENGTH and name.isprintable()) or not isinstance(value, bool):
            raise ReplayError(f"field 'engine_switches' maps switch names to true or false, got "
                              f"{show(name)}: {show(value)}")
    return dict(data)


MAX_PATH_LENGTH = 4096
MAX_SUPPLIED_VALUES = 64


def _sglang_tree(data: Any) -> dict[str, Any] | None:
    if data is None:
        return None
    problem = None
    if not isinstance(data, dict):
        problem = "must be an object"
    else:
        for name, limit in (("path", MAX_PATH_LENGTH), ("origin", MAX_NAME_LENGTH), ("digest", MAX_NAME_LENGTH)):
            value = data.get(name)
            if not (isinstance(value, str) and len(value) <= limit and value.isprintable()):
                problem = f"needs '{name}' as printable text of at most {limit} characters, got {show(value)}"
                break
        version = data.get("version")
        attributes = data.get("attributes")
        if problem is None and not (version is None or isinstance(version, str) and len(version) <= MAX_NAME_LENGTH):
            problem = f"has a 'version' that is neither text nor null: {show(version)}"
        if problem is None and not (isinstance(attributes, list) and len(attributes) <= MAX_SUPPLIED_VALUES
                                    and all(isinstance(a, str) and len(a) <= MAX_PATH_LENGTH for a in attributes)):
            problem = f"needs 'attributes' as a list of at most {MAX_SUPPLIED_VALUES} NAME=VALUE texts, got {show(attributes)}"
    if problem is not None:
        raise ReplayError(f"field 'sglang_tree' {problem}")
    return {name: data[name] for name in ("path", "origin", "version", "digest", "attributes")}


def divergence_from(data: Any) -> Divergence:
    if not isinstance(data, dict):
        raise ReplayError(f"field 'diagnosis' must be an object, got {type(data).__name__}")
    known = {f.name for f in fields(Divergence)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ReplayError(f"field 'diagnosis' has unknown key(s) {', '.join(map(show, unknown[:5]))}")
    for name in ("kind", "sentence"):
        if not isinstance(data.get(name), str):
            raise ReplayError(f"field 'diagnosis.{name}' must be a string, got {show(data.get(name))}")
    try:
        return Divergence.from_dict(data)
    except TypeError as exc:
        raise ReplayError(f"field 'diagnosis' is incomplete: {exc}") from None


def load_replay(path: str | os.PathLike) -> Replay:
    """Read and check a replay file; every problem is a :class:`ReplayError` naming the file."""
    name = describe_path(path)
    try:
        data = parse_json(read_regular_file(path, "replay file"), name)
    except InputError as exc:
        raise ReplayError(str(exc)) from None
    try:
        return Replay.from_dict(data)
    except ReplayError as exc:
        raise ReplayError(f"{name}: {exc}") from None


def replay_file_name(replay: Replay, run: str | None = None) -> str:
    """``run`` names the run (default: its seed, else its settings). Every divergence one run
    reports goes to the same file, so a later, further-shrunk one replaces the first."""
    if run is None:
        run = f"seed{replay.seed}" if replay.seed is not None else replay.settings or "unseeded"
    return f"{_slug(replay.subject)}-{_slug(replay.profile)}-{_slug(run)}.json"


def write_replay(replay: Replay, directory: str | os.PathLike, run: str | None = None, *,
                 path: Path | None = None) -> Path:
    """Write ``replay`` to ``path``, by default its name (:func:`replay_file_name`) in ``directory``."""
    path = path or Path(directory) / replay_file_name(replay, run)
    return write_atomically(path, json.dumps(replay.to_dict(), indent=2) + "\n")


def claim_replay_path(directory: str | os.PathLike, name: str) -> Path:
    """The path of a new replay file called ``name`` (``x.json``), or ``x-2.json``, ``x-3.json``
    and so on where another run's file has that name: created empty here, at once, so that two
    runs writing into one directory at the same moment never take the same name."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem, number = name.removesuffix(".json"), 1
    while True:
        path = directory / (name if number == 1 else f"{stem}-{number}.json")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            number += 1


def run_replay(replay: Replay, *, subject: str | SubjectInfo | None = None, device: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> RunResult:
    """Run the recorded scenario once against ``subject`` (a name, or a subject a command has
    resolved already; default: the recorded one).

    The recorded subject is resolved only as a built-in or an ``sglang:`` target: a file
    never makes swafuzz import code; ``subject`` (given by the person) may name user code.
    """
    if isinstance(subject, SubjectInfo):
        info = subject
    else:
        info = resolve_subject(subject) if subject else recorded_subject(replay)
    return run_scenario(info.subject, replay.scenario, device=device or replay.device, timeout_s=timeout_s)


def recorded_subject(replay: Replay) -> SubjectInfo:
    """The subject a replay file names, refused when naming it would import code, with the
    engine switches and the SGLang tree the file records (the command line's
    ``--sglang-switch``, ``--sglang-source`` and ``--sglang-attr`` win)."""
    try:
        return resolve_subject(replay.subject, allow_import=False, engine_switches=replay.engine_switches,
                               recorded_tree=replay.sglang_tree)
    except BindError:
        raise  # the tree's code, not the file: the command says so
    except SubjectError as exc:
        raise ReplayError(f"field 'subject': {exc}") from None


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

from swafuzz import run_scenario
from swafuzz.reference import Scenario
from swafuzz.subjects.registry import resolve_subject

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
