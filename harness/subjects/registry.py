"""The table of subjects and how to load a user's own.

Like an OpInfo table: one row per subject, and generic tests iterate over the rows. The
``expected`` verdict and ``diverges_on`` features document what the design is known to do;
tests check them by *running* scenarios, never by reading them back.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import reprlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping

from ..strategies.features import (
    DRAFT_EXTEND,
    DRAFT_MULTISTEP,
    FIRST_SWA_LAYER_NOT_START,
    GPU_STREAMS,
    GRAPH_REPLAY,
    MAPPING_CHANGE_IN_FORWARD,
    MICRO_BATCHES,
    PERMUTED_LAYERS,
    PIPELINE_STAGE,
    RAGGED_EXTEND,
    REGISTER_MAPPING,
    SKIP_METADATA_INIT,
    TARGET_VERIFY,
)

from ..names import SGLANG_SOURCE_ENV
from .info import DIVERGES, EQUIVALENT, POOL, RING, SubjectInfo, listing


@dataclass(frozen=True)
class BuiltinSubject:
    """A row of the built-in table. What ``swafuzz subjects`` lists is stated here, so that
    listing them imports neither their classes nor torch; a test holds each row's truth and
    requirements to its class's."""

    name: str
    class_name: str  # in swafuzz.subjects.builtin
    truth: str
    expected: str
    summary: str
    diverges_on: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return listing(self.name, "builtin", self.truth, self.expected, self.diverges_on, self.requires,
                       self.summary)

    def info(self) -> SubjectInfo:
        from . import builtin

        return SubjectInfo(self.name, getattr(builtin, self.class_name), self.expected, self.diverges_on,
                           summary=self.summary)


BUILTIN_TABLE: tuple[BuiltinSubject, ...] = (
    BuiltinSubject("uncached", "Uncached", POOL, EQUIVALENT,
                   "Translates out_cache_loc through the mapping in every layer: the behaviour before any caching."),
    BuiltinSubject("uncached-ring", "UncachedRing", RING, EQUIVALENT,
                   "Computes the unified ring rows in every layer, expanding request slots by each one's tokens."),
    BuiltinSubject("step-keyed", "StepKeyed", POOL, DIVERGES,
                   "A cache keyed on the forward, the draft step and the mapping, kept per micro-batch: right "
                   "in eager forwards, stale under graph replay, where the captured layers hit a warm-up's rows.",
                   (GRAPH_REPLAY,)),
    BuiltinSubject("step-keyed-ring", "StepKeyedRing", RING, DIVERGES,
                   "The forward-keyed cache for the unified ring: stale under graph replay, like step-keyed.",
                   (GRAPH_REPLAY,)),
    BuiltinSubject("pool-start-layer", "PoolStartLayer", POOL, DIVERGES,
                   "A pool-level cache of the translated locations, refreshed at the stage's start_layer "
                   "(or when empty).",
                   (FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD)),
    BuiltinSubject("pool-layer0", "PoolLayer0", POOL, DIVERGES,
                   "A pool-level cache refreshed at layer 0, whatever stage it runs.",
                   (PIPELINE_STAGE, FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD)),
    BuiltinSubject("pool-no-invalidate", "PoolNoInvalidate", POOL, DIVERGES,
                   "A pool-level cache that survives register_mapping, as the inline cache of release 0.5.12.",
                   (REGISTER_MAPPING, FIRST_SWA_LAYER_NOT_START, MICRO_BATCHES, MAPPING_CHANGE_IN_FORWARD)),
    BuiltinSubject("unified-metadata", "UnifiedMetadata", RING, DIVERGES,
                   "Decode metadata carries the ring rows, trusted whenever their length matches the batch, "
                   "with a uniform repeat_interleave fallback for other batches.",
                   (DRAFT_MULTISTEP, RAGGED_EXTEND, SKIP_METADATA_INIT, GRAPH_REPLAY)),
    BuiltinSubject("unified-metadata-mtp-bypass", "UnifiedMetadataMtpBypass", RING, DIVERGES,
                   "The unified metadata cache with the later fix: multi-step draft decode always recomputes.",
                   (RAGGED_EXTEND, SKIP_METADATA_INIT, GRAPH_REPLAY)),
    BuiltinSubject("swa-out-shape-guard", "SwaOutShapeGuard", POOL, DIVERGES,
                   "Metadata init translates out_cache_loc, and the getter trusts the result whenever its "
                   "length matches the batch.",
                   (DRAFT_MULTISTEP, SKIP_METADATA_INIT, MAPPING_CHANGE_IN_FORWARD)),
    BuiltinSubject("unified-graph-assign", "UnifiedGraphAssign", RING, DIVERGES,
                   "The unified metadata under graphs, the ring rows in the merge's assign list (re-pointed "
                   "before replay), as in releases 0.5.14-0.5.19.",
                   (GRAPH_REPLAY, RAGGED_EXTEND, SKIP_METADATA_INIT)),
    BuiltinSubject("unified-graph-copy", "UnifiedGraphCopy", RING, DIVERGES,
                   "The unified metadata under graphs, the ring rows in the merge's copy list (written in place "
                   "before replay), as in release 0.5.20.",
                   (RAGGED_EXTEND, SKIP_METADATA_INIT)),
    BuiltinSubject("stream-unsynced", "StreamUnsynced", POOL, DIVERGES,
                   "Translates once per forward on the engine's side stream and reads the result without "
                   "waiting for that stream: found on a GPU, not checkable elsewhere.",
                   (GPU_STREAMS,), requires=(GPU_STREAMS,)),
    BuiltinSubject("step-keyed-capture", "StepKeyedCapture", POOL, EQUIVALENT,
                   "The forward-keyed cache, also keyed on whether the call is being captured: correct, and "
                   "as cheap as the others."),
    BuiltinSubject("step-keyed-capture-ring", "StepKeyedCaptureRing", RING, EQUIVALENT,
                   "The capture-aware forward-keyed cache for the unified ring: correct."),
    BuiltinSubject("compressed-metadata", "CompressedMetadata", POOL, EQUIVALENT,
                   "Also answers c4_out_loc and c128_out_loc, computed once per forward and draft step in "
                   "metadata init and read by every C4 and C128 layer; recomputed in the graph: correct."),
    BuiltinSubject("compressed-idle-stale", "CompressedIdleStale", POOL, DIVERGES,
                   "The compressed write locations trusted whenever metadata is there: an idle forward that "
                   "skips metadata init reads the previous forward's.",
                   (SKIP_METADATA_INIT,)),
    BuiltinSubject("compressed-unsliced", "CompressedUnsliced", POOL, DIVERGES,
                   "The compressed write locations of the whole forward handed to every draft step, not sliced "
                   "per step (#24750).",
                   (DRAFT_MULTISTEP,)),
    BuiltinSubject("compressed-first-layer", "CompressedFirstLayer", POOL, DIVERGES,
                   "The compressed write locations derived at the model's first compressed layer of a forward "
                   "and reused by the rest: a pipeline stage past it, or a forward that skips it, reads old ones.",
                   (PIPELINE_STAGE, FIRST_SWA_LAYER_NOT_START, PERMUTED_LAYERS)),
    BuiltinSubject("compressed-graph-assign", "CompressedGraphAssign", POOL, DIVERGES,
                   "The compressed write locations in the graph replay merge's assign list: the captured layers "
                   "keep reading the capture's values.",
                   (GRAPH_REPLAY,)),
    BuiltinSubject("compressed-draft-pad4", "CompressedDraftPad4", POOL, DIVERGES,
                   "The compressed write locations of speculative forwards planned for at most 4 draft tokens "
                   "per request (#34189): more draft tokens leave rows unwritten.",
                   (TARGET_VERIFY, DRAFT_EXTEND)),
    BuiltinSubject("page-table", "PageTable", POOL, EQUIVALENT,
                   "Also answers page_table, built from req_to_token once per forward and draft step in "
                   "metadata init and read by every C4 and C128 layer; rebuilt in the graph: correct."),
    BuiltinSubject("page-table-captured", "PageTableCaptured", POOL, DIVERGES,
                   "The page table under graphs built at capture and never repopulated before a replay "
                   "(#26019's review): replays read the capture's pages.",
                   (GRAPH_REPLAY,)),
)


def __getattr__(name: str) -> Any:
    # the classes, and torch with them, load only when a subject is to run
    if name == "BUILTIN_SUBJECTS":
        value = tuple(row.info() for row in BUILTIN_TABLE)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def subject_names() -> list[str]:
    return [row.name for row in BUILTIN_TABLE]


def builtin_subject(name: str) -> SubjectInfo | None:
    return next((info for info in __getattr__("BUILTIN_SUBJECTS") if info.name == name), None)


def all_subjects() -> list[SubjectInfo]:
    """The built-in subjects, then the real SGLang targets the default SGLang source has."""
    from . import sglang

    return [*__getattr__("BUILTIN_SUBJECTS"), *sglang.discover()]


def unknown_subject(spec: str) -> str | None:
    """Why ``spec`` names no subject, where that shows from the name alone (a bare name that
    is no built-in): the command line says so before it imports anything heavy."""
    if ":" in spec or spec in subject_names():
        return None
    return (f"unknown subject {_SHORT_NAME.repr(spec)}; built-in subjects are {', '.join(subject_names())}, "
            "or give module:attr")


# a name for a one-line message, shortened as swafuzz.run.boundary.show shortens one (that module
# loads the truth, and torch with it)
_SHORT_NAME = reprlib.Repr()
_SHORT_NAME.maxstring = 60


def subject_listing() -> list[dict]:
    """What ``swafuzz subjects --json`` prints: the built-in rows as stated, then the real SGLang
    targets where an SGLang source is found (binding those imports torch; nothing else does)."""
    rows = [row.to_dict() for row in BUILTIN_TABLE]
    if os.environ.get(SGLANG_SOURCE_ENV) or importlib.util.find_spec("sglang") is not None:
        from . import sglang

        rows += [info.to_dict() for info in sglang.discover()]
    return rows


def resolve_subject(spec: str, allow_import: bool = True,
                    engine_switches: Mapping[str, bool] | None = None,
                    recorded_tree: Mapping[str, Any] | None = None) -> SubjectInfo:
    """A built-in name, ``sglang:<target>[@<version>]`` (real SGLang code), or
    ``module:attr`` naming a Subject class or a SubjectInfo.

    ``engine_switches`` (SGLang targets only) are set against the release's defaults, over
    any that ``$SWAFUZZ_SGLANG_SWITCHES`` leaves unset; ``recorded_tree`` is the SGLang tree
    a replay file records (see :func:`swafuzz.subjects.sglang.resolve`).

    A module is looked for in the current directory first, as ``python -m`` would, so that
    ``--subject my_subject:Class`` finds ``my_subject.py`` where the command runs. With
    ``allow_import`` false (a spec read from a file) only built-in names and ``sglang:``
    targets resolve.
    """
    from ..run.boundary import show
    from ..run.executor import SubjectError, check_subject
    from ..run.guard import SubjectFailure, load_subject

    if engine_switches and not spec.startswith("sglang:"):
        raise SubjectError(f"engine switches ({', '.join(engine_switches)}) are SGLang's; {show(spec)} "
                           "is not an sglang:<target> subject")
    found = builtin_subject(spec)
    if found is not None:
        return found
    if spec.startswith("sglang:"):  # before module:attr, since "sglang" is a module too
        from . import sglang  # swafuzz.subjects.sglang imports this module

        return sglang.resolve(spec, switches=engine_switches, recorded_tree=recorded_tree)
    unknown = unknown_subject(spec)
    if unknown is not None:
        raise SubjectError(unknown)
    if not allow_import:
        raise SubjectError(
            f"{show(spec)} names code to import, which swafuzz never does because a file says so; "
            f"to run it, pass --subject {show(spec)} on the command line"
        )
    module_name, _, attr = spec.partition(":")
    _look_in_the_working_directory()
    shown = show(spec)
    try:
        module = load_subject("it", _import_subject_module, module_name)
    except SubjectFailure as failure:
        raise SubjectError(f"cannot import module {module_name!r} for subject {shown}: {failure.message}") from None
    try:
        target = load_subject(f"reading {show(attr)}", getattr, module, attr, _MISSING)
        if target is _MISSING:
            raise SubjectError(f"module {module_name!r} has no attribute {attr!r}")
        if load_subject(f"reading {show(attr)}", isinstance, target, SubjectInfo):
            return target
        not_a_subject = load_subject(f"reading {show(attr)}", _not_a_subject, target)
        if not_a_subject is None:
            check_subject(target)
    except SubjectFailure as failure:
        raise SubjectError(f"subject {shown}: {failure.message}") from None
    except SubjectError as exc:
        raise SubjectError(f"subject {shown}: {exc}") from None
    if not_a_subject is not None:
        raise SubjectError(f"{shown} is {not_a_subject}, which is not a swafuzz subject: give a subclass of "
                           "swafuzz.api.Subject (swafuzz.Subject) or a SubjectInfo")
    return SubjectInfo(spec, target, expected="unknown", kind="user")


_MISSING = object()  # an attribute a module does not have


def _not_a_subject(target: Any) -> str | None:
    """What ``target`` is, where it is no Subject class (the subject's code may run here)."""
    from ..api import Subject

    if isinstance(target, type) and issubclass(target, Subject):
        return None
    return f"the class {target.__qualname__}" if isinstance(target, type) else f"an object of type {type(target).__name__}"


# Before swafuzz was installed under one import name its three packages were top-level;
# replay files, databases and commands written then still name subjects by those modules.
_FORMER_PACKAGES = {"harness": "swafuzz", "reference": "swafuzz.reference", "strategies": "swafuzz.strategies"}


def _import_subject_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top, dot, rest = name.partition(".")
        # not there, or (in a checkout) the folder of that name, whose modules import as swafuzz's
        missing = exc.name or ""
        if top not in _FORMER_PACKAGES or not (missing == top or missing.startswith(f"{top}.")):
            raise
    return importlib.import_module(_FORMER_PACKAGES[top] + dot + rest)


def _look_in_the_working_directory() -> None:
    # the console script's sys.path starts at its own folder, not where it was started
    here = os.getcwd()
    if not any(entry in ("", here) or os.path.abspath(entry) == here for entry in sys.path):
        sys.path.insert(0, here)
