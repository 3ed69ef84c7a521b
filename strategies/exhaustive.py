"""Every scenario within small bounds, for statements of equivalence within a scope.

The scope: stages of 1..``max_layers`` layers starting at layer 0 or 1, with or without a
non-SWA first layer, with and without speculative decoding; two requests under test and a
bystander whose departure frees slots; after the bystander's own decode, up to
``max_forwards`` forwards, each one of :func:`forward_variants` (the plain decode plus every
lifecycle feature switched on alone), with any one state event between consecutive forwards.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from reference import EngineConfig, Scenario

from .scenarios import ADVERSARIAL, REALISTIC, adversarial_reasons

BETWEEN_FORWARDS: tuple[tuple[dict, ...], ...] = (
    (),
    ({"op": "register_mapping", "shuffle": 1},),
    ({"op": "relocate", "request": 0},),
    ({"op": "finish", "request": 2},),
)


# gives the bystander request 2 tokens, so finishing it frees slots that later forwards reuse
_WARM_UP = {"op": "forward", "mode": "decode", "requests": [2]}


def forward_variants(num_swa_calls: int, speculative: bool, first_layer: int) -> list[dict]:
    """The plain two-request decode, then each feature on alone."""
    both = [0, 1]
    decode = {"op": "forward", "mode": "decode", "requests": both}
    variants = [
        decode,
        {**decode, "requests": [1]},
        {"op": "forward", "mode": "extend", "requests": both, "tokens": [1, 3]},
        {"op": "forward", "mode": "extend", "requests": both, "tokens": [1, 2]},
        {"op": "forward", "mode": "extend", "requests": both, "tokens": [2, 2]},
        {"op": "forward", "mode": "idle", "pad": 2},
        {**decode, "graph": True},
        {"op": "forward", "mode": "idle", "graph": True, "pad": 2},
        {**decode, "micro_batches": 2},
        {**decode, "micro_batches": 2, "order": [0] * num_swa_calls + [1] * num_swa_calls},
        {**decode, "skip_init": True},
        {**decode, "skip_layers": [first_layer]},
        {**decode, "mutation": {"after_calls": 1, "op": "relocate", "request": 0}},
        {**decode, "mutation": {"after_calls": 1, "op": "register_mapping", "shuffle": 2}},
    ]
    if speculative:
        variants += [
            {"op": "forward", "mode": "verify", "requests": both},
            {"op": "forward", "mode": "draft", "requests": both, "steps": 2},
            {"op": "forward", "mode": "draft_extend", "requests": both, "tokens": [1, 2]},
            {"op": "forward", "mode": "idle", "pad": 2, "skip_init": True},
            {"op": "forward", "mode": "idle", "graph": True, "pad": 2, "skip_init": True},
        ]
    if num_swa_calls < 2:
        variants = [v for v in variants if "mutation" not in v and "order" not in v]
    return variants


def _configs(max_layers: int) -> Iterator[dict]:
    for num_layers, start, hybrid, speculative in itertools.product(
        range(1, max_layers + 1), (0, 1), (False, True), (False, True)
    ):
        if hybrid and num_layers == 1:
            continue
        yield {
            "start_layer": start,
            "end_layer": start + num_layers,
            "non_swa_layers": [start] if hybrid else [],
            "sliding_window": 2,
            "speculative": speculative,
            "num_draft_tokens": 3 if speculative else 1,
            "num_req_slots": 4,
            "full_pool_size": 64,
            "swa_pool_size": 32,
            "graph_batch_sizes": [2, 4],
        }


def enumerate_scenarios(
    max_forwards: int = 2, max_layers: int = 3, max_micro_batches: int = 2, profile: str = ADVERSARIAL
) -> Iterator[Scenario]:
    """Every scenario of the scope (see module docstring), in a fixed order.

    ``max_forwards`` counts the forwards under test, after the bystander's decode. Scenarios
    with fewer forwards come first.
    """
    configs = []
    for config in _configs(max_layers):
        swa = EngineConfig.from_dict(config).swa_layers
        variants = [
            v for v in forward_variants(len(swa), config["speculative"], config["start_layer"])
            if v.get("micro_batches", 1) <= max_micro_batches
            and not (v.get("skip_layers") and len(swa) == len(v["skip_layers"]))
        ]
        configs.append((config, variants))
    # fewest forwards first, so the first divergence found is a shortest one
    for count in range(1, max_forwards + 1):
        for config, variants in configs:
            for forwards in itertools.product(variants, repeat=count):
                for betweens in itertools.product(BETWEEN_FORWARDS, repeat=count - 1):
                    events: list[dict] = [{"op": "admit", "count": 3}, _WARM_UP]
                    for i, forward in enumerate(forwards):
                        if i:
                            events.extend(betweens[i - 1])
                        events.append(forward)
                    scenario = Scenario.from_dict({"config": config, "events": events})
                    if profile == REALISTIC and adversarial_reasons(scenario):
                        continue
                    yield scenario
