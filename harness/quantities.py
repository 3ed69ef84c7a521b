"""The per-step values a subject may answer beside its SWA write location, as one table.

Like an OpInfo table: one row per value, and the harness reads every row the same way. A
row names the value as SGLang's ``DSV4AttnMetadata`` field does, says which layers read it
(by their compress ratio, the model config's ``compress_ratios[layer_id]``), and gives its
truth as a function of one micro-batch's live inputs (its positions, full-pool write
locations and request slots) and the pages the engine model's books give each request
(``req_to_token``), from :mod:`swafuzz.reference`.

A subject lists the names it answers in its ``answers`` class attribute and answers them
through ``per_step_value(batch, layer_id, name)``; the harness asks each answered value
once per layer that reads it, right after that layer's ``swa_write_location``, and
compares it with the truth of the micro-batch and draft step the layer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .api import ModelSpec
from .reference import UNREAD_PAGE, EngineState, StepInputs, compressed_out_loc

Truth = Callable[[StepInputs, EngineState], torch.Tensor]


@dataclass(frozen=True)
class Quantity:
    """One per-step value: its SGLang name, the compress ratios of the layers that read it,
    its truth and its dtype.

    A value of one entry per row is 1-D. A value with a table per row is 2-D
    (``unread`` set): its truth holds ``unread`` in the entries no layer reads, which are
    not compared, and an answer may have more columns than the truth (a graph's static
    buffer holds ``graph_columns(spec)``, the widest the model can need)."""

    name: str
    read_by_ratios: frozenset[int]
    truth: Truth  # (a micro-batch's live inputs, the engine's books) -> rows
    dtype: torch.dtype
    unread: int | None = None
    graph_columns: Callable[[ModelSpec], int] | None = None
    reads_req_to_token: bool = False  # its subjects are handed ``ModelSpec.req_to_token``

    def read_by(self, ratio: int) -> bool:
        return ratio in self.read_by_ratios

    @property
    def is_table(self) -> bool:
        return self.unread is not None

    def matches(self, answer: torch.Tensor, truth: torch.Tensor) -> bool:
        """Whether ``answer``, a tensor of the value's dtype on the host, is its truth: of a
        table, with at least the truth's columns and the read entries equal."""
        if not self.is_table:
            return torch.equal(answer, truth)
        return (answer.dim() == 2 and answer.shape[0] == truth.shape[0] and answer.shape[1] >= truth.shape[1]
                and torch.equal(self.compared(answer, truth), truth))

    def compared(self, answer: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        """What of ``answer`` is held against ``truth``: all of it, or of a table its
        first columns, with the truth's unread entries copied in."""
        if not self.is_table:
            return answer
        cut = answer[:, :truth.shape[1]]
        return torch.where(truth == self.unread, truth, cut.to(truth.device))


def _compressed_out_loc(ratio: int) -> Truth:
    def truth(inputs: StepInputs, state: EngineState) -> torch.Tensor:
        return compressed_out_loc(inputs.positions, inputs.out_cache_loc, ratio)
    return truth


def _page_table(inputs: StepInputs, state: EngineState) -> torch.Tensor:
    return state.page_table(inputs.token_slots.numpy(), inputs.positions.numpy())


def _page_table_columns(spec: ModelSpec) -> int:
    return -(-spec.req_to_token.shape[1] // spec.page_size)


# c4_out_loc and c128_out_loc are made by _init_compressed_attn_metadata_kernel through
# DSV4AttnMetadata.init_compression_metadata (int64 from 0.5.13 to 0.5.23) and read by every
# C4 / C128 layer's compressor store (CompressorBackendMixin._get_out_loc, read in 0.5.23).
# page_table is made in the backend's make_core_attn_metadata (int32; inline from
# req_to_token in 0.5.13 to 0.5.15, by BuildPageTablePositions from 0.5.16 to 0.5.23) and
# read by the C4 indexer and, through the C128 page indices the compression metadata
# kernel makes from it, by the C128 attention.
QUANTITIES: Mapping[str, Quantity] = {
    q.name: q for q in (
        Quantity("c4_out_loc", frozenset({4}), _compressed_out_loc(4), torch.int64),
        Quantity("c128_out_loc", frozenset({128}), _compressed_out_loc(128), torch.int64),
        Quantity("page_table", frozenset({4, 128}), _page_table, torch.int32, unread=UNREAD_PAGE,
                 graph_columns=_page_table_columns, reads_req_to_token=True),
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
