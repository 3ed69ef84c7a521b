"""The benchmark ratios ``swafuzz bench --json-out`` writes stay above their floors.

The measuring test is slow and excluded from the default run (``pytest -m slow`` runs it):
speed is judged from ratios measured side by side in one run, never from a timed unit test.
"""

from __future__ import annotations

import json

import pytest

from swafuzz.tools import bench, peer
from swafuzz.subjects.builtin import Uncached


def test_a_ratio_under_its_floor_is_named_and_one_above_is_not(monkeypatch):
    monkeypatch.setattr(bench, "RATIO_FLOORS", {"peer/checks_per_s/": 5.0})
    lines = bench.ratios_below_floors({
        "peer/checks_per_s/uncached/realistic": 4.0,
        "peer/checks_per_s/uncached/adversarial": 6.0,
        "executor/43x64/uncached/alone_over_harness": 0.01,
    })
    assert lines == ["peer/checks_per_s/uncached/realistic = 4 is below its floor 5"]


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["executor", "peer", "scaling"])
def test_benchmark_ratios_stay_above_their_floors(suite, tmp_path):
    out = tmp_path / "ratios.json"
    assert bench.main(["--suite", suite, "--seeds", "3", "--json-out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["suite"] == suite and written["ratios"]
    assert bench.ratios_below_floors(written["ratios"]) == []


class _OffByOne(Uncached):
    def swa_write_location(self, batch, layer_id):
        return super().swa_write_location(batch, layer_id) + 1


def test_the_bound_makes_every_call_of_the_lifecycle_and_compares_each_answer():
    scenario = bench.decode_scenario(layers=3, batch=5, forwards=4)
    assert bench.subject_alone(Uncached, scenario, compare=True)() == 3 * 4
    with pytest.raises(AssertionError, match="forward 0, layer 0 diverges"):
        bench.subject_alone(_OffByOne, scenario, compare=True)()
    assert bench.subject_alone(_OffByOne, scenario)() == 3 * 4  # the executor suite's "alone" compares nothing


def test_the_peer_bound_measures_until_its_budget_is_spent():
    checks, seconds = peer.bound_checks_per_s(Uncached, budget_s=0.05, seed=3)
    assert checks > 0 and seconds >= 0.05


def test_the_scaling_suite_compares_no_rate_of_a_campaign_that_diverged():
    lines: list[str] = []
    ratios = bench.bench_scaling(("pool-start-layer",), ("realistic",), budget_s=600.0, out=lines.append)
    assert ratios == {}
    assert any(line.startswith("pool-start-layer") and "diverged" in line for line in lines)


def test_each_peer_row_returns_its_bound_beside_its_ratio_on_a_correct_design():
    printed: list[str] = []
    ratios = peer.bench_peer(subjects=("step-keyed-capture",), profiles=("realistic",), rounds=1, round_s=0.2,
                             seeds=1, out=printed.append)
    for kind in ("default", "long-horizon"):
        key = f"step-keyed-capture/realistic/{kind}"
        assert ratios[f"checks_per_s/{key}"] > 0 and ratios[f"bound/{key}"] > 0
    rows = [line.split() for line in printed if line.startswith("step-keyed-capture ")]
    assert len(rows) == 2
    assert printed[1].split()[-3:] == ["of", "bound", "drawing"]
    for row in rows:  # the share of swafuzz's time spent drawing examples, outside the executor
        assert row[-1].endswith("%") and 0 < int(row[-1][:-1]) < 100


def test_the_peer_suite_measures_throughput_on_designs_that_never_diverge():
    import inspect

    from swafuzz.subjects.registry import EQUIVALENT, resolve_subject

    subjects = inspect.signature(peer.bench_peer).parameters["subjects"].default
    assert subjects == ("uncached", "step-keyed-capture")
    assert all(resolve_subject(name).expected == EQUIVALENT for name in subjects)
