"""The truth: what every SWA store of a forward must write, from live inputs only."""

from .engine import EngineState, ForwardPlan, StepInputs, replay_events
from .scenario import LIMITS, SCENARIO_VERSION, EngineConfig, Event, Mutation, Scenario, ScenarioError, store_schedule
from .truth import DUMMY_SLOT, INT32_MAX, TruthError, ring_rows, ring_size, translate_pool

__all__ = [
    "DUMMY_SLOT", "INT32_MAX", "LIMITS", "SCENARIO_VERSION", "EngineConfig", "EngineState", "Event",
    "ForwardPlan", "Mutation", "Scenario", "ScenarioError", "StepInputs", "TruthError",
    "replay_events", "ring_rows", "ring_size", "store_schedule", "translate_pool",
]
