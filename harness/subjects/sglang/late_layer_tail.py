"""SGLang's late-layer tail under decoder SWA bounded replay (0.5.21+), bound from a tree for
the code that runs over it: the producers' check of its rows (:mod:`.producers`) and the
getter targets' drivers (:mod:`.drivers`), whose extends run their late layers on the tail
when the run sets ``--enable-decoder-swa-bounded-replay``.

``late_layer_tail_layout`` picks an extend's tail rows: each request's last ``tail_len``
tokens (SGLang passes its ``SWA_WINDOW``), or every token of a request marked
``whole_extend`` (0.5.23). It lives in ``attn_metadata_kernels.py`` under
``kernels/ops/attention/dsv4/`` in 0.5.23, in ``dsv4_attn_metadata_kernels.py`` beside it in
0.5.21 and 0.5.22, and calls the helpers its release has (``late_layer_tail_lens``,
``_whole_extend_tail_layout``, ``async_h2d``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .binding import Binding, BindError, FunctionCode, bind
from .locate import SourceTree
from .request_window import WINDOW_STAND_INS

LATE_LAYER_TAIL = "late_layer_tail_layout"
UTILS_FILE = "sglang/srt/utils/common.py"
# where late_layer_tail_layout lives: 0.5.23, then 0.5.21-0.5.22
ATTN_METADATA_FILES = ("sglang/kernels/ops/attention/dsv4/attn_metadata_kernels.py",
                       "sglang/kernels/ops/attention/dsv4_attn_metadata_kernels.py")


@dataclass(frozen=True)
class TailLayout:
    """A tree's ``late_layer_tail_layout``, bound from ``path``."""

    function: Any
    binding: Binding
    path: str

    @property
    def module(self) -> str:
        return self.path.rsplit("/", 1)[-1].removesuffix(".py")


def bind_tail_layout(tree: SourceTree, stand_ins: dict[str, Any], mode: str) -> TailLayout:
    """The tree's ``late_layer_tail_layout`` with the helpers it calls, over ``stand_ins``
    (the names its module reads that are not SGLang code under test); BindError naming
    each place it was looked for where the tree has none that binds."""
    reasons = []
    for path in ATTN_METADATA_FILES:
        text = tree.read(path)
        if text is None:
            reasons.append(f"{tree.label} has no file {path}")
            continue
        helpers = [FunctionCode(UTILS_FILE, "async_h2d")] if "async_h2d" in text else []
        helpers += [FunctionCode(path, name) for name in ("late_layer_tail_lens", "_whole_extend_tail_layout")
                    if f"def {name}(" in text]
        try:
            binding = bind(tree, (*helpers, FunctionCode(path, LATE_LAYER_TAIL)), stand_ins, {}, mode)
        except BindError as exc:
            reasons.append(str(exc))
            continue
        return TailLayout(binding.functions[LATE_LAYER_TAIL], binding, path)
    raise BindError("; ".join(reasons))


def bind_tail_code(tree: SourceTree, mode: str) -> TailLayout:
    """:func:`bind_tail_layout` over the names the request window's code reads too (torch,
    typing names, host staging without pinned memory), as the getter targets' drivers run it."""
    return bind_tail_layout(tree, WINDOW_STAND_INS, mode)
