"""Where subject calls run: the one seam between the executor and a device's streams.

On the host there is a single in-order timeline: a layer reads what the previous call left,
so stream-ordering bugs cannot occur and answers are checked as they come back. On a GPU
each micro-batch runs on its own stream, the engine's side stream is real, a store kernel
reads the returned tensor at its own point in its stream (modelled by an asynchronous copy
on that stream), and answers are checked after the device has settled.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class HostTimeline:
    deferred = False

    def __init__(self, device: torch.device):
        self.device = device

    def stream_for(self, micro_batch: int) -> None:
        return None

    @property
    def side_stream(self) -> None:
        return None

    def consumed(self, store: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
        """``store`` with its answer read as a store kernel reads it: on the host, itself."""
        return store

    def on_streams(self, store: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
        """``store`` consumed on the batch's stream: on the host, itself."""
        return store

    def begin_forward(self) -> None:
        pass

    def delay_side_stream(self) -> None:
        pass

    def settle(self) -> None:
        pass


class GpuStreams(HostTimeline):
    """CUDA or ROCm (torch calls both ``cuda``): real streams, optional side-stream delay."""

    deferred = True

    def __init__(self, device: torch.device, delay_cycles: int = 0):
        super().__init__(device)
        self.delay_cycles = delay_cycles
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._side = torch.cuda.Stream(device=device)

    def stream_for(self, micro_batch: int) -> torch.cuda.Stream:
        if micro_batch not in self._streams:
            self._streams[micro_batch] = torch.cuda.Stream(device=self.device)
        return self._streams[micro_batch]

    @property
    def side_stream(self) -> torch.cuda.Stream:
        return self._side

    def consumed(self, store: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
        """``store`` whose answer is read where the call runs, as a store kernel would read
        it: the read is part of the call, so a race the sanitizer sees there is the
        subject's."""
        consume = self.consume
        return lambda batch, layer_id: consume(store(batch, layer_id))

    def on_streams(self, store: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
        """``store`` consumed on the batch's stream."""
        consumed = self.consumed(store)

        def on_batch_stream(batch, layer_id: int) -> Any:
            with torch.cuda.stream(batch.stream):
                return consumed(batch, layer_id)

        return on_batch_stream

    def begin_forward(self) -> None:
        # inputs were copied on the current stream: every stream of the forward starts after
        current = torch.cuda.current_stream(self.device)
        for stream in (*self._streams.values(), self._side):
            stream.wait_stream(current)

    def delay_side_stream(self) -> None:
        if self.delay_cycles:
            with torch.cuda.stream(self._side):
                torch.cuda._sleep(self.delay_cycles)

    def consume(self, out: Any) -> Any:
        # what a store kernel on this stream reads, at this point of the stream
        return out.clone() if isinstance(out, torch.Tensor) and out.is_cuda else out

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)


def timeline_for(device: torch.device, delay_cycles: int = 0) -> HostTimeline:
    if device.type == "cuda":
        return GpuStreams(device, delay_cycles)
    if delay_cycles:
        raise ValueError("stream delay injection needs a GPU device (--device cuda)")
    return HostTimeline(device)


def enable_stream_sanitizer() -> None:
    """PyTorch's CUDA Stream Sanitizer: unsynchronized cross-stream access then raises."""
    from torch.cuda._sanitizer import enable_cuda_sanitizer

    enable_cuda_sanitizer()
