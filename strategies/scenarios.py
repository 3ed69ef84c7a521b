"""Hypothesis strategies for engine configurations and lifecycle scenarios.

Two profiles. ``realistic`` draws only what the real engine does; every feature it uses is
listed in :data:`REALISTIC_FEATURES` with the fact of the domain brief that justifies it.
``adversarial`` draws everything the harness can express, including event orders no engine
produces today, so that a cache designed against tomorrow's scheduler is checked too.

Shrinking: numbers are small integers drawn with small alternatives first, and every
optional feature is a boolean whose ``False`` is the plain case, so a failure shrinks toward
few forwards, few layers and few requests. Each forward's span holds the spans of the
forwards after it, so the shrinker can delete any one of them. Requests are admitted in one
count before the first forward and by state events between forwards only, so the count
shrinks to the requests the failure needs (two admissions before the first forward would
need one raised while the other is dropped, which shrinking never does).

Runs: a scenario may hold one run of plain decode forwards of every live request, up to
:data:`MAX_RUN` of them (:data:`MAX_LONG_RUN` with ``long_horizon=True``, for nightly runs,
so that state which goes stale only after hundreds of forwards, a step counter that wraps at
256 or a ring of per-step buffers, is reached). A serving engine spends most of its forwards
so, and a run checks every layer of its batch in every forward for the price of three
choices in Hypothesis's choice sequence: a branch index, a length and the interesting
forward it comes before (one choice, the index, where there is none). Three scenarios in
four hold a run, and two in three runs are long (three quarters of the budget or more):
the run is where checks come for no choices, so it is the common case. They are the first
choices of a scenario, so the shrinker's first attempt drops a run the failure does not
need, and otherwise shortens it as a single integer, to the fewest forwards that still
reproduce.

Forwards: up to :data:`MAX_FORWARDS` interesting ones, two in three draws taking one more.
Most triggers come per forward (a multi-step draft, a ragged batch, a graph replay), so
each forward is another chance at one for the price of its own choices, and the shrinker
deletes the forwards a failure does not need.

Cost: the fuzzer's speed is layer checks per second, and a draw costs per choice and per
strategy built, whatever it yields. So nearly half of all stages are as deep as a
DeepSeek-V4 stage (43-64 layers, each checked by every forward), a branch is drawn as ``one_of`` draws
it without the strategy ``one_of`` builds per draw (:func:`_either`), a subset (the requests
a forward schedules, a hybrid model's full-attention layers, skipped layers, graph sizes) is
drawn as places among the items not yet taken (the strategies depend only on how many are
left and are built once, and no choice can name an item twice, so a shrink candidate never
makes a unique list redraw past the end of its choices), and an adversarial interleaving is
a few (micro-batch, count) chunks rather than a permutation of every store of a forward.
Fewer choices also mean fewer shrink attempts: most of the time to a shrunk divergence is
Hypothesis drawing the shrinker's candidates.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache

from hypothesis import reject
from hypothesis import strategies as st

from ..reference import GRAPH_MODES, LIMITS, EngineConfig, Event, LimitExceeded, Mutation, Scenario, live_rows
from .features import (
    DRAFT_EXTEND, DRAFT_MODEL, DRAFT_MULTISTEP, DSPARK_DRAFT, FIRST_SWA_LAYER_NOT_START, GRAPH_REPLAY, IDLE,
    MICRO_BATCHES, NON_SWA_LAYERS, PIPELINE_STAGE, TARGET_VERIFY, in_mode, restriction_terms_of, together,
)
from .profiles import ADVERSARIAL, PROFILES, REALISTIC

MAX_FORWARDS = 6  # interesting forwards, runs left out
# Plain decode forwards in a default scenario's run: half an 8-bit step counter's period,
# so that with every interesting forward's batches and graph captures added the forward ids
# stay short of a wrap, and the state that only long horizons reach stays theirs.
MAX_RUN = 128
# Plain decode forwards per long-horizon scenario: twice an 8-bit step counter's period, so a
# counter or table that wraps at 256 goes stale wherever the runs start.
MAX_LONG_RUN = 512
# Compressed scenarios: extends up to this many tokens per request cross a C128 group, and
# up to this many draft tokens exceed the 4 a compress write plan was once padded to (#34189).
LONG_EXTEND = 160
LONG_EXTEND_REQUESTS = 4  # the most requests of an extend that may take that many
MAX_COMPRESSED_DRAFT_TOKENS = 8


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
    "DSpark draft blocks (for subjects that draft so)": "SGLang's DSpark draft model drafts "
    "num_draft_tokens - 1 tokens per request in one forward, run as a target-verify forward of "
    "the draft model whose layers store the whole block at once",
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


@st.composite
def _either(draw, branches: tuple[st.SearchStrategy, ...]):
    """A value of one of ``branches``, each as likely, drawn as ``st.one_of`` draws it (an
    index, then the branch's value) without the strategy ``one_of`` builds for every draw;
    the shrinker moves a value to an earlier branch that holds it, then lowers it."""
    return draw(branches[draw(_branch_index(len(branches)))])


@lru_cache(maxsize=None)
def _branch_index(count: int) -> st.SearchStrategy[int]:
    return st.integers(0, count - 1)


@lru_cache(maxsize=None)  # drawn from many times per scenario: built once per bounds
def _small_or(lo: int, small: int, large: int) -> st.SearchStrategy[int]:
    """Mostly small values (good failures), sometimes up to DeepSeek-V4 scale."""
    return _either((st.integers(lo, small), st.integers(lo, large)))


_PAGE_SIZES = st.sampled_from([1, 2, 4, 16])
# DeepSeek-V4's full pool pages hold a multiple of 128 tokens (SGLang asserts it from 0.5.16;
# 256 in practice): the page table and the C128 page indices are read in such pages
_COMPRESSED_PAGE_SIZES = st.sampled_from([128, 256])
# a few layers (where failures shrink to) in one stage of four, tens in the others, and
# nearly half of all stages 43-64 layers deep, as a DeepSeek-V4 stage is: every forward
# checks each of them, so a deep stage makes checks cheap. Every branch's values lie in the
# 1-64 branch, which the shrinker moves a deep stage to before lowering it into the
# few-layer one.
_STAGE_LAYERS = _either((st.integers(1, 3), st.integers(1, 64), st.integers(16, 64), st.integers(43, 64)))
_GRAPH_SIZES = (1, 2, 4, 8, 16, 64, 256)


@dataclass
class _Sim:
    """Just enough engine bookkeeping to draw only valid events and size the pools, with
    the configuration the forwards are drawn for."""

    adversarial: bool
    speculative: bool
    num_draft_tokens: int
    stage: tuple[int, ...]
    swa_layers: frozenset[int]
    run: int  # plain decodes not yet placed
    run_before: int  # the interesting forward they come before
    live: list[int] = field(default_factory=list)
    lengths: dict[int, int] = field(default_factory=dict)
    next_id: int = 0
    peak_live: int = 0
    rows: int = 0  # the rows (positions) of the last forward that had requests
    forwards: int = 0  # interesting forwards drawn
    # drawn when the first forward asks for a graph: an engine that replays none captures none
    graph_sizes: tuple[int, ...] = ()
    excluded: frozenset[str] = frozenset()  # restriction terms not to draw (strategies.restrictions)
    compressed: bool = False  # extends may be long enough to cross a C128 group
    dspark: bool = False  # the draft model is DSpark's: its forwards are draft blocks

    def allows(self, feature: str, mode: str) -> bool:
        """Whether a forward of ``mode`` may exercise ``feature`` here."""
        if feature in self.excluded or in_mode(feature, mode) in self.excluded:
            return False
        return not (self.stage[0] > 0 and together(feature, PIPELINE_STAGE) in self.excluded)

    def admit(self, count: int) -> None:
        for _ in range(count):
            self.live.append(self.next_id)
            self.lengths[self.next_id] = 0
            self.next_id += 1
        self.peak_live = max(self.peak_live, len(self.live))


def scenarios(profile: str = REALISTIC, long_horizon: bool = False, excluded: frozenset[str] = frozenset(),
              compressed: bool = False, draft_blocks: bool = False) -> st.SearchStrategy[Scenario]:
    """Valid scenarios of the given profile (the reference never rejects one); with
    ``long_horizon``, runs of plain decode forwards long enough to wrap a step counter.
    Terms of ``excluded`` (:func:`swafuzz.strategies.restrictions.scenarios_without`) that a
    draw can leave out are left out; with none, the draws are the profile's own.

    ``compressed``: a DeepSeek-V4 model whose layers have compress ratios (the model
    config's ``compress_ratios``, :func:`_compress_ratio_lists`), extends of a few requests
    long enough to cross a C128 group (:data:`LONG_EXTEND` tokens), up to
    :data:`MAX_COMPRESSED_DRAFT_TOKENS` draft tokens and full pool pages of 128 or 256
    tokens, for subjects that answer the
    compressed values. Without it no choice of these is drawn, so an SWA-only search draws
    what it always drew.

    ``draft_blocks``: a speculative engine's draft model may be DSpark's, whose draft
    forwards are ``draft_block`` forwards (for subjects whose engine drafts so); without it,
    likewise, no choice of it is drawn."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return _scenarios(profile == ADVERSARIAL, long_horizon, frozenset(excluded), compressed, draft_blocks)


# built once per profile (a fuzz run asks again for every run of examples); building and
# validating a strategy costs more than a draw from it
@lru_cache(maxsize=None)
@st.composite
def _scenarios(draw, adversarial: bool, long_horizon: bool, excluded: frozenset[str],
               compressed: bool = False, draft_blocks: bool = False) -> Scenario:

    # The run of plain decodes comes first, as the index of a branch and the branch's
    # (length, place): the shrinker's first pass lowers small indices in order, so a failure
    # that does not need the run loses it on the first attempt, and every later attempt runs
    # the short scenario.
    run_length, run_before = draw(_runs(MAX_LONG_RUN if long_horizon else MAX_RUN))
    start_layer = 0 if PIPELINE_STAGE in excluded else draw(_small_or(0, 1, 60))
    num_layers = draw(_STAGE_LAYERS)
    stage = tuple(range(start_layer, start_layer + num_layers))
    # DeepSeek-V4 stores SWA keys in every layer; a hybrid model leaves some layers out
    non_swa = []
    if NON_SWA_LAYERS not in excluded and draw(st.booleans()):
        candidates = stage[1:] if FIRST_SWA_LAYER_NOT_START in excluded else stage
        non_swa = _subset(draw, candidates, max_size=num_layers - 1)
    swa_layers = frozenset(stage) - frozenset(non_swa)
    sliding_window = draw(_small_or(1, 8, 128))
    speculative = draw(st.booleans())
    dspark = draft_blocks and speculative and DSPARK_DRAFT not in excluded and draw(st.booleans())
    # a chain drafter runs num_draft_tokens - 1 steps: one where multi-step drafts are out; a
    # DSpark draft model drafts that many tokens in one block instead
    most_draft_tokens = MAX_COMPRESSED_DRAFT_TOKENS if compressed else 4
    one_step = DRAFT_MULTISTEP in excluded and not dspark
    num_draft_tokens = draw(st.integers(2, 2 if one_step else most_draft_tokens)) if speculative else 1
    draft_model = dspark or (speculative and DRAFT_MODEL not in excluded and draw(st.booleans()))
    full_page = draw(_COMPRESSED_PAGE_SIZES if compressed else _PAGE_SIZES)
    swa_page = draw(_PAGE_SIZES)
    compress_ratios = draw(_COMPRESS_RATIOS(start_layer + num_layers)) if compressed else ()
    sim = _Sim(adversarial, speculative, num_draft_tokens, stage, swa_layers,
               run=run_length, run_before=run_before, excluded=excluded, compressed=compressed, dspark=dspark)
    sim.admit(draw(_small_or(1, 2, 256)))
    drawing = _DRAWING.set(sim)
    try:
        events = [Event(op="admit", count=len(sim.live))] + draw(_FORWARDS_FROM)
    finally:
        _DRAWING.reset(drawing)

    longest = max(sim.lengths.values(), default=0)
    full_pages = sum(-(-n // full_page) for n in sim.lengths.values()) + 1
    swa_pages = sum(-(-n // swa_page) for n in sim.lengths.values()) + 2 + -(-longest // swa_page)
    num_req_slots = sim.peak_live + 1 + draw(_small_or(0, 2, max(0, 4095 - sim.peak_live)))
    # built as the values they are: the strategy draws valid scenarios by construction, and
    # parsing them as JSON again would cost more than the draws
    try:
        config = EngineConfig(
            start_layer=start_layer,
            end_layer=start_layer + num_layers,
            non_swa_layers=tuple(sorted(non_swa)),
            sliding_window=sliding_window,
            speculative=speculative,
            num_draft_tokens=num_draft_tokens,
            num_req_slots=num_req_slots,
            full_page_size=full_page,
            swa_page_size=swa_page,
            full_pool_size=max(2, full_pages) * full_page,
            swa_pool_size=max(2, swa_pages) * swa_page,
            draft_model=draft_model,
            dspark=dspark,
            graph_batch_sizes=sim.graph_sizes,
            compress_ratios=compress_ratios,
        ).validate()
        return Scenario(config, tuple(events))
    except LimitExceeded:
        # many requests over a long horizon can add up past what one scenario may cost
        # (reference.LIMITS); such a draw is no input at all, as a replay file that big is not
        reject()


# The strategies of a forward depend on the live requests and the configuration, which
# repeat from draw to draw: built once per argument tuple.
@lru_cache(maxsize=1024)
def _one_of_values(values: tuple) -> st.SearchStrategy:
    return st.sampled_from(values)


# Requests are drawn by their place among the live ones: the strategies then depend on how
# many are live, which repeats from draw to draw, not on their ids, which seldom do (a new
# strategy costs a validation that outweighs the draw).
@lru_cache(maxsize=None)
def _places(count: int) -> st.SearchStrategy[int]:
    return st.integers(0, count - 1)


_ANOTHER = st.integers(0, 3)  # 0 ends a subset: three in four draws take one more


def _subset(draw, items: tuple | list, min_size: int = 0, max_size: int | None = None) -> list:
    """Distinct items in drawn order, each drawn as its place among those not yet taken.

    Every choice is valid whatever the others are: lowering a place never names a taken
    item, so the shrinker never meets a duplicate a unique list would redraw (a choice past
    the end of the candidate, which Hypothesis discards without running it). Places shrink
    to the first items in order, the length toward ``min_size``."""
    left = list(items)
    high = len(left) if max_size is None else min(max_size, len(left))
    taken: list = []
    while len(taken) < high and (len(taken) < min_size or draw(_ANOTHER)):
        taken.append(left.pop(draw(_places(len(left)))))
    return taken


def _live_request(draw, sim: _Sim) -> int:
    return sim.live[draw(_places(len(sim.live)))]


@lru_cache(maxsize=1024)
def _layer_lists(stage: tuple[int, ...]) -> st.SearchStrategy[list[int]]:
    """Layers in any order, repeats allowed (the adversarial ``layers`` of a forward)."""
    return st.lists(st.sampled_from(stage), min_size=1, max_size=2 * len(stage))


@lru_cache(maxsize=1024)
def _token_counts(high: int, requests: int) -> st.SearchStrategy[list[int]]:
    """Token counts of a ragged batch, drawn as a pattern its requests repeat: any counts
    at all where the pattern is as long as the batch, and a few draws for a batch of
    hundreds (one count per request would cost a draw per request)."""
    return st.lists(st.integers(1, high), min_size=1, max_size=requests)


@lru_cache(maxsize=1024)
def _long_token_counts(high: int, requests: int) -> st.SearchStrategy[list[int]]:
    """:func:`_token_counts`, each count sometimes up to :data:`LONG_EXTEND`: a prefill
    that crosses a C128 group."""
    return st.lists(_small_or(1, high, LONG_EXTEND), min_size=1, max_size=requests)


@st.composite
def _compress_ratio_lists(draw, layers: int) -> tuple[int, ...]:
    """A DeepSeek-V4 model's compress ratio per layer: a few SWA-only layers first, then C4
    and C128 layers alternating, and (sometimes) some SWA-only layers among them. It
    shrinks toward C4 from the first layer on, and a model without SWA-only layers."""
    lead = draw(_LEADING_SWA_ONLY)
    first, second = (128, 4) if draw(st.booleans()) else (4, 128)
    ratios = [0 if layer < lead else (first, second)[(layer - lead) % 2] for layer in range(layers)]
    if draw(st.booleans()):
        for layer in _subset(draw, range(lead, layers), max_size=max(1, layers // 4)):
            ratios[layer] = 0
    return tuple(ratios)


_LEADING_SWA_ONLY = st.integers(0, 2)
_COMPRESS_RATIOS = lru_cache(maxsize=None)(_compress_ratio_lists)

_RUN_PLACES = st.integers(0, MAX_FORWARDS - 1)  # the interesting forward a run comes before
_ANOTHER_FORWARD = st.integers(0, 2)  # 0 ends a scenario: two in three draws take one more forward


@lru_cache(maxsize=None)
def _runs(budget: int) -> st.SearchStrategy[tuple[int, int]]:
    """(length, place) of the run, (0, 0) for none, which one scenario in four holds. No run
    is the first branch: one choice for the shrinker to reach, after which a scenario
    carries no run choices at all. Of the runs drawn, two in three are long (three
    quarters of the budget or more); their values lie in the branch of any length, which
    the shrinker moves a run to before shortening it."""
    any_length = st.tuples(st.integers(1, budget), _RUN_PLACES)
    long = st.tuples(st.integers(budget - budget // 4, budget), _RUN_PLACES)
    return _either((st.just((0, 0)), any_length, long, long))


def _plain_decodes(sim: _Sim) -> list[Event]:
    """The run: decode forwards of every live request with no feature switched on (none
    while no request is live)."""
    count, sim.run = sim.run, 0
    if not sim.live:
        return []
    for rid in sim.live:
        sim.lengths[rid] += count
    sim.rows = len(sim.live)
    return [Event(op="forward", mode="decode", requests=tuple(sim.live))] * count


# The scenario whose forwards are being drawn. The forward strategies read it from here
# rather than take it as an argument, so that each is one strategy object built once: a
# strategy built per forward costs Hypothesis a validation several times its draws.
_DRAWING: ContextVar[_Sim] = ContextVar("_DRAWING")


@st.composite
def _forwards_from(draw) -> list[Event]:
    """The next interesting forward and all after it, the run before the one of its place
    or else before the last, so that every interesting forward may meet the state a run
    leaves.

    Each forward's span holds the next one's, so the shrinker deletes any forward, the
    first included, with the state event after it, by putting the span of the forwards
    after it in its place (Hypothesis replaces a span with a nested span of the same
    label); deleting single choices drops only forwards of at most five."""
    sim = _DRAWING.get()
    index, sim.forwards = sim.forwards, sim.forwards + 1
    more = draw(_ANOTHER_FORWARD) != 0 and index + 1 < MAX_FORWARDS
    events = _plain_decodes(sim) if sim.run and (index == sim.run_before or not more) else []
    events.append(draw(_FORWARD))
    if more:
        if draw(st.booleans()):
            events.append(_state_event(draw, sim))
        events.extend(draw(_FORWARDS_FROM))
    return events


def _state_event(draw, sim: _Sim) -> Event:
    ops = ("admit", "finish", "clear") + (("register_mapping", "relocate") if sim.adversarial else ())
    op = draw(_one_of_values(ops))
    # an engine without idle forwards never runs out of requests: it admits instead
    emptying = op == "clear" or (op == "finish" and len(sim.live) == 1)
    if op == "admit" or not sim.live or (emptying and IDLE in sim.excluded):
        count = draw(st.integers(1, 4))
        sim.admit(count)
        return Event(op="admit", count=count)
    if op == "finish":
        rid = _live_request(draw, sim)
        sim.live.remove(rid)
        return Event(op="finish", request=rid)
    if op == "clear":
        sim.live.clear()
        return Event(op="clear")
    if op == "register_mapping":
        return Event(op="register_mapping", shuffle=draw(st.integers(0, 3)))
    return Event(op="relocate", request=_live_request(draw, sim))


@st.composite
def _forward(draw) -> Event:
    sim = _DRAWING.get()
    adversarial, speculative, num_draft_tokens = sim.adversarial, sim.speculative, sim.num_draft_tokens
    stage, swa_layers = sim.stage, sim.swa_layers
    drafts = ("draft_block",) if sim.dspark else ("draft", "draft_extend")
    modes = ("decode", "extend") + (("verify", *drafts) if speculative else ())
    unreached = {"verify": TARGET_VERIFY, "draft_extend": DRAFT_EXTEND, "idle": IDLE}
    modes = tuple(m for m in modes + ("idle",) if unreached.get(m) not in sim.excluded)
    mode = draw(_one_of_values(modes)) if sim.live else "idle"
    # the scheduler runs every live request, in admission order, unless a subset is drawn
    if mode == "idle":
        requests: tuple[int, ...] = ()
    elif draw(st.booleans()):
        requests = tuple(_subset(draw, sim.live, min_size=1))
    else:
        requests = tuple(sim.live)
    tokens: tuple[int, ...] = ()
    if mode in ("extend", "draft_extend"):
        high = num_draft_tokens if mode == "draft_extend" else 8
        # a prefill long enough to cross a C128 group, for a few requests at a time
        long = sim.compressed and mode == "extend" and len(requests) <= LONG_EXTEND_REQUESTS
        counts = _long_token_counts if long else _token_counts
        pattern = draw(counts(high, len(requests)))
        tokens = tuple(pattern[i % len(pattern)] for i in range(len(requests)))
    steps = 1
    if mode == "draft":
        # a chain drafter runs its configured num_draft_tokens - 1 steps every draft forward
        steps = (draw(st.integers(1, 1 if DRAFT_MULTISTEP in sim.excluded else 4)) if adversarial
                 else max(1, num_draft_tokens - 1))
    per_request = {"decode": 1, "draft": steps, "verify": num_draft_tokens, "draft_block": num_draft_tokens - 1,
                   "idle": 0}
    for i, rid in enumerate(requests):
        sim.lengths[rid] += tokens[i] if tokens else per_request[mode]

    graph, pad = False, 0
    if mode in GRAPH_MODES and sim.allows(GRAPH_REPLAY, mode) and draw(st.booleans()):
        if not sim.graph_sizes:
            sim.graph_sizes = tuple(sorted(_subset(draw, _GRAPH_SIZES, min_size=1)))
        pad = _idle_pad(draw, sim) if mode == "idle" else 0
        # a graph is captured per batch size: it holds the forward's requests (or padding)
        graph = max(len(requests), pad) <= sim.graph_sizes[-1]
        pad = pad if graph else 0
    elif mode == "idle":
        pad = _idle_pad(draw, sim)

    micro_batches = 1
    # a DSpark draft block runs whole: whether its draft model ever splits one into
    # micro-batches is not read, so none is drawn
    max_mbs = 1 if mode == "draft_block" else min(len(requests), 3 if adversarial else 2)
    if not graph and max_mbs > 1 and sim.allows(MICRO_BATCHES, mode) and draw(st.booleans()):
        micro_batches = draw(st.integers(2, max_mbs))

    skip_init, layers, skip_layers = False, None, ()
    if adversarial:
        skip_init = draw(st.booleans())
        if draw(st.booleans()):
            layers = tuple(draw(_layer_lists(stage)))
        if draw(st.booleans()):
            skip_layers = tuple(_subset(draw, stage, min_size=1))
    elif mode == "idle" and speculative and not graph:
        skip_init = True

    schedule = [layer for layer in (stage if layers is None else layers)
                if layer in swa_layers and layer not in skip_layers]
    order = None
    if adversarial and micro_batches > 1 and schedule and draw(st.booleans()):
        order = _interleaving(draw(_order_chunks(micro_batches, len(schedule))), micro_batches, len(schedule))
    mutation = None
    if adversarial and not graph and requests and draw(st.booleans()):
        mutation = Mutation(
            after_calls=draw(st.integers(0, len(schedule) * micro_batches * steps)),
            op=draw(_one_of_values(("relocate", "register_mapping"))),
            request=_live_request(draw, sim),
            shuffle=draw(st.integers(0, 3)),
        )
    event = Event(
        op="forward", mode=mode, requests=requests, tokens=tokens, steps=steps,
        micro_batches=micro_batches, order=order, layers=layers, skip_layers=skip_layers,
        skip_init=skip_init, graph=graph, pad=pad, mutation=mutation,
    )
    if requests:
        sim.rows = live_rows(event, num_draft_tokens)
    return event


_FORWARDS_FROM = _forwards_from()
_FORWARD = _forward()
_FEW_PAD_ROWS = st.integers(0, 4)


def _idle_pad(draw, sim: _Sim) -> int:
    """An idle forward's padding rows: a few, or as many as the last forward with requests
    had. SGLang pads an idle data-parallel rank to its busiest peer's token count
    (``DpPaddingMode.MAX_LEN``), in lockstep decode often the count this rank ran last, and
    an idle forward that skips metadata init then meets metadata of its own length: the
    stale-rows case that a length check alone lets through."""
    return draw(_pad_rows(min(sim.rows, LIMITS["pad"])))


@lru_cache(maxsize=None)  # built once per row count, as the forward strategies are
def _pad_rows(last_rows: int) -> st.SearchStrategy[int]:
    return _either((_FEW_PAD_ROWS, st.just(last_rows)))


@lru_cache(maxsize=1024)
def _order_chunks(micro_batches: int, stores: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    """An interleaving as a few (micro-batch, count) chunks: three choices per chunk instead
    of one per store, and shrinking toward fewer chunks."""
    return st.lists(st.tuples(st.integers(0, micro_batches - 1), st.integers(1, stores)), max_size=micro_batches * stores)


def _interleaving(chunks: list[tuple[int, int]], micro_batches: int, stores: int) -> tuple[int, ...] | None:
    """The store order the chunks spell: each runs up to ``count`` of its micro-batch's
    remaining stores, what is left runs in turn as two-batch overlap does. Chunks of one
    store each spell any interleaving; None where the order is the engine's own."""
    left = [stores] * micro_batches
    order: list[int] = []
    for mb, count in chunks:
        taken = min(count, left[mb])
        order += [mb] * taken
        left[mb] -= taken
    for turn in range(stores):
        order += [mb for mb in range(micro_batches) if left[mb] > turn]
    default = [mb for _ in range(stores) for mb in range(micro_batches)]
    return None if order == default else tuple(order)


def adversarial_reasons(scenario: Scenario, unreached: frozenset[str] = frozenset()) -> list[str]:
    """Why a scenario lies outside the realistic profile (empty when it does not); with
    ``unreached``, the restriction terms the engine under test never takes (its realistic
    profile draws none of them), each one the scenario exercises is a reason too."""
    c = scenario.config
    reasons = [f"the engine under test never takes {term.replace('_', ' ')}"
               for term in sorted(restriction_terms_of(scenario) & unreached)]
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
        if e.mode == "draft_block" and e.micro_batches > 1:
            reasons.append(f"{where}: a DSpark draft block split into micro-batches")
        if e.mode == "draft" and e.steps != max(1, c.num_draft_tokens - 1):
            reasons.append(f"{where}: {e.steps} draft steps with num_draft_tokens {c.num_draft_tokens}")
        if e.mode == "draft_extend" and any(n > c.num_draft_tokens for n in e.tokens):
            reasons.append(f"{where}: draft-extend accepts more than num_draft_tokens tokens")
    return reasons


def weakest_profile(scenario: Scenario, unreached: frozenset[str] = frozenset()) -> str:
    """The weakest profile whose strategy can produce this scenario, for an engine that
    never takes the restriction terms of ``unreached``."""
    return ADVERSARIAL if adversarial_reasons(scenario, unreached) else REALISTIC
