"""Campaigns over many machines: shards that never repeat each other, and their merged report;
campaigns over many processes: their threads, their budget and their counts."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import junitparser
import pytest
import torch

from swafuzz.search import campaign
from swafuzz.search import fuzz as fuzz_engine
from swafuzz.cli import main as swafuzz
from swafuzz.search.fuzz import FuzzResult, Progress
from swafuzz.search.progress import ProgressLine
from swafuzz.subjects.registry import resolve_subject
from swafuzz.search.shard import WHOLE, Shard, seed_lane


@pytest.mark.parametrize("total,workers", [(1, 1), (4, 1), (3, 2), (5, 3)])
def test_the_seed_lanes_of_all_shards_and_workers_are_disjoint_and_cover_every_seed(total, workers):
    chunks, base = 40, 1000
    lanes = [seed_lane(Shard(index, total), worker, workers)
             for index in range(1, total + 1) for worker in range(workers)]
    seed_sets = [set(lane.seeds(base, chunks)) for lane in lanes]
    assert sum(len(seeds) for seeds in seed_sets) == len(set().union(*seed_sets))  # disjoint
    assert set().union(*seed_sets) == set(range(base, base + chunks * len(lanes)))  # and whole


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "two/4", "1", "-1/4", ""])
def test_a_shard_outside_1_to_n_is_a_usage_error(capsys, tmp_path, text):
    code = swafuzz(["fuzz", "--subject", "uncached", "--shard", text, "--report-dir", str(tmp_path)])
    assert code == 2
    assert "--shard" in capsys.readouterr().err


def _fuzz_report(tmp_path: Path, name: str, *argv: str) -> dict:
    code = swafuzz(["fuzz", "--settings", "ci", "--json", "--report-dir", str(tmp_path / name), *argv])
    assert code in (0, 1)
    return json.loads((tmp_path / name / "report.json").read_text())


def test_two_shards_search_different_seeds_and_record_their_shard(capsys, tmp_path):
    first = _fuzz_report(tmp_path, "one", "--subject", "uncached", "--shard", "1/2", "--max-examples", "150")
    second = _fuzz_report(tmp_path, "two", "--subject", "uncached", "--shard", "2/2", "--max-examples", "150")
    assert (first["shard"], second["shard"]) == ("1/2", "2/2")
    assert (first["seed"], second["seed"]) == (0, 1)
    # a shard is the seeded run of its lane: the same shard repeats exactly
    again = _fuzz_report(tmp_path, "again", "--subject", "uncached", "--shard", "2/2", "--max-examples", "150")
    assert again["coverage"] == second["coverage"]


@pytest.fixture
def shard_reports(capsys, tmp_path) -> tuple[Path, Path]:
    _fuzz_report(tmp_path, "shard1", "--subject", "pool-start-layer", "--shard", "1/2")
    _fuzz_report(tmp_path, "shard2", "--subject", "uncached", "--shard", "2/2", "--max-examples", "30")
    capsys.readouterr()
    return tmp_path / "shard1", tmp_path / "shard2"


def test_merge_reports_writes_one_summary_junit_and_html_page(capsys, tmp_path, shard_reports):
    diverging, clean = shard_reports
    out = tmp_path / "merged"
    assert swafuzz(["merge-reports", str(diverging), str(clean / "report.json"), "--report-dir", str(out)]) == 1
    assert "divergence in 1 of 2 runs" in capsys.readouterr().out
    found = json.loads((diverging / "report.json").read_text())
    summary = (out / "summary.md").read_text()
    assert found["diagnosis"]["sentence"] in summary
    assert found["replay_command"] in summary
    assert "shard 1/2" in summary and "shard 2/2" in summary
    suites = list(junitparser.JUnitXml.fromfile(str(out / "junit.xml")))
    assert len(suites) == 2
    assert sorted(suite.failures for suite in suites) == [0, 1]
    page = (out / "report.html").read_text()
    assert html.escape(found["diagnosis"]["sentence"]) in page and '<table class="grid">' in page
    merged = json.loads((out / "report.json").read_text())
    assert merged["verdict"] == "divergence"
    assert merged["examples"] == found["examples"] + json.loads((clean / "report.json").read_text())["examples"]


def test_merging_only_clean_runs_exits_0(capsys, tmp_path, shard_reports):
    _, clean = shard_reports
    assert swafuzz(["merge-reports", str(clean), "--report-dir", str(tmp_path / "merged")]) == 0
    assert "no divergence in 1 runs" in capsys.readouterr().out


def test_a_merged_report_is_not_merged_again(capsys, tmp_path, shard_reports):
    merged = tmp_path / "merged"
    swafuzz(["merge-reports", *map(str, shard_reports), "--report-dir", str(merged)])
    assert swafuzz(["merge-reports", str(merged), "--report-dir", str(tmp_path / "again")]) == 2
    assert "merged report already" in capsys.readouterr().err


@pytest.mark.parametrize("damage,message", [
    (lambda path: path.write_text("{"), "not valid JSON"),
    (lambda path: path.write_text("[]"), "expected a JSON object"),
    (lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "examples": "many"})), "'examples'"),
    (lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "verdict": "maybe"})), "'verdict'"),
    (lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "examples_per_worker": [3, "x"]})),
     "'examples_per_worker'"),
    (lambda path: path.unlink(), "no such report"),
    # reports come from other machines: read within the limits of any file from elsewhere
    (lambda path: path.write_text("[" * 100 + "]" * 100), "exceeds the limit MAX_JSON_DEPTH"),
])
def test_a_malformed_report_exits_2_with_one_line_and_writes_nothing(capsys, tmp_path, shard_reports, damage,
                                                                     message):
    diverging, clean = shard_reports
    damage(clean / "report.json")
    out = tmp_path / "merged"
    assert swafuzz(["merge-reports", str(diverging), str(clean), "--report-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "swafuzz merge-reports: error:" in err
    assert not out.exists()


# ---- worker processes ------------------------------------------------------------------------


_THREAD_COUNTING_SUBJECT = """
import torch

from swafuzz.subjects.builtin import Uncached


class OneThreadOnly(Uncached):
    # answers wrong rows wherever torch runs more than one intra-op thread
    def swa_write_location(self, batch, layer_id):
        return super().swa_write_location(batch, layer_id) + (torch.get_num_threads() - 1)
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_process_of_a_campaign_runs_torch_on_one_thread(capsys, tmp_path, monkeypatch, workers):
    (tmp_path / "thread_counting.py").write_text(_THREAD_COUNTING_SUBJECT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what a worker's torch would start with
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        report = _fuzz_report(tmp_path, "run", "--subject", "thread_counting:OneThreadOnly", "--seed", "4",
                              "--max-examples", "6", "--workers", workers)
        assert torch.get_num_threads() == 3  # this process's own setting is given back
    finally:
        torch.set_num_threads(threads)
    assert report["verdict"] == "no divergence" and report["examples"] == 6


def test_a_budget_counts_from_the_start_it_is_given():
    budget_s = 5.0
    result = fuzz_engine.fuzz(resolve_subject("uncached"), settings="ci", budget_s=budget_s,
                              started_at=time.monotonic() - budget_s)
    assert result.examples == 0 and result.elapsed_s >= budget_s


def _worker_pool(workers: int) -> campaign.WorkerPool:
    base = campaign.FuzzJob(subject="uncached", profile="realistic", settings="ci", seed=3, run="seed3",
                            device="cpu", replay_dir="replays", database_dir="db", budget_s=60.0)
    jobs = [campaign._worker_job(base, i, None, seed_lane(WHOLE, i, workers)) for i in range(workers)]
    return campaign.WorkerPool(resolve_subject("uncached"), jobs, ProgressLine(None, enabled=False),
                               campaign.InterruptWatch())


def test_every_worker_spends_the_budget_from_the_campaign_start_not_its_own():
    pool = _worker_pool(3)
    assert [job.started_at for job in pool.jobs] == [pool.started] * 3


def test_a_worker_campaign_counts_each_workers_examples_and_a_dead_workers_last_progress():
    pool = _worker_pool(3)
    pool.progress[1] = Progress(examples=7, elapsed_s=1.0, budget_s=60.0, features_covered=2, divergences=0)
    outcomes = {index: FuzzResult("uncached", "realistic", "ci", examples=examples, elapsed_s=1.0, checks=checks)
                for index, examples, checks in ((0, 5, 40), (2, 9, 70))}
    merged, _ = pool._merge(outcomes)
    assert pool.examples_per_worker == [5, 7, 9] and merged.examples == 21
    assert merged.checks == 110  # what the workers that answered compared


def test_the_report_of_a_worker_campaign_lists_the_examples_each_worker_ran(capsys, tmp_path):
    report = _fuzz_report(tmp_path, "run", "--subject", "uncached", "--seed", "2", "--max-examples", "10",
                          "--workers", "2")
    assert report["workers"] == 2 and report["examples_per_worker"] == [5, 5] and report["examples"] == 10
    alone = _fuzz_report(tmp_path, "alone", "--subject", "uncached", "--seed", "2", "--max-examples", "10")
    assert "examples_per_worker" not in alone
