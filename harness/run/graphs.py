"""Graph capture and replay behind one small seam.

On a GPU this is ``torch.cuda.CUDAGraph``. On the CPU, :class:`RecordedGraph` models the
same contract: every tensor operation run during capture is recorded with the tensor
objects it read and wrote, and replay re-runs the operations on those same objects, writing
results back into the tensors captured as outputs. Python code (``if`` on cached state,
attribute lookups, re-pointing a field at a new tensor) runs at capture only, exactly as on
a GPU, so a consumer that captured a tensor keeps reading that tensor.

Work a GPU cannot capture is refused at capture: host reads of device values and ops whose
output size depends on tensor values (boolean masks, ``repeat_interleave`` without
``output_size``). Host reads that bypass the dispatcher (``.tolist()``, ``.numpy()``) are
invisible to the model; a real GPU run catches those.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from ..errors import GraphCaptureError


_HOST_SYNC_OPS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::equal"}


def _sizes_output_from_data(func, args, kwargs) -> bool:
    """Ops whose output size depends on tensor values: a GPU must sync to launch them."""
    name = func._schema.name
    if name == "aten::repeat_interleave" and func._overloadname == "Tensor":
        return kwargs.get("output_size", args[1] if len(args) > 1 else None) is None
    if name == "aten::index":
        return any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
        )
    return False


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name in _HOST_SYNC_OPS or _sizes_output_from_data(func, args, kwargs):
            raise GraphCaptureError(
                f"{func._schema.name} reads a device value on the host during graph capture"
            )
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class RecordedGraph:
    """CPU model of a CUDA graph (see module docstring)."""

    def __init__(self) -> None:
        self._ops: list[tuple[Any, tuple, dict, Any]] = []
        # per recorded op, the outputs replay writes back: (position among the op's
        # flattened outputs, the captured tensor), worked out once when capture ends
        self._writes: list[tuple[Any, tuple, dict, bool, list[tuple[int, torch.Tensor]]]] = []

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with _Recorder(self._ops):
            yield
        self._writes = [(func, args, kwargs, *_written_outputs(func, recorded)) for func, args, kwargs, recorded in self._ops]

    def replay(self) -> None:
        for func, args, kwargs, single, writes in self._writes:
            fresh = func(*args, **kwargs)
            if not writes:
                continue
            fresh_flat = (fresh,) if single else tree_flatten(fresh)[0]
            for i, old in writes:
                new = fresh_flat[i]
                if old.shape != new.shape:
                    raise GraphCaptureError(
                        f"{func._schema.name} produced shape {tuple(new.shape)} at replay, "
                        f"{tuple(old.shape)} at capture"
                    )
                old.copy_(new)


def _written_outputs(func, recorded: Any) -> tuple[bool, list[tuple[int, torch.Tensor]]]:
    """Whether ``func`` returns one tensor, and its outputs a replay writes back into the
    captured tensors: every tensor output except those that alias an input (an in-place or
    view op's result is the input, which the op itself updates)."""
    returns = func._schema.returns
    recorded_flat, _ = tree_flatten(recorded)
    writes = [
        (i, old) for i, old in enumerate(recorded_flat)
        if isinstance(old, torch.Tensor) and not (i < len(returns) and returns[i].alias_info is not None)
    ]
    return isinstance(recorded, torch.Tensor), writes


class CudaGraph:
    """The real thing (CUDA or ROCm builds of torch)."""

    def __init__(self) -> None:
        self._graph = torch.cuda.CUDAGraph()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with torch.cuda.graph(self._graph):
            yield

    def replay(self) -> None:
        self._graph.replay()


def load_capture_machinery() -> None:
    """Run one operation under the recorder now: the first one in a process imports
    ``torch._dynamo`` (seconds), which must not be charged to whatever is being timed."""
    with _Recorder([]):
        torch.zeros(1).add_(1)


def make_graph(device: torch.device) -> RecordedGraph | CudaGraph:
    return CudaGraph() if device.type == "cuda" else RecordedGraph()
