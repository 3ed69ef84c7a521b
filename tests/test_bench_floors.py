"""The benchmark ratios ``swafuzz bench --json-out`` writes stay above their floors.

The measuring test is slow and excluded from the default run (``pytest -m slow`` runs it):
speed is judged from ratios measured side by side in one run, never from a timed unit test.
"""

from __future__ import annotations

import json

import pytest

from harness import bench


def test_a_ratio_under_its_floor_is_named_and_one_above_is_not(monkeypatch):
    monkeypatch.setattr(bench, "RATIO_FLOORS", {"peer/checks_per_s/": 5.0})
    lines = bench.ratios_below_floors({
        "peer/checks_per_s/uncached/realistic": 4.0,
        "peer/checks_per_s/uncached/adversarial": 6.0,
        "executor/43x64/uncached/alone_over_harness": 0.01,
    })
    assert lines == ["peer/checks_per_s/uncached/realistic = 4 is below its floor 5"]


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["executor", "peer"])
def test_benchmark_ratios_stay_above_their_floors(suite, tmp_path):
    out = tmp_path / "ratios.json"
    assert bench.main(["--suite", suite, "--seeds", "3", "--json-out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["suite"] == suite and written["ratios"]
    assert bench.ratios_below_floors(written["ratios"]) == []
