"""The per-step values a subject may answer beside its SWA write location, as one table.

Like an OpInfo table: one row per value, and the harness reads every row the same way. A
row names the value as SGLang's ``DSV4AttnMetadata`` field does, says which layers read it
(by their compress ratio, the model config's ``compress_ratios[layer_id]``), and gives its
truth as a function of one micro-batch's live inputs (its positions and full-pool write
locations), from :mod:`swafuzz.reference.compressed`.

A subject lists the names it answers in its ``answers`` class attribute and answers them
through ``per_step_value(batch, layer_id, name)``; the harness asks each answered value
once per layer that reads it, right after that layer's ``swa_write_location``, and
compares it with the truth of the micro-batch and draft step the layer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .reference import compressed_out_loc


@dataclass(frozen=True)
class Quantity:
    """One per-step value: its SGLang name, the compress ratios of the layers that read it,
    its truth and its dtype."""

    name: str
    read_by_ratios: frozenset[int]
    truth: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (positions, out_cache_loc) -> rows
    dtype: torch.dtype

    def read_by(self, ratio: int) -> bool:
        return ratio in self.read_by_ratios


def _compressed_out_loc(ratio: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def truth(positions: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
        return compressed_out_loc(positions, out_cache_loc, ratio)
    return truth


# Both are made by _init_compressed_attn_metadata_kernel through
# DSV4AttnMetadata.init_compression_metadata (int64 from 0.5.13 to 0.5.23) and read by every
# C4 / C128 layer's compressor store (CompressorBackendMixin._get_out_loc, read in 0.5.23).
QUANTITIES: Mapping[str, Quantity] = {
    q.name: q for q in (
        Quantity("c4_out_loc", frozenset({4}), _compressed_out_loc(4), torch.int64),
        Quantity("c128_out_loc", frozenset({128}), _compressed_out_loc(128), torch.int64),
    )
}


class UnknownQuantity(ValueError):
    """A subject answers a value the table does not hold."""


def answered(names: object) -> tuple[Quantity, ...]:
    """The table's rows for a subject's ``answers``; a name the table lacks is refused."""
    if not isinstance(names, (tuple, list, frozenset, set)) or not all(type(n) is str for n in names):
        raise UnknownQuantity(f"answers must be a tuple of value names, got {names!r:.80}")
    unknown = sorted(set(names) - set(QUANTITIES))
    if unknown:
        raise UnknownQuantity(f"answers names {', '.join(unknown)}, which is not among the values the harness "
                              f"checks ({', '.join(QUANTITIES)})")
    return tuple(QUANTITIES[name] for name in names)


def reads_per_layer(quantities: tuple[Quantity, ...], layers, compress_ratio) -> dict[int, tuple[Quantity, ...]]:
    """Per layer of ``layers`` that reads any of ``quantities``, those it reads, in table
    order; ``compress_ratio(layer_id)`` gives a layer's ratio."""
    out = {}
    for layer in layers:
        ratio = compress_ratio(layer)
        read = tuple(q for q in quantities if q.read_by(ratio))
        if read:
            out[layer] = read
    return out
