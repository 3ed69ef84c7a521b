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
DRAFT_MODEL = "draft_model"  # DeepSeek-V4's MTP draft model beside the target
DSPARK_DRAFT = "dspark_draft"  # a DSpark draft model beside the target, drafting in blocks
PAGED_POOLS = "paged_pools"

# Not a scenario feature: the device's stream ordering, observable on a GPU only.
GPU_STREAMS = "gpu_streams"

ALL_FEATURES = (
    FIRST_SWA_LAYER_NOT_START, PIPELINE_STAGE, PERMUTED_LAYERS, MICRO_BATCHES,
    REGISTER_MAPPING, MAPPING_CHANGE_IN_FORWARD, IN_PLACE_MAPPING_CHANGE, DRAFT_MULTISTEP,
    RAGGED_EXTEND, TARGET_VERIFY, DRAFT_EXTEND, IDLE, SKIP_METADATA_INIT, GRAPH_REPLAY,
    DRAFT_MODEL, DSPARK_DRAFT, PAGED_POOLS,
)


# Terms a restriction (:mod:`swafuzz.strategies.restrictions`) may name besides the features:
# what an engine reaches only in some forward modes, or not together with another feature.
NON_SWA_LAYERS = "non_swa_layers"  # a stage whose layers do not all store SWA keys (a hybrid model)
# a feature of one forward, drawn per forward mode
PER_FORWARD = (MICRO_BATCHES, GRAPH_REPLAY)
FORWARD_MODES = ("decode", "extend", "verify", "draft", "draft_extend", "draft_block", "idle")


def in_mode(feature: str, mode: str) -> str:
    """The term for ``feature`` on a forward of ``mode``."""
    return f"{feature}@{mode}"


def together(feature: str, other: str) -> str:
    """The term for two features in one scenario."""
    return "+".join(sorted((feature, other)))


# two features an engine may reach apart but not together: two-batch overlap on a pipeline stage
PAIRS = ((MICRO_BATCHES, PIPELINE_STAGE),)
RESTRICTION_TERMS = (
    *ALL_FEATURES, NON_SWA_LAYERS,
    *(in_mode(feature, mode) for feature in PER_FORWARD for mode in FORWARD_MODES),
    *(together(*pair) for pair in PAIRS),
)


def restriction_terms_of(scenario: Scenario) -> set[str]:
    """Every term of :data:`RESTRICTION_TERMS` the scenario exercises: its features, the
    modes of its per-forward features, and the pairs of :data:`PAIRS` it holds."""
    found = features_of(scenario)
    if scenario.config.non_swa_layers:
        found.add(NON_SWA_LAYERS)
    for event in {id(event): event for event in scenario.events}.values():
        if event.op != "forward":
            continue
        if event.micro_batches > 1:
            found.add(in_mode(MICRO_BATCHES, event.mode))
        if event.graph:
            found.add(in_mode(GRAPH_REPLAY, event.mode))
    found.update(together(*pair) for pair in PAIRS if set(pair) <= found)
    return found


def features_of(scenario: Scenario) -> set[str]:
    """Every feature the scenario's configuration and events exercise."""
    from ..reference import store_schedule  # here, so that the names above load without torch

    c = scenario.config
    found: set[str] = set()
    if c.start_layer > 0:
        found.add(PIPELINE_STAGE)
    if c.draft_model:
        found.add(DSPARK_DRAFT if c.dspark else DRAFT_MODEL)
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
