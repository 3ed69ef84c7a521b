"""The truth: what every SWA store of a forward must write, from live inputs only."""

from .engine import EngineState, replay_events
from .packing import PACKED_INPUTS, ForwardPlan, StepInputs
from .scenario import (
    LIMITS, SCENARIO_VERSION, EngineConfig, Event, LimitExceeded, Mutation, Scenario, ScenarioError, live_rows,
    store_schedule,
)
from .truth import (
    DUMMY_SLOT,
    INT32_MAX,
    PrefillRows,
    RequestWindowRows,
    TruthError,
    draft_step_slots,
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
    "DUMMY_SLOT", "INT32_MAX", "LIMITS", "SCENARIO_VERSION", "EngineConfig", "EngineState", "Event", "LimitExceeded",
    "ForwardPlan", "Mutation", "PACKED_INPUTS", "PrefillRows", "RequestWindowRows", "Scenario", "ScenarioError", "StepInputs", "TruthError",
    "draft_step_slots", "late_layer_tail_tokens", "live_rows", "prefill_rows", "request_window_rows", "replay_events", "ring_rows", "ring_size",
    "store_schedule", "token_state_slots", "translate_pool", "whole_page_ring",
]
