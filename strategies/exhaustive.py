"""Every scenario within small bounds, for statements of equivalence within a scope.

The scope: stages of 1..``max_layers`` layers starting at layer 0 or 1, with or without a
non-SWA first layer; without speculative decoding, with it, and with it and a draft model
beside the target; pools of one-slot pages, and of two-slot pages with the smallest stage of
each shape (paging changes which slots tokens take, not the layers). Two requests under test and
a bystander whose departure frees slots; after the bystander's own decode, up to
``max_forwards`` forwards, each one of :func:`forward_variants` (the plain decode plus every
lifecycle feature switched on alone), with any one state event between consecutive forwards
(a clear re-admits three requests, which take the places of the three before).

For a subject that answers per-step values the scope is compressed: the same scenarios on
models whose layers alternate C4 and C128 from layer 0, with full pool pages of 128 tokens.
For a subject whose engine drafts in blocks, speculative decoding with a DSpark draft model
beside the target is in the scope too, its draft forwards DSpark draft blocks.

Every realistic feature (:data:`swafuzz.strategies.scenarios.REALISTIC_FEATURES`) is in the scope at
its smallest size; :func:`scope_statement` says what a scope covers and what it leaves out.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Iterator

from ..reference import EngineConfig, Scenario

from .features import ALL_FEATURES, DSPARK_DRAFT
from .scenarios import ADVERSARIAL, REALISTIC, adversarial_reasons

REQUESTS = 3  # two under test and a bystander

BETWEEN_FORWARDS: tuple[tuple[dict, ...], ...] = (
    (),
    ({"op": "register_mapping", "shuffle": 1},),
    ({"op": "relocate", "request": 0},),
    ({"op": "finish", "request": 2},),
    ({"op": "clear"}, {"op": "admit", "count": REQUESTS}),
)

# What no scope of this module holds, whatever its bounds.
ALWAYS_LEFT_OUT = (
    "more than two requests under test (and one bystander)",
    "sliding windows other than 2 (rings of 2 and, with 3 draft tokens, 4 rows)",
    "page sizes other than 1 and 2 (of the full pool, 128 in a compressed scope), two-slot pages with "
    "longer stages, and pools of other sizes",
    "graph batch sizes other than 2 and 4, and graph replays of target-verify forwards and DSpark draft blocks",
    "two features switched on in one forward, and more than one state event between forwards",
    "draft step counts other than 2, and mapping changes after other than the first store",
    "long horizons (runs of many plain forwards)",
)


# gives the bystander request 2 tokens, so finishing it frees slots that later forwards reuse
_WARM_UP = {"op": "forward", "mode": "decode", "requests": [2]}


def forward_variants(num_swa_calls: int, speculative: bool, stage: range, dspark: bool = False) -> list[dict]:
    """The plain two-request decode, then each feature on alone (``dspark``: the draft
    forwards are DSpark draft blocks)."""
    first_layer = stage.start
    both = [0, 1]
    decode = {"op": "forward", "mode": "decode", "requests": both}
    variants = [
        decode,
        {**decode, "requests": [1]},
        {**decode, "requests": [1, 0]},
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
        {**decode, "layers": list(reversed(stage))},
        {**decode, "mutation": {"after_calls": 1, "op": "relocate", "request": 0}},
        {**decode, "mutation": {"after_calls": 1, "op": "register_mapping", "shuffle": 2}},
    ]
    if speculative:
        drafts = [{"op": "forward", "mode": "draft_block", "requests": both}] if dspark else [
            {"op": "forward", "mode": "draft", "requests": both, "steps": 2},
            {"op": "forward", "mode": "draft_extend", "requests": both, "tokens": [1, 2]},
        ]
        variants += [
            {"op": "forward", "mode": "verify", "requests": both},
            *drafts,
            {"op": "forward", "mode": "idle", "pad": 2, "skip_init": True},
            {"op": "forward", "mode": "idle", "graph": True, "pad": 2, "skip_init": True},
        ]
    if num_swa_calls < 2:
        variants = [v for v in variants if not {"mutation", "order", "layers"} & set(v)]
    return variants


# (speculative, draft model, DSpark's): plain decoding, speculative decoding in the target
# alone, and speculative decoding with a draft model beside the target
_SPECULATION = ((False, False, False), (True, False, False), (True, True, False))
_DSPARK_SPECULATION = (True, True, True)


# a compressed scope's full pool: pages of 128 tokens, as DeepSeek-V4 pages hold a multiple of 128
COMPRESSED_PAGE = 128


def _configs(max_layers: int, compressed: bool = False, draft_blocks: bool = False) -> Iterator[dict]:
    speculation = _SPECULATION + ((_DSPARK_SPECULATION,) if draft_blocks else ())
    for num_layers, start, hybrid, (speculative, draft_model, dspark), page in itertools.product(
        range(1, max_layers + 1), (0, 1), (False, True), speculation, (1, 2)
    ):
        smallest_stage = 2 if hybrid else 1
        if num_layers < smallest_stage or (page > 1 and num_layers > smallest_stage):
            continue
        config = {
            "start_layer": start,
            "end_layer": start + num_layers,
            "non_swa_layers": [start] if hybrid else [],
            "sliding_window": 2,
            "speculative": speculative,
            "num_draft_tokens": 3 if speculative else 1,
            "draft_model": draft_model,
            **({"dspark": True} if dspark else {}),
            "num_req_slots": REQUESTS + 1,
            "full_page_size": page,
            "swa_page_size": page,
            "full_pool_size": 64,
            "swa_pool_size": 32,
            "graph_batch_sizes": [2, 4],
        }
        if compressed:
            # C4 and C128 layers alternate from layer 0; the SWA pool keeps its paging
            config |= {"compress_ratios": [(4, 128)[layer % 2] for layer in range(start + num_layers)],
                       "full_page_size": COMPRESSED_PAGE, "full_pool_size": 8 * COMPRESSED_PAGE}
        yield config


def _renumbered(event: dict, offset: int) -> dict:
    """``event`` naming the requests that took the places of the ones it names, ``offset``
    admissions later."""
    if not offset:
        return event
    event = dict(event)
    if "requests" in event:
        event["requests"] = [rid + offset for rid in event["requests"]]
    if "request" in event:
        event["request"] += offset
    if "request" in event.get("mutation", {}):
        event["mutation"] = _renumbered(event["mutation"], offset)
    return event


def enumerate_scenarios(
    max_forwards: int = 2, max_layers: int = 3, max_micro_batches: int = 2, profile: str = ADVERSARIAL,
    compressed: bool = False, draft_blocks: bool = False,
) -> Iterator[Scenario]:
    """Every scenario of the scope (see module docstring), in a fixed order.

    ``max_forwards`` counts the forwards under test, after the bystander's decode. Scenarios
    with fewer forwards come first. ``compressed``: every model has compress ratios (C4 and
    C128 layers alternating from layer 0) and a full pool of 128-token pages, for subjects
    that answer the compressed values. ``draft_blocks``: DSpark draft models too, for subjects
    whose engine drafts in blocks.
    """
    configs = []
    for config in _configs(max_layers, compressed, draft_blocks):
        engine = EngineConfig.from_dict(config)
        swa = engine.swa_layers
        variants = [
            v for v in forward_variants(len(swa), config["speculative"], engine.stage_layers, engine.dspark)
            if v.get("micro_batches", 1) <= max_micro_batches
            and not (v.get("skip_layers") and len(swa) == len(v["skip_layers"]))
        ]
        configs.append((config, variants))
    # fewest forwards first, so the first divergence found is a shortest one
    for count in range(1, max_forwards + 1):
        for config, variants in configs:
            for forwards in itertools.product(variants, repeat=count):
                for betweens in itertools.product(BETWEEN_FORWARDS, repeat=count - 1):
                    events: list[dict] = [{"op": "admit", "count": REQUESTS}, _WARM_UP]
                    offset = 0
                    for i, forward in enumerate(forwards):
                        if i:
                            events.extend(_renumbered(e, offset) for e in betweens[i - 1])
                            offset += sum(e["count"] for e in betweens[i - 1] if e["op"] == "admit")
                        events.append(_renumbered(forward, offset))
                    scenario = Scenario.from_dict({"config": config, "events": events})
                    if profile == REALISTIC and adversarial_reasons(scenario):
                        continue
                    yield scenario


@dataclass(frozen=True)
class ScopeStatement:
    """What a clean exhaustive run showed: equivalence on ``scenarios`` scenarios, which
    exercise the ``covered`` features; ``left_out`` is what none of them has."""

    scenarios: int
    bounds: str
    covered: tuple[str, ...]
    left_out: tuple[str, ...]

    def lines(self) -> list[str]:
        return [
            f"equivalent to the reference on all {self.scenarios} scenarios within the bounds: {self.bounds}",
            f"covers: {', '.join(self.covered)}",
            f"leaves out: {'; '.join(self.left_out)}",
        ]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"covered": list(self.covered), "left_out": list(self.left_out)}


# What no compressed scope holds, besides ALWAYS_LEFT_OUT.
COMPRESSED_LEFT_OUT = (
    "compress ratios other than C4 and C128 alternating from layer 0 (SWA-only layers among them)",
    f"full pool pages other than {COMPRESSED_PAGE} tokens",
    "requests long enough to complete a C128 group, and more than 3 draft tokens",
)


def scope_statement(scenarios: int, covered: set[str], max_forwards: int, max_layers: int,
                    max_micro_batches: int, profile: str, compressed: bool = False,
                    draft_blocks: bool = False) -> ScopeStatement:
    """The statement for a clean run over the scope of these bounds; ``covered`` is every
    feature its scenarios exercised."""
    missing = [f"{feature} (the subject's engine does not draft in blocks)"
               if feature == DSPARK_DRAFT and not draft_blocks else
               f"{feature} (not in the {profile} profile at these bounds)"
               for feature in ALL_FEATURES if feature not in covered]
    beyond = [
        f"more than {max_forwards} forwards under test",
        f"stages of more than {max_layers} layers, starting past layer 1, or with non-SWA layers "
        "other than the first",
        f"more than {max_micro_batches} micro-batches",
    ]
    bounds = (f"forwards <= {max_forwards}, layers <= {max_layers}, micro-batches <= {max_micro_batches} "
              f"({profile} profile)")
    left_out = (*missing, *beyond, *ALWAYS_LEFT_OUT, *(COMPRESSED_LEFT_OUT if compressed else ()))
    return ScopeStatement(scenarios, bounds, tuple(sorted(covered)), left_out)
