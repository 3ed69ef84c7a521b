"""SGLang's producers of the per-token rows the unified-KV stores read, checked against the truth.

Target-verify stores read ``req_pool_indices_repeated`` (as ``verify_store_state_slot``) and
prefill stores read ``pf_state_slot``, ``pf_chunk_start``, ``pf_cu_q`` and ``pf_final_pos``.
The backends compute them from the batch's live inputs (``expand_extend_with_same_length``,
``expand_prefill_casually``, ``_attach_unified_kv_prefill_meta``); :func:`check` runs the
ones a release has on a batch and names every row that differs from :mod:`reference.truth`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reference.truth import prefill_rows, token_state_slots

from .binding import Binding, BindError, ClassCode, bind
from .drivers import STANDARD_NAMES
from .locate import SourceTree
from .targets import CUDA_BACKEND, CUDA_BACKEND_FILE, HIP_BACKEND, HIP_BACKEND_FILE

PRODUCER_ROLE = "producer backend"
PRODUCER_ATTRIBUTES = frozenset({"cuda_int32_kwargs", "token_to_kv_pool"})
VERIFY_EXPANSION = "expand_extend_with_same_length"
PREFILL_EXPANSION = "expand_prefill_casually"
PREFILL_ROWS = "_attach_unified_kv_prefill_meta"
PRODUCERS = (VERIFY_EXPANSION, PREFILL_EXPANSION, PREFILL_ROWS)
PREFILL_FIELDS = ("state_slot", "chunk_start", "cu_q", "final_pos")


def _unified_kv_on() -> bool:
    """Stands in for SGLang's unified-KV gate: the rows are built only when it is on."""
    return True


class UnifiedRows:
    """Stands in for ``UnifiedKvMetadata``: holds whatever rows the producer attaches."""


# names the producers import inside their bodies or use from their module
PRODUCER_STAND_INS: dict[str, Any] = {
    **STANDARD_NAMES, "is_unified_kv_triton": _unified_kv_on, "UnifiedKvMetadata": UnifiedRows,
    "F": torch.nn.functional, "List": list, "Optional": None, "Tuple": tuple,
}


@dataclass
class Producer:
    backend: str
    method: str
    function: Any


def bind_producers(tree: SourceTree, mode: str = "source") -> tuple[list[Producer], dict[str, str]]:
    """The producers ``tree`` has (HIP backend first, then CUDA), and why each other is absent."""
    found: list[Producer] = []
    absent: dict[str, str] = {}
    for method in PRODUCERS:
        reasons = []
        for path, backend in ((HIP_BACKEND_FILE, HIP_BACKEND), (CUDA_BACKEND_FILE, CUDA_BACKEND)):
            try:
                binding: Binding = bind(
                    tree, (ClassCode(path, backend, (method,), role=PRODUCER_ROLE),),
                    PRODUCER_STAND_INS, {PRODUCER_ROLE: PRODUCER_ATTRIBUTES}, mode,
                )
            except BindError as exc:
                reasons.append(str(exc))
                continue
            found.append(Producer(backend, method, binding.classes[backend].methods[method]))
            break
        else:
            absent[method] = "; ".join(reasons)
    return found, absent


@dataclass(frozen=True)
class Batch:
    """The live inputs of one extend-like forward (target-verify has equal counts)."""

    req_pool_indices: torch.Tensor  # int64 [requests]
    extend_prefix_lens: torch.Tensor  # int64 [requests]
    extend_seq_lens: torch.Tensor  # int64 [requests]

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.extend_prefix_lens + self.extend_seq_lens

    @property
    def num_tokens(self) -> int:
        return int(self.extend_seq_lens.sum())


def _backend(window: int) -> Any:
    pool = type("PoolRows", (), {"unified_swa_window": window})()
    return type("ProducerBackend", (), {"cuda_int32_kwargs": {"dtype": torch.int32, "device": "cpu"},
                                        "token_to_kv_pool": pool})()


def check(producer: Producer, batch: Batch, window: int = 128) -> list[str]:
    """Every row ``producer`` gets wrong on ``batch`` (empty when all match the truth); a
    producer that does not apply to the batch (equal counts only) returns no mismatch."""
    backend = _backend(window)
    counts = [int(c) for c in batch.extend_seq_lens]
    slots = token_state_slots(batch.req_pool_indices, batch.extend_seq_lens)
    if producer.method == VERIFY_EXPANSION:
        if len(set(counts)) != 1:
            return []
        _, repeated = producer.function(
            backend, bs=len(counts), qo_len=counts[0], seq_lens=batch.seq_lens.to(torch.int32),
            req_pool_indices=batch.req_pool_indices,
        )
        return _differences("req_pool_indices_repeated", repeated, slots)
    if producer.method == PREFILL_EXPANSION:
        _, repeated = producer.function(
            backend, num_tokens=batch.num_tokens, seq_lens=[int(s) for s in batch.seq_lens],
            extend_seq_lens=counts, req_pool_indices=batch.req_pool_indices, padded_num_tokens=None,
        )
        return _differences("req_pool_indices_repeated", repeated, slots)
    core = type("CoreRows", (), {"unified": None, "positions_casual": torch.zeros(batch.num_tokens)})()
    offered = {"core": core, "req_pool_indices": batch.req_pool_indices, "seq_lens": batch.seq_lens,
               "extend_seq_lens": batch.extend_seq_lens, "num_tokens": batch.num_tokens,
               "req_pool_indices_repeated": slots}
    code = producer.function.__code__
    taken = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    # releases differ in which of these the producer takes (num_tokens from 0.5.18)
    producer.function(backend, **{k: v for k, v in offered.items() if k in taken})
    truth = prefill_rows(batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens)
    problems = []
    for name in PREFILL_FIELDS:
        problems += _differences(f"pf_{name}", getattr(core.unified, f"pf_{name}", None), getattr(truth, name))
    return problems


def _differences(name: str, got: Any, want: torch.Tensor) -> list[str]:
    if not isinstance(got, torch.Tensor):
        return [f"{name}: got {type(got).__name__}, want {want.tolist()}"]
    got = got.to(device="cpu", dtype=torch.int64).reshape(-1)
    if got.shape != want.shape or not torch.equal(got, want):
        return [f"{name}: got {got.tolist()}, want {want.tolist()}"]
    return []
