"""The subject API: how an implementation under test meets the engine lifecycle.

A *subject* is a class. The harness makes one instance per model (the target, and the draft
model when the scenario has one) and drives it the way the serving engine drives its memory
pool and attention backend:

1. ``__init__(spec)`` once, then ``register_mapping(mapping)`` with the pool's
   ``full_to_swa`` tensor. Later changes happen *in place* on that tensor; only a rebuilt
   pool registers a new tensor object.
2. Per forward and per micro-batch, ``init_forward_metadata(batch)``. The engine may skip it
   (idle forwards under speculative decoding), leaving the previous metadata in place.
3. Per SWA-storing layer (ascending within the stage, micro-batches interleaved),
   ``swa_write_location(batch, layer_id)`` returns the rows the layer writes: int32, one per
   row of the batch, on the batch's device. A subject that lists per-step values in
   ``answers`` (``swafuzz.quantities``) is then asked
   ``per_step_value(batch, layer_id, name)`` for each of them that the layer reads (by its
   compress ratio, ``ModelSpec.compress_ratio(layer_id)``).
4. Multi-step draft forwards run step 1..k-1 with the same ``batch`` object: positions and
   ``out_cache_loc`` are new tensors and ``draft_step`` counts up; metadata is not rebuilt.
5. Graph capture of a batch size calls ``init_capture_metadata(batch)`` once, then runs the
   forward ``EngineConfig.graph_warmups`` times eagerly (warm-up) and once inside the
   capture; each of those runs starts with ``init_graph_metadata(batch)`` (the graph-
   recordable part of metadata preparation) and calls the layers. ``batch.in_graph`` is
   true only inside the capture. The batch's inputs are slices ``buf[:size]`` of static
   buffers allocated once per model at the largest captured size, so every size and every
   replay sees the same addresses. Each replay copies live inputs into those buffers,
   calls ``init_replay_metadata(batch)`` eagerly and replays the captured work: layer code
   does not run again, consumers read the tensors the layers returned at capture, by
   address. ``reference/LIFECYCLE.md`` names the SGLang function behind every step.

The tensors a subject is handed are read-only to it: the batch's tensor fields, the
registered mapping (only the engine's allocator writes it) and the graphs' static inputs are
shared with every later layer and the engine, so a write into one, or a tensor field of the
batch pointed at another object, is a divergence (``wrote_input``) even when every answer is
right.

State the engine keeps on the attention backend (per micro-batch, per model) belongs on
``batch.backend``, a namespace that outlives the forward; state the engine keeps on the pool
belongs on the subject instance, which every micro-batch shares.

What the subject is given mirrors what SGLang's objects carry. :class:`ModelSpec` holds what
a pool knows when it is built, including which layers of the stage store SWA keys
(``swa_layers``, SGLang's per-layer table of the pool), so a pool finds its stage's first
SWA layer as real code would. :class:`ForwardBatch` holds the fields of SGLang's
``ForwardBatch`` that its DeepSeek-V4 attention backends and pool getters read and the
engine model can supply truthfully: ``req_pool_indices``, ``seq_lens`` (and its CPU mirror
``seq_lens_cpu``), ``extend_prefix_lens``, ``extend_seq_lens``, ``positions``,
``out_cache_loc``, ``batch_size``, ``seq_lens_sum`` and the mode.

Versions: a subject states ``api_version``. Version 2 added ``ModelSpec.swa_layers`` and
the batch's ``seq_lens``, ``seq_lens_cpu``, ``extend_prefix_lens``, ``batch_size`` and
``seq_lens_sum``; it removed nothing, so a version-1 subject runs unchanged (it simply does
not read them). Any other version is refused before the run starts.

On a GPU each micro-batch's layers run on ``batch.stream`` and the engine's side stream is
``batch.side_stream`` (both None elsewhere); a subject that orders its own work with streams
sets ``requires = frozenset({"gpu_streams"})`` and is refused, not passed, off the GPU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar, Mapping

import torch

from .reference import EngineConfig

SUBJECT_API_VERSION = 2
# every version this harness runs: each later one only adds fields
SUPPORTED_API_VERSIONS = (1, 2)


class Truth(str, enum.Enum):
    """Which quantity a subject computes."""

    POOL = "pool"  # mapping[out_cache_loc] at write time
    RING = "ring"  # req_slot * ring + position % ring


class ForwardMode(enum.Enum):
    DECODE = "decode"
    EXTEND = "extend"
    TARGET_VERIFY = "verify"
    DRAFT_DECODE = "draft"
    DRAFT_EXTEND = "draft_extend"
    # a DSpark draft block: the draft model's one forward of num_draft_tokens - 1 tokens per
    # request, which SGLang runs as a target-verify forward of the draft model
    DRAFT_BLOCK = "draft_block"
    IDLE = "idle"

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_decode(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE)

    def is_decode_or_idle(self) -> bool:
        return self.is_decode() or self.is_idle()

    @property
    def graph_bucket(self) -> str:
        """The graphs a forward of this mode replays, as SGLang's graph buckets group them:
        decode and idle forwards share ``"decode"``; target-verify forwards and DSpark draft
        blocks (target-verify forwards of the draft model) have ``"target_verify"``."""
        return "decode" if self.is_decode_or_idle() else "target_verify"

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND)


@dataclass(frozen=True)
class ModelSpec:
    """What a pool and backend know about their model when they are built."""

    model: str  # "target" or "draft"
    start_layer: int
    end_layer: int
    sliding_window: int
    ring: int
    num_req_slots: int
    speculative: bool
    num_draft_tokens: int
    full_pool_size: int
    device: torch.device
    # the stage's layers that store SWA keys, ascending (hybrid models interleave others)
    swa_layers: tuple[int, ...]
    # the model's compress ratio per layer id, as its config lists them (empty: SWA-only)
    compress_ratios: tuple[int, ...] = ()
    page_size: int = 1  # the full pool's page size (the backend's ``page_size``)
    # the speculative algorithm is DSpark (EngineConfig.dspark): the draft model's forwards
    # with requests are DSpark draft blocks (ForwardMode.DRAFT_BLOCK)
    dspark: bool = False
    # SGLang's ``req_to_token_pool.req_to_token``: per request slot and position, the
    # token's full-pool slot (int32 [num_req_slots, context], on ``device``). One tensor
    # for the whole run, shared by the models; the engine writes each forward's tokens
    # into it before the forward, as the scheduler does. Handed only to subjects that
    # answer a value read from it (None otherwise); row 0, the dummy slot's, stays zero.
    req_to_token: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, config: EngineConfig, model: str, device: torch.device,
           req_to_token: torch.Tensor | None = None) -> "ModelSpec":
        return cls(
            model=model, start_layer=config.start_layer, end_layer=config.end_layer,
            sliding_window=config.sliding_window, ring=config.ring, num_req_slots=config.num_req_slots,
            speculative=config.speculative, num_draft_tokens=config.num_draft_tokens,
            full_pool_size=config.full_pool_size, device=device, swa_layers=config.swa_layers,
            compress_ratios=config.compress_ratios, page_size=config.full_page_size, req_to_token=req_to_token,
            dspark=config.dspark,
        )

    @property
    def first_swa_layer(self) -> int | None:
        """The stage's first SWA-storing layer, where a per-forward refresh belongs (None
        when the stage stores no SWA keys)."""
        return self.swa_layers[0] if self.swa_layers else None

    def is_swa_layer(self, layer_id: int) -> bool:
        return layer_id in self.swa_layers

    def compress_ratio(self, layer_id: int) -> int:
        """``layer_id``'s compress ratio: 4 or 128 for a layer that also writes a compressed
        KV cache, 0 for one that writes only SWA keys."""
        ratios = self.compress_ratios
        return ratios[layer_id] if layer_id < len(ratios) else 0


@dataclass
class ForwardBatch:
    """One micro-batch of one forward, as a layer sees it.

    Rows past ``num_live_tokens`` are padding: request slot 0, position 0, full slot 0.
    Padded request rows (graph replay) have ``seq_lens`` 1 and ``extend_prefix_lens`` 0,
    as SGLang's graph runner fills them.

    Per request row, ``extend_prefix_lens`` is what the request had cached before this
    forward (step, in multi-step draft decode) and ``extend_seq_lens`` what it adds, in
    every mode; ``seq_lens`` is their sum, except in target-verify and DSpark draft blocks,
    where SGLang leaves the draft tokens out (``seq_lens == extend_prefix_lens``; its
    backends add them). Multi-step draft decode advances ``seq_lens`` with
    ``positions`` at each step.
    """

    forward_id: int
    mode: ForwardMode
    micro_batch: int
    backend: SimpleNamespace
    req_pool_indices: torch.Tensor  # int64 [requests]
    extend_seq_lens: torch.Tensor  # int64 [requests]: tokens per request
    positions: torch.Tensor  # int64 [tokens]
    out_cache_loc: torch.Tensor  # int64 [tokens]
    num_live_tokens: int
    seq_lens: torch.Tensor = field(kw_only=True)  # int64 [requests], see above
    seq_lens_cpu: torch.Tensor = field(kw_only=True)  # the same, on the CPU
    extend_prefix_lens: torch.Tensor = field(kw_only=True)  # int64 [requests]
    draft_step: int = 0
    num_draft_steps: int = 1
    in_graph: bool = False  # the call is being recorded into a graph (not in warm-up runs)
    # the micro-batch's compute stream and the engine's side stream (None off the GPU)
    stream: "torch.cuda.Stream | None" = None
    side_stream: "torch.cuda.Stream | None" = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def batch_size(self) -> int:
        """Request rows, padded ones included (SGLang's ``batch_size`` under graphs)."""
        return int(self.req_pool_indices.shape[0])

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens_cpu.sum())

    @property
    def graph_key(self) -> tuple[str, int]:
        """The captured graph a batch of this shape belongs to, as SGLang keys what it
        captures: its mode's graph bucket (:attr:`ForwardMode.graph_bucket`) and the batch
        size. State kept per captured graph is kept per key."""
        return self.mode.graph_bucket, self.batch_size


@dataclass(frozen=True)
class CodeNames:
    """How findings name the code under test, in its own terms instead of the subject
    API's: ``calls``, per subject method, the code's function (or functions) that the method
    runs, as ``"Backend.get_loc (backend.py:120)"``; ``inputs``, per input handed to it (a
    :class:`ForwardBatch` field, or ``"mapping"``), the name that code knows it by
    (``"forward_batch.out_cache_loc"``). A method or input not named keeps the API's name."""

    calls: Mapping[str, str]
    inputs: Mapping[str, str]


class Subject:
    """Base class with the engine's defaults; subclasses set ``truth`` and override
    :meth:`swa_write_location` and whatever else they cache."""

    api_version: ClassVar[int] = SUBJECT_API_VERSION
    truth: ClassVar[Truth]
    # "gpu_streams": the subject orders work with streams, so only a GPU can check it
    requires: ClassVar[frozenset[str]] = frozenset()
    # the code that gives the answer, and how, named in finding sentences instead of
    # swa_write_location: "Backend.get_loc (backend.py:120) returned"; None: not named
    answered_by: ClassVar[str | None] = None
    # the per-step values answered beside the SWA write location, by their names in
    # swafuzz.quantities.QUANTITIES ("c4_out_loc", ...): each is asked of every layer that
    # reads it through per_step_value
    answers: ClassVar[tuple[str, ...]] = ()
    # the subject's engine drafts with DSpark blocks (ForwardMode.DRAFT_BLOCK forwards of a
    # draft model): only then does a search draw them
    drafts_in_blocks: ClassVar[bool] = False
    # what the code under test runs in each method and the names it knows its inputs by, for
    # the sentences of timeouts and writes into inputs; None: the subject API's names
    code_names: ClassVar[CodeNames | None] = None

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.mapping: torch.Tensor | None = None

    def register_mapping(self, mapping: torch.Tensor) -> None:
        self.mapping = mapping

    def answer_origin(self, batch: ForwardBatch, answer: torch.Tensor) -> tuple[str, int] | None:
        """Where ``answer``, just returned for ``batch`` eagerly, lies in the state the subject
        keeps: the field that holds it, as the code under test names it, and the
        ``forward_id`` of the batch whose metadata init set that field. Asked only of an
        answer whose rows are stale, to say where they sat; None (the default): not known."""
        return None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement swa_write_location")

    def per_step_value(self, batch: ForwardBatch, layer_id: int, quantity: str) -> torch.Tensor:
        """The value named ``quantity`` (one of :attr:`answers`) that layer ``layer_id``
        reads: one row per row of the batch, in the quantity's dtype, on the batch's device."""
        raise NotImplementedError(f"{type(self).__name__} does not implement per_step_value")

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self.init_forward_metadata(batch)

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        """Metadata work a graph records: runs at the start of every warm-up run and inside
        the capture, and its recorded operations run again at each replay."""

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        self.init_forward_metadata(batch)


def tokens_request_slots(batch: ForwardBatch) -> torch.Tensor:
    """The request slot of every token row (exact for ragged batches, graph-capturable)."""
    return batch.req_pool_indices.repeat_interleave(
        batch.extend_seq_lens, output_size=batch.num_tokens
    )
