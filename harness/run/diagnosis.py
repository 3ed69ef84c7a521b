"""Divergences and where a wrong value came from.

The executor keeps every answer the reference gave during a run (per model, forward, draft
step and micro-batch), the rows recorded at graph capture and the mappings that were
replaced. When a subject's rows are wrong, each of those is a candidate source, next to the
values of known wrong formulas (the uniform ``repeat_interleave`` fallback, ring rows
computed with the sliding window instead of the ring size); the first that reproduces every
wrong row names the bug. Wrong padding rows are traced the same way, row by row, and to the
live tokens of the same forward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, NamedTuple

import re

import torch

from ..reference import DUMMY_SLOT, EngineConfig

# What went wrong (the divergence kind).
WRONG_ROWS = "wrong_rows"
PADDING = "padding"
WRONG_DTYPE = "wrong_dtype"
WRONG_LENGTH = "wrong_length"
WRONG_DEVICE = "wrong_device"
NON_TENSOR = "non_tensor"
RAISED = "raised"
TIMEOUT = "timeout"
CAPTURE = "capture"
RACE = "race"
WROTE_INPUT = "wrote_input"  # the subject wrote into (or re-pointed) a tensor it was handed
KINDS = (WRONG_ROWS, PADDING, WRONG_DTYPE, WRONG_LENGTH, WRONG_DEVICE, NON_TENSOR, RAISED, TIMEOUT, CAPTURE, RACE,
         WROTE_INPUT)

# Values of an answer (or of the reference) a divergence keeps: a wrong answer may have
# millions of rows, or claim 2**40 through a stride of 0, and a replay file stays small.
MAX_STORED_VALUES = 4096

# Where the wrong rows came from (the source kind).
EARLIER_FORWARD = "earlier_forward"
EARLIER_STEP = "earlier_step"
OTHER_MICRO_BATCH = "other_micro_batch"
OTHER_MODEL = "other_model"
GRAPH_CAPTURE = "graph_capture"
OLD_MAPPING = "old_mapping"
UNIFORM_REPEAT = "uniform_repeat"
WINDOW_RING = "window_ring"
LIVE_TOKENS = "live_tokens"
DUMMY = "dummy"
ALIASES_LIVE = "aliases_live"
POSITION_SHIFT = "position_shift"  # the right request's ring rows, at shifted positions
RING_SIZE_OFF = "ring_size_off"  # ring rows with the ring size off by one
OTHER_REQUEST = "other_request"  # the right position in another request's ring
NEIGHBOUR_SLOT = "neighbour_slot"  # the translation of out_cache_loc off by one
UNTRANSLATED = "untranslated"  # the full-pool location itself
INT32_WRAP = "int32_wrap"  # the right value wrapped around to int32
UNKNOWN = "unknown"
# the SWA write location's two truths; any other truth is a per-step value (swafuzz.quantities)
SWA_TRUTHS = ("pool", "ring")
# sources that mean a cache handed out a value computed for other inputs
STALE_SOURCES = (EARLIER_FORWARD, EARLIER_STEP, OTHER_MICRO_BATCH, OTHER_MODEL, GRAPH_CAPTURE, OLD_MAPPING)


@dataclass(frozen=True)
class Source:
    kind: str
    phrase: str  # noun phrase: "the rows of forward 1 (decode)"
    consequence: str  # why that happens: "a cached value was not refreshed"
    forward: int | None = None
    draft_step: int | None = None
    micro_batch: int | None = None


@dataclass(frozen=True)
class Divergence:
    kind: str
    sentence: str
    forward: int | None  # 1-based count of forwards in the scenario
    event: int | None  # index into scenario.events
    mode: str | None
    model: str | None
    draft_step: int | None
    micro_batch: int | None
    layer_id: int | None
    call: int  # 0-based index of the subject call that diverged
    expected: list[int] | None = None
    actual: list[int] | None = None
    source: dict[str, Any] | None = None
    detail: str = ""
    quantity: str | None = None  # the per-step value that was wrong (None: the SWA write location)

    @property
    def stale(self) -> bool:
        return self.source is not None and self.source["kind"] in STALE_SOURCES

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.quantity is None:  # a finding on the SWA write location reads as it always has
            del data["quantity"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Divergence":
        return cls(**data)


@dataclass(frozen=True)
class Site:
    """Where in the run a call happened."""

    forward: int
    event: int
    mode: str
    model: str
    draft_step: int
    micro_batch: int
    layer_id: int | None
    call: int
    num_draft_steps: int = 1
    num_micro_batches: int = 1

    def describe(self) -> str:
        if self.mode == "setup":
            return f"setup of the {self.model} model"
        parts = [f"forward {self.forward} ({self.mode})"]
        if self.num_micro_batches > 1:
            parts.append(f"micro-batch {self.micro_batch}")
        if self.num_draft_steps > 1:
            parts.append(f"draft step {self.draft_step}")
        if self.layer_id is not None:
            parts.append(f"layer {self.layer_id}")
        return ", ".join(parts)

    def divergence(self, kind: str, sentence: str, **extra: Any) -> Divergence:
        return Divergence(
            kind=kind, sentence=sentence, forward=self.forward, event=self.event,
            mode=self.mode, model=self.model, draft_step=self.draft_step,
            micro_batch=self.micro_batch, layer_id=self.layer_id, call=self.call, **extra,
        )


def source_dict(source: Source) -> dict[str, Any]:
    """``source`` as a divergence carries it: its fields that are set."""
    return {k: v for k, v in source.__dict__.items() if v is not None}


def stored_values(tensor: torch.Tensor) -> list:
    """The first :data:`MAX_STORED_VALUES` values of ``tensor`` in row-major order, read
    without materialising the rest (an expanded tensor's rows share memory until copied)."""
    cap = MAX_STORED_VALUES
    while tensor.dim() > 1 and tensor.numel() and tensor[0].numel() >= cap:
        tensor = tensor[0]
    if tensor.dim() > 1 and tensor.numel():
        tensor = tensor[: -(-cap // tensor[0].numel())]  # fewer than 2 * cap values
    return tensor.reshape(-1)[:cap].tolist()


# who reads each tensor a subject is handed, in SGLang: why writing into it is a bug
_READERS = {
    "out_cache_loc": "in SGLang this tensor is shared by every later layer and the allocator",
    "positions": "in SGLang every later layer reads these positions (rotary embedding, ring rows)",
    "req_pool_indices": "in SGLang every later layer and the scheduler read these request slots",
    "extend_seq_lens": "in SGLang the attention backends and the scheduler read these token counts",
    "extend_prefix_lens": "in SGLang the attention backends and the scheduler read these prefix lengths",
    "seq_lens": "in SGLang the attention backends and the scheduler read these lengths",
    "seq_lens_cpu": "in SGLang the scheduler and the backends' host-side planning read these lengths",
    "mapping": ("it is the pool's full_to_swa_index_mapping, which only the allocator writes: every later "
                "translation reads it"),
}


def row_span(rows: list[int]) -> str:
    """``rows 0-3``, ``row 5``, ``rows 2-4 (7 rows in all)``: the first run of ``rows``."""
    end = 0
    while end + 1 < len(rows) and rows[end + 1] == rows[end] + 1:
        end += 1
    span = f"row {rows[0]}" if end == 0 else f"rows {rows[0]}-{rows[end]}"
    return span if end + 1 == len(rows) else f"{span} ({len(rows)} rows in all)"


def input_change(shown: str, tensor: torch.Tensor, held: torch.Tensor) -> str | None:
    """What the subject did to ``tensor``, shown as ``shown`` and handed holding ``held``
    (a participle phrase for :func:`wrote_input_sentence`); None if it holds ``held``."""
    if tensor.shape != held.shape:
        return f"resized {shown} from shape {tuple(held.shape)} to {tuple(tensor.shape)}"
    now = tensor.cpu()
    if torch.equal(now, held):
        return None
    return f"written into {shown} ({row_span((now != held).nonzero()[:, 0].unique().tolist())})"


def wrote_input_sentence(when: str, name: str, change: str, writer: str = "the subject",
                         read_only: bool = False) -> str:
    """``when``: "the end of forward 2 (decode)", "forward 2 (decode), layer 1", "the
    eviction after forward 2"; ``name``: the input (a batch field, or "mapping");
    ``writer``: the code that wrote it; ``read_only``: say that the engine hands the input
    in read-only (where ``change`` names it in the code's own terms)."""
    handed = ", which the engine hands in read-only" if read_only else ""
    return f"By {when}, {writer} had {change}{handed}: {_READERS[name]}."


# the replaced mappings the history keeps per model: enough changes to reach back past a
# lifecycle's worth of allocations, and at most a few MB of their values
_KEPT_MAPPING_CHANGES = 64
_KEPT_MAPPING_VALUES = 1 << 20


class _Answer(NamedTuple):
    """Where the reference gave an answer (the fields of :class:`Site` a candidate source
    names: a whole site is built only for a divergence) and its live rows."""

    forward: int
    mode: str
    model: str
    draft_step: int
    micro_batch: int
    rows: torch.Tensor


@dataclass
class History:
    """Reference answers and replaced mappings of one run, newest last."""

    answers: list[_Answer] = field(default_factory=list)
    captures: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)  # forward, rows, live rows
    # per model, the mapping as the latest sync left it (the executor keeps it in line), and
    # the changes that led there, newest last: a label, the rows changed (None: all) and
    # their values before
    mappings: dict[str, torch.Tensor] = field(default_factory=dict)
    changes: dict[str, deque[tuple[str, torch.Tensor | None, torch.Tensor]]] = field(default_factory=dict)
    held_values: dict[str, int] = field(default_factory=dict)  # per model, the values its changes hold
    registrations: list[int] = field(default_factory=list)  # forwards run before each

    def record_answer(self, forward: int, mode: str, model: str, draft_step: int, micro_batch: int,
                      live_rows: torch.Tensor) -> None:
        """The reference's live rows for a micro-batch of a (draft) step of a forward."""
        last = self.answers[-1] if self.answers else None
        if (last is not None and last.forward == forward and last.draft_step == draft_step
                and last.micro_batch == micro_batch and torch.equal(last.rows, live_rows)):
            return
        self.answers.append(_Answer(forward, mode, model, draft_step, micro_batch, live_rows))

    def record_capture(self, forward: int, rows: torch.Tensor, num_live: int) -> None:
        """``rows``: what the captured layers yield for the capture's inputs, of which the
        first ``num_live`` rows belong to live requests."""
        self.captures.append((forward, rows, num_live))

    def record_old_mapping(self, model: str, label: str, rows: torch.Tensor | None, values: torch.Tensor) -> None:
        """``model``'s mapping before a change held ``values`` at ``rows`` (None: ``values``
        is all of it). The caller hands them over and never writes them again. The last
        :data:`_KEPT_MAPPING_CHANGES` changes are kept while they hold few values, so that a
        cache that missed several changes is traced to the mapping it did keep; past that,
        the oldest go first."""
        kept = self.changes.get(model)
        if kept is None:
            kept = self.changes[model] = deque()
        kept.append((label, rows, values))
        held = self.held_values.get(model, 0) + values.numel()
        while len(kept) > 1 and (len(kept) > _KEPT_MAPPING_CHANGES or held > _KEPT_MAPPING_VALUES):
            held -= kept.popleft()[2].numel()
        self.held_values[model] = held

    def old_mappings(self, model: str) -> list[tuple[str, torch.Tensor]]:
        """Each kept earlier mapping of ``model`` and its label, newest first: the current
        one with the changes since undone."""
        mapping, out = self.mappings.get(model), []
        for label, rows, values in reversed(self.changes.get(model, [])):
            mapping = values if rows is None else mapping.clone().index_put_((rows,), values)
            out.append((label, mapping))
        return out

    def _earlier_answers(self, site: Site) -> tuple[list[tuple[Source, torch.Tensor]], list[tuple[Source, torch.Tensor]]]:
        """The reference's answers before ``site``, newest first: the same model's, and the
        other model's (the draft and target models each have their own pool)."""
        same: list[tuple[Source, torch.Tensor]] = []
        other: list[tuple[Source, torch.Tensor]] = []
        for answer in reversed(self.answers):
            if answer.model != site.model:
                other.append((Source(
                    OTHER_MODEL, f"the {answer.model} model's rows of forward {answer.forward} ({answer.mode})",
                    f"one cache serves the {answer.model} and {site.model} models, whose pools are separate",
                    answer.forward, answer.draft_step, answer.micro_batch,
                ), answer.rows))
                continue
            same_step = answer.forward == site.forward and answer.draft_step == site.draft_step
            if same_step and answer.micro_batch == site.micro_batch:
                continue
            if same_step:
                source = Source(
                    OTHER_MICRO_BATCH, f"micro-batch {answer.micro_batch}'s rows",
                    "one cache is shared by micro-batches whose layers interleave",
                    answer.forward, answer.draft_step, answer.micro_batch,
                )
            elif answer.forward == site.forward:
                source = Source(
                    EARLIER_STEP, f"the rows of draft step {answer.draft_step}",
                    "the cache was not refreshed between draft steps",
                    answer.forward, answer.draft_step, answer.micro_batch,
                )
            else:
                registered = [r for r in self.registrations if answer.forward <= r < site.forward]
                consequence = (
                    f"the cache outlived the new mapping registered after forward {registered[-1]}"
                    if registered else "a cached value was not refreshed for this forward"
                )
                source = Source(
                    EARLIER_FORWARD, f"the rows of forward {answer.forward} ({answer.mode})",
                    consequence, answer.forward, answer.draft_step, answer.micro_batch,
                )
            same.append((source, answer.rows))
        return same, other

    def _captured(self, live_only: bool) -> list[tuple[Source, torch.Tensor]]:
        """The rows recorded at graph capture, newest first: every row, or (``live_only``)
        those the capture computed for live requests."""
        return [(Source(
            GRAPH_CAPTURE, f"the rows recorded at graph capture (forward {forward})",
            "the captured layers read a tensor that the replay no longer updates", forward,
        ), rows[:num_live] if live_only else rows) for forward, rows, num_live in reversed(self.captures)]

    def candidates(self, site: Site, truth: str, inputs, config: EngineConfig) -> list[tuple[Source, torch.Tensor]]:
        """Live rows each candidate source would have given at ``site``, most likely first."""
        same_model, other_model = self._earlier_answers(site)
        captured = [(source, rows[: inputs.num_live]) for source, rows in self._captured(live_only=False)]
        out = [*same_model, *captured, *other_model]
        n_req, n_tok = len(inputs.request_ids), inputs.num_live
        ring, window = config.ring, config.sliding_window
        dummy_consequence = "live tokens would overwrite padding's slot"
        if truth not in SWA_TRUTHS:  # a per-step value: its history is its only candidate source
            dummy_consequence = "the entries those rows complete are never written"
        elif truth == "pool":
            loc = inputs.out_cache_loc[:n_tok]
            for since, (label, mapping) in enumerate(self.old_mappings(site.model)):
                missed = "when the mapping changed" if not since else (
                    f"at any of the {since + 1} changes of the mapping since")
                out.append((Source(
                    OLD_MAPPING, f"the translation under {label}", f"the cache was not invalidated {missed}",
                ), mapping[loc].to(torch.int32)))
        else:
            counts = inputs.token_counts[:n_req]
            if n_req and n_tok % n_req == 0 and bool((counts != n_tok // n_req).any()):
                slots = inputs.req_slots[:n_req].repeat_interleave(n_tok // n_req)
                rows = (slots * ring + inputs.positions[:n_tok] % ring).to(torch.int32)
                out.append((Source(
                    UNIFORM_REPEAT, "the uniform repeat_interleave fallback",
                    f"it gives every request {n_tok // n_req} tokens, but their counts are "
                    f"{counts.tolist()}",
                ), rows))
            if window != ring:
                rows = (inputs.token_slots[:n_tok] * window + inputs.positions[:n_tok] % window).to(torch.int32)
                out.append((Source(
                    WINDOW_RING, f"ring rows computed with the sliding window {window} instead of the ring size {ring}",
                    f"under speculative decoding each request slot's ring holds window + num_draft_tokens - 1 = "
                    f"{ring} rows",
                ), rows))
        out.append((Source(DUMMY, "the dummy slot", dummy_consequence),
                    torch.full((n_tok,), DUMMY_SLOT, dtype=torch.int32)))
        return out

    def padding_candidates(self, site: Site) -> list[tuple[Source, torch.Tensor]]:
        """Live rows that padding may hold, aligned by row index: earlier answers, then the
        capture's. Rows a capture computed for padding inputs are left out: a padding row
        that matches them was computed the same wrong way again, not left stale."""
        same_model, other_model = self._earlier_answers(site)
        return [*same_model, *self._captured(live_only=True), *other_model]


def wrong_rows(wrong: torch.Tensor) -> torch.Tensor:
    """Which rows hold a wrong entry, of a value with one entry per row or a table per row."""
    return wrong if wrong.dim() <= 1 else wrong.flatten(1).any(1)


def explain(
    history: History, site: Site, truth: str, inputs, config: EngineConfig, actual: torch.Tensor,
    expected: torch.Tensor, fit: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
) -> Source:
    """The first candidate that reproduces every wrong live entry, else the first pattern
    of wrong rows that explains them all (:func:`_patterns`), else UNKNOWN, saying which
    rows are wrong and the candidate that comes closest. ``fit``: how a candidate of a
    table value is held against ``expected`` (None where it cannot be)."""
    wrong = actual != expected
    closest: tuple[int, Source | None] = (0, None)
    if truth in SWA_TRUTHS:
        candidates = [*history.candidates(site, truth, inputs, config),
                      *_patterns(history, site, truth, inputs, config, actual, expected)]
    else:
        candidates = history.candidates(site, truth, inputs, config)
        if fit is not None:
            candidates = [(source, fitted) for source, rows in candidates if (fitted := fit(rows)) is not None]
        candidates = _value_candidates(candidates, actual, wrong)
    for source, rows in candidates:
        if rows.shape != actual.shape:
            continue
        explained = int((rows[wrong] == actual[wrong]).sum())
        if explained == int(wrong.sum()):
            return source
        if explained > closest[0]:
            closest = (explained, source)
    phrase = "rows that no earlier answer, mapping or fallback explains"
    phrase += f" ({_which_rows(inputs, wrong_rows(wrong))}"
    explained, source = closest
    if source is not None:
        phrase += f"; closest: {source.phrase}, which explains {explained} of {int(wrong.sum())}"
    return Source(UNKNOWN, phrase + ")", "the value is wrong")


def _value_candidates(candidates: list[tuple[Source, torch.Tensor]], actual: torch.Tensor,
                      wrong: torch.Tensor) -> list[tuple[Source, torch.Tensor]]:
    """A per-step value's candidates, reordered: most rows of such a value hold the dummy, so
    an earlier answer often agrees with wrong rows by chance. A candidate that is the whole
    answer comes first (the capture's before the rest); then, where every wrong row holds
    the dummy, the dummy itself."""
    whole = [(source, rows) for source, rows in candidates if rows.shape == actual.shape and bool((rows == actual).all())]
    # a graph replay's answer equal to the capture's is the capture's, whatever else it equals
    whole.sort(key=lambda candidate: candidate[0].kind != GRAPH_CAPTURE)
    dummy = [(source, rows) for source, rows in candidates if source.kind == DUMMY]
    if not dummy or not bool((actual[wrong] == DUMMY_SLOT).all()):
        dummy = []
    return [*whole, *dummy, *candidates]


def _which_rows(inputs, wrong: torch.Tensor) -> str:
    """What the wrong live rows have in common: whose tokens they are, and which of them."""
    n_req = len(inputs.request_ids)
    counts = inputs.token_counts[:n_req]
    if n_req == 0 or int(counts.sum()) != wrong.shape[0]:
        return f"rows {row_span(wrong.nonzero().flatten().tolist())}"
    request_of = torch.repeat_interleave(torch.arange(n_req), counts)
    hit = sorted({int(r) for r in request_of[wrong]})
    whose = "every request" if len(hit) == n_req else (
        "request " + ", ".join(str(inputs.request_ids[r]) for r in hit) + f" of {n_req}")
    first = torch.zeros(wrong.shape[0], dtype=torch.bool)
    first[torch.cumsum(counts, 0)[:-1]] = True
    first[0] = True
    if bool(wrong[first].all()) and not bool(wrong[~first].any()) and bool((counts > 1).any()):
        which = "each one's first token only"
    elif bool(wrong[~first].all()) and not bool(wrong[first].any()):
        which = "all tokens but each one's first"
    else:
        which = "all its tokens" if bool(wrong[torch.isin(request_of, torch.tensor(hit))].all()) else "some tokens"
    return f"wrong: {whose}, {which}"


def _per_token(inputs, values: torch.Tensor) -> torch.Tensor | None:
    """A per-request-row value for each live token row; None where the counts do not add up."""
    n_req = len(inputs.request_ids)
    counts = inputs.token_counts[:n_req]
    if int(counts.sum()) != inputs.num_live:
        return None
    return torch.repeat_interleave(values[:n_req], counts)


def _patterns(history: History, site: Site, truth: str, inputs, config: EngineConfig,
              actual: torch.Tensor, expected: torch.Tensor) -> list[tuple[Source, torch.Tensor]]:
    """Rows of wrong formulas that recur in cached write locations, most specific first: the
    right request's ring at positions shifted (by each request's cached prefix, by its token
    count, which in target-verify is the draft tokens seq_lens leaves out, by one, or by the
    constant the first wrong row shows), the ring size off by one, another request's ring at
    the right positions (slot 0's, the next or previous request's, or any live request's),
    the translation of a neighbouring full-pool slot, the full-pool location untranslated,
    an int32 wrap-around."""
    n = inputs.num_live
    out: list[tuple[Source, torch.Tensor]] = []
    wrapped = ((expected.to(torch.int64) + 2**31) % 2**32 - 2**31).to(torch.int32)
    if truth == "pool":
        mapping = history.mappings.get(site.model)
        loc = inputs.out_cache_loc[:n]
        if mapping is not None and n:
            for step, word in ((1, "next"), (-1, "previous")):
                neighbour = (loc + step).clamp(0, mapping.shape[0] - 1)
                out.append((Source(
                    NEIGHBOUR_SLOT, f"the translation of each token's {word} full-pool slot",
                    f"out_cache_loc is read off by {step:+d}",
                ), mapping[neighbour].to(torch.int32)))
        out.append((Source(UNTRANSLATED, "the full-pool locations themselves",
                           "out_cache_loc was not translated to the SWA pool"), loc.to(torch.int32)))
    else:
        ring = config.ring
        slots, positions = inputs.token_slots[:n].to(torch.int64), inputs.positions[:n].to(torch.int64)
        counts = _per_token(inputs, inputs.token_counts)
        prefixes = _per_token(inputs, inputs.prefix_lens)
        draft = " (in target-verify, the draft tokens that seq_lens leaves out)" if site.mode == "verify" else ""
        shifts = []
        if prefixes is not None and bool((prefixes != 0).any()):
            shifts += [(-prefixes, "minus its request's cached prefix length"),
                       (prefixes, "plus its request's cached prefix length")]
        if counts is not None and bool((counts != 1).any()):  # one token each: a shift of 1 says it
            shifts += [(-counts, f"minus its request's token count{draft}"),
                       (counts, f"plus its request's token count{draft}")]
        for shift, how in shifts:
            out.append((_shifted(f"at each token's position {how}"),
                        (slots * ring + (positions + shift) % ring).to(torch.int32)))
        # off by one, or by the shift the first wrong row shows
        first = _first_shift(slots, positions, ring, actual, expected)
        for shift in dict.fromkeys((1, -1, *(() if first is None else (first,)))):
            source = _shifted(f"at each token's position {shift:+d}", f"the position arithmetic is off by {shift:+d}")
            out.append((source, (slots * ring + (positions + shift) % ring).to(torch.int32)))
        out += _ring_size_off_by_one(slots, positions, ring)
        for other, phrase in _other_slots(inputs):
            out.append((Source(OTHER_REQUEST, phrase, "the request slot was not the token's own"),
                        (other * ring + positions % ring).to(torch.int32)))
        permuted = _slots_of_other_requests(inputs, slots, positions, ring, actual)
        if permuted is not None:
            out.append((Source(OTHER_REQUEST, "the ring rows of other requests in the batch, at the right positions",
                               "the request slots were permuted: tokens were given another live request's slot"),
                        (permuted * ring + positions % ring).to(torch.int32)))
    out.append((Source(INT32_WRAP, "the right values wrapped around to int32",
                       "int64 arithmetic was narrowed to int32 before it was done"), wrapped))
    return out


def _shifted(how: str, why: str = "the positions were computed from lengths, not read from the batch's "
                                   "positions") -> Source:
    return Source(POSITION_SHIFT, f"the ring rows of each token's own request {how}", why)


def _first_shift(slots: torch.Tensor, positions: torch.Tensor, ring: int, actual: torch.Tensor,
                 expected: torch.Tensor) -> int | None:
    """The shift of position the first wrong row shows, where it lies in its own request's
    ring (the smallest in size of the shifts that give it), to be tried on every row; None
    where fewer than two rows are wrong."""
    wrong = (actual != expected).nonzero().flatten()
    if wrong.numel() < 2:  # read off the one wrong row, a shift would explain it by construction
        return None
    row = int(wrong[0])
    offset = int(actual[row]) - int(slots[row]) * ring
    if not 0 <= offset < ring:
        return None
    shift = (offset - int(positions[row])) % ring
    return shift - ring if shift > ring // 2 else shift


def _ring_size_off_by_one(slots: torch.Tensor, positions: torch.Tensor, ring: int) -> list[tuple[Source, torch.Tensor]]:
    """Ring rows with the ring size off by one as the slot's stride, as the position's
    modulus, or as both."""
    out = []
    for size in (ring + 1, ring - 1):
        if size < 1:
            continue
        for stride, modulus, where in ((size, ring, "as each slot's stride"), (ring, size, "as the position's modulus"),
                                       (size, size, "as both stride and modulus")):
            out.append((Source(
                RING_SIZE_OFF,
                f"ring rows computed with {size} {where} instead of the ring size {ring}",
                "the ring arithmetic is off by one",
            ), (slots * stride + positions % modulus).to(torch.int32)))
    return out


def _other_slots(inputs) -> list[tuple[torch.Tensor, str]]:
    """Request slots each token might have been given instead of its own: slot 0 (the one
    padded requests use), and the live requests' slots shifted by one row either way."""
    n, n_req = inputs.num_live, len(inputs.request_ids)
    out = [(torch.zeros(n, dtype=torch.int64), "request slot 0's ring rows (the slot padded requests use)")]
    if n_req > 1:
        for step, word in ((1, "next"), (-1, "previous")):
            shifted = _per_token(inputs, torch.roll(inputs.req_slots[:n_req].to(torch.int64), -step))
            if shifted is not None:
                out.append((shifted, f"the ring rows of the {word} request in the batch, at the right positions"))
    return out


def _slots_of_other_requests(inputs, slots: torch.Tensor, positions: torch.Tensor, ring: int,
                             actual: torch.Tensor) -> torch.Tensor | None:
    """Per token, the live request slot whose ring row at the token's own position is the
    row it got, else its own slot: a permutation of the batch's request slots in any order.
    A row fits only at its own position and in a slot some live request holds, so this is
    no row read back by construction; None where the batch has one request."""
    n_req = len(inputs.request_ids)
    if n_req < 2:
        return None
    offsets, got = positions % ring, actual.to(torch.int64)
    slot_of_row = torch.div(got - offsets, ring, rounding_mode="floor")
    fits = ((got - offsets) % ring == 0) & torch.isin(slot_of_row, inputs.req_slots[:n_req].to(torch.int64))
    return torch.where(fits, slot_of_row, slots)


def explain_padding(history: History, site: Site, num_live: int, actual: torch.Tensor,
                    expected: torch.Tensor) -> Source | None:
    """Where every wrong padding row's value came from: the rows an earlier answer or the
    capture had at the same row indices, else this forward's live tokens; None if neither."""
    wrong = wrong_rows(actual[num_live:] != expected[num_live:]).nonzero().flatten() + num_live
    if not wrong.numel():
        return None
    values = actual[wrong]
    for source, rows in history.padding_candidates(site):
        if (rows.shape[0] > int(wrong.max()) and rows.shape[1:] == actual.shape[1:]
                and bool((rows[wrong] == values).all())):
            return source
    if num_live and bool(torch.isin(values, expected[:num_live]).all()):
        return Source(LIVE_TOKENS, "the rows of this forward's live tokens",
                      "padding rows were given live tokens' rows, so their writes overwrite those tokens' keys")
    return None


def padding_sentence(site: Site, row: int, value: int, aliases_live: bool, source: Source | None,
                     answered_by: str | None = None) -> str:
    """``answered_by``: the code that gave the answer and how ("X (file:line) returned"),
    where the subject names it."""
    padding = f"padding row {row}" + (f" that {answered_by}" if answered_by else "")
    where = f"at {site.describe()}, {padding} writes to {value}"
    where += ", which a live request owns, instead of the dummy slot" if aliases_live else ", not to the dummy slot"
    if source is None:
        return f"{where[0].upper()}{where[1:]}."
    label = "Stale cache" if source.kind in STALE_SOURCES else "Wrong padding"
    return f"{label}: {where}: the padding holds {source.phrase}: {source.consequence}."


# what a size or shape mismatch says in torch's and numpy's words
_SIZE_MISMATCH = re.compile(
    r"size of tensor|must match the size|sizes of tensors must match|shape mismatch|size mismatch"
    r"|is invalid for input of size|doesn't match the broadcast shape|cannot be broadcast|expected size"
    r"|shapes? .* (do not|don't|cannot) match|not broadcastable",
    re.IGNORECASE,
)


def ragged_expansion_hint(inputs, message: str) -> Source | None:
    """A size error on a ragged batch: likely a uniform expansion of request slots to tokens
    (``repeat_interleave(n_tokens // n_reqs)``) that only fits equal token counts."""
    n_req = len(inputs.request_ids)
    counts = inputs.token_counts[:n_req].tolist()
    if n_req < 2 or len(set(counts)) == 1 or not _SIZE_MISMATCH.search(message):
        return None
    per_request = inputs.num_live // n_req
    tokens = "token" if per_request == 1 else "tokens"
    return Source(
        UNIFORM_REPEAT, "a uniform expansion such as repeat_interleave(n_tokens // n_reqs)",
        f"it gives every request {per_request} {tokens} ({per_request * n_req} in all), but the batch's "
        f"token counts are {counts} ({inputs.num_live} in all)",
    )


def raised_sentence(site: Site, message: str, hint: Source | None) -> str:
    if hint is None:
        return f"At {site.describe()}, {message}."
    return f"At {site.describe()}, {message}; likely {hint.phrase} met this ragged batch: {hint.consequence}."


def wrong_rows_sentence(site: Site, source: Source, n_wrong: int, n_rows: int, answered_by: str | None = None,
                        held_in: str | None = None) -> str:
    """``answered_by``: as for :func:`padding_sentence`; ``held_in``: the field of the
    subject's state the rows were returned from, and which forward set it."""
    rows = ("all" if n_wrong == n_rows else f"{n_wrong} of {n_rows}") + " live rows"
    if answered_by:
        rows += f" that {answered_by}"
    if held_in:
        rows += f" from {held_in},"
    if source.kind == UNKNOWN:
        return f"At {site.describe()}, {rows} are wrong: {source.phrase}."
    label = "Stale cache" if source.kind in STALE_SOURCES else "Wrong rows"
    return f"{label}: at {site.describe()}, {rows} hold {source.phrase}: {source.consequence}."


# the kinds of a run whose process was lost (see swafuzz.supervisor)
EXITED, KILLED, HUNG = "exited", "killed", "hung"


def lost_run_divergence(kind: str, what_happened: str, ran_a_scenario: bool) -> Divergence:
    """The divergence of a process that ended (or was ended) while the subject ran in it."""
    where = "while running this scenario" if ran_a_scenario else "before it ran any scenario"
    harm = "stalls" if kind == HUNG else "takes down"
    sentence = f"{what_happened} {where}: in a serving engine this {harm} the worker and every request in flight."
    return Divergence(kind=kind, sentence=sentence, forward=None, event=None, mode=None, model=None,
                      draft_step=None, micro_batch=None, layer_id=None, call=0)
