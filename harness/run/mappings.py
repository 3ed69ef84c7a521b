"""The mapping tensors a subject is handed, kept in line with the engine state.

The engine model's mappings are the truth; the subject gets its own tensors, placed in the
run's arena, registered with it and written by the harness as the engine would write them.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd.graph import increment_version

from ..reference import EngineState

from . import diagnosis as dx
from .arena import ALTERNATING_SLOTS, Arena
from .progress import Progress

# mappings shorter than this are synced whole: below it, three passes over the whole
# tensor (compare, keep, copy) cost less than picking out and writing the changed rows
ROWS_COPIED_WHOLE_BELOW = 4096


class MappingSync:
    """Per model, the registered mapping tensor and its in-place version after the last
    sync, and the mappings registered before it that the harness no longer writes, with
    what each held when the next was registered (the subject may keep them).
    ``register(model, mapping)`` hands a newly placed mapping to the subject."""

    def __init__(self, state: EngineState, history: dx.History, arena: Arena, progress: Progress,
                 device: torch.device, register: Callable[[str, torch.Tensor], None]):
        self.state = state
        self.history = history
        self.arena = arena
        self.progress = progress
        self.device = device
        self.on_host = device.type == "cpu"
        self.register = register
        self.mappings: dict[str, torch.Tensor] = {}
        self.mapping_versions: dict[str, int] = {}  # each registered tensor's version after the last sync
        self.earlier_mappings: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
        self.seen_epoch = 0
        self.seen_version = -1
        self.unsynced_since: str | None = None  # the first change a deferred sync has yet to write

    def sync(self, what: str, until_called: bool = False) -> None:
        """Bring the subject's mapping tensors in line with the engine state: the rows the
        engine wrote since the last sync where it says which, the whole mapping where it
        does not (a registration, a clear), at a cost that follows what changed rather than
        the pool's size (below a few thousand rows, comparing and copying it whole costs
        less than picking rows out). A registered tensor is written only where values
        differ, as a subject may key a cache on its in-place version. The caller has
        stopped a subject that wrote into a mapping first: the sync never hides it.
        ``until_called``: the change may wait for the next sync, as nothing calls the
        subject before it (an eviction, then the next forward's allocation): a state that
        no call sees is no state a cache could have kept, and the two are written as one."""
        if self.state.version == self.seen_version:
            return
        if self.unsynced_since is None:
            self.unsynced_since = what
        if until_called:
            return
        what, self.unsynced_since = self.unsynced_since, None
        self.seen_version = self.state.version
        registered = self.state.mapping_epoch != self.seen_epoch or not self.mappings
        self.seen_epoch = self.state.mapping_epoch
        if registered and self.mappings:
            self.history.registrations.append(self.progress.forward)
        label = f"the mapping before {what}"
        synced = self.history.mappings
        for model, truth in self.state.mappings.items():
            old = synced.get(model)
            whole = old is None or registered or truth.shape[0] < ROWS_COPIED_WHOLE_BELOW
            written = self.state.take_written(model, joined=not whole)
            rows = None  # the rows that changed; None: the whole mapping is compared
            if whole or written is None:
                changed = old is None or not torch.equal(old, truth)
                if changed:
                    if old is not None:
                        self.history.record_old_mapping(model, label, None, old)  # replaced, never written
                    synced[model] = truth.clone()
            else:  # through numpy: a few rows cost a fraction of torch's indexing
                kept = old.numpy()
                old_rows, new_rows = kept[written], truth.numpy()[written]
                changed = bool((old_rows != new_rows).any())
                if changed:
                    rows = torch.from_numpy(written)
                    self.history.record_old_mapping(model, label, rows, torch.from_numpy(old_rows))
                    kept[written] = new_rows
            if registered:
                # a rebuilt pool's mapping is allocated while the old one is still registered
                earlier = self.mappings.get(model)
                self.mappings[model] = placed = self.arena.place(("mapping", model, self.seen_epoch % ALTERNATING_SLOTS),
                                                                 [truth])
                self._retire_mapping(model, earlier, old, placed)
                self.mapping_versions[model] = self.mappings[model]._version
                self.register(model, self.mappings[model])
            else:
                mapping = self.mappings[model]
                if changed:
                    if rows is None:
                        mapping.copy_(truth)
                    elif self.on_host:  # through numpy, and the version moves as a torch write moves it
                        mapping.numpy()[written] = new_rows
                        increment_version(mapping)
                    else:
                        mapping.index_put_((rows.to(self.device),), torch.from_numpy(new_rows).to(self.device))
                self.mapping_versions[model] = mapping._version

    def _retire_mapping(self, model: str, earlier: torch.Tensor | None, held: torch.Tensor | None,
                        placed: torch.Tensor) -> None:
        """Keep the mapping ``earlier`` (holding ``held``), replaced by ``placed``, to check that
        the subject leaves it alone; one whose memory the harness has just written ``placed``
        into is no longer the subject's to keep."""
        memory = placed.untyped_storage().data_ptr()
        kept = [entry for entry in self.earlier_mappings.get(model, ())
                if entry[0].untyped_storage().data_ptr() != memory]
        if earlier is not None and held is not None and earlier.untyped_storage().data_ptr() != memory:
            kept.append((earlier, held.clone(), earlier._version))
        self.earlier_mappings[model] = kept
