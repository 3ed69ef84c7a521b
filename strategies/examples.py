"""Hand-written scenarios, one per bug class of the domain brief, each minimal.

They are the explicit examples of the test suite and the demo's input. A scenario here
says nothing about which subject it breaks; the tests run every subject on every one.
"""

from __future__ import annotations

from ..reference import Scenario


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


_ONE = {"op": "admit", "count": 1}
_TWO = {"op": "admit", "count": 2}

EXAMPLES: dict[str, Scenario] = {
    # 1. the first SWA layer of the stage is not start_layer (a hybrid model)
    "first-swa-layer-not-start": _scenario(
        {"start_layer": 0, "end_layer": 3, "non_swa_layers": [0]},
        [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]}],
    ),
    # 2. a pipeline stage that starts at layer 1
    "pipeline-stage": _scenario(
        {"start_layer": 1, "end_layer": 3},
        [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]}],
    ),
    # 3. two micro-batches whose layers interleave (two-batch overlap)
    "two-batch-overlap": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "requests": [0, 1], "micro_batches": 2}],
    ),
    # 4a. the mapping changes in place between two layers of one forward
    "in-place-change-mid-forward": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "requests": [0, 1],
                "mutation": {"after_calls": 1, "op": "relocate", "request": 0}}],
    ),
    # 4b. a new mapping is registered, then the next forward's first SWA layer is not start_layer
    "register-then-skip-start": _scenario(
        {"start_layer": 0, "end_layer": 3, "full_pool_size": 16, "swa_pool_size": 8},
        [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "register_mapping", "shuffle": 3},
         {"op": "forward", "requests": [0, 1], "skip_layers": [0]}],
    ),
    # 5. multi-step draft decode: positions advance, metadata is built once
    "multi-step-draft": _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 3},
        [_TWO, {"op": "forward", "mode": "draft", "requests": [0, 1], "steps": 2}],
    ),
    # 6a. a ragged extend whose token counts divide evenly into the batch
    "ragged-extend": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [1, 3]}],
    ),
    # 6b. a ragged extend whose token counts do not divide
    "ragged-extend-indivisible": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [1, 2]}],
    ),
    # 7a. metadata init skipped on a forward with the same token count as the last one
    "skipped-metadata-init": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "requests": [0, 1]},
         {"op": "forward", "requests": [0, 1], "skip_init": True}],
    ),
    # 7b. an idle graph replay that skips metadata init (eager idle forwards under speculative
    # decoding skip it; released graph runners prepare metadata before every replay)
    "idle-replay-skips-init": _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 2},
        [_TWO, {"op": "forward", "requests": [0, 1], "graph": True},
         {"op": "forward", "mode": "idle", "graph": True, "skip_init": True, "pad": 2}],
    ),
    # 8. graph replay after capture
    "graph-replay": _scenario(
        {"start_layer": 0, "end_layer": 2},
        [_TWO, {"op": "forward", "requests": [0, 1], "graph": True}],
    ),
    # The compressed write locations (swafuzz.quantities) of a model with C4 and C128 layers.
    # A C4 value differs from the dummy only at a token completing a group of 4, so each
    # example first brings a request to such a position.
    # an idle forward that skips metadata init, padded to the last forward's rows
    "compressed-idle-skips-init": _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 2, "compress_ratios": [4, 128]},
        [_ONE, {"op": "forward", "mode": "extend", "requests": [0], "tokens": [4]},
         {"op": "forward", "mode": "idle", "skip_init": True, "pad": 4}],
    ),
    # a pipeline stage that starts after the model's first compressed layer
    "compressed-pipeline-stage": _scenario(
        {"start_layer": 1, "end_layer": 3, "compress_ratios": [4, 4, 128]},
        [_ONE, *[{"op": "forward", "requests": [0]}] * 4],
    ),
    # multi-step draft decode reaching a C4 group's last token at draft step 1
    "compressed-multi-step-draft": _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 4, "compress_ratios": [4, 128]},
        [_ONE, {"op": "forward", "mode": "extend", "requests": [0], "tokens": [2]},
         {"op": "forward", "mode": "draft", "requests": [0], "steps": 3}],
    ),
    # a graph replay whose token completes a C4 group
    "compressed-graph-replay": _scenario(
        {"start_layer": 0, "end_layer": 2, "compress_ratios": [4, 128]},
        [_ONE, {"op": "forward", "mode": "extend", "requests": [0], "tokens": [3]},
         {"op": "forward", "requests": [0], "graph": True}],
    ),
    # target-verify of 8 draft tokens, the last completing a C4 group
    "compressed-verify-eight-drafts": _scenario(
        {"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 8, "compress_ratios": [4, 128]},
        [_ONE, {"op": "forward", "mode": "verify", "requests": [0]}],
    ),
}
