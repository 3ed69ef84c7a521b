"""Specification of the diagnosis (``swafuzz.run.diagnosis``): a wrong value is traced to where it
came from whenever the run holds a source that reproduces it.

Each test hand-writes a small subject with one known mistake and pins the sentence and the
source kind the diagnosis gives it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from swafuzz import Subject, Truth, run_scenario
from swafuzz.subjects.builtin import Uncached, UncachedRing
from swafuzz.run.diagnosis import STALE_SOURCES, History, Site, explain, explain_padding
from swafuzz.reference import Scenario

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


def _divergence(subject, scenario):
    result = run_scenario(subject, scenario)
    assert result.divergence is not None, f"{subject.__name__} passed"
    return result.divergence


# ---- the other model's answers -------------------------------------------------------------


class _OneCacheForBothModels(Uncached):
    """A cache held by the class, so one model's pool reads what the other's wrote."""

    refreshed_by = "target"
    shared: dict = {}

    def __init__(self, spec):
        super().__init__(spec)
        if spec.model == "target":  # made first: a run starts with an empty cache
            type(self).shared = {}

    def swa_write_location(self, batch, layer_id):
        if self.spec.model == self.refreshed_by:
            type(self).shared["rows"] = super().swa_write_location(batch, layer_id)
        return type(self).shared["rows"]


class _OneCacheRefreshedByTheDraft(_OneCacheForBothModels):
    refreshed_by = "draft"


@pytest.mark.parametrize("subject, modes, sentence", [
    (_OneCacheForBothModels, ("decode", "draft"),
     "Stale cache: at forward 2 (draft), layer 0, all live rows hold the target model's rows of forward 1 "
     "(decode): one cache serves the target and draft models, whose pools are separate."),
    (_OneCacheRefreshedByTheDraft, ("draft", "decode"),
     "Stale cache: at forward 2 (decode), layer 0, all live rows hold the draft model's rows of forward 1 "
     "(draft): one cache serves the draft and target models, whose pools are separate."),
], ids=["target-rows-to-draft", "draft-rows-to-target"])
def test_rows_one_model_produced_served_to_the_other_model_are_named(subject, modes, sentence):
    scenario = _scenario({"end_layer": 1, "speculative": True, "draft_model": True}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "mode": modes[0], "requests": [0, 1]},
        {"op": "forward", "mode": modes[1], "requests": [0, 1]},
    ])
    d = _divergence(subject, scenario)
    assert (d.kind, d.source["kind"], d.forward, d.source["forward"]) == ("wrong_rows", "other_model", 2, 1)
    assert "other_model" in STALE_SOURCES and d.stale
    assert d.sentence == sentence


# ---- ring rows computed with the window ----------------------------------------------------


class _RingOfWindowSize(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens, output_size=batch.num_tokens)
        window = self.spec.sliding_window
        return (slots * window + batch.positions % window).to(torch.int32)


def test_ring_rows_computed_with_the_sliding_window_instead_of_the_ring_size_are_named():
    scenario = _scenario({"end_layer": 1, "sliding_window": 4, "speculative": True, "num_draft_tokens": 3}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [2, 3]},
    ])
    d = _divergence(_RingOfWindowSize, scenario)
    assert (d.kind, d.source["kind"]) == ("wrong_rows", "window_ring")
    assert not d.stale
    assert d.sentence == (
        "Wrong rows: at forward 1 (extend), layer 0, all live rows hold ring rows computed with the sliding "
        "window 4 instead of the ring size 6: under speculative decoding each request slot's ring holds "
        "window + num_draft_tokens - 1 = 6 rows."
    )


# ---- where padding's values came from ------------------------------------------------------


class _TrustsMetadataByLength(Uncached):
    """Translates in metadata init and trusts it whenever the length matches, idle included."""

    def init_forward_metadata(self, batch):
        batch.backend.rows = super().swa_write_location(batch, 0)

    def swa_write_location(self, batch, layer_id):
        cached = getattr(batch.backend, "rows", None)
        if cached is not None and cached.shape[0] == batch.num_tokens:
            return cached
        return super().swa_write_location(batch, layer_id)


def test_padding_holding_an_earlier_forwards_rows_names_that_forward():
    scenario = _scenario({"end_layer": 1}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "requests": [0, 1]},
        {"op": "forward", "mode": "idle", "pad": 2, "skip_init": True},
    ])
    d = _divergence(_TrustsMetadataByLength, scenario)
    assert (d.kind, d.source["kind"], d.source["forward"]) == ("padding", "earlier_forward", 1)
    assert d.sentence == (
        "Stale cache: at forward 2 (idle), layer 0, padding row 0 writes to 1, which a live request owns, "
        "instead of the dummy slot: the padding holds the rows of forward 1 (decode): a cached value was not "
        "refreshed for this forward."
    )


class _PadsWithTheLastLiveRow(Uncached):
    """Fills padding rows (full slot 0) with the last live row, in capturable tensor ops."""

    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        live = batch.out_cache_loc != 0
        last = (live.sum() - 1).clamp(min=0).reshape(1)
        return torch.where(live, rows, rows.index_select(0, last))


def test_padding_holding_this_forwards_live_rows_says_so():
    scenario = _scenario({"end_layer": 1, "graph_batch_sizes": [4]}, [
        {"op": "admit", "count": 3},
        {"op": "forward", "requests": [0, 1, 2], "graph": True},
    ])
    d = _divergence(_PadsWithTheLastLiveRow, scenario)
    assert (d.kind, d.source["kind"]) == ("padding", "live_tokens")
    assert d.sentence == (
        "Wrong padding: at forward 1 (decode), layer 0, padding row 3 writes to 3, which a live request owns, "
        "instead of the dummy slot: the padding holds the rows of this forward's live tokens: padding rows "
        "were given live tokens' rows, so their writes overwrite those tokens' keys."
    )


def test_padding_holding_live_rows_recorded_at_graph_capture_names_the_capture():
    history = History()
    history.record_capture(1, torch.tensor([0, 0, 5, 7], dtype=torch.int32), num_live=4)
    site = Site(forward=2, event=2, mode="decode", model="target", draft_step=0, micro_batch=0, layer_id=0, call=3)
    actual = torch.tensor([9, 0, 5, 7], dtype=torch.int32)
    expected = torch.tensor([9, 0, 0, 0], dtype=torch.int32)
    source = explain_padding(history, site, 1, actual, expected)
    assert (source.kind, source.forward) == ("graph_capture", 1)


def test_padding_rows_computed_the_same_wrong_way_at_capture_are_not_blamed_on_the_capture():
    # the capture ran on padding inputs only: its rows there are the subject's formula, not
    # live rows a replay failed to update
    history = History()
    history.record_capture(1, torch.tensor([77, 77, 77, 77], dtype=torch.int32), num_live=0)
    site = Site(forward=2, event=2, mode="decode", model="target", draft_step=0, micro_batch=0, layer_id=0, call=3)
    actual = torch.tensor([9, 77, 77, 77], dtype=torch.int32)
    expected = torch.tensor([9, 0, 0, 0], dtype=torch.int32)
    assert explain_padding(history, site, 1, actual, expected) is None


def test_padding_no_recorded_rows_explain_keeps_the_plain_sentence():
    scenario = _scenario({"end_layer": 1, "graph_batch_sizes": [4]}, [
        {"op": "admit", "count": 3},
        {"op": "forward", "requests": [0, 1, 2], "graph": True},
    ])

    class PadsTo77(Uncached):
        def swa_write_location(self, batch, layer_id):
            rows = super().swa_write_location(batch, layer_id)
            return torch.where(batch.out_cache_loc != 0, rows, 77).to(torch.int32)

    d = _divergence(PadsTo77, scenario)
    assert (d.kind, d.source["kind"]) == ("padding", "unknown")
    assert d.sentence == "At forward 1 (decode), layer 0, padding row 3 writes to 77, not to the dummy slot."


# ---- a shape error on a ragged batch -------------------------------------------------------


class _UniformExpansion(Subject):
    """Expands request slots to tokens as if every request had the same token count."""

    truth = Truth.RING

    def swa_write_location(self, batch, layer_id):
        slots = batch.req_pool_indices.repeat_interleave(batch.num_tokens // batch.batch_size)
        return (slots * self.spec.ring + batch.positions % self.spec.ring).to(torch.int32)


def _extend(tokens: list[int]) -> Scenario:
    return _scenario({"end_layer": 1}, [
        {"op": "admit", "count": len(tokens)},
        {"op": "forward", "mode": "extend", "requests": list(range(len(tokens))), "tokens": tokens},
    ])


def test_a_size_error_on_a_ragged_batch_hints_that_a_uniform_expansion_met_it():
    d = _divergence(_UniformExpansion, _extend([2, 1, 2]))
    assert (d.kind, d.source["kind"]) == ("raised", "uniform_repeat")
    assert d.sentence.startswith("At forward 1 (extend), layer 0, swa_write_location raised RuntimeError: ")
    assert d.sentence.endswith(
        "; likely a uniform expansion such as repeat_interleave(n_tokens // n_reqs) met this ragged batch: "
        "it gives every request 1 token (3 in all), but the batch's token counts are [2, 1, 2] (5 in all)."
    )


def test_the_uniform_expansion_passes_a_batch_whose_counts_are_equal():
    assert run_scenario(_UniformExpansion, _extend([2, 2])).passed


def test_an_error_that_is_not_about_sizes_gets_no_ragged_hint():
    class RaisesKeyError(UncachedRing):
        def swa_write_location(self, batch, layer_id):
            raise KeyError("layer")

    d = _divergence(RaisesKeyError, _extend([2, 1]))
    assert d.kind == "raised" and d.source is None
    assert d.sentence == "At forward 1 (extend), layer 0, swa_write_location raised KeyError: 'layer'."


def test_a_size_error_on_a_uniform_batch_gets_no_ragged_hint():
    class SizeErrorAnyway(UncachedRing):
        def swa_write_location(self, batch, layer_id):
            return batch.positions[:2] + batch.positions[:3]

    d = _divergence(SizeErrorAnyway, _extend([2, 2]))
    assert d.kind == "raised" and d.source is None
    assert "likely" not in d.sentence


def test_earlier_mappings_are_rebuilt_from_the_current_one_newest_first():
    history = History()
    first = torch.tensor([0, 5, 6, 7])
    history.mappings["target"] = current = first.clone()
    rows = torch.tensor([1, 2])
    history.record_old_mapping("target", "the mapping before forward 2", rows, current[rows])
    current[rows] = torch.tensor([8, 9])
    history.record_old_mapping("target", "the previously registered mapping", None, current)
    history.mappings["target"] = current = torch.tensor([0, 1, 2, 3])
    history.record_old_mapping("target", "the mapping before forward 3", torch.tensor([3]), current[[3]])
    current[3] = 4
    assert [(label, mapping.tolist()) for label, mapping in history.old_mappings("target")] == [
        ("the mapping before forward 3", [0, 1, 2, 3]),
        ("the previously registered mapping", [0, 8, 9, 7]),
        ("the mapping before forward 2", [0, 5, 6, 7]),
    ]
    assert history.mappings["target"].tolist() == [0, 1, 2, 4]  # rebuilding leaves it as it is


def _explain_pool_rows(history: History, out_cache_loc: list[int], actual: list[int]):
    inputs = SimpleNamespace(num_live=len(out_cache_loc), request_ids=tuple(range(len(out_cache_loc))),
                             out_cache_loc=torch.tensor(out_cache_loc), token_counts=torch.ones(len(out_cache_loc)))
    site = Site(forward=3, event=9, mode="decode", model="target", draft_step=0, micro_batch=0, layer_id=0, call=5)
    expected = history.mappings["target"][inputs.out_cache_loc].to(torch.int32)
    config = SimpleNamespace(ring=4, sliding_window=4)
    return explain(history, site, "pool", inputs, config, torch.tensor(actual, dtype=torch.int32), expected)


def test_a_cache_that_missed_several_mapping_changes_is_traced_to_the_mapping_it_kept():
    history = History()
    history.mappings["target"] = current = torch.tensor([0, 11, 12, 13, 14])
    for change in range(8):  # each moves slot 1 on, so each earlier mapping is told apart
        history.record_old_mapping("target", f"the mapping before event {change}", torch.tensor([1]), current[[1]])
        current[1] = 20 + change
    source = _explain_pool_rows(history, [1, 2], [26, 12])
    assert (source.kind, source.phrase, source.consequence) == (
        "old_mapping", "the translation under the mapping before event 7",
        "the cache was not invalidated when the mapping changed")
    source = _explain_pool_rows(history, [1, 2], [11, 12])  # the first mapping, eight changes back
    assert (source.kind, source.phrase, source.consequence) == (
        "old_mapping", "the translation under the mapping before event 0",
        "the cache was not invalidated at any of the 8 changes of the mapping since")


# ---- recurring patterns of wrong rows ------------------------------------------------------------

EXTEND_AFTER_PREFIX = [
    {"op": "admit", "count": 2},
    {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [2, 3]},
    {"op": "relocate", "request": 0},  # the translation is no longer the identity
    {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [2, 1]},
]


def _ring_rows(slots, positions, ring):
    return (slots * ring + positions % ring).to(torch.int32)


class _PositionsFromThisStepsTokens(UncachedRing):
    """Rebuilds each token's position from this step's token counts alone: the cached prefix
    an extend continues is left out."""

    def swa_write_location(self, batch, layer_id):
        starts = torch.cumsum(batch.extend_seq_lens, 0) - batch.extend_seq_lens
        within = torch.arange(batch.num_tokens) - starts.repeat_interleave(batch.extend_seq_lens)
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens)
        return _ring_rows(slots, within, self.spec.ring)


class _PositionsOffByOne(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens)
        return _ring_rows(slots, batch.positions + 1, self.spec.ring)


class _RingStrideOffByOne(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens)
        return (slots * (self.spec.ring + 1) + batch.positions % self.spec.ring).to(torch.int32)


class _SlotOfTheNextRequest(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        slots = torch.roll(batch.req_pool_indices, -1).repeat_interleave(batch.extend_seq_lens)
        return _ring_rows(slots, batch.positions, self.spec.ring)


class _NextFullPoolSlot(Uncached):
    def swa_write_location(self, batch, layer_id):
        return self.mapping[(batch.out_cache_loc + 1).clamp(max=self.mapping.shape[0] - 1)].to(torch.int32)


class _Untranslated(Uncached):
    def swa_write_location(self, batch, layer_id):
        return batch.out_cache_loc.to(torch.int32)


@pytest.mark.parametrize("subject, kind, phrase", [
    (_PositionsFromThisStepsTokens, "position_shift",
     "the ring rows of each token's own request at each token's position minus its request's cached prefix length"),
    (_PositionsOffByOne, "position_shift", "the ring rows of each token's own request at each token's position +1"),
    (_RingStrideOffByOne, "ring_size_off", "ring rows computed with 9 as each slot's stride instead of the ring size 8"),
    (_SlotOfTheNextRequest, "other_request", "the ring rows of the next request in the batch, at the right positions"),
    (_NextFullPoolSlot, "neighbour_slot", "the translation of each token's next full-pool slot"),
    (_Untranslated, "untranslated", "the full-pool locations themselves"),
])
def test_a_recurring_pattern_of_wrong_rows_is_named_when_it_explains_every_one(subject, kind, phrase):
    d = _divergence(subject, _scenario({"end_layer": 1, "sliding_window": 8}, EXTEND_AFTER_PREFIX))
    assert d.source["kind"] == kind and phrase in d.sentence, d.sentence
    assert not d.stale


class _RequestSlotsReversed(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        slots = torch.flip(batch.req_pool_indices, [0]).repeat_interleave(batch.extend_seq_lens)
        return _ring_rows(slots, batch.positions, self.spec.ring)


def test_tokens_given_other_live_requests_slots_in_any_order_are_named():
    scenario = _scenario({"end_layer": 1, "sliding_window": 8}, [
        {"op": "admit", "count": 3},
        {"op": "forward", "mode": "extend", "requests": [0, 1, 2], "tokens": [2, 2, 2]},
        {"op": "forward", "mode": "extend", "requests": [0, 1, 2], "tokens": [2, 2, 2]},
    ])
    d = _divergence(_RequestSlotsReversed, scenario)
    assert d.source["kind"] == "other_request"
    assert "the ring rows of other requests in the batch, at the right positions: the request slots were permuted" \
        in d.sentence, d.sentence


class _VerifyPositionsFromSeqLens(UncachedRing):
    """Rebuilds positions from seq_lens, which in target-verify leaves the draft tokens out."""

    def swa_write_location(self, batch, layer_id):
        ends = batch.seq_lens.repeat_interleave(batch.extend_seq_lens)
        starts = torch.cumsum(batch.extend_seq_lens, 0) - batch.extend_seq_lens
        within = torch.arange(batch.num_tokens) - starts.repeat_interleave(batch.extend_seq_lens)
        slots = batch.req_pool_indices.repeat_interleave(batch.extend_seq_lens)
        counts = batch.extend_seq_lens.repeat_interleave(batch.extend_seq_lens)
        return _ring_rows(slots, ends - counts + within, self.spec.ring)


def test_positions_rebuilt_from_seq_lens_in_target_verify_are_named_by_the_draft_tokens():
    scenario = _scenario({"end_layer": 1, "sliding_window": 8, "speculative": True, "num_draft_tokens": 3}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [2, 3]},
        {"op": "forward", "mode": "verify", "requests": [0, 1]},
    ])
    d = _divergence(_VerifyPositionsFromSeqLens, scenario)
    assert d.source["kind"] == "position_shift"
    assert "minus its request's token count (in target-verify, the draft tokens that seq_lens leaves out)" in d.sentence


class _FirstTokenWrong(UncachedRing):
    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id).clone()
        rows[0] += 5
        rows[1] += 1
        return rows


def test_rows_no_pattern_explains_say_which_rows_are_wrong_and_the_closest_candidate():
    d = _divergence(_FirstTokenWrong, _scenario({"end_layer": 1, "sliding_window": 8}, EXTEND_AFTER_PREFIX[:2]))
    assert d.source["kind"] == "unknown"
    assert ("rows that no earlier answer, mapping or fallback explains (wrong: request 0 of 2, all its tokens; "
            "closest: ") in d.sentence and "which explains 1 of 2)" in d.sentence
