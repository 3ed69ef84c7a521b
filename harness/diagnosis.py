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

from dataclasses import asdict, dataclass, field
from typing import Any

import re

import torch

from .reference import DUMMY_SLOT, EngineConfig

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
UNKNOWN = "unknown"
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

    @property
    def stale(self) -> bool:
        return self.source is not None and self.source["kind"] in STALE_SOURCES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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


def wrote_input_sentence(when: str, name: str, change: str) -> str:
    """``when``: "the end of forward 2 (decode)", "forward 2 (decode), layer 1", "the
    eviction after forward 2"; ``name``: the input (a batch field, or "mapping")."""
    return f"By {when}, the subject had {change}: {_READERS[name]}."


@dataclass
class _Answer:
    site: Site
    rows: torch.Tensor  # the live rows the reference gave


@dataclass
class History:
    """Reference answers and replaced mappings of one run, newest last."""

    answers: list[_Answer] = field(default_factory=list)
    captures: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)  # forward, rows, live rows
    # per model, the mapping as the latest sync left it (the executor keeps it in line), and
    # the changes that led there, newest last: a label, the rows changed (None: all) and
    # their values before
    mappings: dict[str, torch.Tensor] = field(default_factory=dict)
    changes: dict[str, list[tuple[str, torch.Tensor | None, torch.Tensor]]] = field(default_factory=dict)
    registrations: list[int] = field(default_factory=list)  # forwards run before each

    def record_answer(self, site: Site, live_rows: torch.Tensor) -> None:
        last = self.answers[-1] if self.answers else None
        if last is not None and (last.site.forward, last.site.draft_step, last.site.micro_batch) == (
            site.forward, site.draft_step, site.micro_batch
        ) and torch.equal(last.rows, live_rows):
            return
        self.answers.append(_Answer(site, live_rows))

    def record_capture(self, forward: int, rows: torch.Tensor, num_live: int) -> None:
        """``rows``: what the captured layers yield for the capture's inputs, of which the
        first ``num_live`` rows belong to live requests."""
        self.captures.append((forward, rows, num_live))

    def record_old_mapping(self, model: str, label: str, rows: torch.Tensor | None, values: torch.Tensor) -> None:
        """``model``'s mapping before a change held ``values`` at ``rows`` (None: ``values``
        is all of it). The caller hands them over and never writes them again."""
        kept = self.changes.setdefault(model, [])
        kept.append((label, rows, values))
        del kept[:-4]

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
            s = answer.site
            if s.model != site.model:
                other.append((Source(
                    OTHER_MODEL, f"the {s.model} model's rows of forward {s.forward} ({s.mode})",
                    f"one cache serves the {s.model} and {site.model} models, whose pools are separate",
                    s.forward, s.draft_step, s.micro_batch,
                ), answer.rows))
                continue
            if s.forward == site.forward and s.draft_step == site.draft_step and s.micro_batch == site.micro_batch:
                continue
            if s.forward == site.forward and s.draft_step == site.draft_step:
                source = Source(
                    OTHER_MICRO_BATCH, f"micro-batch {s.micro_batch}'s rows",
                    "one cache is shared by micro-batches whose layers interleave",
                    s.forward, s.draft_step, s.micro_batch,
                )
            elif s.forward == site.forward:
                source = Source(
                    EARLIER_STEP, f"the rows of draft step {s.draft_step}",
                    "the cache was not refreshed between draft steps", s.forward, s.draft_step, s.micro_batch,
                )
            else:
                registered = [r for r in self.registrations if s.forward <= r < site.forward]
                consequence = (
                    f"the cache outlived the new mapping registered after forward {registered[-1]}"
                    if registered else "a cached value was not refreshed for this forward"
                )
                source = Source(
                    EARLIER_FORWARD, f"the rows of forward {s.forward} ({s.mode})",
                    consequence, s.forward, s.draft_step, s.micro_batch,
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
        if truth == "pool":
            for label, mapping in self.old_mappings(site.model):
                loc = inputs.out_cache_loc[:n_tok]
                out.append((Source(
                    OLD_MAPPING, f"the translation under {label}",
                    "the cache was not invalidated when the mapping changed",
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
        out.append((Source(DUMMY, "the dummy slot", "live tokens would overwrite padding's slot"),
                    torch.full((n_tok,), DUMMY_SLOT, dtype=torch.int32)))
        return out

    def padding_candidates(self, site: Site) -> list[tuple[Source, torch.Tensor]]:
        """Live rows that padding may hold, aligned by row index: earlier answers, then the
        capture's. Rows a capture computed for padding inputs are left out: a padding row
        that matches them was computed the same wrong way again, not left stale."""
        same_model, other_model = self._earlier_answers(site)
        return [*same_model, *self._captured(live_only=True), *other_model]


def explain(
    history: History, site: Site, truth: str, inputs, config: EngineConfig, actual: torch.Tensor,
    expected: torch.Tensor,
) -> Source:
    """The first candidate that reproduces every wrong live row, else UNKNOWN."""
    wrong = actual != expected
    for source, rows in history.candidates(site, truth, inputs, config):
        if rows.shape == actual.shape and bool((rows[wrong] == actual[wrong]).all()):
            return source
    return Source(UNKNOWN, "rows that no earlier answer, mapping or fallback explains", "the value is wrong")


def explain_padding(history: History, site: Site, num_live: int, actual: torch.Tensor,
                    expected: torch.Tensor) -> Source | None:
    """Where every wrong padding row's value came from: the rows an earlier answer or the
    capture had at the same row indices, else this forward's live tokens; None if neither."""
    wrong = (actual[num_live:] != expected[num_live:]).nonzero().flatten() + num_live
    if not wrong.numel():
        return None
    values = actual[wrong]
    for source, rows in history.padding_candidates(site):
        if rows.shape[0] > int(wrong.max()) and bool((rows[wrong] == values).all()):
            return source
    if num_live and bool(torch.isin(values, expected[:num_live]).all()):
        return Source(LIVE_TOKENS, "the rows of this forward's live tokens",
                      "padding rows were given live tokens' rows, so their writes overwrite those tokens' keys")
    return None


def padding_sentence(site: Site, row: int, value: int, aliases_live: bool, source: Source | None) -> str:
    where = f"at {site.describe()}, padding row {row} writes to {value}"
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


def wrong_rows_sentence(site: Site, source: Source, n_wrong: int, n_rows: int) -> str:
    rows = "all" if n_wrong == n_rows else f"{n_wrong} of {n_rows}"
    if source.kind == UNKNOWN:
        return f"At {site.describe()}, {rows} live rows are wrong: {source.phrase}."
    label = "Stale cache" if source.kind in STALE_SOURCES else "Wrong rows"
    return f"{label}: at {site.describe()}, {rows} live rows hold {source.phrase}: {source.consequence}."
