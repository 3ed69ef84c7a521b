"""SGLang's engine switches that change which cached path runs, with each release's default.

Each switch names where a release declares it (an environment variable in
``sglang/srt/environ.py``, or a server argument field), and the default read there per
release; None means the release has no such switch (the behaviour is fixed, see ``fixed``).
``tests/test_sglang_reachability.py`` reads the declarations from each available wheel and
checks the defaults recorded here; a route of :mod:`.reachability` that needs a setting must
name one of these switches set against its default.

A run's engine configuration is a :class:`SwitchSettings`: each switch a release has, at its
default unless the run overrides it (``--switch NAME=0|1`` of the matrix).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from .locate import RELEASES, SourceTree, release_key

ENVIRON = "sglang/srt/environ.py"


@dataclass(frozen=True)
class Switch:
    name: str  # as a user sets it
    declared_in: tuple[str, ...]  # files, tried in order, that declare the default
    field: str  # the declared name
    effect: str
    defaults: tuple[tuple[str, str | None, bool | None], ...]  # (first, last, default) release ranges
    fixed: str = ""  # what the releases without the switch do

    def default(self, version: str) -> bool | None:
        key = release_key(version)
        for first, last, value in self.defaults:
            if release_key(first) <= key and (last is None or key <= release_key(last)):
                return value
        return None

    def setting(self, value: bool) -> str:
        """How a user sets the switch to ``value``."""
        if self.name.startswith("--"):
            return self.name if value else f"without {self.name}"
        return f"{self.name}={int(value)}"


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
        "--enable-encoder-swa-bounded-replay",
        ("sglang/srt/arg_groups/fields/exec_.py",), "enable_encoder_swa_bounded_replay",
        "the DeepSeek-V4.1 target pool keeps SWA keys in a per-request window (RequestWindow); "
        "DeepSeek-V4.1 and CUDA only",
        (("0.5.21", None, False),),
        fixed="before 0.5.21: no request window",
    ),
)

_BY_NAME = {switch.name: switch for switch in SWITCHES}


def switch(name: str) -> Switch:
    return _BY_NAME[name]


def parse_override(text: str) -> tuple[str, bool]:
    """``NAME=1`` or ``NAME=0`` (a server argument as ``--flag=1``): the switch and its value;
    ValueError naming the switches for anything else."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if name not in _BY_NAME and f"--{name}" in _BY_NAME:  # a server argument written without its dashes
        name = f"--{name}"
    if name not in _BY_NAME:
        raise ValueError(f"unknown engine switch {name!r}; switches are {', '.join(_BY_NAME)}")
    if not sep or value.strip() not in ("0", "1"):
        raise ValueError(f"engine switch {text!r}: write {name}=1 or {name}=0")
    return name, value.strip() == "1"


@dataclass(frozen=True)
class SwitchSettings:
    """The engine switches one release has, each with the value a run uses."""

    version: str
    values: tuple[tuple[str, bool], ...]  # in SWITCHES order, only the release's switches

    def get(self, name: str) -> bool | None:
        """The value of switch ``name``; None when the release has no such switch."""
        return dict(self.values).get(name)

    def off_default(self) -> tuple[str, ...]:
        """How the switches set against the release's default are set (``NAME=0``)."""
        return tuple(switch(name).setting(value) for name, value in self.values
                     if value != switch(name).default(self.version))

    def label(self) -> str:
        """Every switch with its value, the overridden ones marked (for the report)."""
        parts = []
        for name, value in self.values:
            default = switch(name).default(self.version)
            parts.append(switch(name).setting(value) + ("" if value == default else " (not the default)"))
        return ", ".join(parts) or "no engine switch"

    def to_dict(self) -> dict[str, bool]:
        return dict(self.values)


def settings_for(version: str, overrides: Mapping[str, bool] | None = None) -> SwitchSettings:
    """``version``'s switches at their defaults, except those ``overrides`` sets; an override
    of a switch the release lacks does not apply to it."""
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ValueError(f"unknown engine switch(es) {', '.join(unknown)}; switches are {', '.join(_BY_NAME)}")
    values = []
    for item in SWITCHES:
        default = item.default(version)
        if default is not None:
            values.append((item.name, overrides.get(item.name, default)))
    return SwitchSettings(version, tuple(values))


def declared_default(tree: SourceTree, item: Switch) -> bool | None:
    """The default ``tree`` declares for ``item``: ``NAME = EnvBool(True)`` in a class body,
    or ``name: A[...] = False`` for a server-argument field; None when it declares none."""
    for path in item.declared_in:
        text = tree.read(path)
        if text is None:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == item.field for t in node.targets
            ):
                return _literal_bool(node.value)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == item.field:
                return _literal_bool(node.value)
    return None


def _literal_bool(value: ast.expr | None) -> bool | None:
    if isinstance(value, ast.Call) and value.args:  # EnvBool(True)
        value = value.args[0]
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return value.value
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
