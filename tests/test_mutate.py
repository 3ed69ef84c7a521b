"""Specifications of the mutation figures: which mutants each operator makes, that a mutant
changes nothing but itself, what counts as a kill, and what the reports say."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from swafuzz import Subject, Truth
from swafuzz.subjects import builtin
from swafuzz.tools import mutate as mutation
from swafuzz.api import ModelSpec
from swafuzz.cli import MUTATION_OPERATORS, main
from swafuzz.tools.mutate import (
    EQUIVALENT, KILLED_STATUS, NEVER_READ, NOT_RUNNABLE, ORIGINAL_DIVERGES, PASSES, SURVIVED, derive_mutants,
    examine,
    mutant_class, mutate,
)
from swafuzz.reference import EngineConfig
from swafuzz.search.fuzz import FuzzResult

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

SPEC = ModelSpec.of(EngineConfig(), "target", torch.device("cpu"))
# a search here is bounded by its examples, seeded, so it finds the same on a busy machine as
# on an idle one; its time budget is only a net that no run comes near
NEVER_BINDS_S = 600.0


# ---- hand-written subjects, one place for each operator --------------------------------------


def _rows(mapping, out_cache_loc):
    return mapping[out_cache_loc].to(torch.int32)


def _ring_slot(req_slot, position, ring):
    return req_slot * ring + position % ring


class RefreshedAtFirstSwaLayer(Subject):
    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        self.cached = None

    def register_mapping(self, mapping):
        super().register_mapping(mapping)
        self.cached = None

    def swa_write_location(self, batch, layer_id):
        if layer_id == self.spec.first_swa_layer or self.cached is None:
            self.cached = _rows(self.mapping, batch.out_cache_loc)
        return self.cached


class KeyedOnTheStep(Subject):
    truth = Truth.POOL

    def step_key(self, batch):
        return (batch.forward_id, batch.draft_step)

    def swa_write_location(self, batch, layer_id):
        return _rows(self.mapping, batch.out_cache_loc)


class RingArithmetic(Subject):
    truth = Truth.RING

    def swa_write_location(self, batch, layer_id):
        return _ring_slot(batch.req_pool_indices[:batch.batch_size], batch.positions, self.spec.ring)


class CopiedIntoTheCapture(Subject):
    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        self.rows = torch.empty(0, dtype=torch.int32)
        self.captured = {}

    def init_forward_metadata(self, batch):
        self.captured.clear()
        self.rows.copy_(_rows(self.mapping, batch.out_cache_loc).clone())

    def swa_write_location(self, batch, layer_id):
        return self.rows


OPERATOR_PLACES = [
    ("negate-guard", RefreshedAtFirstSwaLayer, "if not (layer_id == self.spec.first_swa_layer or self.cached is None):"),
    ("negate-guard", RefreshedAtFirstSwaLayer, "if layer_id == self.spec.first_swa_layer or not (self.cached is None):"),
    ("drop-guard", RefreshedAtFirstSwaLayer, "if (self.cached is None):"),
    ("layer-bound", RefreshedAtFirstSwaLayer, "if layer_id == self.spec.start_layer or self.cached is None:"),
    ("layer-bound", RefreshedAtFirstSwaLayer, "if layer_id == 0 or self.cached is None:"),
    ("drop-key-element", KeyedOnTheStep, "return (batch.draft_step,)"),
    ("drop-reset", RefreshedAtFirstSwaLayer, "        pass"),
    ("drop-reset", CopiedIntoTheCapture, "        pass"),
    ("ring-window", RingArithmetic, "batch.positions, self.spec.sliding_window)"),
    ("off-by-one", RingArithmetic, "return req_slot * ring + (position + 1) % ring"),
    ("off-by-one", RingArithmetic, "return req_slot * (ring - 1) + position % ring"),
    ("copy-prefix", RingArithmetic, "batch.req_pool_indices[:(batch.batch_size - 1)]"),
    ("assign-instead-of-copy", CopiedIntoTheCapture, "self.rows = _rows(self.mapping, batch.out_cache_loc).clone()"),
    ("assign-instead-of-copy", CopiedIntoTheCapture, "self.rows.copy_(_rows(self.mapping, batch.out_cache_loc))"),
    ("swap-arguments", RefreshedAtFirstSwaLayer, "_rows(batch.out_cache_loc, self.mapping)"),
    ("swap-arguments", RingArithmetic, "_ring_slot(batch.req_pool_indices[:batch.batch_size], self.spec.ring, "
                                       "batch.positions)"),
]


def _added_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("operator, subject, added", OPERATOR_PLACES,
                         ids=[f"{operator}-{subject.__name__}-{i}" for i, (operator, subject, _) in
                              enumerate(OPERATOR_PLACES)])
def test_each_operator_makes_the_mutant_of_its_place_and_it_compiles(operator, subject, added):
    mutants = derive_mutants(subject, operators=(operator,))
    matching = [m for m in mutants if any(added in line for line in _added_lines(m.diff))]
    assert matching, [m.diff for m in mutants]
    for mutant in matching:
        assert mutant.id.startswith(f"{operator}/") and mutant.operator == operator
        assert mutant.path.endswith("test_mutate.py") and mutant.description
        changed = mutant_class(subject, mutant)
        assert issubclass(changed, subject) and changed.__name__ == subject.__name__


def test_every_operator_is_offered_on_the_command_line():
    assert tuple(mutation.OPERATORS) == MUTATION_OPERATORS


def test_mutant_ids_name_operator_function_and_number_and_are_unique():
    mutants = derive_mutants(builtin.StepKeyedCaptureRing)
    ids = [m.id for m in mutants]
    assert len(ids) == len(set(ids))
    assert "drop-key-element/StepKeyedCapture._key/4" in ids  # batch.in_graph, the capture state
    assert "off-by-one/_ring_rows/1" in ids  # a helper the methods call is mutated too


def test_a_shadowed_method_is_not_mutated():
    # StepKeyed._key is overridden by StepKeyedCapture._key: changing it changes nothing that runs
    functions = {m.qualname for m in derive_mutants(builtin.StepKeyedCapture)}
    assert "StepKeyedCapture._key" in functions and "StepKeyed._key" not in functions


def test_a_mutant_changes_neither_the_subject_nor_its_module_nor_its_file():
    source = Path(builtin.__file__).read_bytes()
    helper, method = builtin._ring_rows, builtin.UncachedRing.swa_write_location
    for mutant in derive_mutants(builtin.UncachedRing):
        changed = mutant_class(builtin.UncachedRing, mutant)
        assert changed is not builtin.UncachedRing
    assert builtin._ring_rows is helper and builtin.UncachedRing.swa_write_location is method
    assert Path(builtin.__file__).read_bytes() == source


def test_a_changed_helper_is_the_one_the_mutant_calls():
    mutant = next(m for m in derive_mutants(builtin.UncachedRing, operators=("off-by-one",))
                  if "% (ring - 1)" in m.diff)
    changed = mutant_class(builtin.UncachedRing, mutant)
    calls = changed.swa_write_location.__globals__["_ring_rows"]
    slots, positions = torch.tensor([1, 2]), torch.tensor([5, 6])
    assert calls is not builtin._ring_rows
    assert calls(slots, positions, 4).tolist() == [1 * 4 + 5 % 3, 2 * 4 + 6 % 3]
    assert builtin._ring_rows(slots, positions, 4).tolist() == [1 * 4 + 5 % 4, 2 * 4 + 6 % 4]


def test_super_in_a_changed_method_still_reaches_the_base_class():
    mutant = next(m for m in derive_mutants(RefreshedAtFirstSwaLayer, operators=("drop-reset",))
                  if m.function == "__init__")
    instance = mutant_class(RefreshedAtFirstSwaLayer, mutant)(SPEC)
    assert instance.spec is SPEC and instance.mapping is None  # Subject.__init__ ran
    assert "cached" not in vars(instance)  # the reset the mutant left out


class WindowOrRequestWindow(Subject):
    """Reads a window that is no sliding window and locations kept per ring, beside the
    sliding window (where the ring size belongs)."""

    truth = Truth.RING

    def swa_write_location(self, batch, layer_id):
        if self.request_window is not None:
            return self.swa_ring_out_cache_loc
        return _ring_slot(batch.req_pool_indices[:batch.batch_size], batch.positions, self.spec.sliding_window)


def test_ring_window_swaps_only_names_that_are_a_ring_size_or_a_sliding_window():
    mutants = derive_mutants(WindowOrRequestWindow, operators=("ring-window",))
    assert sorted(m.description for m in mutants) == [
        "`self.spec.sliding_window` replaced by `.ring`"]


class UnifiedPoolRing(Subject):
    """Ring rows from the sizes a unified-KV pool names, as SGLang's HIP getter reads them."""

    truth = Truth.RING

    def swa_write_location(self, batch, layer_id):
        ring = self.pool.unified_swa_ring_size
        return _ring_slot(batch.req_pool_indices[:batch.batch_size], batch.positions % self.pool.unified_swa_window, ring)


def test_ring_window_swaps_the_unified_pools_ring_size_and_window():
    mutants = derive_mutants(UnifiedPoolRing, operators=("ring-window",))
    assert sorted(m.description for m in mutants) == [
        "`self.pool.unified_swa_ring_size` replaced by `.unified_swa_window`",
        "`self.pool.unified_swa_window` replaced by `.unified_swa_ring_size`"]


# ---- what a kill is ----------------------------------------------------------------------------


def test_an_obviously_wrong_mutant_of_a_correct_design_is_killed():
    mutant = next(m for m in derive_mutants(builtin.UncachedRing, operators=("ring-window",)))
    outcome = examine(builtin.UncachedRing, mutant, budget_s=NEVER_BINDS_S, seed=0, max_examples=20)
    assert outcome.status == KILLED_STATUS, outcome
    assert outcome.profile == "realistic" and outcome.kind == "wrong_rows"
    assert outcome.time_to_kill_s is not None and 0 < outcome.time_to_kill_s <= outcome.elapsed_s
    assert outcome.scenario is not None and "sliding window" in outcome.sentence


class WrongUnlessGuarded(Subject):
    """Diverges at every layer: the branch that returns the right rows is never taken."""

    truth = Truth.POOL

    def swa_write_location(self, batch, layer_id):
        if layer_id is not None:
            return torch.zeros_like(batch.out_cache_loc, dtype=torch.int32)
        return _rows(self.mapping, batch.out_cache_loc)


def test_a_divergence_the_unmutated_subject_shares_is_no_kill():
    mutant = next(m for m in derive_mutants(WrongUnlessGuarded, operators=("drop-guard",)))
    outcome = examine(WrongUnlessGuarded, mutant, budget_s=NEVER_BINDS_S, seed=0, max_examples=10)
    assert outcome.status == ORIGINAL_DIVERGES and outcome.scenario is not None


def test_the_unmutated_subject_is_searched_first_and_never_counted_among_the_mutants():
    assert examine(builtin.Uncached, None, budget_s=NEVER_BINDS_S, seed=0, max_examples=20).status == PASSES
    report = mutate("uncached", budget_s=NEVER_BINDS_S, max_examples=20, isolated=False)
    assert report.baseline.status == PASSES and report.baseline.mutant is None
    assert all(outcome.mutant is not None for outcome in report.outcomes)
    assert report.count(KILLED_STATUS) == len(report.outcomes) == 1 and report.passed


def test_a_diverging_subject_makes_no_figures_and_does_not_pass(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    report = mutate("test_mutate:WrongUnlessGuarded", budget_s=NEVER_BINDS_S, max_examples=10, isolated=False)
    assert report.baseline.status == "diverges" and report.outcomes == []
    assert not report.passed and "diverges" in report.headline()


class RedundantlyGuarded(Subject):
    truth = Truth.POOL

    def swa_write_location(self, batch, layer_id):
        rows = _rows(self.mapping, batch.out_cache_loc)
        if rows.numel() >= 0:
            return rows
        return rows.clone()


def test_survivors_listed_as_equivalent_are_left_out_of_the_kill_rate_with_their_reason(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    mutant_id = "negate-guard/RedundantlyGuarded.swa_write_location/1"
    reason = "both branches return the same rows"
    report = mutate("test_mutate:RedundantlyGuarded", budget_s=NEVER_BINDS_S, max_examples=10, isolated=False,
                    operators=("negate-guard",), equivalents={mutant_id: reason})
    (outcome,) = report.outcomes
    assert outcome.status == EQUIVALENT and outcome.equivalent_reason == reason
    assert report.counted == 0 and report.kill_rate is None and report.passed
    report.write(tmp_path)
    assert reason in (tmp_path / "mutants.md").read_text()
    unlisted = mutate("test_mutate:RedundantlyGuarded", budget_s=NEVER_BINDS_S, max_examples=10, isolated=False,
                      operators=("negate-guard",), equivalents={})
    assert unlisted.outcomes[0].status == SURVIVED and unlisted.survivors and not unlisted.passed


class KeepsATallyNothingReads(Subject):
    truth = Truth.POOL

    def swa_write_location(self, batch, layer_id):
        if layer_id == self.spec.first_swa_layer:
            self.tally_nothing_reads = layer_id
        return _rows(self.mapping, batch.out_cache_loc)


def test_a_survivor_whose_edit_changes_only_what_nothing_reads_is_never_read_and_left_out_of_the_rate(
        tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    report = mutate("test_mutate:KeepsATallyNothingReads", budget_s=NEVER_BINDS_S, max_examples=10,
                    isolated=False, operators=("negate-guard",), equivalents={})
    (outcome,) = report.outcomes
    assert outcome.status == NEVER_READ and "`self.tally_nothing_reads`" in outcome.sentence
    assert report.counted == 0 and report.passed and not report.survivors
    assert "1 never read" in report.headline() and report.to_dict()["never_read"] == 1
    report.write(tmp_path)
    assert "## Never read" in (tmp_path / "mutants.md").read_text()


def test_an_edit_that_reaches_a_returned_value_is_not_never_read():
    # the guard of RefreshedAtFirstSwaLayer chooses what is cached and returned
    assert not any(m.never_read for m in derive_mutants(RefreshedAtFirstSwaLayer))
    assert all(m.never_read for m in derive_mutants(KeepsATallyNothingReads, operators=("negate-guard",)))


def test_a_never_read_mutant_that_the_search_kills_counts_as_killed(monkeypatch):
    # the reading explains survivors; an edit it calls unread may still raise, and that is a kill
    def outcome(runner, mutant, budget_s, seed, search):
        if mutant is None:
            return mutation.Outcome(None, PASSES)
        return mutation.Outcome(mutant, KILLED_STATUS, profile="realistic", time_to_kill_s=0.1, kind="raised")

    monkeypatch.setattr(mutation, "_outcome", outcome)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    report = mutate("test_mutate:KeepsATallyNothingReads", budget_s=1, isolated=False, operators=("negate-guard",))
    assert report.outcomes[0].mutant.never_read and report.outcomes[0].status == KILLED_STATUS
    assert report.counted == 1 and report.kill_rate == 1.0


def test_a_killed_mutant_listed_as_equivalent_is_named_as_wrongly_listed():
    listed = {"ring-window/UncachedRing.swa_write_location/1": "thought to be the same"}
    report = mutate("uncached-ring", budget_s=NEVER_BINDS_S, max_examples=20, isolated=False,
                    operators=("ring-window",), equivalents=listed)
    assert report.outcomes[0].status == KILLED_STATUS
    assert report.wrongly_listed == list(listed) and report.kill_rate == 1.0


def test_the_json_report_carries_the_figures_and_each_mutant(tmp_path):
    report = mutate("uncached-ring", budget_s=NEVER_BINDS_S, max_examples=20, isolated=False,
                    operators=("ring-window", "swap-arguments"))
    report.write(tmp_path)
    data = json.loads((tmp_path / "mutants.json").read_text())
    for name in ("subject", "budget_s", "seed", "passed", "unmutated", "made", "killed", "killed_by_profile",
                 "survived", "equivalent", "not_runnable", "counted", "kill_rate", "time_to_kill", "mutants"):
        assert name in data, name
    assert data["made"] == 2 == data["killed"] and data["kill_rate"] == 1.0
    assert set(data["time_to_kill"]) == {"median_s", "p90_s", "max_s"}
    assert data["time_to_kill"]["median_s"] <= data["time_to_kill"]["p90_s"] <= data["time_to_kill"]["max_s"]
    for entry in data["mutants"]:
        assert {"id", "operator", "function", "path", "line", "diff", "status", "profile", "time_to_kill_s"} <= set(entry)
        assert entry["diff"].startswith("--- ")
    assert "# Mutants of `uncached-ring`" in (tmp_path / "mutants.md").read_text()


def test_the_figures_count_the_kills_whose_diagnosis_names_a_cause_per_operator():
    report = mutate("uncached-ring", budget_s=NEVER_BINDS_S, max_examples=20, isolated=False,
                    operators=("ring-window", "swap-arguments"))
    causes = {outcome.mutant.operator: outcome.cause for outcome in report.outcomes}
    assert causes["ring-window"] == "window_ring"  # the diagnosis's name for the window used as the ring
    figures = report.diagnosis()
    named = sum(cause != "unknown" for cause in causes.values())
    assert (figures["named"], figures["killed"]) == (named, 2)
    assert figures["catch_all"] == [o.mutant.id for o in report.outcomes if o.cause == "unknown"]
    assert figures["by_operator"]["ring-window"] == {"named": 1, "killed": 1}
    assert f"the diagnosis names the cause of {named} of 2 kills" in report.headline()


# ---- the search's bounds -----------------------------------------------------------------------


def test_a_seed_and_an_example_bound_give_the_same_figures_whatever_budget_does_not_bind():
    def figures(budget_s):
        report = mutate("uncached-ring", budget_s=budget_s, max_examples=20, seed=0, isolated=False,
                        operators=("ring-window", "swap-arguments"))
        return report.baseline.status, [(o.mutant.id, o.status, o.profile, o.kind, o.cause, o.sentence, o.scenario)
                                        for o in report.outcomes]

    halved, tenfold = figures(NEVER_BINDS_S / 2), figures(NEVER_BINDS_S * 10)
    assert halved == tenfold
    assert halved[0] == PASSES and [status for _, status, *_ in halved[1]] == [KILLED_STATUS, KILLED_STATUS]


def test_each_profile_searches_its_share_of_the_example_bound_within_its_share_of_the_budget(monkeypatch):
    asked = []

    def search(info, **options):  # a search that finds nothing, having run all it may
        asked.append((options["profile"], options["max_examples"], options["budget_s"]))
        return FuzzResult(info.name, options["profile"], "ci", examples=options["max_examples"] or 0, elapsed_s=0.0)

    monkeypatch.setattr(mutation, "fuzz", search)
    assert examine(builtin.Uncached, None, budget_s=NEVER_BINDS_S, seed=0, max_examples=7).status == PASSES
    (first, shared, first_budget), (second, rest, second_budget) = asked
    assert (first, shared, second, rest) == ("realistic", 3, "adversarial", 4)
    assert first_budget <= NEVER_BINDS_S / 2 <= second_budget <= NEVER_BINDS_S  # the first half, then the rest
    asked.clear()
    examine(builtin.Uncached, None, budget_s=NEVER_BINDS_S, seed=0)  # the budget alone, as before
    assert [shared for _, shared, _ in asked] == [None, None]


# ---- a mutant that ends, hangs or cannot be built ----------------------------------------------


class GuardedAgainstEnding(Subject):
    truth = Truth.POOL

    def __init__(self, spec):
        super().__init__(spec)
        if spec.start_layer < 0:
            raise RuntimeError("a stage never starts below layer 0")

    def swa_write_location(self, batch, layer_id):
        if layer_id < 0:
            os._exit(3)
        return _rows(self.mapping, batch.out_cache_loc)


def test_a_mutant_that_ends_its_process_is_killed_and_one_that_raises_when_built_is_not_runnable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    report = mutate("test_mutate:GuardedAgainstEnding", budget_s=NEVER_BINDS_S, max_examples=10, isolated=True,
                    operators=("negate-guard",))
    outcomes = {outcome.mutant.function: outcome for outcome in report.outcomes}
    assert outcomes["__init__"].status == NOT_RUNNABLE
    assert "raises on construction" in outcomes["__init__"].sentence
    ended = outcomes["swa_write_location"]
    assert ended.status == KILLED_STATUS and ended.kind == "exited" and "status 3" in ended.sentence
    assert ended.scenario is not None  # the one it ended in, kept by the worker
    assert report.baseline.status == PASSES and report.passed


class GuardedAgainstHanging(Subject):
    truth = Truth.POOL

    def swa_write_location(self, batch, layer_id):
        if layer_id < 0:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # no call timeout ends it
            while True:
                pass
        return _rows(self.mapping, batch.out_cache_loc)


def test_a_mutant_that_hangs_past_every_alarm_is_ended_and_killed(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    # the grace covers the first search of a process (its one-time loading) on a loaded machine
    monkeypatch.setattr(mutation, "WORKER_GRACE_S", 15.0)
    # the budget is what ends the hung mutant's process, so it stays short: the unmutated
    # subject passes within it on examples or time, whichever runs out first
    report = mutate("test_mutate:GuardedAgainstHanging", budget_s=1, max_examples=10, isolated=True,
                    operators=("negate-guard",))
    assert report.baseline.status == PASSES, report.baseline
    hung = next(o for o in report.outcomes if "`layer_id < 0`" in o.mutant.description)
    assert hung.status == KILLED_STATUS and hung.kind == "hung" and hung.scenario is not None


def test_the_mutants_benchmark_prints_and_returns_the_figures():
    from swafuzz.tools.bench import bench_mutants

    printed: list[str] = []
    figures = bench_mutants(subjects=("uncached",), targets=(), budget_s=NEVER_BINDS_S, max_examples=20,
                            out=printed.append)
    overall = figures["overall"]
    assert overall["kill_rate"] == 1.0 and overall["unmutated_divergences"] == 0
    assert set(overall["time_to_kill"]) == {"median_s", "p90_s", "max_s"}
    assert figures["subjects"]["uncached"]["made"] == 1
    assert any(line.startswith("uncached ") for line in printed)
    assert any(line.startswith("all: 1 of 1 killed") for line in printed)
    assert overall["diagnosis"]["killed"] == 1
    assert any(line.startswith("diagnosis: names the cause of ") for line in printed)


# ---- the command line ----------------------------------------------------------------------------


def test_mutate_on_the_command_line_writes_both_reports_and_exits_0_when_all_are_killed(tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.setenv("SWAFUZZ_SUPERVISOR", "0")
    code = main(["mutate", "--subject", "uncached", "--budget", "600", "--max-examples", "20",
                 "--report-dir", str(tmp_path), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["killed"] == printed["made"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mutants.json", "mutants.md"]
    assert printed["max_examples"] == 20
    assert "Budget 600 s or 20 examples per mutant" in (tmp_path / "mutants.md").read_text()


@pytest.mark.parametrize("arguments", [
    ["--subject", "no-such-subject"],
    ["--subject", "uncached", "--operator", "no-such-operator"],
    ["--subject", "uncached", "--equivalent", "/no/such/file.json"],
    ["--subject", "sglang:pool-getter"],
    ["--subject", "uncached", "--exclude", "no-such-feature"],
    ["--subject", "uncached", "--profile", "no-such-profile"],
    ["--subject", "uncached", "--max-examples", "0"],
], ids=["unknown-subject", "unknown-operator", "missing-equivalent-list", "unknown-sglang-target", "unknown-feature",
        "unknown-profile", "no-examples"])
def test_bad_input_to_mutate_is_a_usage_error(arguments, tmp_path):
    assert main(["mutate", *arguments, "--report-dir", str(tmp_path)]) == 2


def test_a_subject_no_operator_applies_to_is_a_usage_error(tmp_path):
    # uncached's one mutant swaps two arguments; a key to drop it has none
    assert main(["mutate", "--subject", "uncached", "--operator", "drop-key-element",
                 "--report-dir", str(tmp_path)]) == 2


def test_a_malformed_list_of_equivalent_mutants_is_a_usage_error(tmp_path):
    listed = tmp_path / "equivalent.json"
    listed.write_text(json.dumps({"negate-guard/X.y/1": 3}))
    assert main(["mutate", "--subject", "uncached", "--equivalent", str(listed),
                 "--report-dir", str(tmp_path)]) == 2


def test_the_builtin_list_of_equivalent_mutants_names_only_mutants_that_exist():
    from swafuzz.subjects.registry import resolve_subject

    lists = json.loads(mutation.BUILTIN_EQUIVALENTS.read_text())
    for subject, listed in lists.items():
        if subject.startswith("sglang:"):
            continue  # tests/test_mutate_sglang.py reads those from their releases
        ids = {m.id for m in derive_mutants(resolve_subject(subject).subject)}
        assert set(listed) <= ids, (subject, set(listed) - ids)
        assert all(reason.strip() for reason in listed.values())


def test_each_search_runs_only_the_profiles_given_and_never_draws_an_excluded_feature():
    # the start-layer pool cache is right on a stage whose first layer stores SWA keys, with
    # no micro-batches: a scope in which its mutants can be measured
    scope = {"profiles": ("realistic",), "exclude": frozenset({"first_swa_layer_not_start", "micro_batches"})}
    passes = examine(builtin.PoolStartLayer, None, budget_s=NEVER_BINDS_S, seed=0, max_examples=20, **scope)
    assert passes.status == PASSES
    found = examine(builtin.PoolStartLayer, None, budget_s=NEVER_BINDS_S, seed=0, max_examples=20,
                    profiles=("realistic",))
    assert found.status == "diverges" and found.profile == "realistic"


def test_the_reports_name_the_scope_the_mutants_were_searched_in(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWAFUZZ_SUPERVISOR", "0")
    code = main(["mutate", "--subject", "uncached", "--budget", "600", "--max-examples", "20",
                 "--profile", "adversarial", "--exclude", "graph_replay", "--report-dir", str(tmp_path), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["profiles"] == ["adversarial"] and printed["exclude"] == ["graph_replay"]
    assert all(m["profile"] == "adversarial" for m in printed["mutants"])
    assert "(adversarial; never drawing graph_replay)" in (tmp_path / "mutants.md").read_text()
