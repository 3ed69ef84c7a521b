"""Hypothesis strategies for engine configurations and lifecycle scenarios.

Two profiles. ``realistic`` draws only what the real engine does; every feature it uses is
listed in :data:`REALISTIC_FEATURES` with the fact of the domain brief that justifies it.
``adversarial`` draws everything the harness can express, including event orders no engine
produces today, so that a cache designed against tomorrow's scheduler is checked too.

Shrinking: events are a flat sequence, numbers are small integers drawn with small
alternatives first, and every optional feature is a boolean whose ``False`` is the plain
case, so a failure shrinks toward few forwards, few layers and few requests. Requests are
admitted in one count before the first forward and by state events between forwards only,
so the count shrinks to the requests the failure needs (two admissions before the first
forward would need one raised while the other is dropped, which shrinking never does).

Long horizons (``long_horizon=True``, for nightly runs): before each interesting forward a
scenario may hold a run of plain decode forwards of every live request, up to
:data:`MAX_LONG_RUN` such forwards in all, so state that goes stale only after hundreds of forwards (a step counter that
wraps at 256, a ring of per-step buffers) is reached. A run is one boolean and one count
in Hypothesis's choices: shrinking drops it or shortens it as a single integer, to the
fewest forwards that still reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from hypothesis import reject
from hypothesis import strategies as st

from reference import LimitExceeded, Scenario

MAX_FORWARDS = 6
# Plain decode forwards per long-horizon scenario: twice an 8-bit step counter's period, so a
# counter or table that wraps at 256 goes stale wherever the runs start.
MAX_LONG_RUN = 512

REALISTIC = "realistic"
ADVERSARIAL = "adversarial"
PROFILES = (REALISTIC, ADVERSARIAL)

REALISTIC_FEATURES = {
    "pipeline stage (start_layer > 0)": "layers of one stage [start_layer, end_layer) run in "
    "ascending order; under pipeline parallelism start_layer > 0",
    "hybrid layers (first SWA layer need not be start_layer)": "hybrid models interleave SWA "
    "and full-attention layers, so the first SWA-storing layer of a stage need not be start_layer",
    "admit, finish, clear, eviction between forwards": "the mapping is mutated in place: "
    "allocation sets mapping[full] = swa, free and out-of-window eviction set it to 0, clear fills 0",
    "decode, ragged extend, target-verify, draft-extend": "forward modes of the engine",
    "multi-step draft decode": "several steps per forward, positions advancing, metadata built "
    "once; a chain drafter runs num_draft_tokens - 1 steps in every draft forward",
    "idle forwards (metadata init skipped under speculative decoding)": "a data-parallel rank "
    "with no requests: with speculative decoding on, metadata init is skipped and the previous "
    "forward's metadata stays in place; a graph replay prepares metadata even when idle (the "
    "decode graph runner of released SGLang does so before every replay)",
    "two micro-batches, layers interleaved": "two-batch overlap splits a batch into two "
    "micro-batches that share the pool but have their own backend and metadata",
    "graph capture and replay with padding": "decode runs as captured graphs at fixed batch "
    "sizes; the live batch is padded up and copied into static input buffers",
    "draft model beside the target": "a draft model and the target model run in one process "
    "with separate pools",
    "batch subsets in any order": "each forward schedules the requests the scheduler picked",
}

ADVERSARIAL_ONLY = (
    "skipped or permuted or repeated layers within a forward",
    "mapping changes between the layers of one forward",
    "register_mapping and in-place relocation between forwards",
    "metadata init skipped on non-idle forwards",
    "explicit micro-batch interleavings and three micro-batches",
    "draft step counts other than num_draft_tokens - 1",
)


@lru_cache(maxsize=None)  # drawn from many times per scenario: built once per bounds
def _small_or(lo: int, small: int, large: int) -> st.SearchStrategy[int]:
    """Mostly small values (good failures), sometimes up to DeepSeek-V4 scale."""
    return st.one_of(st.integers(lo, small), st.integers(lo, large))


_PAGE_SIZES = st.sampled_from([1, 2, 4, 16])
_GRAPH_SIZE_SETS = st.sets(st.sampled_from([1, 2, 4, 8, 16, 64, 256]), min_size=1)


@dataclass
class _Sim:
    """Just enough engine bookkeeping to draw only valid events and size the pools."""

    live: list[int] = field(default_factory=list)
    lengths: dict[int, int] = field(default_factory=dict)
    next_id: int = 0
    peak_live: int = 0

    def admit(self, count: int) -> None:
        for _ in range(count):
            self.live.append(self.next_id)
            self.lengths[self.next_id] = 0
            self.next_id += 1
        self.peak_live = max(self.peak_live, len(self.live))


def scenarios(profile: str = REALISTIC, long_horizon: bool = False) -> st.SearchStrategy[Scenario]:
    """Valid scenarios of the given profile (the reference never rejects one); with
    ``long_horizon``, runs of plain decode forwards between the interesting ones."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return _scenarios(profile == ADVERSARIAL, long_horizon)


# built once per profile (a fuzz run asks again for every run of examples); building and
# validating a strategy costs more than a draw from it
@lru_cache(maxsize=None)
@st.composite
def _scenarios(draw, adversarial: bool, long_horizon: bool) -> Scenario:

    start_layer = draw(_small_or(0, 1, 60))
    num_layers = draw(_small_or(1, 3, 64))
    stage = list(range(start_layer, start_layer + num_layers))
    non_swa = draw(_layer_sets(tuple(stage), max_size=num_layers - 1))
    swa_layers = [layer for layer in stage if layer not in non_swa]
    sliding_window = draw(_small_or(1, 8, 128))
    speculative = draw(st.booleans())
    num_draft_tokens = draw(st.integers(2, 4)) if speculative else 1
    draft_model = speculative and draw(st.booleans())
    full_page = draw(_PAGE_SIZES)
    swa_page = draw(_PAGE_SIZES)
    graph_sizes = sorted(draw(_GRAPH_SIZE_SETS))

    sim = _Sim()
    events: list[dict] = []
    sim.admit(draw(_small_or(1, 2, 256)))
    events.append({"op": "admit", "count": len(sim.live)})

    plain_budget = MAX_LONG_RUN
    state_ops = ["admit", "finish", "clear"] + (["register_mapping", "relocate"] if adversarial else [])
    # a continue-flag per forward (as st.lists draws) lets the shrinker delete any forward
    for index in range(MAX_FORWARDS):
        if index and not draw(st.booleans()):
            break
        if long_horizon and sim.live and plain_budget and draw(st.booleans()):
            count = draw(st.integers(1, plain_budget))
            plain_budget -= count
            events.extend(_plain_decodes(sim, count))
        if index and draw(st.booleans()):
            op = draw(st.sampled_from(state_ops))
            if op == "admit" or not sim.live:
                count = draw(st.integers(1, 4))
                sim.admit(count)
                events.append({"op": "admit", "count": count})
            elif op == "finish":
                rid = draw(st.sampled_from(sim.live))
                sim.live.remove(rid)
                events.append({"op": "finish", "request": rid})
            elif op == "clear":
                sim.live.clear()
                events.append({"op": "clear"})
            elif op == "register_mapping":
                events.append({"op": "register_mapping", "shuffle": draw(st.integers(0, 3))})
            else:
                events.append({"op": "relocate", "request": draw(st.sampled_from(sim.live))})
        events.append(draw(_forwards(
            sim, adversarial, speculative, num_draft_tokens, stage, swa_layers, graph_sizes,
        )))

    longest = max(sim.lengths.values(), default=0)
    full_pages = sum(-(-n // full_page) for n in sim.lengths.values()) + 1
    swa_pages = sum(-(-n // swa_page) for n in sim.lengths.values()) + 2 + -(-longest // swa_page)
    num_req_slots = sim.peak_live + 1 + draw(_small_or(0, 2, max(0, 4095 - sim.peak_live)))
    config = {
        "start_layer": start_layer,
        "end_layer": start_layer + num_layers,
        "non_swa_layers": sorted(non_swa),
        "sliding_window": sliding_window,
        "speculative": speculative,
        "num_draft_tokens": num_draft_tokens,
        "num_req_slots": num_req_slots,
        "full_page_size": full_page,
        "swa_page_size": swa_page,
        "full_pool_size": max(2, full_pages) * full_page,
        "swa_pool_size": max(2, swa_pages) * swa_page,
        "draft_model": draft_model,
        "graph_batch_sizes": graph_sizes,
    }
    try:
        return Scenario.from_dict({"config": config, "events": events})
    except LimitExceeded:
        # many requests over a long horizon can add up past what one scenario may cost
        # (reference.LIMITS); such a draw is no input at all, as a replay file that big is not
        reject()


# The strategies of a forward depend on the live requests and the configuration, which
# repeat from draw to draw: built once per argument tuple.
@lru_cache(maxsize=1024)
def _one_of_values(values: tuple) -> st.SearchStrategy:
    return st.sampled_from(values)


@lru_cache(maxsize=1024)
def _batches(live: tuple[int, ...]) -> st.SearchStrategy[list[int]]:
    """The requests a forward schedules: any non-empty subset of the live ones, in any order."""
    return st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True)


@lru_cache(maxsize=1024)
def _layer_sets(stage: tuple[int, ...], min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[list[int]]:
    return st.lists(st.sampled_from(stage), unique=True, min_size=min_size, max_size=max_size)


@lru_cache(maxsize=1024)
def _layer_lists(stage: tuple[int, ...]) -> st.SearchStrategy[list[int]]:
    """Layers in any order, repeats allowed (the adversarial ``layers`` of a forward)."""
    return st.lists(st.sampled_from(stage), min_size=1, max_size=2 * len(stage))


@lru_cache(maxsize=1024)
def _token_counts(high: int, requests: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, high), min_size=requests, max_size=requests)


def _plain_decodes(sim: _Sim, count: int) -> list[dict]:
    """``count`` decode forwards of every live request, with no feature switched on."""
    for rid in sim.live:
        sim.lengths[rid] += count
    forward = {"op": "forward", "mode": "decode", "requests": list(sim.live)}
    return [dict(forward) for _ in range(count)]


@st.composite
def _forwards(draw, sim: _Sim, adversarial: bool, speculative: bool, num_draft_tokens: int,
              stage: list[int], swa_layers: list[int], graph_sizes: list[int]) -> dict:
    modes = ("decode", "extend") + (("verify", "draft", "draft_extend") if speculative else ())
    mode = draw(_one_of_values(modes + ("idle",))) if sim.live else "idle"
    event: dict = {"op": "forward", "mode": mode}
    requests = [] if mode == "idle" else draw(_batches(tuple(sim.live)))
    event["requests"] = requests
    if mode in ("extend", "draft_extend"):
        high = num_draft_tokens if mode == "draft_extend" else 8
        event["tokens"] = draw(_token_counts(high, len(requests)))
    steps = 1
    if mode == "draft":
        # a chain drafter runs its configured num_draft_tokens - 1 steps every draft forward
        steps = draw(st.integers(1, 4)) if adversarial else max(1, num_draft_tokens - 1)
        if steps > 1:
            event["steps"] = steps
    per_request = {"decode": 1, "draft": steps, "verify": num_draft_tokens, "idle": 0}
    for i, rid in enumerate(requests):
        sim.lengths[rid] += event["tokens"][i] if "tokens" in event else per_request[mode]

    live_tokens = len(requests) if mode == "decode" else 0
    if mode in ("decode", "idle") and draw(st.booleans()):
        pad = draw(st.integers(0, 4)) if mode == "idle" else 0
        if max(live_tokens, pad) <= graph_sizes[-1]:
            event["graph"] = True
            if pad:
                event["pad"] = pad
    elif mode == "idle":
        event["pad"] = draw(st.integers(0, 4))

    max_mbs = min(len(requests), 3 if adversarial else 2)
    if not event.get("graph") and max_mbs > 1 and draw(st.booleans()):
        event["micro_batches"] = draw(st.integers(2, max_mbs))

    if adversarial:
        if draw(st.booleans()):
            event["skip_init"] = True
        if draw(st.booleans()):
            event["layers"] = draw(_layer_lists(tuple(stage)))
        if draw(st.booleans()):
            event["skip_layers"] = draw(_layer_sets(tuple(stage), min_size=1))
    elif mode == "idle" and speculative and not event.get("graph"):
        event["skip_init"] = True

    base = event.get("layers", stage)
    schedule = [layer for layer in base if layer in swa_layers and layer not in event.get("skip_layers", ())]
    mbs = event.get("micro_batches", 1)
    if adversarial and mbs > 1 and schedule and draw(st.booleans()):
        event["order"] = draw(st.permutations([mb for mb in range(mbs) for _ in schedule]))
    if adversarial and not event.get("graph") and requests and draw(st.booleans()):
        event["mutation"] = {
            "after_calls": draw(st.integers(0, len(schedule) * mbs * steps)),
            "op": draw(_one_of_values(("relocate", "register_mapping"))),
            "request": draw(_one_of_values(tuple(sim.live))),
            "shuffle": draw(st.integers(0, 3)),
        }
    return event


def adversarial_reasons(scenario: Scenario) -> list[str]:
    """Why a scenario lies outside the realistic profile (empty when it does not)."""
    c = scenario.config
    reasons = []
    for i, e in enumerate(scenario.events):
        where = f"events[{i}]"
        if e.op in ("register_mapping", "relocate"):
            reasons.append(f"{where}: {e.op} between forwards")
        if e.op != "forward":
            continue
        if e.layers is not None or e.skip_layers:
            reasons.append(f"{where}: layers skipped, permuted or repeated within a forward")
        if e.mutation is not None:
            reasons.append(f"{where}: the mapping changes between layers of one forward")
        eager_idle_under_speculation = e.mode == "idle" and c.speculative and not e.graph
        if e.skip_init != eager_idle_under_speculation:
            reasons.append(f"{where}: metadata init {'skipped' if e.skip_init else 'run'} on a "
                           f"{e.mode} forward{' under speculative decoding' if c.speculative else ''}")
        if e.order is not None or e.micro_batches > 2:
            reasons.append(f"{where}: micro-batch interleaving other than two-batch overlap")
        if e.mode == "draft" and e.steps != max(1, c.num_draft_tokens - 1):
            reasons.append(f"{where}: {e.steps} draft steps with num_draft_tokens {c.num_draft_tokens}")
        if e.mode == "draft_extend" and any(n > c.num_draft_tokens for n in e.tokens):
            reasons.append(f"{where}: draft-extend accepts more than num_draft_tokens tokens")
    return reasons


def weakest_profile(scenario: Scenario) -> str:
    """The weakest profile whose strategy can produce this scenario."""
    return ADVERSARIAL if adversarial_reasons(scenario) else REALISTIC
