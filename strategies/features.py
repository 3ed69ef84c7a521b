"""Names for the lifecycle features a scenario exercises, and how to read them off one.

Subjects declare the features that break them, strategies count the features they produce,
and reports group findings by them: all three use these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..reference import Scenario

FIRST_SWA_LAYER_NOT_START = "first_swa_layer_not_start"
PIPELINE_STAGE = "pipeline_stage"
PERMUTED_LAYERS = "permuted_layers"
MICRO_BATCHES = "micro_batches"
REGISTER_MAPPING = "register_mapping"
MAPPING_CHANGE_IN_FORWARD = "mapping_change_in_forward"
IN_PLACE_MAPPING_CHANGE = "in_place_mapping_change"
DRAFT_MULTISTEP = "draft_multistep"
RAGGED_EXTEND = "ragged_extend"
TARGET_VERIFY = "target_verify"
DRAFT_EXTEND = "draft_extend"
IDLE = "idle"
SKIP_METADATA_INIT = "skip_metadata_init"
GRAPH_REPLAY = "graph_replay"
DRAFT_MODEL = "draft_model"
PAGED_POOLS = "paged_pools"

# Not a scenario feature: the device's stream ordering, observable on a GPU only.
GPU_STREAMS = "gpu_streams"

ALL_FEATURES = (
    FIRST_SWA_LAYER_NOT_START, PIPELINE_STAGE, PERMUTED_LAYERS, MICRO_BATCHES,
    REGISTER_MAPPING, MAPPING_CHANGE_IN_FORWARD, IN_PLACE_MAPPING_CHANGE, DRAFT_MULTISTEP,
    RAGGED_EXTEND, TARGET_VERIFY, DRAFT_EXTEND, IDLE, SKIP_METADATA_INIT, GRAPH_REPLAY,
    DRAFT_MODEL, PAGED_POOLS,
)


def features_of(scenario: Scenario) -> set[str]:
    """Every feature the scenario's configuration and events exercise."""
    from ..reference import store_schedule  # here, so that the names above load without torch

    c = scenario.config
    found: set[str] = set()
    if c.start_layer > 0:
        found.add(PIPELINE_STAGE)
    if c.draft_model:
        found.add(DRAFT_MODEL)
    if c.full_page_size > 1 or c.swa_page_size > 1:
        found.add(PAGED_POOLS)
    # a run of plain forwards repeats one event object: its features are read once
    for event in {id(event): event for event in scenario.events}.values():
        if event.op == "register_mapping":
            found.add(REGISTER_MAPPING)
        elif event.op in ("relocate", "finish", "clear"):
            found.add(IN_PLACE_MAPPING_CHANGE)
        if event.op != "forward":
            continue
        swa = store_schedule(event, c)
        if swa and swa[0] != c.start_layer:
            found.add(FIRST_SWA_LAYER_NOT_START)
        if event.layers is not None and event.layers != tuple(c.stage_layers):
            found.add(PERMUTED_LAYERS)
        if event.micro_batches > 1:
            found.add(MICRO_BATCHES)
        if event.mutation is not None:
            found.add(MAPPING_CHANGE_IN_FORWARD)
        if event.mode == "draft" and event.steps > 1:
            found.add(DRAFT_MULTISTEP)
        if event.mode == "extend" and len(set(event.tokens)) > 1:
            found.add(RAGGED_EXTEND)
        mode_feature = {"verify": TARGET_VERIFY, "draft_extend": DRAFT_EXTEND, "idle": IDLE}
        if event.mode in mode_feature:
            found.add(mode_feature[event.mode])
        if event.skip_init:
            found.add(SKIP_METADATA_INIT)
        if event.graph:
            found.add(GRAPH_REPLAY)
    return found


def scenario_size(scenario: Scenario) -> tuple[int, int, int]:
    """(forwards, stage layers, requests admitted): the sizes shrinking should make small."""
    forwards = sum(e.op == "forward" for e in scenario.events)
    admitted = sum(e.count for e in scenario.events if e.op == "admit")
    return forwards, scenario.config.end_layer - scenario.config.start_layer, admitted
