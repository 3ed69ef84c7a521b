"""Strategies make valid scenarios of their profile, and the exhaustive scope is what it says."""

from __future__ import annotations

from itertools import pairwise
from random import Random

import pytest
from hypothesis import HealthCheck, find, given, settings

from swafuzz import run_scenario
from swafuzz.subjects.builtin import Uncached
from swafuzz.reference import EngineState, live_rows
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.exhaustive import enumerate_scenarios
from swafuzz.strategies.features import ALL_FEATURES, GRAPH_REPLAY, features_of, in_mode
from swafuzz.strategies.scenarios import (
    ADVERSARIAL, MAX_FORWARDS, MAX_RUN, PROFILES, REALISTIC, adversarial_reasons, scenarios, weakest_profile,
)
from swafuzz.strategies.restrictions import scenarios_without

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _run_engine_model(scenario) -> None:
    state = EngineState(scenario.config)
    for index, event in enumerate(scenario.events):
        where = f"events[{index}]"
        if event.op == "forward":
            state.plan_forward(event, index, where)
            state.finish_forward()
        else:
            state.apply(event, where)


@pytest.mark.parametrize("profile", [REALISTIC, ADVERSARIAL])
def test_generated_scenarios_are_accepted_by_the_engine_model_and_round_trip(profile):
    @FAST
    @given(scenarios(profile))
    def check(scenario):
        _run_engine_model(scenario)
        assert type(scenario).from_dict(scenario.to_dict()) == scenario

    check()


def test_realistic_strategy_draws_only_what_the_engine_does():
    @FAST
    @given(scenarios(REALISTIC))
    def check(scenario):
        assert adversarial_reasons(scenario) == []

    check()


def test_long_horizon_scenarios_are_valid_realistic_and_reach_past_an_8_bit_counter():
    forwards_per_scenario = []

    @settings(FAST, max_examples=60, derandomize=True)
    @given(scenarios(REALISTIC, long_horizon=True))
    def check(scenario):
        _run_engine_model(scenario)
        assert type(scenario).from_dict(scenario.to_dict()) == scenario
        assert adversarial_reasons(scenario) == []
        forwards_per_scenario.append(sum(e.op == "forward" for e in scenario.events))

    check()
    assert max(forwards_per_scenario) > 256
    assert min(forwards_per_scenario) <= MAX_FORWARDS  # a scenario without a run stays short


def _every_swafuzz_module() -> None:
    """Import all of swafuzz: Hypothesis draws constants from every local module loaded, so
    a measured share must not hang on which modules the tests before it happened to load."""
    import importlib
    import pkgutil

    import swafuzz

    for module in pkgutil.walk_packages(swafuzz.__path__, "swafuzz."):
        importlib.import_module(module.name)


def _measured(profile: str, measure, max_examples: int) -> list:
    """``measure`` of each default scenario Hypothesis draws (derandomized: the same list
    every run, whichever tests ran before)."""
    _every_swafuzz_module()
    values = []

    @settings(FAST, max_examples=max_examples, derandomize=True)
    @given(scenarios(profile))
    def check(scenario):
        values.append(measure(scenario))

    check()
    return values


@pytest.mark.parametrize("profile", PROFILES)
def test_default_scenarios_hold_runs_of_plain_decodes_short_of_a_step_counter_wrap(profile):
    forwards_per_scenario = _measured(profile, lambda scenario: sum(e.op == "forward" for e in scenario.events), 100)
    assert max(forwards_per_scenario) > MAX_FORWARDS  # a run: many forwards for a few choices
    assert max(forwards_per_scenario) <= MAX_FORWARDS + MAX_RUN < 256


@pytest.mark.parametrize("profile", PROFILES)
def test_many_default_scenarios_hold_a_run_three_quarters_of_the_longest_or_more(profile):
    # a run's forwards are checks for no choices: long runs are what make checks cheap, so
    # they are a common case rather than the tail
    def holds_a_long_run(scenario):
        decodes = sum(e.op == "forward" and e.mode == "decode" for e in scenario.events)
        return decodes >= MAX_RUN * 3 // 4

    long_runs = _measured(profile, holds_a_long_run, 300)
    assert sum(long_runs) >= len(long_runs) / 3


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("seed", [3, 5])
def test_shrinking_deletes_every_forward_the_failure_does_not_need(profile, seed):
    # a forward is more choices than Hypothesis deletes one by one: the forwards before a
    # failing one go only because each forward's span holds the spans after it
    def multi_step_draft(scenario):
        return any(e.op == "forward" and e.steps > 1 for e in scenario.events)

    found = find(scenarios(profile), multi_step_draft, random=Random(seed),
                 settings=settings(FAST, database=None, max_examples=10**4))
    assert sum(e.op == "forward" for e in found.events) == 1, found.to_dict()["events"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["verify", "draft_block"])
def test_both_profiles_replay_target_verify_forwards_and_draft_blocks_as_graphs_the_engine_model_runs(profile,
                                                                                                      mode):
    def graph_of_mode(scenario):
        return any(e.op == "forward" and e.graph and e.mode == mode for e in scenario.events)

    found = find(scenarios(profile, draft_blocks=mode == "draft_block"), graph_of_mode, random=Random(0),
                 settings=settings(FAST, database=None, max_examples=10**4))
    _run_engine_model(found)
    assert run_scenario(Uncached, found).passed


def test_a_subject_that_leaves_verify_graphs_out_is_drawn_none_in_any_profile():
    excluded = frozenset({in_mode(GRAPH_REPLAY, "verify")})

    @given(scenarios_without(ADVERSARIAL, excluded))
    @settings(FAST, database=None, max_examples=300)
    def check(scenario):
        assert not any(e.op == "forward" and e.graph and e.mode == "verify" for e in scenario.events)

    check()


@pytest.mark.parametrize("profile", PROFILES)
def test_long_horizon_draws_stay_within_the_scenario_limits(profile):
    # many requests over hundreds of forwards can add up past reference.LIMITS; such a
    # draw must be rejected by the strategy, never raised at the fuzzer as a refused input
    @settings(FAST, max_examples=400, derandomize=True)
    @given(scenarios(profile, long_horizon=True))
    def check(scenario):
        assert type(scenario).from_dict(scenario.to_dict()) == scenario

    check()


def test_unknown_profile_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="realistic"):
        scenarios("lenient")


@pytest.mark.parametrize(
    "name, profile",
    [
        ("first-swa-layer-not-start", REALISTIC),
        ("pipeline-stage", REALISTIC),
        ("two-batch-overlap", REALISTIC),
        ("multi-step-draft", REALISTIC),
        ("ragged-extend", REALISTIC),
        ("graph-replay", REALISTIC),
        ("in-place-change-mid-forward", ADVERSARIAL),
        ("idle-replay-skips-init", ADVERSARIAL),
        ("register-then-skip-start", ADVERSARIAL),
        ("skipped-metadata-init", ADVERSARIAL),
    ],
)
def test_weakest_profile_of_each_bug_class_example(name, profile):
    assert weakest_profile(EXAMPLES[name]) == profile


def test_adversarial_reasons_name_the_event_and_the_feature():
    reasons = adversarial_reasons(EXAMPLES["in-place-change-mid-forward"])
    assert reasons == ["events[1]: the mapping changes between layers of one forward"]


def test_exhaustive_scope_is_valid_and_realistic_scope_is_a_subset():
    adversarial = list(enumerate_scenarios(max_forwards=1, max_layers=2))
    realistic = list(enumerate_scenarios(max_forwards=1, max_layers=2, profile=REALISTIC))
    assert 0 < len(realistic) < len(adversarial)
    assert set(map(repr, realistic)) <= set(map(repr, adversarial))
    for scenario in adversarial:
        assert run_scenario(Uncached, scenario).passed


def test_exhaustive_scope_switches_every_feature_on_somewhere():
    seen = set()
    for scenario in enumerate_scenarios(max_forwards=2, max_layers=2, draft_blocks=True):
        seen |= features_of(scenario)
    assert set(ALL_FEATURES) - seen == set()


def test_only_a_subject_that_drafts_in_blocks_meets_dspark_draft_models():
    assert not any(scenario.config.dspark for scenario in enumerate_scenarios(max_forwards=1, max_layers=1))
    with_blocks = [scenario for scenario in enumerate_scenarios(max_forwards=1, max_layers=1, draft_blocks=True)
                   if scenario.config.dspark]
    modes = {event.mode for scenario in with_blocks for event in scenario.events if event.op == "forward"}
    assert "draft_block" in modes and not modes & {"draft", "draft_extend"}


def test_exhaustive_scope_holds_every_realistic_engine_fact_at_its_smallest():
    scenarios = list(enumerate_scenarios(max_forwards=2, max_layers=2, profile=REALISTIC, draft_blocks=True))
    configs = {scenario.config for scenario in scenarios}
    assert any(c.draft_model for c in configs) and any(c.speculative and not c.draft_model for c in configs)
    assert {c.full_page_size for c in configs} == {1, 2}
    events = [event for scenario in scenarios for event in scenario.events]
    assert any(e.op == "clear" for e in events)
    assert any(e.op == "forward" and list(e.requests) != sorted(e.requests) for e in events)
    assert set(ALL_FEATURES) - set().union(*map(features_of, scenarios)) == {
        "permuted_layers", "mapping_change_in_forward", "register_mapping",  # adversarial only
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_strategy_is_built_once_and_reused(profile):
    # a fuzz run asks for the strategy once per run of examples: rebuilding it would
    # re-validate every inner strategy
    assert scenarios(profile) is scenarios(profile)


def test_chunks_spell_every_interleaving_and_none_means_two_batch_overlap():
    from itertools import permutations

    from swafuzz.strategies.scenarios import _interleaving

    every = set(permutations([0, 0, 0, 1, 1, 1]))
    spelled = {_interleaving([(mb, 1) for mb in order], 2, 3) for order in every}
    assert spelled == every - {(0, 1, 0, 1, 0, 1)} | {None}
    assert _interleaving([], 2, 3) is None  # the engine's own order: a realistic forward
    # a chunk runs at most the stores its micro-batch has left; the rest run in turn
    assert _interleaving([(1, 5), (0, 1)], 2, 3) == (1, 1, 1, 0, 0, 0)
    assert _interleaving([(0, 2)], 3, 2) == (0, 0, 1, 2, 1, 2)


def test_a_failure_that_needs_an_explicit_interleaving_shrinks_to_a_few_stores():
    def interleaved(scenario):
        return any(e.op == "forward" and e.order is not None for e in scenario.events)

    found = find(scenarios(ADVERSARIAL), interleaved, random=Random(1),
                 settings=settings(FAST, database=None, max_examples=10**4))
    orders = [e.order for e in found.events if e.op == "forward" and e.order is not None]
    assert len(orders) == 1 and len(orders[0]) <= 4, found.to_dict()["events"]


@pytest.mark.parametrize("profile", PROFILES)
def test_an_idle_forward_that_skips_metadata_init_often_has_the_rows_of_the_forward_before(profile):
    # the metadata it keeps then has its length, so a cache trusted on length alone is stale
    def idle_pads_after_a_live_forward(scenario):
        forwards = [e for e in scenario.events if e.op == "forward"]
        return [(idle.pad, live_rows(before, scenario.config.num_draft_tokens)) for before, idle in pairwise(forwards)
                if idle.mode == "idle" and idle.skip_init and before.requests]

    # a large sample: Hypothesis draws constants from every module loaded, so the share varies
    # with the code and with the tests that ran before
    pairs = [pair for pads in _measured(profile, idle_pads_after_a_live_forward, 1200) for pair in pads]
    assert len(pairs) >= 20
    assert sum(pad == rows for pad, rows in pairs) >= len(pairs) / 4


@pytest.mark.parametrize("profile", PROFILES)
def test_many_stages_are_as_deep_as_a_deepseek_v4_stage_and_some_are_a_few_layers(profile):
    # every forward checks each layer of its stage: deep stages are where checks come cheap.
    # The strategy draws 43 or more layers in 45% of stages; Hypothesis mutates an example a
    # few times over before it draws afresh, and what it draws depends on the constants of
    # the modules imported so far, so a few hundred examples (under a hundred independent
    # stages) hold 35-45% of them, and the bound leaves room for that spread
    depths = []

    @settings(FAST, max_examples=600, derandomize=True)
    @given(scenarios(profile))
    def check(scenario):
        depths.append(scenario.config.end_layer - scenario.config.start_layer)

    check()
    assert sum(depth >= 43 for depth in depths) >= len(depths) / 4
    assert sum(depth <= 3 for depth in depths) >= 0.15 * len(depths)
