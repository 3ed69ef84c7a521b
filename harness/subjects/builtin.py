"""Built-in subjects: faithful models of the cached designs, plus correct baselines.

Each class models one design from the domain brief, bugs included; none of them knows
which scenarios break it. The table of names and verdicts is in :mod:`swafuzz.subjects.registry`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..api import ForwardBatch, ForwardMode, Subject, Truth, tokens_request_slots


def _translate(mapping: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
    return mapping[out_cache_loc].to(torch.int32)


def _ring_rows(req_slot_per_token: torch.Tensor, positions: torch.Tensor, ring: int) -> torch.Tensor:
    return (req_slot_per_token.to(torch.int64) * ring + positions.to(torch.int64) % ring).to(torch.int32)


# ---- correct baselines ---------------------------------------------------------------------


class Uncached(Subject):
    """Translates ``out_cache_loc`` in every layer: the behaviour before any caching."""

    truth = Truth.POOL

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        return _translate(self.mapping, batch.out_cache_loc)


class UncachedRing(Subject):
    """Computes ring rows in every layer, expanding request slots by each one's tokens."""

    truth = Truth.RING

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        return _ring_rows(tokens_request_slots(batch), batch.positions, self.spec.ring)


class StepKeyed(Subject):
    """A cache keyed on the forward, kept per micro-batch: right in eager forwards, stale
    under graphs.

    The cached rows live on the micro-batch's backend (never shared between micro-batches)
    and are reused only while the key matches: the same forward, the same draft step, and
    for pool translation the same mapping object at the same in-place version (torch bumps
    ``_version`` on every in-place write). Holding the mapping object keeps its id from
    being reused by a newly registered tensor. Graph capture runs the forward eagerly on
    the same batch before capturing it, so the captured layers find the warm-up's rows
    cached and the graph never recomputes them.
    """

    truth = Truth.POOL

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        key = self._key(batch)
        cache = batch.backend.__dict__.get("step_keyed")
        if cache is not None and cache.key == key and cache.mapping is self.mapping:
            return cache.rows
        rows = self._compute(batch)
        batch.backend.step_keyed = SimpleNamespace(key=key, mapping=self.mapping, rows=rows)
        return rows

    def _key(self, batch: ForwardBatch) -> tuple:
        return (batch.forward_id, batch.draft_step, self.mapping._version)

    def _compute(self, batch: ForwardBatch) -> torch.Tensor:
        return _translate(self.mapping, batch.out_cache_loc)


class StepKeyedCapture(StepKeyed):
    """The forward-keyed cache, also keyed on whether the call is being captured: correct.

    ``batch.in_graph`` is what ``torch.cuda.is_current_stream_capturing()`` tells real code:
    the captured run misses the warm-up's entry and records the computation, so every replay
    recomputes. As cheap as :class:`StepKeyed`."""

    def _key(self, batch: ForwardBatch) -> tuple:
        # written out rather than extending the base key: this runs in every layer
        return (batch.forward_id, batch.draft_step, self.mapping._version, batch.in_graph)


class _RingRows:
    """The unified-ring quantity for the step-keyed designs; the mapping part of the key
    never changes, since ring rows do not read the mapping."""

    truth = Truth.RING

    def register_mapping(self, mapping: torch.Tensor) -> None:
        if self.mapping is None:
            self.mapping = torch.empty(0)

    def _compute(self, batch: ForwardBatch) -> torch.Tensor:
        return _ring_rows(tokens_request_slots(batch), batch.positions, self.spec.ring)


class StepKeyedRing(_RingRows, StepKeyed):
    """The forward-keyed cache for the unified ring: stale under graphs, like StepKeyed."""


class StepKeyedCaptureRing(_RingRows, StepKeyedCapture):
    """The capture-aware forward-keyed cache for the unified ring: correct."""


# ---- pool-level cache (seed 000 and its variants) ------------------------------------------


class PoolStartLayer(Subject):
    """Seed 000: the pool translates at ``start_layer`` (or when empty) and caches.

    ``register_mapping`` clears the cache; every micro-batch shares the one pool.
    """

    truth = Truth.POOL
    clears_on_register = True

    def __init__(self, spec):
        super().__init__(spec)
        self.cached_loc: torch.Tensor | None = None

    def refresh_layer(self) -> int:
        # the seed's check, by design; a pool that knows its layers would refresh at
        # ``self.spec.first_swa_layer``, which hybrid stages need
        return self.spec.start_layer

    def register_mapping(self, mapping: torch.Tensor) -> None:
        super().register_mapping(mapping)
        if self.clears_on_register:
            self.cached_loc = None

    def invalidate_loc_cache(self) -> None:
        self.cached_loc = None

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        if layer_id == self.refresh_layer() or self.cached_loc is None:
            self.cached_loc = _translate(self.mapping, batch.out_cache_loc)
        return self.cached_loc


class PoolLayer0(PoolStartLayer):
    """A fork of seed 000 that refreshes at layer 0, whatever stage it runs."""

    def refresh_layer(self) -> int:
        return 0


class PoolNoInvalidate(PoolStartLayer):
    """Release 0.5.12: the inline cache survives ``register_mapping``."""

    clears_on_register = False


# ---- metadata-level caches (seed 002 and successors) ---------------------------------------


class UnifiedMetadata(Subject):
    """Seed 002: decode metadata carries the ring rows; the getter trusts them when the
    forward is not idle and the length matches, else recomputes with a uniform
    ``repeat_interleave`` of request slots."""

    truth = Truth.RING
    bypass_multistep_draft = False

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.forward_metadata = self._build_metadata(batch)

    def _build_metadata(self, batch: ForwardBatch) -> SimpleNamespace:
        rows = None
        if batch.mode.is_decode_or_idle():
            # decode: one token per request, so request slots line up with positions
            n = batch.req_pool_indices.shape[0]
            rows = _ring_rows(batch.req_pool_indices[:n], batch.positions, self.spec.ring)
        return SimpleNamespace(unified_swa_loc=rows)

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        metadata = getattr(batch.backend, "forward_metadata", None)
        cached = metadata.unified_swa_loc if metadata is not None else None
        multistep_draft = batch.mode.is_decode_or_idle() and batch.num_draft_steps > 1
        if (
            cached is not None
            and not batch.mode.is_idle()
            and cached.shape[0] == batch.positions.shape[0]
            and not (self.bypass_multistep_draft and multistep_draft)
        ):
            return cached
        req_slot = batch.req_pool_indices.to(torch.int64)
        if req_slot.shape[0] != batch.positions.shape[0]:
            req_slot = req_slot.repeat_interleave(batch.positions.shape[0] // req_slot.shape[0])
        return _ring_rows(req_slot, batch.positions, self.spec.ring)


class UnifiedMetadataMtpBypass(UnifiedMetadata):
    """The later fix: multi-step draft decode always recomputes."""

    bypass_multistep_draft = True


class SwaOutShapeGuard(Subject):
    """The translated-loc metadata cache: metadata init translates ``out_cache_loc``; the
    getter trusts it when the forward is not idle and the length matches. Under graphs the
    translation is a captured operation of the forward itself, so replay recomputes it."""

    truth = Truth.POOL

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.forward_metadata = SimpleNamespace(swa_out_cache_loc=None)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.forward_metadata = SimpleNamespace(
            swa_out_cache_loc=_translate(self.mapping, batch.out_cache_loc)
        )

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        metadata = getattr(batch.backend, "forward_metadata", None)
        cached = metadata.swa_out_cache_loc if metadata is not None else None
        if (
            cached is not None
            and not batch.mode.is_idle()
            and cached.shape[0] == batch.out_cache_loc.shape[0]
        ):
            return cached
        return _translate(self.mapping, batch.out_cache_loc)


class _UnifiedGraphMerge(UnifiedMetadataMtpBypass):
    """Graph support for the unified metadata: capture keeps one metadata object per batch
    size; before each replay fresh metadata is built eagerly and merged into it."""

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        metadata = self._build_metadata(batch)
        captured = batch.backend.__dict__.setdefault("graph_metadata", {})
        captured[batch.graph_key] = metadata
        batch.backend.forward_metadata = metadata

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        captured = batch.backend.graph_metadata[batch.graph_key]
        self._merge(captured, self._build_metadata(batch))
        batch.backend.forward_metadata = captured

    def _merge(self, captured: SimpleNamespace, fresh: SimpleNamespace) -> None:
        raise NotImplementedError


class UnifiedGraphAssign(_UnifiedGraphMerge):
    """Releases 0.5.14-0.5.19: the ring rows are in the merge's assign list (re-pointed)."""

    def _merge(self, captured: SimpleNamespace, fresh: SimpleNamespace) -> None:
        captured.unified_swa_loc = fresh.unified_swa_loc


class UnifiedGraphCopy(_UnifiedGraphMerge):
    """Release 0.5.20: the ring rows are in the copy list (written in place)."""

    def _merge(self, captured: SimpleNamespace, fresh: SimpleNamespace) -> None:
        captured.unified_swa_loc.copy_(fresh.unified_swa_loc)


# ---- stream ordering (GPU only) -------------------------------------------------------------


class StreamUnsynced(Subject):
    """Translates once per forward on the engine's side stream, overlapping other preparation,
    and hands the result to every layer without making the layer's stream wait for it."""

    truth = Truth.POOL
    requires = frozenset({"gpu_streams"})

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        side = batch.side_stream
        side.wait_stream(torch.cuda.current_stream(side.device))
        with torch.cuda.stream(side):
            batch.backend.swa_rows = _translate(self.mapping, batch.out_cache_loc)

    def swa_write_location(self, batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        return batch.backend.swa_rows


# ---- compressed write locations (swafuzz.quantities) ---------------------------------------

_COMPRESS_RATIO_OF = {"c4_out_loc": 4, "c128_out_loc": 128}
CompressedValues = dict[str, torch.Tensor]  # value name -> its rows


def _compressed_out_locs(batch: ForwardBatch) -> CompressedValues:
    """Every row's C4 and C128 write location: ``out_cache_loc // ratio`` where the row
    completes a group of ``ratio`` tokens, else the dummy 0 (int64, graph-capturable)."""
    positions = batch.positions.to(torch.int64)
    loc = batch.out_cache_loc.to(torch.int64)
    dummy = torch.zeros_like(loc)
    return {name: torch.where((positions + 1) % ratio == 0, loc // ratio, dummy)
            for name, ratio in _COMPRESS_RATIO_OF.items()}


class CompressedMetadata(Uncached):
    """The compressed write locations computed once per forward in metadata init, as
    SGLang's ``DSV4AttnMetadata.init_compression_metadata``, and read by every C4 and C128
    layer: correct.

    The metadata records the forward and draft step it was built for (#26239 bakes
    per-step locations into the metadata); the getter rebuilds it for any other, so a
    skipped init or a later draft step never reads another's values. Under graphs the values are computed in the graph-recordable
    part of metadata preparation into buffers the capture made, so every replay
    recomputes them from the static inputs. The SWA write location is translated per layer.
    """

    answers = ("c4_out_loc", "c128_out_loc")

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.compressed = SimpleNamespace(built_for=self._key(batch), values=_compressed_out_locs(batch))

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        buffers = {name: torch.zeros_like(batch.out_cache_loc) for name in _COMPRESS_RATIO_OF}
        batch.backend.compressed = SimpleNamespace(built_for=self._key(batch), values=buffers)

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        metadata = batch.backend.compressed
        metadata.built_for = self._key(batch)
        for name, values in _compressed_out_locs(batch).items():
            metadata.values[name].copy_(values)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        pass  # the replayed graph recomputes the values into the captured buffers

    def per_step_value(self, batch: ForwardBatch, layer_id: int, quantity: str) -> torch.Tensor:
        metadata = batch.backend.__dict__.get("compressed")
        if metadata is None or metadata.built_for != self._key(batch):
            self.init_forward_metadata(batch)
            metadata = batch.backend.compressed
        return metadata.values[quantity]

    def _key(self, batch: ForwardBatch) -> tuple:
        """What metadata is built for: the getter trusts only metadata built for its own."""
        return (batch.forward_id, batch.draft_step)


class CompressedIdleStale(CompressedMetadata):
    """The compressed write locations trusted whenever metadata of the draft step is
    there, whatever forward built it, as SGLang's compressor store reads them
    (``CompressorBackendMixin._get_out_loc``, no idle or shape test): an idle forward that
    skips metadata init under speculative decoding reads the previous forward's values."""

    def _key(self, batch: ForwardBatch) -> tuple:
        return (batch.draft_step,)


class CompressedUnsliced(CompressedMetadata):
    """Multi-step draft decode reading the values metadata init computed for the whole
    forward in every draft step, as before SGLang sliced them per step (#24750, fixed by
    #26239): steps 1..k-1 read step 0's."""

    def _key(self, batch: ForwardBatch) -> tuple:
        return (batch.forward_id,)


class CompressedFirstLayer(CompressedMetadata):
    """The compressed write locations derived by the model's first compressed layer of a
    forward and reused by the rest, as the HIP backend derives its fp4 write metadata "by the
    first C4 layer of a forward": a pipeline stage that starts after that layer, or a
    forward that skips it, reads the values an earlier forward left."""

    def __init__(self, spec):
        super().__init__(spec)
        ratios = spec.compress_ratios
        self.first_compressed_layer = next((layer for layer, ratio in enumerate(ratios) if ratio), None)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        pass

    def per_step_value(self, batch: ForwardBatch, layer_id: int, quantity: str) -> torch.Tensor:
        derived = batch.backend.__dict__.get("first_layer_values")
        if layer_id == self.first_compressed_layer or derived is None:
            derived = batch.backend.first_layer_values = _compressed_out_locs(batch)
        return derived[quantity]


class CompressedGraphAssign(CompressedMetadata):
    """The compressed write locations under graphs with the values in the replay merge's
    assign list: capture keeps one metadata object per batch size, and before each replay
    fresh values are built eagerly and the captured object re-pointed at them, so the
    captured layers keep reading the capture's values (the pattern of the ring rows in
    releases 0.5.14-0.5.19)."""

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self.init_forward_metadata(batch)
        batch.backend.__dict__.setdefault("graph_compressed", {})[batch.graph_key] = batch.backend.compressed

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        captured = batch.backend.graph_compressed[batch.graph_key]
        captured.built_for = self._key(batch)
        captured.values = _compressed_out_locs(batch)
        batch.backend.compressed = captured


# the largest number of draft tokens per request a compress write plan was padded to (#34189)
PLANNED_DRAFT_TOKENS = 4


class CompressedDraftPad4(CompressedMetadata):
    """The compressed write locations of speculative forwards built from a plan padded to
    4 draft tokens per request (#34189): with more than 4, a request's tokens past the
    fourth are left out of the plan and write nothing."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
            planned = _token_index_in_request(batch) < PLANNED_DRAFT_TOKENS
            values = batch.backend.compressed.values
            for name in values:
                values[name] = torch.where(planned, values[name], torch.zeros_like(values[name]))


def _token_index_in_request(batch: ForwardBatch) -> torch.Tensor:
    """Each token row's index among its request's tokens."""
    counts = batch.extend_seq_lens.to(torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    tokens = torch.arange(batch.num_tokens, device=counts.device)
    return tokens - starts.repeat_interleave(counts, output_size=batch.num_tokens)


# ---- the page table (swafuzz.quantities) -----------------------------------------------------

def _page_table(batch: ForwardBatch, req_to_token: torch.Tensor, page_size: int,
                columns: int | None = None) -> torch.Tensor:
    """Per token row, its request's full-pool pages, ``req_to_token[slot, 0:width:page_size]
    // page_size``: ``columns`` of them (a graph's static width), else as many as the
    batch's longest causal length needs."""
    if columns is None:
        longest = int(batch.positions.max()) + 1 if batch.num_tokens else 0
        columns = -(-longest // page_size)
    slots = tokens_request_slots(batch).to(torch.int64)
    return req_to_token[slots, 0:columns * page_size:page_size] // page_size


class PageTable(Uncached):
    """The page table built once per forward and draft step in metadata init from
    ``req_to_token``, as SGLang's ``make_core_attn_metadata``, and read by every C4 and C128
    layer: correct. Under graphs it is rebuilt in the graph-recordable part of metadata
    preparation into a static buffer as wide as ``req_to_token`` allows, so every replay
    reads the tokens the engine wrote for it."""

    answers = ("page_table",)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.pages = SimpleNamespace(
            built_for=(batch.forward_id, batch.draft_step),
            table=_page_table(batch, self.spec.req_to_token, self.spec.page_size))

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.pages = SimpleNamespace(built_for=None, table=self._graph_table(batch))

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.pages.built_for = (batch.forward_id, batch.draft_step)
        batch.backend.pages.table.copy_(self._graph_table(batch))

    def per_step_value(self, batch: ForwardBatch, layer_id: int, quantity: str) -> torch.Tensor:
        pages = batch.backend.__dict__.get("pages")
        if pages is None or pages.built_for != (batch.forward_id, batch.draft_step):
            self.init_forward_metadata(batch)
            pages = batch.backend.pages
        return pages.table

    def _graph_table(self, batch: ForwardBatch) -> torch.Tensor:
        req_to_token, page = self.spec.req_to_token, self.spec.page_size
        return _page_table(batch, req_to_token, page, -(-req_to_token.shape[1] // page))


class PageTableCaptured(PageTable):
    """The page table under graphs built at capture and never repopulated before a replay
    (#26019's review): every replay reads the capture's pages, those of the dummy request."""

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        batch.backend.pages.built_for = (batch.forward_id, batch.draft_step)
