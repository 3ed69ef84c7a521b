"""SGLang's engine switches that change which cached path runs, with each release's default.

Each switch names where a release declares it (an environment variable in
``sglang/srt/environ.py``, or a server argument field), and the default read there per
release; None means the release has no such switch (the behaviour is fixed, see ``fixed``).
``tests/test_sglang_reachability.py`` reads the declarations from each available wheel and
checks the defaults recorded here; a route of :mod:`.reachability` that needs a setting must
name one of these switches set against its default.
"""

from __future__ import annotations

import ast
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
