"""Specification of scenario parsing: malformed input is a ScenarioError naming the field,
and every valid scenario survives a JSON round trip unchanged."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from swafuzz import run_scenario
from swafuzz.subjects.builtin import PoolStartLayer, Uncached
from swafuzz.reference import SCENARIO_VERSION, EngineConfig, EngineState, Event, Scenario, ScenarioError
from swafuzz.strategies.examples import EXAMPLES

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FAST = settings(max_examples=75, deadline=None)

_TWO = {"op": "admit", "count": 2}


def _parse(config: dict | None = None, events: list | None = None, **top) -> Scenario:
    data = {"config": config or {}, "events": events or [], **top}
    return Scenario.from_dict(data)


def _forward(**fields) -> dict:
    return {"op": "forward", "requests": [0, 1], **fields}


def _rejects(field: str, *, config=None, events=None, **top) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        _parse(config, events, **top)
    assert str(info.value).startswith(field + ":"), f"{field!r} not named first in {str(info.value)!r}"
    return info.value


# ---- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, field",
    [
        ({"start_layer": -1}, "config.start_layer"),
        ({"start_layer": 4, "end_layer": 4}, "config.start_layer"),
        ({"start_layer": 5, "end_layer": 2}, "config.start_layer"),
        ({"sliding_window": 0}, "config.sliding_window"),
        ({"sliding_window": -8}, "config.sliding_window"),
        ({"num_draft_tokens": 0, "speculative": True}, "config.num_draft_tokens"),
        ({"num_draft_tokens": 3}, "config.num_draft_tokens"),
        ({"num_req_slots": 1}, "config.num_req_slots"),
        ({"num_req_slots": -4}, "config.num_req_slots"),
        ({"full_page_size": 0}, "config.full_page_size"),
        ({"swa_page_size": -2}, "config.swa_page_size"),
        ({"full_pool_size": -16}, "config.full_pool_size"),
        ({"swa_pool_size": 0}, "config.swa_pool_size"),
        ({"full_pool_size": 4, "full_page_size": 4}, "config.full_pool_size"),
        ({"swa_pool_size": 10, "swa_page_size": 4}, "config.swa_pool_size"),
        ({"num_req_slots": 2**30, "sliding_window": 4}, "config.num_req_slots"),
        ({"graph_batch_sizes": [0]}, "config.graph_batch_sizes"),
        ({"graph_batch_sizes": [-1, 2]}, "config.graph_batch_sizes"),
        ({"non_swa_layers": [4]}, "config.non_swa_layers"),
        ({"start_layer": 2, "end_layer": 4, "non_swa_layers": [1]}, "config.non_swa_layers"),
    ],
)
def test_config_out_of_range_is_rejected_naming_the_field(config, field):
    _rejects(field, config=config)


def test_start_layer_not_below_end_layer_message_mentions_both():
    error = _rejects("config.start_layer", config={"start_layer": 3, "end_layer": 3})
    assert "end_layer" in str(error)


def test_zero_window_is_rejected_as_a_zero_ring():
    error = _rejects("config.sliding_window", config={"sliding_window": 0})
    assert "ring" in str(error)


def test_config_rejects_unknown_fields_by_name():
    error = _rejects("config", config={"window": 8, "sliding_window": 8})
    assert "'window'" in str(error)


@pytest.mark.parametrize(
    "config, field",
    [
        ({"sliding_window": "8"}, "config.sliding_window"),
        ({"sliding_window": 8.0}, "config.sliding_window"),
        ({"end_layer": True}, "config.end_layer"),
        ({"end_layer": None}, "config.end_layer"),
        ({"speculative": 1}, "config.speculative"),
        ({"draft_model": "yes"}, "config.draft_model"),
        ({"non_swa_layers": 1}, "config.non_swa_layers"),
        ({"non_swa_layers": [True]}, "config.non_swa_layers"),
        ({"graph_batch_sizes": ["4"]}, "config.graph_batch_sizes"),
    ],
)
def test_config_of_wrong_type_is_rejected_naming_the_field(config, field):
    _rejects(field, config=config)


def test_config_that_is_not_an_object_is_rejected():
    with pytest.raises(ScenarioError, match="^config: expected an object, got list"):
        Scenario.from_dict({"config": [1, 2]})
    with pytest.raises(ScenarioError, match="^config: expected an object, got NoneType"):
        Scenario.from_dict({"config": None})


def test_an_empty_config_is_the_default_configuration():
    assert _parse().config == EngineConfig()


# ---- events --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event, field",
    [
        ({"op": "admit", "count": 0}, "events[1].count"),
        ({"op": "admit", "count": -2}, "events[1].count"),
        ({"op": "finish", "request": -1}, "events[1].request"),
        ({"op": "register_mapping", "shuffle": -3}, "events[1].shuffle"),
        (_forward(mode="extend", tokens=[0, 2]), "events[1].tokens"),
        (_forward(mode="draft", steps=0), "events[1].steps"),
        (_forward(micro_batches=0), "events[1].micro_batches"),
        (_forward(requests=[-1]), "events[1].requests"),
        ({"op": "forward", "mode": "idle", "pad": -1}, "events[1].pad"),
    ],
)
def test_event_negative_or_zero_sizes_are_rejected_naming_the_field(event, field):
    _rejects(field, events=[_TWO, event])


@pytest.mark.parametrize(
    "event, field",
    [
        ({"op": "admit", "count": "2"}, "events[1].count"),
        ({"op": "finish", "request": 1.0}, "events[1].request"),
        (_forward(requests=0), "events[1].requests"),
        (_forward(requests=["0"]), "events[1].requests"),
        (_forward(skip_init="true"), "events[1].skip_init"),
        (_forward(graph=1), "events[1].graph"),
        (_forward(layers=[0.5]), "events[1].layers"),
        (_forward(skip_layers=0), "events[1].skip_layers"),
        (_forward(micro_batches=2, order="0101"), "events[1].order"),
        (_forward(mutation=[1, "relocate"]), "events[1].mutation"),
        (_forward(mutation={"after_calls": "1", "op": "relocate"}), "events[1].mutation.after_calls"),
    ],
)
def test_event_of_wrong_type_is_rejected_naming_the_field(event, field):
    _rejects(field, events=[_TWO, event])


@pytest.mark.parametrize(
    "event, unknown",
    [
        ({"op": "admit", "requests": [0]}, "'requests'"),
        ({"op": "clear", "request": 0}, "'request'"),
        ({"op": "finish", "request": 0, "count": 1}, "'count'"),
        (_forward(batch=4), "'batch'"),
        (_forward(shuffle=2), "'shuffle'"),
    ],
)
def test_event_unknown_fields_are_rejected_by_name(event, unknown):
    error = _rejects("events[1]", events=[_TWO, event])
    assert unknown in str(error)


def test_mutation_unknown_field_is_rejected_by_name():
    error = _rejects("events[1].mutation", events=[_TWO, _forward(mutation={"after_calls": 1, "op": "relocate", "when": 1})])
    assert "'when'" in str(error)


def test_mutation_without_after_calls_is_rejected():
    error = _rejects("events[1].mutation", events=[_TWO, _forward(mutation={"op": "relocate"})])
    assert "after_calls" in str(error)


@pytest.mark.parametrize("op", ["allocate", None, "Forward", 3])
def test_unknown_event_op_is_rejected_listing_the_known_ones(op):
    error = _rejects("events[1].op", events=[_TWO, {"op": op}])
    assert "forward" in str(error) and "register_mapping" in str(error)


@pytest.mark.parametrize("mode", ["prefill", "DECODE", None, 1])
def test_unknown_forward_mode_is_rejected(mode):
    error = _rejects("events[1].mode", events=[_TWO, _forward(mode=mode)])
    assert "decode" in str(error)


def test_unknown_mutation_op_is_rejected():
    _rejects("events[1].mutation.op", events=[_TWO, _forward(mutation={"after_calls": 0, "op": "clear"})])


def test_event_that_is_not_an_object_is_rejected():
    _rejects("events[0]", events=["admit"])


def test_events_that_are_not_a_list_are_rejected():
    with pytest.raises(ScenarioError, match=r"^scenario\.events: expected a list"):
        Scenario.from_dict({"events": {"op": "admit"}})


@pytest.mark.parametrize(
    "event, field",
    [
        ({"op": "forward", "requests": []}, "events[1].requests"),
        ({"op": "forward", "mode": "idle", "requests": [0]}, "events[1].requests"),
        (_forward(requests=[0, 0]), "events[1].requests"),
        (_forward(mode="extend"), "events[1].tokens"),
        (_forward(mode="extend", tokens=[1]), "events[1].tokens"),
        (_forward(tokens=[1, 1]), "events[1].tokens"),
        (_forward(steps=2), "events[1].steps"),
        (_forward(micro_batches=3), "events[1].micro_batches"),
        (_forward(micro_batches=2, graph=True), "events[1].graph"),
        (_forward(mode="extend", tokens=[1, 1], graph=True), "events[1].graph"),
        (_forward(graph=True, mutation={"after_calls": 0, "op": "relocate"}), "events[1].mutation"),
        (_forward(pad=2), "events[1].pad"),
        (_forward(order=[0, 0]), "events[1].order"),
    ],
)
def test_impossible_forward_shapes_are_rejected_naming_the_field(event, field):
    _rejects(field, events=[_TWO, event])


@pytest.mark.parametrize("name", ["requests", "tokens", "skip_layers"])
def test_a_null_list_field_that_has_a_list_default_is_rejected_naming_it(name):
    error = _rejects(f"events[1].{name}", events=[_TWO, {**_forward(mode="extend", tokens=[1, 1]), name: None}])
    assert "expected a list of integers, got None" in str(error)


def test_graph_with_micro_batches_is_rejected():
    error = _rejects("events[1].graph", events=[_TWO, _forward(micro_batches=2, graph=True)])
    assert "single micro-batch" in str(error)


@pytest.mark.parametrize("mode", ["extend", "draft", "draft_extend"])
def test_a_graph_of_a_mode_no_graph_runner_replays_is_rejected_naming_the_modes_that_replay(mode):
    tokens = {"tokens": [1, 1]} if "extend" in mode else {}
    error = _rejects("events[1].graph", events=[_TWO, _forward(mode=mode, graph=True, **tokens)])
    assert f"graph replay runs decode, idle, verify, draft_block forwards, not {mode}" in str(error)


@pytest.mark.parametrize("mode", ["verify", "draft_block"])
def test_target_verify_forwards_and_draft_blocks_replay_as_graphs(mode):
    config = {"speculative": True, "num_draft_tokens": 3, "draft_model": True, "dspark": mode == "draft_block"}
    scenario = _parse(config, [_TWO, _forward(mode=mode, graph=True)])
    assert scenario.events[1].graph


# ---- checks that need the configuration, made while the events run ------------------------


def _plan_error(config: dict, event: dict) -> ScenarioError:
    scenario = _parse(config, [_TWO, event])
    state = EngineState(scenario.config)
    state.apply(scenario.events[0], "events[0]")
    with pytest.raises(ScenarioError) as info:
        state.plan_forward(scenario.events[1], 1, "events[1]")
    return info.value


@pytest.mark.parametrize("name", ["layers", "skip_layers"])
@pytest.mark.parametrize("layer", [0, 4])
def test_event_layer_outside_the_stage_is_rejected_naming_event_and_field(name, layer):
    error = _rejects(f"events[1].{name}", config={"start_layer": 1, "end_layer": 4},
                     events=[_TWO, _forward(**{name: [2, layer]})])
    assert f"layer {layer} is outside the stage [1, 4)" in str(error)


@pytest.mark.parametrize("order", [[0, 1], [0, 0, 0, 1], [0, 1, 1, 1], [0, 1, 2, 1]])
def test_order_that_does_not_name_each_micro_batch_once_per_store_is_rejected(order):
    error = _rejects("events[1].order", config={"start_layer": 0, "end_layer": 2},
                     events=[_TWO, _forward(micro_batches=2, order=order)])
    assert "must name each of the 2 micro-batches exactly 2 times" in str(error)


def test_mutation_after_more_calls_than_the_forward_makes_is_rejected():
    error = _plan_error(
        {"start_layer": 0, "end_layer": 2},
        _forward(mutation={"after_calls": 3, "op": "relocate", "request": 0}),
    )
    assert "mutation.after_calls 3" in str(error) and "2 store calls" in str(error)


_LATE_INVALID = {
    "config": {"start_layer": 0, "end_layer": 3, "non_swa_layers": [0]},
    "events": [_TWO, _forward(), _forward(), _forward(layers=[7])],
}


def test_an_event_invalid_for_the_configuration_is_rejected_before_anything_runs():
    with pytest.raises(ScenarioError, match=r"events\[3\]\.layers: layer 7 is outside the stage"):
        Scenario.from_dict(_LATE_INVALID)


@pytest.mark.parametrize(
    "event, field",
    [
        (_forward(layers=[7]), "events[1].layers"),
        (_forward(skip_layers=[7]), "events[1].skip_layers"),
        (_forward(micro_batches=2, order=[0, 1]), "events[1].order"),
    ],
)
def test_config_dependent_event_fields_are_rejected_when_parsing(event, field):
    _rejects(field, config={"start_layer": 0, "end_layer": 2}, events=[_TWO, event])


_DSPARK = {"speculative": True, "num_draft_tokens": 3, "draft_model": True, "dspark": True}


@pytest.mark.parametrize("config", [
    {**_DSPARK, "num_draft_tokens": 1, "speculative": True},
    {**_DSPARK, "draft_model": False},
    {**_DSPARK, "speculative": False, "num_draft_tokens": 1},
])
def test_a_dspark_draft_model_needs_speculation_a_draft_model_and_a_block_of_one_token_or_more(config):
    error = _rejects("config.dspark", config=config)
    assert "num_draft_tokens - 1" in str(error)


def test_a_draft_block_needs_a_dspark_draft_model():
    _rejects("events[1].mode", config={"speculative": True, "num_draft_tokens": 3, "draft_model": True},
             events=[_TWO, _forward(mode="draft_block")])


@pytest.mark.parametrize("mode, tokens", [("draft", None), ("draft_extend", [1, 1])])
def test_a_dspark_draft_model_runs_no_mtp_draft_forward(mode, tokens):
    event = _forward(mode=mode, **({"tokens": tokens} if tokens else {}))
    error = _rejects("events[1].mode", config=_DSPARK, events=[_TWO, event])
    assert "draft_block" in str(error)


def test_a_dspark_scenario_round_trips_and_an_mtp_one_reads_as_before():
    dspark = Scenario.from_dict({"config": _DSPARK, "events": [_TWO, _forward(mode="draft_block")]})
    assert Scenario.from_dict(dspark.to_dict()) == dspark and dspark.to_dict()["config"]["dspark"] is True
    assert "dspark" not in Scenario().to_dict()["config"]


def test_an_invalid_scenario_is_never_reported_as_a_divergence():
    with pytest.raises(ScenarioError):
        scenario = Scenario.from_dict(_LATE_INVALID)
        run_scenario(PoolStartLayer, scenario)


# ---- the document as a whole ---------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_unknown_scenario_version_is_rejected(version):
    with pytest.raises(ScenarioError, match=rf"^scenario\.version: this harness reads version {SCENARIO_VERSION}"):
        Scenario.from_dict({"version": version})


def test_missing_version_means_the_current_version():
    assert Scenario.from_dict({}) == Scenario()


def test_scenario_rejects_unknown_top_level_fields():
    with pytest.raises(ScenarioError, match=r"^scenario: unknown field\(s\) 'seed'"):
        Scenario.from_dict({"events": [], "seed": 3})


@pytest.mark.parametrize("data", [None, [], "scenario", 3])
def test_scenario_that_is_not_an_object_is_rejected(data):
    with pytest.raises(ScenarioError, match="^scenario: expected an object"):
        Scenario.from_dict(data)


def test_to_dict_writes_the_version():
    assert Scenario().to_dict()["version"] == SCENARIO_VERSION


# ---- round trip ----------------------------------------------------------------------------


def _round_trips(scenario: Scenario) -> None:
    data = scenario.to_dict()
    assert Scenario.from_dict(data) == scenario
    assert Scenario.from_dict(json.loads(json.dumps(data))) == scenario


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_round_trips_through_json(name):
    _round_trips(EXAMPLES[name])


_ints = st.lists(st.integers(0, 5), max_size=4)


@st.composite
def _config_dicts(draw):
    start = draw(st.integers(0, 3))
    end = start + draw(st.integers(1, 4))
    speculative = draw(st.booleans())
    full_page, swa_page = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    data = {
        "start_layer": start,
        "end_layer": end,
        "non_swa_layers": draw(st.lists(st.integers(start, end - 1), max_size=2)),
        "sliding_window": draw(st.integers(1, 64)),
        "speculative": speculative,
        "num_draft_tokens": draw(st.integers(1, 4)) if speculative else 1,
        "num_req_slots": draw(st.integers(2, 16)),
        "full_page_size": full_page,
        "swa_page_size": swa_page,
        "full_pool_size": full_page * draw(st.integers(2, 64)),
        "swa_pool_size": swa_page * draw(st.integers(2, 64)),
        "draft_model": draw(st.booleans()),
        "graph_batch_sizes": draw(st.lists(st.integers(1, 16), max_size=4)),
    }
    # any subset of the fields may be left to its default
    keep = draw(st.lists(st.sampled_from(sorted(data)), unique=True))
    keep += ["start_layer", "end_layer"] if "non_swa_layers" in keep else []
    keep += ["speculative"] if "num_draft_tokens" in keep else []
    keep += ["full_page_size"] if "full_pool_size" in keep else []
    keep += ["swa_page_size"] if "swa_pool_size" in keep else []
    return {k: data[k] for k in set(keep)}


@st.composite
def _event_dicts(draw):
    op = draw(st.sampled_from(Event.OPS))
    if op == "admit":
        return {"op": op, "count": draw(st.integers(1, 4))}
    if op in ("finish", "relocate"):
        return {"op": op, "request": draw(st.integers(0, 6))}
    if op == "register_mapping":
        return {"op": op, "shuffle": draw(st.integers(0, 99))}
    if op == "clear":
        return {"op": op}
    mode = draw(st.sampled_from(["decode", "extend", "verify", "draft", "draft_extend", "idle"]))
    event: dict = {"op": "forward", "mode": mode}
    if mode == "idle":
        event["pad"] = draw(st.integers(0, 4))
        event["graph"] = draw(st.booleans())
        event["skip_init"] = draw(st.booleans())
        return event
    requests = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True))
    event["requests"] = requests
    if mode in ("extend", "draft_extend"):
        event["tokens"] = draw(st.lists(st.integers(1, 5), min_size=len(requests), max_size=len(requests)))
    if mode == "draft":
        event["steps"] = draw(st.integers(1, 3))
    micro_batches = draw(st.integers(1, len(requests)))
    if micro_batches > 1:
        event["micro_batches"] = micro_batches
        if draw(st.booleans()):
            event["order"] = draw(st.lists(st.integers(0, micro_batches - 1), max_size=6))
    elif mode == "decode" and draw(st.booleans()):
        event["graph"] = True
    if draw(st.booleans()):
        event["layers"] = draw(_ints)
    if draw(st.booleans()):
        event["skip_layers"] = draw(_ints)
    if draw(st.booleans()):
        event["skip_init"] = True
    if not event.get("graph") and draw(st.booleans()):
        event["mutation"] = {
            "after_calls": draw(st.integers(0, 6)),
            "op": draw(st.sampled_from(["relocate", "register_mapping"])),
            "request": draw(st.integers(0, 3)),
            "shuffle": draw(st.integers(0, 9)),
        }
    return event


@FAST
@given(_config_dicts(), st.lists(_event_dicts(), max_size=8))
def test_hand_made_variants_round_trip_through_json(config, events):
    _round_trips(_valid_or_reject({"config": config, "events": events}))


@FAST
@given(st.sampled_from(sorted(EXAMPLES)), st.data())
def test_examples_with_extra_events_round_trip_through_json(name, data):
    base = EXAMPLES[name].to_dict()
    extra = data.draw(st.lists(_event_dicts(), max_size=3))
    at = data.draw(st.integers(0, len(base["events"])))
    base["events"][at:at] = extra
    _round_trips(_valid_or_reject(base))


def _valid_or_reject(data: dict) -> Scenario:
    """Drawn layers and orders may not fit the configuration; only valid scenarios count."""
    try:
        return Scenario.from_dict(data)
    except ScenarioError:
        reject()


def test_to_dict_leaves_default_forward_fields_out():
    scenario = _parse(events=[_TWO, _forward()])
    assert scenario.to_dict()["events"][1] == {"op": "forward", "mode": "decode", "requests": [0, 1]}
