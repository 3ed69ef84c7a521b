"""The truth: what every SWA store of a forward must write, from live inputs only."""

from .compressed import (
    COMPRESS_RATIOS,
    LOW_RATIOS,
    CompressedLengths,
    CompressionMetadata,
    c128_page_indices,
    compress_state_ring_size,
    compress_state_slots,
    compressed_lengths,
    compressed_out_loc,
    compressed_positions,
    compression_metadata,
    empty_sparse_page_indices,
    low_ratio_out_loc,
    page_table,
    sparse_topk_lengths,
    swa_page_indices,
    swa_topk_lengths,
    unified_compressed_out_loc,
)
from .engine import UNREAD_PAGE, EngineState, replay_events
from .packing import PACKED_INPUTS, ForwardPlan, StepInputs
from .scenario import (
    GRAPH_MODES, LIMITS, SCENARIO_VERSION, EngineConfig, Event, LimitExceeded, Mutation, Scenario, ScenarioError,
    live_rows, request_length_bound, store_schedule, tokens_per_request,
)
from .truth import (
    DUMMY_SLOT,
    INT32_MAX,
    PrefillRows,
    RequestWindowRows,
    TruthError,
    draft_step_slots,
    injected_context_rows,
    late_layer_tail_tokens,
    prefill_rows,
    request_window_rows,
    ring_rows,
    ring_size,
    token_state_slots,
    translate_pool,
    whole_page_ring,
)

__all__ = [
    "COMPRESS_RATIOS", "LOW_RATIOS", "CompressedLengths", "CompressionMetadata", "c128_page_indices",
    "compress_state_ring_size", "compress_state_slots", "compressed_lengths", "compressed_out_loc",
    "compressed_positions", "compression_metadata", "empty_sparse_page_indices", "low_ratio_out_loc", "page_table", "sparse_topk_lengths",
    "swa_page_indices", "swa_topk_lengths", "unified_compressed_out_loc",
    "DUMMY_SLOT", "GRAPH_MODES", "INT32_MAX", "UNREAD_PAGE", "LIMITS", "SCENARIO_VERSION", "EngineConfig", "EngineState", "Event", "LimitExceeded",
    "ForwardPlan", "Mutation", "PACKED_INPUTS", "PrefillRows", "RequestWindowRows", "Scenario", "ScenarioError", "StepInputs", "TruthError",
    "draft_step_slots", "injected_context_rows", "late_layer_tail_tokens", "live_rows", "prefill_rows", "request_window_rows", "replay_events", "request_length_bound",
    "ring_rows", "ring_size",
    "store_schedule", "token_state_slots", "tokens_per_request", "translate_pool", "whole_page_ring",
]
