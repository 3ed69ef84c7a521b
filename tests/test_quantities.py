"""Per-step values beside the SWA write location: the table, the subject API that answers
them, the compressed scenarios, and the built-in compressed designs, which the search finds.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings

from swafuzz import run_scenario
from swafuzz.api import tokens_request_slots
from swafuzz.errors import SubjectError
from swafuzz.quantities import QUANTITIES
from swafuzz.reference import UNREAD_PAGE, EngineConfig, EngineState, Event, Scenario, ScenarioError, page_table
from swafuzz.results.replay import load_replay
from swafuzz.run.diagnosis import DUMMY, EARLIER_FORWARD, EARLIER_STEP, GRAPH_CAPTURE
from swafuzz.search.fuzz import exhaustive, fuzz
from swafuzz.strategies.exhaustive import COMPRESSED_LEFT_OUT
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.scenarios import LONG_EXTEND, MAX_COMPRESSED_DRAFT_TOKENS, REALISTIC, scenarios
from swafuzz.subjects.builtin import CompressedMetadata, PageTable, Uncached
from swafuzz.subjects.registry import resolve_subject

ROOT = Path(__file__).resolve().parent.parent


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


# ---- the table ---------------------------------------------------------------------------


def test_each_compressed_write_location_is_read_by_the_layers_of_its_ratio_only():
    assert QUANTITIES["c4_out_loc"].read_by(4) and not QUANTITIES["c4_out_loc"].read_by(128)
    assert QUANTITIES["c128_out_loc"].read_by(128) and not QUANTITIES["c128_out_loc"].read_by(4)
    assert not any(q.read_by(0) for q in QUANTITIES.values())  # an SWA-only layer reads none


def test_a_compressed_write_location_is_the_group_slot_where_a_row_completes_a_group_else_the_dummy():
    inputs = SimpleNamespace(positions=torch.tensor([0, 2, 3, 127, 7]), out_cache_loc=torch.tensor([40, 41, 42, 1024, 0]))
    assert QUANTITIES["c4_out_loc"].truth(inputs, None).tolist() == [0, 0, 10, 256, 0]
    assert QUANTITIES["c128_out_loc"].truth(inputs, None).tolist() == [0, 0, 0, 8, 0]


def _planned(config: EngineConfig, events: list[Event]) -> tuple[EngineState, list]:
    """The engine model after ``events`` (admits, then forwards), with each forward's plan."""
    state, plans = EngineState(config), []
    for index, event in enumerate(events):
        if event.op == "forward":
            plans.append(state.plan_forward(event, index, f"events[{index}]"))
            state.finish_forward()
        else:
            state.apply(event, f"events[{index}]")
    return state, plans


def test_the_page_table_truth_is_the_req_to_token_pages_of_each_rows_request_where_a_layer_reads_them():
    config = EngineConfig(end_layer=2, compress_ratios=(4, 128), full_page_size=128, full_pool_size=128 * 8,
                          swa_pool_size=512, sliding_window=128)
    state, plans = _planned(config, [Event(op="admit", count=2),
                                     Event(op="forward", mode="extend", requests=(0, 1), tokens=(130, 3)),
                                     Event(op="forward", mode="extend", requests=(1,), tokens=(200,))])
    req_to_token = torch.zeros(config.num_req_slots, 512, dtype=torch.int64)
    for plan in plans:
        inputs = plan.steps[0][0]
        req_to_token[inputs.token_slots, inputs.positions] = inputs.out_cache_loc
    truth = QUANTITIES["page_table"].truth(inputs, state)
    plain = page_table(req_to_token, inputs.token_slots, int(inputs.positions.max()) + 1, 128)
    assert truth.dtype == plain.dtype == torch.int32 and truth.shape == plain.shape == (200, 2)
    own = torch.arange(2) < -(-(inputs.positions[:, None] + 1) // 128)  # a row's own pages
    assert torch.equal(truth[own], plain[own]) and bool((truth[~own] == UNREAD_PAGE).all())
    assert truth[0].tolist() == [plain[0, 0], UNREAD_PAGE] and truth[-1, 1] != UNREAD_PAGE


def test_a_page_table_answer_is_held_to_its_first_columns_where_a_layer_reads_them():
    page_table = QUANTITIES["page_table"]
    truth = torch.tensor([[5, UNREAD_PAGE], [5, 6]], dtype=torch.int32)
    wider = torch.tensor([[5, 9, 9], [5, 6, 9]], dtype=torch.int32)  # unread entries hold anything
    assert torch.equal(page_table.compared(wider, truth), truth)
    assert not torch.equal(page_table.compared(torch.tensor([[5, 9], [5, 7]], dtype=torch.int32), truth), truth)


# ---- the engine model --------------------------------------------------------------------


def test_an_swa_only_configuration_reads_and_writes_as_it_did_before_compress_ratios():
    config = EngineConfig(end_layer=2)
    assert "compress_ratios" not in config.to_dict()
    assert EngineConfig.from_dict(config.to_dict()) == config
    assert config.compress_ratio(1) == 0


def test_a_compressed_configuration_round_trips_and_names_each_layers_ratio():
    config = EngineConfig.from_dict({"start_layer": 1, "end_layer": 3, "compress_ratios": [0, 4, 128]})
    assert config.to_dict()["compress_ratios"] == [0, 4, 128]
    assert [config.compress_ratio(layer) for layer in config.stage_layers] == [4, 128]


@pytest.mark.parametrize("ratios, message", [([4], "needs a ratio for each of the 2 layers"),
                                             ([4, 8], "ratios must be among")])
def test_compress_ratios_that_do_not_describe_the_model_are_refused(ratios, message):
    with pytest.raises(ScenarioError, match=message):
        EngineConfig.from_dict({"end_layer": 2, "compress_ratios": ratios})


def test_a_committed_replay_file_of_an_swa_only_run_reads_back_to_the_same_scenario():
    path = sorted((ROOT / "reports" / "sglang-matrix").glob("*.json"))[0]
    recorded = json.loads(path.read_text())
    replay = load_replay(path)
    assert "compress_ratios" not in recorded["scenario"]["config"]
    assert replay.scenario.to_dict() == recorded["scenario"]
    assert replay.divergence.to_dict() == recorded["diagnosis"]


# ---- the subject API -----------------------------------------------------------------------


class _Recording(CompressedMetadata):
    """The correct design, noting every value it is asked for."""

    asked: list[tuple[int, int, str]] = []

    def per_step_value(self, batch, layer_id, quantity):
        type(self).asked.append((batch.forward_id, layer_id, quantity))
        return super().per_step_value(batch, layer_id, quantity)


def test_each_answered_value_is_asked_once_per_layer_that_reads_it_after_its_store():
    _Recording.asked = []
    scenario = _scenario({"end_layer": 4, "compress_ratios": [0, 4, 128, 4]},
                         [{"op": "admit", "count": 1}, {"op": "forward", "requests": [0]},
                          {"op": "forward", "requests": [0]}])
    result = run_scenario(_Recording, scenario)
    assert result.passed
    assert [(layer, q) for _, layer, q in _Recording.asked] == [
        (1, "c4_out_loc"), (2, "c128_out_loc"), (3, "c4_out_loc")] * 2
    assert result.checks == 2 * (4 + 3)  # per forward: 4 SWA stores and 3 values


class _AnswersOnlyC4(_Recording):
    answers = ("c4_out_loc",)


def test_a_value_the_subject_does_not_answer_is_never_asked():
    _AnswersOnlyC4.asked = []
    scenario = _scenario({"end_layer": 2, "compress_ratios": [4, 128]},
                         [{"op": "admit", "count": 1}, {"op": "forward", "requests": [0]}])
    assert run_scenario(_AnswersOnlyC4, scenario).passed
    assert [q for _, _, q in _AnswersOnlyC4.asked] == ["c4_out_loc"]


class _SwaOnlyWithAValueMethod(Uncached):
    def per_step_value(self, batch, layer_id, quantity):
        raise AssertionError("an SWA-only subject is asked for a per-step value")


@pytest.mark.parametrize("example", [name for name in EXAMPLES if name.startswith("compressed-")])
def test_an_swa_only_subject_is_checked_on_its_swa_rows_alone_on_a_compressed_model(example):
    scenario = EXAMPLES[example]
    swa_only = Scenario.from_dict({**scenario.to_dict(), "config": {
        k: v for k, v in scenario.config.to_dict().items() if k != "compress_ratios"}})
    result = run_scenario(_SwaOnlyWithAValueMethod, scenario)
    assert result.passed, result.divergence.sentence
    assert result.checks == run_scenario(Uncached, swa_only).checks


class _UnknownValue(Uncached):
    answers = ("c3_out_loc",)


def test_a_subject_answering_a_value_the_table_lacks_is_refused_before_the_run():
    with pytest.raises(SubjectError, match="c3_out_loc, which is not among the values the harness checks"):
        run_scenario(_UnknownValue, EXAMPLES["compressed-graph-replay"])


class _Int32Values(CompressedMetadata):
    def per_step_value(self, batch, layer_id, quantity):
        return super().per_step_value(batch, layer_id, quantity).int()


class _FirstPageOnly(PageTable):
    def per_step_value(self, batch, layer_id, quantity):
        return super().per_step_value(batch, layer_id, quantity)[:, :1]


@pytest.mark.parametrize("subject, kind, quantity, said", [
    (_Int32Values, "wrong_dtype", "c4_out_loc", "returned torch.int32, not torch.int64."),
    (_FirstPageOnly, "wrong_length", "page_table", "returned shape (3, 1) for 3 rows of at least 3 columns."),
], ids=["dtype", "too-few-pages"])
def test_a_value_of_the_wrong_dtype_or_shape_is_a_divergence_naming_the_value(subject, kind, quantity, said):
    d = run_scenario(subject, EXAMPLES["compressed-graph-replay"]).divergence
    assert (d.kind, d.quantity, d.layer_id) == (kind, quantity, 0)
    assert d.sentence == f"At forward 1 (extend), layer 0, per_step_value({quantity!r}) {said}"


class _PaddingPagesOffByOne(PageTable):
    def per_step_value(self, batch, layer_id, quantity):
        table = super().per_step_value(batch, layer_id, quantity)
        padding = (tokens_request_slots(batch) == 0)[:, None]  # the dummy request slot
        return torch.where(padding, table + 1, table)


def test_a_page_table_padding_row_off_the_dummy_page_is_a_padding_divergence_naming_the_value():
    # one request at position 3 replayed in a graph of two rows: a table of 4 pages, one padding row
    scenario = _scenario({"end_layer": 2, "compress_ratios": [4, 128], "graph_batch_sizes": [2]},
                         [{"op": "admit", "count": 1}, {"op": "forward", "mode": "extend", "requests": [0], "tokens": [3]},
                          {"op": "forward", "requests": [0], "graph": True}])
    d = run_scenario(_PaddingPagesOffByOne, scenario).divergence
    assert (d.kind, d.quantity) == ("padding", "page_table")
    assert d.sentence.startswith("At forward 2 (decode), layer 0, padding row 1 that per_step_value('page_table') "
                                 "returned writes to 1, not to the dummy slot"), d.sentence


class _RecordsReqToToken:
    """Keeps what ``ModelSpec.req_to_token`` holds at each metadata init (a copy)."""

    seen: list = []

    def init_forward_metadata(self, batch):
        held = self.spec.req_to_token
        type(self).seen.append(None if held is None else held.clone())
        super().init_forward_metadata(batch)


class _SeesReqToToken(_RecordsReqToToken, PageTable):
    seen: list = []


class _AnswersNoPageTable(_RecordsReqToToken, CompressedMetadata):
    seen: list = []


def test_req_to_token_holds_each_forwards_tokens_before_it_runs_and_only_for_page_table_subjects():
    example = EXAMPLES["compressed-graph-replay"]  # one request: an extend of 3 tokens first
    _SeesReqToToken.seen = []
    assert run_scenario(_SeesReqToToken, example).divergence is None
    first = _SeesReqToToken.seen[0]
    assert first.dtype == torch.int32 and first.shape[0] == example.config.num_req_slots
    assert first[1, :3].tolist() != [0, 0, 0] and not bool(first[0].any())
    _AnswersNoPageTable.seen = []
    assert run_scenario(_AnswersNoPageTable, example).divergence is None
    assert _AnswersNoPageTable.seen and all(seen is None for seen in _AnswersNoPageTable.seen)


def test_an_swa_finding_carries_no_value_name_in_its_record():
    d = run_scenario(resolve_subject("pool-start-layer").subject, EXAMPLES["first-swa-layer-not-start"]).divergence
    assert d.quantity is None and "quantity" not in d.to_dict()


# ---- the compressed scenarios --------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(scenarios(REALISTIC))
def test_an_swa_only_search_draws_no_compressed_model_and_at_most_4_draft_tokens(scenario):
    assert scenario.config.compress_ratios == () and scenario.config.num_draft_tokens <= 4
    assert all(n <= 8 for event in scenario.events for n in event.tokens)


def _found(condition):
    return find(scenarios(REALISTIC, compressed=True), condition,
                settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)))


def test_a_compressed_search_draws_models_with_c4_c128_and_swa_only_layers():
    scenario = _found(lambda s: {0, 4, 128} <= set(s.config.compress_ratios[s.config.start_layer:]))
    assert len(scenario.config.compress_ratios) == scenario.config.end_layer


def test_a_compressed_search_draws_prefills_past_a_c128_group_and_more_than_4_draft_tokens():
    long = _found(lambda s: any(n > 128 for e in s.events for n in e.tokens))
    assert max(n for e in long.events for n in e.tokens) <= LONG_EXTEND
    drafts = _found(lambda s: s.config.num_draft_tokens > 4 and any(e.mode == "verify" for e in s.events))
    assert drafts.config.num_draft_tokens <= MAX_COMPRESSED_DRAFT_TOKENS


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(scenarios(REALISTIC, compressed=True))
def test_a_compressed_search_pages_the_full_pool_in_multiples_of_128_tokens(scenario):
    assert scenario.config.full_page_size in (128, 256)


# ---- the built-in designs, found by the search ---------------------------------------------


@pytest.mark.parametrize("subject, source", [
    ("compressed-idle-stale", EARLIER_FORWARD),  # idle forwards reuse the metadata left in place
    ("compressed-unsliced", EARLIER_STEP),  # every draft step reads step 0's values
    ("compressed-first-layer", EARLIER_FORWARD),  # a stage past the refreshing layer reads old ones
    ("compressed-graph-assign", GRAPH_CAPTURE),  # the captured layers read the capture's values
    ("compressed-draft-pad4", DUMMY),  # draft tokens past the fourth write nothing
    ("page-table-captured", GRAPH_CAPTURE),  # replays read the page table of the capture
])
def test_the_search_finds_each_buggy_compressed_design_and_names_the_value_and_its_source(subject, source):
    result = fuzz(resolve_subject(subject), profile=REALISTIC, settings="ci", seed=0, max_examples=1500)
    d = result.divergence
    assert d is not None, f"{subject}: no divergence in {result.examples} examples"
    assert d.quantity in QUANTITIES and f"per_step_value({d.quantity!r}) returned" in d.sentence
    assert d.source["kind"] == source, d.sentence
    assert run_scenario(resolve_subject(subject).subject, result.scenario).divergence == d


def test_an_exhaustive_run_of_a_subject_answering_values_enumerates_compressed_models():
    clean = exhaustive(resolve_subject("page-table"), max_forwards=1, max_layers=2)
    assert clean.divergence is None and clean.examples > 100
    assert set(COMPRESSED_LEFT_OUT) <= set(clean.scope.left_out)
    found = exhaustive(resolve_subject("page-table-captured"), max_forwards=1, max_layers=2).divergence
    assert found is not None and (found.quantity, found.source["kind"]) == ("page_table", GRAPH_CAPTURE)
    assert not set(COMPRESSED_LEFT_OUT) & set(exhaustive(resolve_subject("uncached"), max_forwards=1,
                                                           max_layers=1).scope.left_out)

