"""Divergences and where a wrong value came from.

The executor keeps every answer the reference gave during a run (per forward, draft step
and micro-batch) and the mappings that were replaced. When a subject's rows are wrong, each
of those is a candidate source; the first that reproduces every wrong row names the bug.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from reference import DUMMY_SLOT

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
KINDS = (WRONG_ROWS, PADDING, WRONG_DTYPE, WRONG_LENGTH, WRONG_DEVICE, NON_TENSOR, RAISED, TIMEOUT, CAPTURE, RACE)

# Where the wrong rows came from (the source kind).
EARLIER_FORWARD = "earlier_forward"
EARLIER_STEP = "earlier_step"
OTHER_MICRO_BATCH = "other_micro_batch"
GRAPH_CAPTURE = "graph_capture"
OLD_MAPPING = "old_mapping"
UNIFORM_REPEAT = "uniform_repeat"
DUMMY = "dummy"
ALIASES_LIVE = "aliases_live"
UNKNOWN = "unknown"
# sources that mean a cache handed out a value computed for other inputs
STALE_SOURCES = (EARLIER_FORWARD, EARLIER_STEP, OTHER_MICRO_BATCH, GRAPH_CAPTURE, OLD_MAPPING)


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


@dataclass
class _Answer:
    site: Site
    rows: torch.Tensor  # the live rows the reference gave


@dataclass
class History:
    """Reference answers and replaced mappings of one run, newest last."""

    answers: list[_Answer] = field(default_factory=list)
    captures: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    old_mappings: dict[str, list[tuple[str, torch.Tensor]]] = field(default_factory=dict)
    registrations: list[int] = field(default_factory=list)  # forwards run before each

    def record_answer(self, site: Site, live_rows: torch.Tensor) -> None:
        last = self.answers[-1] if self.answers else None
        if last is not None and (last.site.forward, last.site.draft_step, last.site.micro_batch) == (
            site.forward, site.draft_step, site.micro_batch
        ) and torch.equal(last.rows, live_rows):
            return
        self.answers.append(_Answer(site, live_rows))

    def record_capture(self, forward: int, rows: torch.Tensor) -> None:
        self.captures.append((forward, rows))

    def record_old_mapping(self, model: str, label: str, mapping: torch.Tensor) -> None:
        kept = self.old_mappings.setdefault(model, [])
        kept.append((label, mapping.clone()))
        del kept[:-4]

    def candidates(self, site: Site, truth: str, inputs, ring: int) -> list[tuple[Source, torch.Tensor]]:
        out: list[tuple[Source, torch.Tensor]] = []
        for answer in reversed(self.answers):
            s = answer.site
            if s.model != site.model:
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
            out.append((source, answer.rows))
        for forward, rows in reversed(self.captures):
            out.append((Source(
                GRAPH_CAPTURE, f"the rows recorded at graph capture (forward {forward})",
                "the captured layers read a tensor that the replay no longer updates", forward,
            ), rows[: inputs.num_live]))
        if truth == "pool":
            for label, mapping in reversed(self.old_mappings.get(site.model, [])):
                loc = inputs.out_cache_loc[: inputs.num_live]
                out.append((Source(
                    OLD_MAPPING, f"the translation under {label}",
                    "the cache was not invalidated when the mapping changed",
                ), mapping[loc].to(torch.int32)))
        else:
            counts = inputs.token_counts[: len(inputs.request_ids)]
            n_req, n_tok = len(inputs.request_ids), inputs.num_live
            if n_req and n_tok % n_req == 0 and bool((counts != n_tok // n_req).any()):
                slots = inputs.req_slots[:n_req].repeat_interleave(n_tok // n_req)
                rows = (slots * ring + inputs.positions[:n_tok] % ring).to(torch.int32)
                out.append((Source(
                    UNIFORM_REPEAT, "the uniform repeat_interleave fallback",
                    f"it gives every request {n_tok // n_req} tokens, but their counts are "
                    f"{counts.tolist()}",
                ), rows))
        out.append((Source(DUMMY, "the dummy slot", "live tokens would overwrite padding's slot"),
                    torch.full((inputs.num_live,), DUMMY_SLOT, dtype=torch.int32)))
        return out


def explain(
    history: History, site: Site, truth: str, inputs, ring: int, actual: torch.Tensor, expected: torch.Tensor
) -> Source:
    """The first candidate that reproduces every wrong live row, else UNKNOWN."""
    wrong = actual != expected
    for source, rows in history.candidates(site, truth, inputs, ring):
        if rows.shape == actual.shape and bool((rows[wrong] == actual[wrong]).all()):
            return source
    return Source(UNKNOWN, "rows that no earlier answer, mapping or fallback explains", "the value is wrong")


def wrong_rows_sentence(site: Site, source: Source, n_wrong: int, n_rows: int) -> str:
    rows = "all" if n_wrong == n_rows else f"{n_wrong} of {n_rows}"
    if source.kind == UNKNOWN:
        return f"At {site.describe()}, {rows} live rows are wrong: {source.phrase}."
    label = "Stale cache" if source.kind in STALE_SOURCES else "Wrong rows"
    return f"{label}: at {site.describe()}, {rows} live rows hold {source.phrase}: {source.consequence}."
