"""The table of subjects and how to load a user's own.

Like an OpInfo table: one row per subject, and generic tests iterate over the rows. The
``expected`` verdict and ``diverges_on`` features document what the design is known to do;
tests check them by *running* scenarios, never by reading them back.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from strategies.features import (
    DRAFT_MULTISTEP,
    FIRST_SWA_LAYER_NOT_START,
    GPU_STREAMS,
    GRAPH_REPLAY,
    MAPPING_CHANGE_IN_FORWARD,
    MICRO_BATCHES,
    PIPELINE_STAGE,
    RAGGED_EXTEND,
    REGISTER_MAPPING,
    SKIP_METADATA_INIT,
)

from . import builtin
from .api import Subject
from .boundary import show
from .executor import SubjectError, check_subject

DIVERGES = "diverges"
EQUIVALENT = "equivalent"


@dataclass(frozen=True)
class SubjectInfo:
    name: str
    subject: type[Subject]
    expected: str
    diverges_on: tuple[str, ...] = ()
    kind: str = "builtin"
    summary: str = field(default="")

    @property
    def truth(self) -> str:
        return self.subject.truth.value

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "truth": self.truth,
            "expected": self.expected,
            "diverges_on": list(self.diverges_on),
            "requires": sorted(getattr(self.subject, "requires", ())),
            "summary": self.summary or ((self.subject.__doc__ or "").strip().splitlines() or [""])[0],
        }


BUILTIN_SUBJECTS: tuple[SubjectInfo, ...] = (
    SubjectInfo("uncached", builtin.Uncached, EQUIVALENT),
    SubjectInfo("uncached-ring", builtin.UncachedRing, EQUIVALENT),
    SubjectInfo("step-keyed", builtin.StepKeyed, DIVERGES, (GRAPH_REPLAY,)),
    SubjectInfo("step-keyed-ring", builtin.StepKeyedRing, DIVERGES, (GRAPH_REPLAY,)),
    SubjectInfo(
        "pool-start-layer", builtin.PoolStartLayer, DIVERGES,
        (FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD),
    ),
    SubjectInfo(
        "pool-layer0", builtin.PoolLayer0, DIVERGES,
        (PIPELINE_STAGE, FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD),
    ),
    SubjectInfo(
        "pool-no-invalidate", builtin.PoolNoInvalidate, DIVERGES,
        (REGISTER_MAPPING, FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD),
    ),
    SubjectInfo(
        "unified-metadata", builtin.UnifiedMetadata, DIVERGES,
        (DRAFT_MULTISTEP, RAGGED_EXTEND, SKIP_METADATA_INIT, GRAPH_REPLAY),
    ),
    SubjectInfo(
        "unified-metadata-mtp-bypass", builtin.UnifiedMetadataMtpBypass, DIVERGES,
        (RAGGED_EXTEND, SKIP_METADATA_INIT, GRAPH_REPLAY),
    ),
    SubjectInfo(
        "swa-out-shape-guard", builtin.SwaOutShapeGuard, DIVERGES,
        (DRAFT_MULTISTEP, SKIP_METADATA_INIT, MAPPING_CHANGE_IN_FORWARD),
    ),
    SubjectInfo(
        "unified-graph-assign", builtin.UnifiedGraphAssign, DIVERGES,
        (GRAPH_REPLAY, RAGGED_EXTEND, SKIP_METADATA_INIT),
    ),
    SubjectInfo(
        "unified-graph-copy", builtin.UnifiedGraphCopy, DIVERGES,
        (RAGGED_EXTEND, SKIP_METADATA_INIT),
    ),
    SubjectInfo("stream-unsynced", builtin.StreamUnsynced, DIVERGES, (GPU_STREAMS,)),
    SubjectInfo("step-keyed-capture", builtin.StepKeyedCapture, EQUIVALENT),
    SubjectInfo("step-keyed-capture-ring", builtin.StepKeyedCaptureRing, EQUIVALENT),
)

_BY_NAME = {info.name: info for info in BUILTIN_SUBJECTS}


def subject_names() -> list[str]:
    return [info.name for info in BUILTIN_SUBJECTS]


def all_subjects() -> list[SubjectInfo]:
    """The built-in subjects, then the real SGLang targets the default SGLang source has."""
    from . import sglang

    return [*BUILTIN_SUBJECTS, *sglang.discover()]


def resolve_subject(spec: str, allow_import: bool = True,
                    engine_switches: Mapping[str, bool] | None = None) -> SubjectInfo:
    """A built-in name, ``sglang:<target>[@<version>]`` (real SGLang code), or
    ``module:attr`` naming a Subject class or a SubjectInfo.

    ``engine_switches`` (SGLang targets only) are set against the release's defaults, over
    any that ``$SWAFUZZ_SGLANG_SWITCHES`` leaves unset.

    A module is looked for in the current directory first, as ``python -m`` would, so that
    ``--subject my_subject:Class`` finds ``my_subject.py`` where the command runs. With
    ``allow_import`` false (a spec read from a file) only built-in names and ``sglang:``
    targets resolve.
    """
    if engine_switches and not spec.startswith("sglang:"):
        raise SubjectError(f"engine switches ({', '.join(engine_switches)}) are SGLang's; {show(spec)} "
                           "is not an sglang:<target> subject")
    if spec in _BY_NAME:
        return _BY_NAME[spec]
    if spec.startswith("sglang:"):  # before module:attr, since "sglang" is a module too
        from . import sglang  # harness.sglang imports this module

        return sglang.resolve(spec, switches=engine_switches)
    if ":" not in spec:
        raise SubjectError(
            f"unknown subject {show(spec)}; built-in subjects are {', '.join(subject_names())}, "
            "or give module:attr"
        )
    if not allow_import:
        raise SubjectError(
            f"{show(spec)} names code to import, which swafuzz never does because a file says so; "
            f"to run it, pass --subject {show(spec)} on the command line"
        )
    module_name, _, attr = spec.partition(":")
    _look_in_the_working_directory()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - report any import failure as a usage error
        raise SubjectError(f"cannot import module {module_name!r} for subject {spec!r}: {exc}") from exc
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise SubjectError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, SubjectInfo):
        return target
    check_subject(target)
    return SubjectInfo(spec, target, expected="unknown", kind="user")


def _look_in_the_working_directory() -> None:
    # the console script's sys.path starts at its own folder, not where it was started
    here = os.getcwd()
    if not any(entry in ("", here) or os.path.abspath(entry) == here for entry in sys.path):
        sys.path.insert(0, here)
