"""Memory the executor owns, so the addresses a subject sees follow from the scenario alone.

A subject may key a cache on ``data_ptr()``. Whether two tensors it is handed share an
address must then come out the same in fuzzing, in a replay and in an emitted test, in any
process. Tensors from the process allocator do not give that: whether a freed block comes
back depends on everything else the process did. So every tensor the executor hands a
subject is a view into a block allocated here and kept alive for the whole run.

What is modelled, and why:

- **Eager batch inputs** alternate between two slots per model, forward by forward. The
  engine prepares the next batch while the current one is still referenced (the scheduler
  overlaps preparation with execution), and by then the batch before it has been freed,
  so the caching allocator hands that memory back. Within a forward the tensors are laid
  out one after the other in a fixed order (draft step, micro-batch, field), so forwards
  ``n`` and ``n + 2`` of one model with the same row counts get the same addresses.
- **Registered mappings** alternate the same way: a rebuilt pool's tensor is allocated
  while the old one is still registered.
- **Graph inputs** are one buffer per input and model at the largest captured batch size,
  allocated once (:meth:`Arena.buffer`); each captured size uses ``buf[:size]``.

A block that must grow is replaced by a larger one and the old one stays alive, so a new
block never takes an address that a live view has. Views of one block share its in-place
version counter (``Tensor._version``), as views do.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

ALTERNATING_SLOTS = 2
_MIN_BLOCK = 64


class Arena:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._on_host = device.type == "cpu"
        self._blocks: dict[tuple[Hashable, torch.dtype], torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []  # grown-out-of blocks, kept so no address is reused
        # per block and length, its first elements as one tensor, for the placements whose
        # caller hands out only views of it (:meth:`place_split`): those mostly repeat a
        # length (a run of forwards), and a slice costs as much as the copy into it
        self._heads: dict[tuple[Hashable, torch.dtype, int], torch.Tensor] = {}

    def place(self, key: Hashable, sources: Sequence[torch.Tensor]) -> torch.Tensor:
        """Copies of the 1-D ``sources`` (one dtype, at least one) laid out one after the
        other in block ``key``, written with one copy (one transfer to a device): the
        block's first elements, as a new tensor object."""
        numel = _numel(sources)
        return self._fill(self._block((key, sources[0].dtype), numel)[:numel], sources)

    def place_split(self, key: Hashable, sources: Sequence[torch.Tensor],
                    sizes: Sequence[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """:meth:`place`, and new views of the placed elements cut at ``sizes``. The placed
        tensor is the same object whenever a block takes as many elements: it is for the
        caller to read, never to hand out."""
        dtype, numel = sources[0].dtype, _numel(sources)
        head = self._heads.get((key, dtype, numel))
        if head is None:
            head = self._heads[key, dtype, numel] = self._block((key, dtype), numel)[:numel]
        placed = self._fill(head, sources)
        return placed, placed.split_with_sizes(sizes)

    def _fill(self, placed: torch.Tensor, sources: Sequence[torch.Tensor]) -> torch.Tensor:
        """``placed``, which holds as many elements as ``sources``, with their copies."""
        if len(sources) == 1:
            return placed.copy_(sources[0])
        if self._on_host:  # sources are host tensors: joined in place
            return torch.cat(sources, out=placed)
        return placed.copy_(torch.cat(sources))

    def buffer(self, key: Hashable, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A block of exactly ``numel`` elements, allocated at the first call for ``key``."""
        return self._block((key, dtype), numel, minimum=numel)

    def _block(self, key: tuple[Hashable, torch.dtype], numel: int, minimum: int = _MIN_BLOCK) -> torch.Tensor:
        block = self._blocks.get(key)
        if block is None or block.numel() < numel:
            if block is not None:
                self._retired.append(block)
                self._heads = {head: view for head, view in self._heads.items() if head[:2] != key}
            capacity = max(numel, minimum, 2 * block.numel() if block is not None else 0)
            block = self._blocks[key] = torch.zeros(capacity, dtype=key[1], device=self.device)
        return block


def _numel(sources: Sequence[torch.Tensor]) -> int:
    return sources[0].numel() if len(sources) == 1 else sum(source.numel() for source in sources)
