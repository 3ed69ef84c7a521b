"""SGLang's engine switches that change which cached path runs, with each release's default.

Each switch names where a release declares it (an environment variable in
``sglang/srt/environ.py``, or a server argument field), and the default read there per
release; None means the release has no such switch (the behaviour is fixed, see ``fixed``).
``tests/test_sglang_reachability.py`` reads the declarations from each available wheel and
checks the defaults recorded here; a route of :mod:`.reachability` that needs a setting must
name one of these switches set against its default.

A run's engine configuration is a :class:`SwitchSettings`: each switch a release has, at its
default unless the run overrides it (``--switch NAME=0|1`` of the matrix). A tree that is no
release (a checkout, a pull request) is configured as it declares itself
(:func:`settings_of`): the switches above at the defaults its own files declare, and any
other boolean environment variable its ``environ.py`` declares may be set too, since the code
under test may read one that no release has.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .locate import RELEASES, SourceTree, release_key

ENVIRON = "sglang/srt/environ.py"
REQUEST_WINDOW_SWITCH = "--enable-encoder-swa-bounded-replay"
DECODER_REPLAY_SWITCH = "--enable-decoder-swa-bounded-replay"


@dataclass(frozen=True)
class Switch:
    name: str  # as a user sets it
    declared_in: tuple[str, ...]  # files, tried in order, that declare the default
    field: str  # the declared name
    effect: str
    defaults: tuple[tuple[str, str | None, bool | None], ...]  # (first, last, default) release ranges
    fixed: str = ""  # what the releases without the switch do
    # the value a declared default of None stands for (a server argument resolved at start-up)
    unresolved: bool | None = None

    def default(self, version: str) -> bool | None:
        key = release_key(version)
        for first, last, value in self.defaults:
            if release_key(first) <= key and (last is None or key <= release_key(last)):
                return value
        return None

    def setting(self, value: bool) -> str:
        """How a user sets the switch to ``value``."""
        return setting_text(self.name, value)


def setting_text(name: str, value: bool) -> str:
    """How a user sets switch ``name`` (an environment variable, or a ``--server-argument``)."""
    if name.startswith("--"):
        return name if value else f"without {name}"
    return f"{name}={int(value)}"


SWITCHES: tuple[Switch, ...] = (
    Switch(
        "SGLANG_PREP_IN_CUDA_GRAPH", (ENVIRON,), "SGLANG_PREP_IN_CUDA_GRAPH",
        "decode metadata is kept raw out of the graph and upgraded (ring rows, translated "
        "locations) inside the captured graph",
        (("0.5.12", "0.5.17", True),),
        fixed="0.5.18+: the DeepSeek-V4 backends always keep decode metadata raw",
    ),
    Switch(
        "SGLANG_OPT_CACHE_SWA_TRANSLATION", (ENVIRON,), "SGLANG_OPT_CACHE_SWA_TRANSLATION",
        "the DeepSeek-V4 pool caches its SWA translation (cached_loc) across layers",
        (("0.5.12", "0.5.12.post1", True),),
        fixed="0.5.13+: the translation is cached per forward on the backend metadata, always",
    ),
    Switch(
        "SGLANG_DSV4_UNIFIED_KV_FP8", (ENVIRON,), "SGLANG_DSV4_UNIFIED_KV_FP8",
        "the unified KV ring stores fp8 (AMD gfx95 only); in 0.5.23 fp8 target-verify stores "
        "take their ring rows from the getter",
        (("0.5.20", None, False),),
        fixed="before 0.5.20: bf16 ring only",
    ),
    Switch(
        REQUEST_WINDOW_SWITCH,
        ("sglang/srt/arg_groups/fields/exec_.py",), "enable_encoder_swa_bounded_replay",
        "the DeepSeek-V4.1 target pool keeps SWA keys in a per-request window (RequestWindow); "
        "DeepSeek-V4.1 and CUDA only",
        (("0.5.21", None, False),),
        fixed="before 0.5.21: no request window",
    ),
    Switch(
        DECODER_REPLAY_SWITCH,
        ("sglang/srt/arg_groups/fields/exec_.py",), "enable_decoder_swa_bounded_replay",
        "the DeepSeek-V4.1 layers from the model's late_layer_start store only each extend's last "
        "sliding-window rows (the backend's late-layer tail metadata); 0.5.23 declares no default and "
        "resolves it at start-up (validate_deepseek_v41_features: on for DeepSeek-V4.1 where supported), "
        "which swafuzz's DeepSeek-V4 takes as off",
        (("0.5.21", None, False),),
        fixed="before 0.5.21: every layer stores every row",
        unresolved=False,
    ),
)

_BY_NAME = {switch.name: switch for switch in SWITCHES}


def switch(name: str) -> Switch:
    return _BY_NAME[name]


# an environment variable as SGLang names its own (a tree may declare switches of its own)
_ENVIRONMENT_NAME = re.compile(r"SGLANG_[A-Z0-9_]+")


def parse_override(text: str) -> tuple[str, bool]:
    """``NAME=1`` or ``NAME=0`` (a server argument as ``--flag=1``): the switch and its value;
    ValueError naming the switches for anything else. NAME may be any ``SGLANG_*``
    environment variable: whether the tree declares it is checked when it binds."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if name not in _BY_NAME and f"--{name}" in _BY_NAME:  # a server argument written without its dashes
        name = f"--{name}"
    if name not in _BY_NAME and not _ENVIRONMENT_NAME.fullmatch(name):
        raise ValueError(f"unknown engine switch {name!r}; switches are {', '.join(_BY_NAME)}, or any "
                         "SGLANG_* boolean the tree's environ.py declares")
    if not sep or value.strip() not in ("0", "1"):
        raise ValueError(f"engine switch {text!r}: write {name}=1 or {name}=0")
    return name, value.strip() == "1"


@dataclass(frozen=True)
class SwitchSettings:
    """The engine switches one tree has, each with the value a run uses and its default."""

    version: str  # the release, or the label of the tree
    values: tuple[tuple[str, bool], ...]  # SWITCHES the tree has (in that order), then any other set
    defaults: tuple[tuple[str, bool], ...]  # the tree's default of each of them
    # every environment variable the tree declares with a readable default (see the stand-in
    # for SGLang's ``envs``), at its default
    environment: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str) -> bool | None:
        """The value of switch ``name``; None when the tree has no such switch."""
        return dict(self.values).get(name)

    def default(self, name: str) -> bool | None:
        return dict(self.defaults).get(name)

    def environment_value(self, name: str) -> Any:
        """What ``envs.NAME.get()`` returns in the run; KeyError when the tree declares no
        ``NAME`` with a default swafuzz can read."""
        if name in dict(self.values):
            return dict(self.values)[name]
        return dict(self.environment)[name]

    def off_default(self) -> tuple[str, ...]:
        """How the switches set against the tree's default are set (``NAME=0``)."""
        return tuple(setting_text(name, value) for name, value in self.values if value != self.default(name))

    def label(self) -> str:
        """Every switch with its value, the overridden ones marked (for the report)."""
        parts = [setting_text(name, value) + ("" if value == self.default(name) else " (not the default)")
                 for name, value in self.values]
        return ", ".join(parts) or "no engine switch"

    def to_dict(self) -> dict[str, bool]:
        return dict(self.values)


def settings_for(version: str, overrides: Mapping[str, bool] | None = None) -> SwitchSettings:
    """``version``'s switches at their defaults (as recorded in :data:`SWITCHES`), except
    those ``overrides`` sets; an override of a switch the release lacks does not apply to it."""
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ValueError(f"unknown engine switch(es) {', '.join(unknown)}; switches are {', '.join(_BY_NAME)}")
    defaults = tuple((item.name, item.default(version)) for item in SWITCHES if item.default(version) is not None)
    values = tuple((name, overrides.get(name, default)) for name, default in defaults)
    return SwitchSettings(version, values, defaults)


def settings_of(tree: SourceTree, overrides: Mapping[str, bool] | None = None) -> SwitchSettings:
    """The switches ``tree`` declares, at the defaults it declares, except those ``overrides``
    sets. An override of a switch of :data:`SWITCHES` that the tree lacks does not apply to
    it (as for a release); any other must be a boolean the tree's environ.py declares, else
    ValueError naming what it declares."""
    overrides = dict(overrides or {})
    environment = declared_environment(tree)
    defaults = [(item.name, declared_default(tree, item)) for item in SWITCHES]
    defaults = [(name, default) for name, default in defaults if default is not None]
    for name in overrides:
        if name in _BY_NAME:
            continue
        if not isinstance(environment.get(name), bool):
            raise ValueError(
                f"engine switch {name}: {tree.label} declares no boolean {name} in {ENVIRON}"
                + ("" if name not in environment else f" (it declares {name} = {environment[name]!r})"))
        defaults.append((name, environment[name]))
    values = tuple((name, overrides.get(name, default)) for name, default in defaults)
    return SwitchSettings(tree.version or tree.label, values, tuple(defaults), tuple(sorted(environment.items())))


def declared_environment(tree: SourceTree) -> dict[str, Any]:
    """Every environment variable ``tree`` declares in environ.py (``NAME = EnvBool(True)``,
    ``EnvInt(4)``, ... in a class body) whose default is a literal: name -> default."""
    text = tree.read(ENVIRON)
    if text is None:
        return {}
    declared = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call)
                    and statement.value.args):
                try:
                    declared[statement.targets[0].id] = ast.literal_eval(statement.value.args[0])
                except ValueError:
                    continue  # a default computed at import: not one to guess
    return declared


def declared_default(tree: SourceTree, item: Switch) -> bool | None:
    """The default ``tree`` declares for ``item``: ``NAME = EnvBool(True)`` in a class body,
    or ``name: A[...] = False`` for a server-argument field (``= None``, resolved at start-up:
    ``item.unresolved``); None when it declares none."""
    for path in item.declared_in:
        text = tree.read(path)
        if text is None:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == item.field for t in node.targets
            ):
                return _literal_bool(node.value, item.unresolved)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == item.field:
                return _literal_bool(node.value, item.unresolved)
    return None


def _literal_bool(value: ast.expr | None, unresolved: bool | None = None) -> bool | None:
    """The boolean ``value`` declares; ``unresolved`` where it declares None (resolved later)."""
    if isinstance(value, ast.Call) and value.args:  # EnvBool(True)
        value = value.args[0]
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return value.value
    if isinstance(value, ast.Constant) and value.value is None:
        return unresolved
    return None


def defaults_table(versions: tuple[str, ...] = RELEASES) -> list[str]:
    """Markdown: release x switch default ('-' where the release has no such switch)."""
    rows = ["| release | " + " | ".join(f"`{s.name}`" for s in SWITCHES) + " |",
            "| --- |" + " --- |" * len(SWITCHES)]
    for version in versions:
        cells = []
        for item in SWITCHES:
            value = item.default(version)
            cells.append("-" if value is None else ("on" if value else "off"))
        rows.append(f"| {version} | " + " | ".join(cells) + " |")
    rows += ["", *(f"- `{s.name}`: {s.effect}; {s.fixed}." for s in SWITCHES)]
    return rows
