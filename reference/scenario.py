"""Scenarios as plain data: an engine configuration and a flat list of lifecycle events.

A scenario round-trips through JSON unchanged (``Scenario.from_dict(s.to_dict()) == s``).
Parsing checks shapes and ranges and names the offending field; checks that need the
engine's state (is request 3 live? does the pool have room?) happen while the engine model
runs the events, with the event's index in the message.
"""

from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .truth import ring_size

SCENARIO_VERSION = 1

MODES = ("decode", "extend", "verify", "draft", "draft_extend", "draft_block", "idle")
# the forwards of a DeepSeek-V4 MTP draft model, and of a DSpark one (config.dspark)
MTP_DRAFT_MODES = ("draft", "draft_extend")
# the modes a forward may run as a graph replay: those SGLang's decode graph runner captures
# (decode and idle share a graph; target-verify, and the DSpark draft block the draft
# worker runs as one, have graphs of their own)
GRAPH_MODES = ("decode", "idle", "verify", "draft_block")
MUTATIONS = ("relocate", "register_mapping")
# a DeepSeek-V4 layer's compress ratio: a C4 or C128 layer, or (0) an SWA-only one
MODEL_COMPRESS_RATIOS = (0, 4, 128)


# The largest value swafuzz accepts for each size in a scenario, checked before the engine
# model allocates or loops over anything, so that a scenario from anywhere runs in bounded
# time and memory. Each is far above what the strategies draw and what a real engine stage
# holds. A field of a configuration or an event is limited under its own name (a list field:
# its entries); the rest bound what a scenario adds up to.
LIMITS: dict[str, int] = {
    # configuration
    "start_layer": 1023,
    "end_layer": 1024,
    "sliding_window": 65536,
    "num_draft_tokens": 64,
    "num_req_slots": 4096,
    "full_page_size": 4096,
    "swa_page_size": 4096,
    "full_pool_size": 2**20,
    "swa_pool_size": 2**20,
    "graph_warmups": 8,
    "graph_batch_sizes": 4096,
    "non_swa_layers": 1023,
    "compress_ratios": 128,
    # events
    "count": 4096,
    "request": 2**31 - 1,
    "requests": 2**31 - 1,
    "shuffle": 2**63 - 1,
    "tokens": 65536,
    "steps": 64,
    "micro_batches": 64,
    "pad": 4096,
    "order": 63,
    "layers": 1023,
    "skip_layers": 1023,
    "after_calls": 2**31 - 1,
    # what a scenario adds up to
    "list_length": 4096,  # entries of any list but an interleaving order
    "order_length": 2**18,  # micro-batches x stores of one step
    "events": 16384,
    "ring_rows": 2**20,  # num_req_slots x ring
    "forward_rows": 65536,  # rows one step of a forward writes, padding included
    "stores": 65536,  # store calls of the whole scenario
    "checked_rows": 2**22,  # rows of all store calls together
    # every event brings the subject's copy of the mappings in line: slots of both pools of
    # every model, summed over the events; register_mapping also lays out every SWA page
    # again, which costs far more per page
    "pool_work": 2**26,
    "remapped_pages": 2**18,
}


class ScenarioError(ValueError):
    """A scenario or configuration that does not describe a possible engine run."""


class LimitExceeded(ScenarioError):
    """A possible engine run, but larger than :data:`LIMITS` allow: refused before it runs."""


def _fail(where: str, message: str) -> ScenarioError:
    return ScenarioError(f"{where}: {message}")


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def abbreviate(value: Any) -> str:
    """A value for a one-line message: shortened, never a wall of digits or text."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return _SHORT.repr(value)


def _over_limit(where: str, name: str, value: int, what: str = "") -> LimitExceeded:
    return LimitExceeded(f"{where}: {what or abbreviate(value)} exceeds the limit {name} = {LIMITS[name]}")


def _check_limit(where: str, name: str, value: int, what: str = "") -> None:
    if value > LIMITS[name]:
        raise _over_limit(where, name, value, what)


def _int(data: dict, key: str, where: str, default: Any = ..., minimum: int | None = None):
    value = data.get(key, default)
    if value is ...:
        raise _fail(where, f"missing field '{key}'")
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{where}.{key}", f"expected an integer, got {abbreviate(value)}")
    if minimum is not None and value < minimum:
        raise _fail(f"{where}.{key}", f"must be >= {minimum}, got {abbreviate(value)}")
    if key in LIMITS:
        _check_limit(f"{where}.{key}", key, value)
    return value


def _bool(data: dict, key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{where}.{key}", f"expected true or false, got {abbreviate(value)}")
    return value


def _int_list(data: dict, key: str, where: str, default: Any, minimum: int = 0):
    value = data.get(key, default)
    if value is None and default is None:  # elsewhere null is refused, as _int refuses it
        return None
    if not isinstance(value, (list, tuple)):
        raise _fail(f"{where}.{key}", f"expected a list of integers, got {abbreviate(value)}")
    length_limit = "order_length" if key == "order" else "list_length"
    _check_limit(f"{where}.{key}", length_limit, len(value), f"{len(value)} entries")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise _fail(f"{where}.{key}", f"expected a list of integers, got {abbreviate(value)}")
    if any(v < minimum for v in value):
        raise _fail(f"{where}.{key}", f"entries must be >= {minimum}, got {abbreviate(list(value))}")
    largest = max(value, default=minimum)
    if key in LIMITS:
        _check_limit(f"{where}.{key}", key, largest, f"entry {abbreviate(largest)}")
    return tuple(value)


def _reject_unknown(data: dict, known: set[str], where: str) -> None:
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        raise _fail(where, f"unknown field(s) {', '.join(map(abbreviate, unknown[:5]))}")


@dataclass(frozen=True)
class EngineConfig:
    """One pipeline stage of a DeepSeek-V4-like engine and its KV pools.

    Request slot 0 and page 0 of both pools are reserved dummies; padding writes there.
    """

    start_layer: int = 0
    end_layer: int = 4
    non_swa_layers: tuple[int, ...] = ()
    sliding_window: int = 8
    speculative: bool = False
    num_draft_tokens: int = 1
    num_req_slots: int = 8
    full_page_size: int = 1
    swa_page_size: int = 1
    full_pool_size: int = 1024
    swa_pool_size: int = 256
    draft_model: bool = False
    # the draft model is a DSpark block drafter (SGLang's --speculative-algorithm DSPARK)
    # rather than DeepSeek-V4's MTP draft: each draft forward is one block of
    # num_draft_tokens - 1 tokens per request (a draft_block forward), stored in one call
    # per layer, and no MTP draft or draft-extend forward runs
    dspark: bool = False
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    # eager runs of the forward on the static buffers before each capture; every release
    # 0.5.12 .. 0.5.23 runs two (reference/LIFECYCLE.md)
    graph_warmups: int = 2
    # the model's compress ratio per layer id (SGLang's model config ``compress_ratios``): 4
    # and 128 layers also write a compressed KV cache, 0 layers only their SWA keys; empty:
    # every layer is SWA-only
    compress_ratios: tuple[int, ...] = ()

    @property
    def ring(self) -> int:
        return ring_size(self.sliding_window, self.speculative, self.num_draft_tokens)

    @property
    def stage_layers(self) -> range:
        return range(self.start_layer, self.end_layer)

    @property
    def swa_layers(self) -> tuple[int, ...]:
        skipped = set(self.non_swa_layers)
        return tuple(layer for layer in self.stage_layers if layer not in skipped)

    @property
    def models(self) -> tuple[str, ...]:
        return ("target", "draft") if self.draft_model else ("target",)

    def validate(self) -> "EngineConfig":
        w = "config"
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in LIMITS:
                continue  # a flag (tests/test_boundary.py requires a limit of every size)
            if isinstance(value, tuple):
                _check_limit(f"{w}.{f.name}", "list_length", len(value), f"{len(value)} entries")
                if value:
                    _check_limit(f"{w}.{f.name}", f.name, max(value), f"entry {abbreviate(max(value))}")
            else:
                _check_limit(f"{w}.{f.name}", f.name, value)
        if self.start_layer < 0:
            raise _fail(f"{w}.start_layer", f"must be >= 0, got {self.start_layer}")
        if self.start_layer >= self.end_layer:
            raise _fail(
                f"{w}.start_layer",
                f"must be < end_layer ({self.start_layer} >= {self.end_layer})",
            )
        for layer in self.non_swa_layers:
            if layer not in self.stage_layers:
                raise _fail(
                    f"{w}.non_swa_layers",
                    f"layer {layer} is outside the stage [{self.start_layer}, {self.end_layer})",
                )
        if self.compress_ratios:
            if len(self.compress_ratios) < self.end_layer:
                raise _fail(f"{w}.compress_ratios", f"needs a ratio for each of the {self.end_layer} layers "
                                                    f"up to end_layer, got {len(self.compress_ratios)}")
            unknown = sorted(set(self.compress_ratios) - set(MODEL_COMPRESS_RATIOS))
            if unknown:
                raise _fail(f"{w}.compress_ratios", f"ratios must be among {MODEL_COMPRESS_RATIOS}, got {unknown}")
        if self.sliding_window < 1:
            raise _fail(f"{w}.sliding_window", f"must be >= 1 (a zero ring holds nothing), got {self.sliding_window}")
        if self.num_draft_tokens < 1:
            raise _fail(f"{w}.num_draft_tokens", f"must be >= 1, got {self.num_draft_tokens}")
        if self.num_draft_tokens > 1 and not self.speculative:
            raise _fail(f"{w}.num_draft_tokens", "is > 1 but speculative is false")
        if self.dspark and not (self.speculative and self.draft_model and self.num_draft_tokens >= 2):
            raise _fail(f"{w}.dspark", "a DSpark draft model needs speculative, draft_model and num_draft_tokens >= 2 "
                                       f"(its blocks hold num_draft_tokens - 1 tokens), got speculative "
                                       f"{str(self.speculative).lower()}, draft_model {str(self.draft_model).lower()}, "
                                       f"num_draft_tokens {self.num_draft_tokens}")
        if self.num_req_slots < 2:
            raise _fail(f"{w}.num_req_slots", f"must be >= 2 (slot 0 is the dummy), got {self.num_req_slots}")
        for name in ("full_page_size", "swa_page_size"):
            if getattr(self, name) < 1:
                raise _fail(f"{w}.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name, page in (("full_pool_size", self.full_page_size), ("swa_pool_size", self.swa_page_size)):
            size = getattr(self, name)
            if size < 2 * page or size % page:
                raise _fail(
                    f"{w}.{name}",
                    f"must be a multiple of the page size {page} holding at least two pages, got {size}",
                )
        ring_rows = self.num_req_slots * self.ring
        _check_limit(f"{w}.num_req_slots", "ring_rows", ring_rows, f"num_req_slots x ring = {ring_rows} ring rows")
        if any(size < 1 for size in self.graph_batch_sizes):
            raise _fail(f"{w}.graph_batch_sizes", "sizes must be >= 1")
        if self.graph_warmups < 0:
            raise _fail(f"{w}.graph_warmups", f"must be >= 0 (released runners run 2), got {self.graph_warmups}")
        return self

    @classmethod
    def from_dict(cls, data: Any) -> "EngineConfig":
        w = "config"
        if not isinstance(data, dict):
            raise _fail(w, f"expected an object, got {type(data).__name__}")
        defaults = cls()
        _reject_unknown(data, {f.name for f in dataclasses.fields(cls)}, w)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            default = getattr(defaults, f.name)
            if isinstance(default, bool):
                values[f.name] = _bool(data, f.name, w, default)
            elif isinstance(default, tuple):
                values[f.name] = _int_list(data, f.name, w, default)
            else:
                values[f.name] = _int(data, f.name, w, default)
        return cls(**values).validate()

    def to_dict(self) -> dict:
        # an SWA-only model's configuration reads as before compress ratios existed, and an
        # MTP draft's as before DSpark's existed
        data = {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }
        if not self.compress_ratios:
            del data["compress_ratios"]
        if not self.dspark:
            del data["dspark"]
        return data

    def compress_ratio(self, layer_id: int) -> int:
        """The compress ratio of ``layer_id`` (0: it writes only SWA keys)."""
        ratios = self.compress_ratios
        return ratios[layer_id] if layer_id < len(ratios) else 0


@dataclass(frozen=True)
class Mutation:
    """A mapping change injected after ``after_calls`` store-location calls of a forward."""

    after_calls: int
    op: str
    request: int = 0
    shuffle: int = 0

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Mutation":
        if not isinstance(data, dict):
            raise _fail(where, f"expected an object, got {type(data).__name__}")
        _reject_unknown(data, {"after_calls", "op", "request", "shuffle"}, where)
        op = data.get("op")
        if op not in MUTATIONS:
            raise _fail(f"{where}.op", f"expected one of {MUTATIONS}, got {abbreviate(op)}")
        return cls(
            after_calls=_int(data, "after_calls", where, minimum=0),
            op=op,
            request=_int(data, "request", where, 0, minimum=0),
            shuffle=_int(data, "shuffle", where, 0, minimum=0),
        )


@dataclass(frozen=True)
class Event:
    """One lifecycle event. ``op`` selects which of the other fields mean something.

    - ``admit``: ``count`` new requests take the lowest free request slots; ids count up
      from 0 in admission order.
    - ``finish``: ``request`` leaves; its full slots map to 0 again.
    - ``relocate``: ``request``'s SWA pages move to other free pages, in place.
    - ``register_mapping``: the pools are rebuilt with an SWA layout permuted by
      ``shuffle`` and a new mapping tensor is registered.
    - ``clear``: every request leaves and the mapping is filled with 0.
    - ``forward``: one model forward (see the forward fields below). Every forward writes
      its requests' next tokens from their current lengths, so an ``extend`` of a request
      that already holds tokens continues over that cached prefix.
    """

    op: str
    count: int = 1
    request: int = 0
    shuffle: int = 0
    # forward fields
    mode: str = "decode"
    requests: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    steps: int = 1
    micro_batches: int = 1
    order: tuple[int, ...] | None = None
    layers: tuple[int, ...] | None = None
    skip_layers: tuple[int, ...] = ()
    skip_init: bool = False
    graph: bool = False
    pad: int = 0
    mutation: Mutation | None = None

    OPS: ClassVar[tuple[str, ...]] = (
        "admit", "finish", "relocate", "register_mapping", "clear", "forward",
    )
    _FIELDS: ClassVar[dict[str, set[str]]] = {
        "admit": {"count"},
        "finish": {"request"},
        "relocate": {"request"},
        "register_mapping": {"shuffle"},
        "clear": set(),
        "forward": {
            "mode", "requests", "tokens", "steps", "micro_batches", "order", "layers",
            "skip_layers", "skip_init", "graph", "pad", "mutation",
        },
    }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Event":
        if not isinstance(data, dict):
            raise _fail(where, f"expected an object, got {type(data).__name__}")
        op = data.get("op")
        if op not in cls.OPS:
            raise _fail(f"{where}.op", f"expected one of {cls.OPS}, got {abbreviate(op)}")
        _reject_unknown(data, cls._FIELDS[op] | {"op"}, where)
        if op != "forward":
            return cls(
                op=op,
                count=_int(data, "count", where, 1, minimum=1),
                request=_int(data, "request", where, 0, minimum=0),
                shuffle=_int(data, "shuffle", where, 0, minimum=0),
            )
        mode = data.get("mode", "decode")
        if mode not in MODES:
            raise _fail(f"{where}.mode", f"expected one of {MODES}, got {abbreviate(mode)}")
        event = cls(
            op=op,
            mode=mode,
            requests=_int_list(data, "requests", where, ()),
            tokens=_int_list(data, "tokens", where, (), minimum=1),
            steps=_int(data, "steps", where, 1, minimum=1),
            micro_batches=_int(data, "micro_batches", where, 1, minimum=1),
            order=_int_list(data, "order", where, None),
            layers=_int_list(data, "layers", where, None),
            skip_layers=_int_list(data, "skip_layers", where, ()),
            skip_init=_bool(data, "skip_init", where, False),
            graph=_bool(data, "graph", where, False),
            pad=_int(data, "pad", where, 0, minimum=0),
            mutation=(
                Mutation.from_dict(data["mutation"], f"{where}.mutation")
                if data.get("mutation") is not None
                else None
            ),
        )
        return event._check_forward(where)

    def _check_forward(self, where: str) -> "Event":
        if self.mode == "idle":
            if self.requests:
                raise _fail(f"{where}.requests", "an idle forward has no requests")
        elif not self.requests:
            raise _fail(f"{where}.requests", f"a {self.mode} forward needs at least one request")
        if len(set(self.requests)) != len(self.requests):
            raise _fail(f"{where}.requests", f"a request appears twice in {abbreviate(list(self.requests))}")
        if self.mode in ("extend", "draft_extend"):
            if len(self.tokens) != len(self.requests):
                raise _fail(
                    f"{where}.tokens",
                    f"needs one token count per request ({len(self.requests)}), got {len(self.tokens)}",
                )
        elif self.tokens:
            raise _fail(f"{where}.tokens", f"only extend and draft_extend forwards take token counts")
        if self.steps > 1 and self.mode != "draft":
            raise _fail(f"{where}.steps", "only draft forwards run several steps")
        if self.micro_batches > max(1, len(self.requests)):
            raise _fail(
                f"{where}.micro_batches",
                f"{self.micro_batches} micro-batches for {len(self.requests)} requests",
            )
        if self.graph:
            if self.mode not in GRAPH_MODES:
                raise _fail(f"{where}.graph", f"graph replay runs {', '.join(GRAPH_MODES)} forwards, not {self.mode}")
            if self.micro_batches != 1:
                raise _fail(f"{where}.graph", "graph replay runs a single micro-batch")
            if self.mutation is not None:
                raise _fail(f"{where}.mutation", "a replayed graph runs its layers without a break")
        if self.pad and self.mode != "idle":
            raise _fail(f"{where}.pad", "only idle forwards take explicit padding rows")
        if self.order is not None and self.micro_batches == 1:
            raise _fail(f"{where}.order", "an interleaving order needs several micro-batches")
        return self

    def to_dict(self) -> dict:
        if self.op != "forward":
            keep = self._FIELDS[self.op]
            return {"op": self.op, **{k: getattr(self, k) for k in sorted(keep)}}
        out: dict[str, Any] = {"op": "forward", "mode": self.mode}
        defaults = Event(op="forward")
        for name in sorted(self._FIELDS["forward"]):
            value = getattr(self, name)
            if name != "mode" and value != getattr(defaults, name):
                if isinstance(value, Mutation):
                    value = dataclasses.asdict(value)
                elif isinstance(value, tuple):
                    value = list(value)
                out[name] = value
        return out


@dataclass(frozen=True)
class Scenario:
    config: EngineConfig = field(default_factory=EngineConfig)
    events: tuple[Event, ...] = ()

    def __post_init__(self) -> None:
        _check_limit("scenario.events", "events", len(self.events), f"{len(self.events)} events")
        checked: set[int] = set()  # a run of plain forwards repeats one event object
        for index, event in enumerate(self.events):
            if event.op == "forward" and id(event) not in checked:
                checked.add(id(event))
                _check_against_config(event, self.config, f"events[{index}]")
        _check_work(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Scenario":
        if not isinstance(data, dict):
            raise _fail("scenario", f"expected an object, got {type(data).__name__}")
        _reject_unknown(data, {"version", "config", "events"}, "scenario")
        version = data.get("version", SCENARIO_VERSION)
        if isinstance(version, bool) or version != SCENARIO_VERSION:
            raise _fail("scenario.version", f"this harness reads version {SCENARIO_VERSION}, got {abbreviate(version)}")
        config = EngineConfig.from_dict(data.get("config", {}))
        events = data.get("events", [])
        if not isinstance(events, list):
            raise _fail("scenario.events", f"expected a list, got {type(events).__name__}")
        _check_limit("scenario.events", "events", len(events), f"{len(events)} events")
        parsed = tuple(Event.from_dict(e, f"events[{i}]") for i, e in enumerate(events))
        return cls(config=config, events=parsed)

    def to_dict(self) -> dict:
        return {
            "version": SCENARIO_VERSION,
            "config": self.config.to_dict(),
            "events": [e.to_dict() for e in self.events],
        }


def _check_against_config(event: Event, config: EngineConfig, where: str) -> None:
    if event.mode == "draft_block" and not config.dspark:
        raise _fail(f"{where}.mode", "a draft_block forward needs a DSpark draft model (config.dspark)")
    if event.mode in MTP_DRAFT_MODES and config.dspark:
        raise _fail(f"{where}.mode", f"a {event.mode} forward is DeepSeek-V4's MTP draft; a DSpark draft model "
                                     "(config.dspark) drafts in draft_block forwards")
    stage = config.stage_layers
    for name, layers in (("layers", event.layers or ()), ("skip_layers", event.skip_layers)):
        for layer in layers:
            if layer not in stage:
                raise _fail(f"{where}.{name}", f"layer {layer} is outside the stage [{stage.start}, {stage.stop})")
    if event.order is not None:
        stores = len(store_schedule(event, config))
        expected = sorted(mb for mb in range(event.micro_batches) for _ in range(stores))
        if sorted(event.order) != expected:
            raise _fail(
                f"{where}.order",
                f"must name each of the {event.micro_batches} micro-batches exactly {stores} times "
                f"(once per store), got {abbreviate(list(event.order))}",
            )


def _check_work(scenario: "Scenario") -> None:
    """Bounds what running the scenario costs, from the events alone (see LIMITS)."""
    config = scenario.config
    pool_slots = (config.full_pool_size + config.swa_pool_size) * len(config.models)
    swa_pages = config.swa_pool_size // config.swa_page_size * len(config.models)
    stores = checked = pool_work = remapped = 0
    # a run of plain forwards repeats one event object: its rows and schedule are read once
    sizes: dict[int, tuple[int, int]] = {}

    def check(index: int, name: str, value: int, what: str) -> None:
        # ``what`` is formatted only for the message: scenarios hold hundreds of events
        if value > LIMITS[name]:
            raise _over_limit(f"events[{index}]", name, value, what.format(value=value, index=index))

    for index, event in enumerate(scenario.events):
        pool_work += pool_slots
        check(index, "pool_work", pool_work, "{value} pool slots walked by events[0..{index}]")
        if event.op == "register_mapping":
            remapped += swa_pages
            check(index, "remapped_pages", remapped, "{value} SWA pages laid out by events[0..{index}]")
        if event.op != "forward":
            continue
        size = sizes.get(id(event))
        if size is None:
            size = sizes[id(event)] = _step_rows(event, config), len(store_schedule(event, config))
        rows, calls = size
        check(index, "forward_rows", rows, "up to {value} rows per step")
        steps = event.steps + (1 if event.graph else 0)  # a graph is captured before it replays
        stores += calls * event.micro_batches * steps
        checked += calls * rows * steps
        check(index, "stores", stores, "{value} store calls by events[0..{index}]")
        check(index, "checked_rows", checked, "up to {value} rows checked by events[0..{index}]")


def request_length_bound(scenario: "Scenario") -> int:
    """An upper bound on the tokens any request of ``scenario`` ever holds, from the events
    alone: each forward adds at most its largest token count to each of its requests (one
    a step in decode and draft decode, the draft tokens in target-verify, one fewer in a
    DSpark draft block)."""
    config = scenario.config
    bound = 0
    for event in scenario.events:
        if event.op == "forward" and event.requests:
            per_request = max(event.tokens) if event.tokens else tokens_per_request(event.mode, config.num_draft_tokens)
            bound += per_request * event.steps
    return bound


def _step_rows(event: Event, config: EngineConfig) -> int:
    """An upper bound on the rows one step of a forward writes, padding included."""
    if event.graph:
        largest = max(config.graph_batch_sizes, default=0)
        # a graph holds its batch size in requests, each a request's tokens in the mode
        return max(largest, event.pad) * tokens_per_request(event.mode, config.num_draft_tokens)
    return live_rows(event, config.num_draft_tokens) + event.pad


def live_rows(event: Event, num_draft_tokens: int) -> int:
    """The rows (positions) one step of an eager forward has for its requests, padding left
    out: its token counts, else :func:`tokens_per_request` per request."""
    if event.tokens:
        return sum(event.tokens)
    return len(event.requests) * tokens_per_request(event.mode, num_draft_tokens)


def tokens_per_request(mode: str, num_draft_tokens: int) -> int:
    """The tokens each request writes in one step of a forward of ``mode`` that takes no
    token counts: ``num_draft_tokens`` in target-verify, one fewer in a DSpark draft block
    (its block size, gamma), else one."""
    if mode == "verify":
        return num_draft_tokens
    return num_draft_tokens - 1 if mode == "draft_block" else 1


def store_schedule(event: Event, config: EngineConfig) -> list[int]:
    """The layers of one step of a forward that store SWA keys, in the order they run."""
    base = event.layers if event.layers is not None else tuple(config.stage_layers)
    skipped = set(event.skip_layers) | set(config.non_swa_layers)
    return [layer for layer in base if layer not in skipped]
