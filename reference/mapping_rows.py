"""The ``full_to_swa`` mapping of each model: the truth's tensors, written in place through
numpy, and which of their rows were written since a caller last asked."""

from __future__ import annotations

import numpy as np
import torch

from .paging import INT, NO_PAGES
from .truth import DUMMY_SLOT


class MappingRows:
    """Per model, the mapping as an array and as a tensor sharing its memory (:attr:`tensors`,
    whose entries a registration replaces), and the full slots whose rows were written since
    the last :meth:`take_written`."""

    def __init__(self, models: tuple[str, ...], full_pool_size: int):
        self.rows = {m: np.zeros(full_pool_size, dtype=INT) for m in models}
        self.tensors = {m: torch.from_numpy(rows) for m, rows in self.rows.items()}
        # per model, the full slots whose mapping rows were written since the last
        # take_written(), and how many; None: any row may have changed
        self._written: dict[str, list[np.ndarray] | None] = {m: [] for m in models}
        self._written_count = dict.fromkeys(models, 0)

    def take_written(self, model: str, joined: bool = True) -> np.ndarray | None:
        """The full slots whose rows of ``model``'s mapping changed since the last call (all
        of them, and maybe others: a row may be written with the value it held, or twice);
        None where any row may have, as after ``clear``, a registration, or more writes than
        the pool has slots. For a caller that keeps a copy of the mapping: it is kept in
        line by copying these rows alone. Only the model's own writes are counted.
        ``joined=False``: the caller compares the whole mapping anyway; the count starts
        again and None comes back, without the rows joined."""
        written = self._written[model]
        self._written[model], self._written_count[model] = [], 0
        if written is None or not joined:
            return None
        if len(written) == 1:
            return written[0]
        return np.concatenate(written) if written else NO_PAGES

    def write(self, model: str, full: np.ndarray, values) -> None:
        """``model``'s mapping rows ``full`` take ``values``, counted for take_written()."""
        self.rows[model][full] = values
        written = self._written[model]
        if written is not None:
            count = self._written_count[model] = self._written_count[model] + len(full)
            if count > len(self.rows[model]):
                self._written[model] = None  # more slots than the pool has: say "any row" instead
            else:
                written.append(full)

    def clear(self, model: str) -> None:
        """Nothing of ``model``'s is mapped."""
        self.tensors[model].fill_(DUMMY_SLOT)
        self._written[model] = None

    def replace(self, model: str) -> None:
        """``model``'s mapping is a new, empty tensor, as a registration allocates it."""
        self.rows[model] = np.zeros_like(self.rows[model])
        self.tensors[model] = torch.from_numpy(self.rows[model])
        self._written[model] = None
