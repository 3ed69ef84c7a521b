"""SGLang's DeepSeek-V4.1 request window (``dsv41_request_window.py``, 0.5.21+), bound from a
tree for the code that runs over it: the producers' checks of its layout, idle rows, commit
and ring rows (:mod:`.producers`) and the getter targets' drivers (:mod:`.drivers`), whose
pool holds a real ``RequestWindow`` when the run sets ``--enable-encoder-swa-bounded-replay``.

Stand-ins remain only for what the pool hands the window (a paged byte pool per layer and
the packed row format); each names the SGLang class it replaces.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...reference.truth import RequestWindowRows, request_window_rows, whole_page_ring
from .binding import Binding, BindError, ClassCode, FunctionCode, bind
from .drivers import STAND_INS, STANDARD_NAMES, StandIn, StandInGap
from .locate import SourceTree
from .real_classes import RealClass, attributes

WINDOW_FILE = "sglang/srt/mem_cache/dsv41_request_window.py"
KV_LAYOUT_FILE = "sglang/kernels/ops/attention/dsv4/kv_layout.py"
MEMORY_POOL_FILE = "sglang/srt/mem_cache/memory_pool.py"
POOL_FILE = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
WINDOW_LAYOUT = "window_layout"
# two-row pages, so that the capacity the window rounds up to whole pages differs from
# the window plus the draft tokens
WINDOW_PAGE = 2
WINDOW_METHODS = ("__init__", "_ensure_workspace", "activate")


class PackedRowFormat(StandIn):
    """The byte sizes of one packed key row (SGLang's ``KVLayout.V4``: 576 data bytes and
    8 scale bytes); the row copies address pages with them."""

    role = "packed row format"
    attributes = frozenset({"data_bytes", "scale_bytes"})
    replaces = (RealClass(KV_LAYOUT_FILE, "KVLayout"),)


V4_ROWS = PackedRowFormat(data_bytes=576, scale_bytes=8)


class PagedRows(StandIn):
    """A paged key pool as the request window's ``pool_factory`` makes it: per layer a byte
    buffer of ``size`` rows, ``page_size`` rows a page, data bytes then scale bytes."""

    role = "paged key pool"
    attributes = frozenset({"kv_buffer", "size", "kv_layout"})
    replaces = (RealClass(POOL_FILE, "DeepSeekV4SingleKVPool"), RealClass(MEMORY_POOL_FILE, "KVCache"))

    @classmethod
    def factory(cls, page_size: int) -> Callable[[int, int], "PagedRows"]:
        def make(size: int, layers: int) -> PagedRows:
            pages = -(-size // page_size)
            width = page_size * (V4_ROWS.data_bytes + V4_ROWS.scale_bytes)
            return cls(kv_buffer=[torch.zeros(pages, width, dtype=torch.uint8) for _ in range(layers)],
                       size=size, kv_layout=V4_ROWS)
        return make

    @classmethod
    def unread(cls, size: int, layers: int) -> "PagedRows":
        """A pool of ``size`` rows whose bytes nobody reads (the store targets' checks read
        only where the rows are), so it holds none."""
        return cls(kv_buffer=[torch.empty(0, dtype=torch.uint8) for _ in range(layers)], size=size,
                   kv_layout=V4_ROWS)


def cuda_only(name: str) -> Callable[..., Any]:
    """A CUDA kernel of SGLang's: a CPU run that reaches it took a path swafuzz does not run."""
    def refuse(*_: Any, **__: Any) -> Any:
        raise StandInGap(f"SGLang code took its CUDA-only path ({name}); swafuzz runs the torch path")
    return refuse


# Global names the window's code reads that are not SGLang code under test: typing names,
# the invariant reporting and capture probes (the runner is never capturing here), and the
# CUDA kernel of the layout, which the CPU never takes.
WINDOW_STAND_INS: dict[str, Any] = {
    **STANDARD_NAMES, **STAND_INS,
    "F": torch.nn.functional, "List": list, "Optional": None, "Tuple": tuple,
    "KVLayout": types.SimpleNamespace(V4=V4_ROWS),
    "get_is_capture_mode": lambda: False,
    "_is_hip": False,
    "InvariantCheckLevel": types.SimpleNamespace(WARN=1), "resolve_level": lambda: 0,
    "expect": cuda_only("expect"), "_WINDOW_GROUPS_FIT": None, "_SWA_HISTORY_PRESENT": None,
    "build_window_layout": cuda_only("build_window_layout"),
    # host-to-device staging: nothing is pinned on a CPU run
    "is_pin_memory_available": lambda device=None: False,
}


def window_layout_code(tree: SourceTree, mode: str) -> tuple[Binding, Any]:
    """SGLang's ``window_layout`` and its helpers, building SGLang's ``WindowLayout`` record
    (rebuilt from the release's field list)."""
    record = bind(tree, (ClassCode(WINDOW_FILE, "WindowLayout", dataclass_fields=True),), WINDOW_STAND_INS, {}, mode)
    layout_class = record.classes["WindowLayout"].build(object)
    binding = bind(
        tree, (FunctionCode(WINDOW_FILE, "_capturing"), FunctionCode(WINDOW_FILE, "_first_row_offsets"),
               FunctionCode(WINDOW_FILE, WINDOW_LAYOUT)),
        {**WINDOW_STAND_INS, "WindowLayout": layout_class}, {}, mode,
    )
    return binding, binding.functions[WINDOW_LAYOUT]


def bind_request_window(
    tree: SourceTree, mode: str, methods: tuple[str, ...] = (), extra: tuple[FunctionCode, ...] = (),
) -> tuple[type, Binding, Any]:
    """SGLang's ``RequestWindow`` with ``methods`` besides its constructor and activation
    (and the helpers ``extra`` they call), and the release's ``window_layout``."""
    layout_binding, layout_function = window_layout_code(tree, mode)
    real = attributes(tree, (RealClass(WINDOW_FILE, "RequestWindow"),))
    binding = bind(
        tree, (*extra, ClassCode(WINDOW_FILE, "RequestWindow", (*WINDOW_METHODS, *methods), role="request window")),
        {**WINDOW_STAND_INS, **layout_binding.functions}, {"request window": real}, mode,
    )
    return binding.classes["RequestWindow"].build(object), binding, layout_function


def parameters(function: types.FunctionType) -> tuple[str, ...]:
    code = function.__code__
    return code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]


@dataclass(frozen=True)
class WindowCode:
    """A tree's ``RequestWindow`` (with ``activate_idle`` where the tree has it) and its
    ``window_layout``, as the getter targets' pool and metadata builder use them."""

    window_class: type
    layout_function: Any

    @property
    def window(self) -> int:
        """The sliding window the layout is built for (SGLang's own, its default)."""
        return self.layout_function.__kwdefaults__["window"]

    def capacity(self, draft_tokens: int) -> int:
        """The ring rows per request slot the truth gives the window: the window plus the
        draft tokens a verify writes past it, in whole pages."""
        return whole_page_ring(self.window, draft_tokens, WINDOW_PAGE)

    def new_window(self, num_slots: int, draft_tokens: int, workspace_rows: int) -> Any:
        """``RequestWindow`` as ``DeepSeekV4TokenToKVPool.__init__`` makes it under encoder
        SWA bounded replay, over pools without bytes: a store target's check reads none."""
        return self.window_class(PagedRows.unread, num_slots=num_slots, layers=1,
                                 page_size=WINDOW_PAGE, capacity=self.window + draft_tokens,
                                 workspace_rows=workspace_rows)

    def layout(self, window: Any, token_slots: torch.Tensor, positions: torch.Tensor,
               num_groups: int | None, padded_rows: int | None = None) -> Any:
        return build_layout(self.layout_function, token_slots, positions, window.capacity, window.zero_row,
                            num_groups, padded_rows)

    def truth(self, req_pool_indices: torch.Tensor, extend_prefix_lens: torch.Tensor,
              extend_seq_lens: torch.Tensor, capacity: int, history_groups: int | None,
              padding: int = 0) -> RequestWindowRows:
        return window_truth(self.layout_function, req_pool_indices, extend_prefix_lens, extend_seq_lens, capacity,
                            history_groups, padding)


def build_layout(layout_function: Any, token_slots: torch.Tensor, positions: torch.Tensor, capacity: int,
                 zero_row: int, num_groups: int | None, padded_rows: int | None = None) -> Any:
    """The layout ``make_core_attn_metadata`` builds: the tokens' request slots and
    positions, the window's capacity (and zero row, where the release takes it), ``num_groups``
    history groups (one per request row where the caller knows the requests, else one per
    row), and the padded row count under a prefill graph, where the release pads."""
    taken = parameters(layout_function)
    arguments: dict[str, Any] = {"capacity": capacity, "num_groups": num_groups}
    if "zero_row" in taken:
        arguments["zero_row"] = zero_row
    if padded_rows is not None:
        if "padded_rows" not in taken:
            raise StandInGap(f"a forward padded to {padded_rows} rows under the request window: this release's "
                             "window_layout pads no layout, and how its metadata builder pads one is not modelled")
        arguments["padded_rows"] = padded_rows
    return layout_function(token_slots, positions, **arguments)


def window_truth(layout_function: Any, req_pool_indices: torch.Tensor, extend_prefix_lens: torch.Tensor,
                 extend_seq_lens: torch.Tensor, capacity: int, history_groups: int | None,
                 padding: int = 0) -> RequestWindowRows:
    """:func:`request_window_rows` for a forward, at the window the layout is built for."""
    return request_window_rows(req_pool_indices, extend_prefix_lens, extend_seq_lens,
                               window=layout_function.__kwdefaults__["window"], capacity=capacity,
                               history_groups=history_groups, padding=padding)


def bind_window_code(tree: SourceTree, mode: str) -> WindowCode:
    """The tree's request window with ``activate_idle`` where it has one (0.5.23; before,
    idle forwards never activate a layout of their own); BindError where it has none."""
    try:
        window_class, _, layout_function = bind_request_window(tree, mode, ("activate_idle",))
    except BindError:
        window_class, _, layout_function = bind_request_window(tree, mode)
    return WindowCode(window_class, layout_function)
