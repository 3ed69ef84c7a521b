"""Real SGLang code as swafuzz subjects.

Subject names are ``sglang:<target>`` (bound from the default source: a checkout named by
``--sglang-source`` / ``$SWAFUZZ_SGLANG_SOURCE``, else the installed package) and
``sglang:<target>@<version>`` (bound from that release's wheel, downloaded on first use).
The binding mode is ``auto`` (import the installed package where it imports, else read
its source), ``import`` or ``source``; ``$SWAFUZZ_SGLANG_MODE`` sets the default. A tree
runs with the engine switches its tree declares, at their defaults (:mod:`.switches`), except
those set in ``$SWAFUZZ_SGLANG_SWITCHES`` (``NAME=0|1``, comma-separated) or given to
:func:`resolve`.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Any, Mapping

from ...names import SGLANG_SOURCE_ENV as SOURCE_ENV
from ..info import SubjectInfo
from . import locate
from .binding import BindError, ImportModeUnavailable
from .configure import configured
from .locate import SglangUnavailable, SourceTree
from .switches import parse_override, settings_of
from .targets import TARGETS, Target, target

MODE_ENV = "SWAFUZZ_SGLANG_MODE"
SWITCHES_ENV = "SWAFUZZ_SGLANG_SWITCHES"
ATTRS_ENV = "SWAFUZZ_SGLANG_ATTRS"
MODES = ("auto", "import", "source")

__all__ = [
    "BindError", "ImportModeUnavailable", "SglangUnavailable", "SourceTree", "TARGETS", "Target",
    "attribute_values", "bind_target", "default_source", "discover", "resolve", "switch_overrides", "target",
    "tree_changes", "tree_record",
]


def default_source(source: str | os.PathLike | None = None) -> SourceTree | None:
    """The checkout given (or named by ``$SWAFUZZ_SGLANG_SOURCE``), else the installed
    package, else None."""
    path = source or os.environ.get(SOURCE_ENV)
    if not path:
        return locate.installed()
    try:
        return locate.checkout(path)
    except SglangUnavailable as exc:
        raise BindError(str(exc)) from None


def switch_overrides(text: str | None = None) -> dict[str, bool]:
    """The engine switches ``text`` sets (default: ``$SWAFUZZ_SGLANG_SWITCHES``), as
    comma-separated ``NAME=0|1``; BindError naming the switches for anything else."""
    text = os.environ.get(SWITCHES_ENV, "") if text is None else text
    overrides = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            name, value = parse_override(item)
        except ValueError as exc:
            raise BindError(str(exc)) from None
        overrides[name] = value
    return overrides


def attribute_values(items: list[str] | None = None) -> dict[str, Any]:
    """The values ``NAME=VALUE`` items give (default: those in ``$SWAFUZZ_SGLANG_ATTRS``, a
    JSON list of such items) for names bound code reads that swafuzz cannot derive; VALUE is
    a Python literal. BindError for an item that is not one."""
    if items is None:
        text = os.environ.get(ATTRS_ENV, "")
        try:
            items = json.loads(text) if text else []
        except json.JSONDecodeError:
            raise BindError(f"${ATTRS_ENV} is not a JSON list of NAME=VALUE items: {text!r}") from None
    values = {}
    for item in items:
        name, equals, literal = str(item).partition("=")
        name = name.strip()
        if not equals or not name.isidentifier():
            raise BindError(f"--sglang-attr takes NAME=VALUE with VALUE a Python literal, got {item!r}")
        try:
            values[name] = ast.literal_eval(literal.strip())
        except (ValueError, SyntaxError):
            raise BindError(f"--sglang-attr {item!r}: {literal.strip()!r} is not a Python literal "
                            "(a number, string, True, False, None, or a tuple, list or dict of them)") from None
    return values


def bind_target(item: Target, tree: SourceTree, mode: str | None = None, name: str | None = None,
                switches: Mapping[str, bool] | None = None,
                supplied: Mapping[str, Any] | None = None) -> SubjectInfo:
    """``item`` bound from ``tree``, run with the engine switches ``tree`` declares, at its
    defaults except ``switches`` and, over those, the environment's (:func:`switch_overrides`:
    the command line's ``--sglang-switch``); ``supplied`` values (default: the command line's
    ``--sglang-attr``) for names the tree's code reads that swafuzz cannot derive."""
    try:  # a switch the tree does not declare is refused before anything binds
        settings = settings_of(tree, {**(switches or {}), **switch_overrides()})
    except ValueError as exc:
        raise BindError(str(exc)) from None
    supplied = attribute_values() if supplied is None else supplied
    mode = mode or os.environ.get(MODE_ENV) or "auto"
    if mode not in MODES:
        raise BindError(f"unknown SGLang binding mode {mode!r}; modes are {', '.join(MODES)}")
    if mode == "import" and tree.origin != "installed":
        raise BindError(f"import mode reads the installed package; {tree.label} is not installed")
    if mode == "auto":
        if tree.origin == "installed":
            try:
                return configured(item.info(tree, "import", name, supplied), item, tree, settings)
            except ImportModeUnavailable:
                pass  # GPU-only dependencies missing: read the same files instead
        mode = "source"
    return configured(item.info(tree, mode, name, supplied), item, tree, settings)


def resolve(
    name: str, *, source: str | os.PathLike | None = None, mode: str | None = None,
    cache: str | os.PathLike | None = None, switches: Mapping[str, bool] | None = None,
    recorded_tree: Mapping[str, Any] | None = None,
) -> SubjectInfo:
    """The subject ``sglang:<target>`` or ``sglang:<target>@<version>``, with ``switches``
    set against its release's defaults (see :func:`bind_target`). ``recorded_tree`` (a
    replay file's :func:`tree_record`) binds the tree and values it records, except where
    the command line names others."""
    bare, _, version = name.partition("@")
    item = target(bare)
    supplied = None
    if recorded_tree is not None and not version:
        source = _replay_source(recorded_tree, source)
        if source == recorded_tree["path"] and not locate.holds_sglang(source):
            raise BindError(
                f"{name!r} was recorded on the SGLang checkout {source}, which holds no sglang package "
                "now: give the tree's new place with --sglang-source PATH")
        if not os.environ.get(ATTRS_ENV):
            supplied = attribute_values(list(recorded_tree["attributes"]))
    if version:
        try:
            tree = locate.wheel(version, cache)
        except SglangUnavailable as exc:
            raise BindError(f"no SGLang for {name!r}: {exc}") from None
    else:
        tree = default_source(source)
        if tree is None:
            raise BindError(
                f"no SGLang for {name!r}: install sglang, point --sglang-source (or "
                f"${SOURCE_ENV}) at a checkout, or name a release, e.g. {bare}@0.5.23"
            )
    return bind_target(item, tree, mode, name, switches, supplied)


def _replay_source(recorded_tree: Mapping[str, Any], source: str | os.PathLike | None = None):
    """The tree a replay binds: the one the command line names, else the recorded checkout."""
    if source or os.environ.get(SOURCE_ENV) or recorded_tree["origin"] != "checkout":
        return source
    return recorded_tree["path"]


def tree_record(name: str, source: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """What a replay file records of the SGLang tree that ``name`` (an ``sglang:`` subject
    bound from the default source, not a release wheel) binds: where it is, a digest of the
    files bound and cited, and the values ``--sglang-attr`` supplied."""
    if not name.startswith("sglang:") or "@" in name:
        return None
    from .provenance import sglang_digest

    tree = default_source(source)
    if tree is None:
        return None
    attributes = json.loads(os.environ.get(ATTRS_ENV) or "[]")
    return {"path": str(tree.root), "origin": tree.origin, "version": tree.version,
            "digest": sglang_digest(tree), "attributes": attributes}


def tree_changes(name: str, recorded_tree: Mapping[str, Any]) -> str | None:
    """A note when the tree ``name`` binds now is not the one ``recorded_tree`` describes
    (its files changed, or another tree is given): the replay then runs on the code as it
    is now, which is how a fix is checked, and says so."""
    now = tree_record(name, _replay_source(recorded_tree))
    if now is None or now["digest"] == recorded_tree["digest"]:
        return None
    where = "" if now["path"] == recorded_tree["path"] else f" (recorded at {recorded_tree['path']}, now {now['path']})"
    return (f"the SGLang files differ from those this replay was recorded on{where}: digest "
            f"{recorded_tree['digest']} then, {now['digest']} now; replaying on the code as it is now")


def discover(source: str | os.PathLike | None = None, mode: str | None = None) -> list[SubjectInfo]:
    """Every target the default SGLang source has; empty when there is none."""
    tree = default_source(source)
    if tree is None:
        return []
    found = []
    for item in TARGETS:
        try:
            found.append(bind_target(item, tree, mode))
        except BindError:
            continue  # this version does not have the target
    return found
