"""Reports: every format from one Report, atomic writes, a JUnit file CI readers accept, and
an HTML grid whose colours say what each store returned."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from swafuzz.run import diagnosis as dx
from swafuzz import run_scenario
from swafuzz.subjects.registry import resolve_subject
from swafuzz.results.reports import (
    ERROR,
    NOT_RUN,
    OK,
    OTHER_MICRO_BATCH,
    REPORT_FILES,
    STALE_CAPTURE,
    STALE_FORWARD,
    STALE_STEP,
    WRONG,
    Report,
    cells_from_divergence,
    outcome_of,
    render_html,
    render_junit,
    render_markdown,
    write_atomically,
    write_reports,
)
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES


def diverging(subject: str, example: str) -> Report:
    scenario = EXAMPLES[example]
    divergence = run_scenario(resolve_subject(subject).subject, scenario).divergence
    assert divergence is not None
    return Report(
        command="fuzz", subject=subject, subject_info=resolve_subject(subject).to_dict(),
        profile="realistic", settings="dev", seed=5, examples=40, elapsed_s=2.0,
        coverage={"micro_batches": 4, "idle": 0}, divergence=divergence, scenario=scenario,
        weakest_profile="realistic", replay_file="reports/replays/x.json",
    )


def passing(**fields) -> Report:
    return Report(command="fuzz", subject="uncached", subject_info=resolve_subject("uncached").to_dict(),
                  profile="realistic", settings="dev", seed=5, examples=300, elapsed_s=6.0,
                  coverage={"micro_batches": 12}, **fields)


# ---- atomic writes -------------------------------------------------------------------------------


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "report.json"
    write_atomically(path, "old")
    write_atomically(path, "new")
    assert path.read_text() == "new"
    assert os.listdir(path.parent) == ["report.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would make it, not private


def test_a_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_atomically(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.json"]


# ---- JSON and Markdown -----------------------------------------------------------------------------


def test_json_has_the_verdict_and_the_diagnosis():
    data = diverging("pool-start-layer", "first-swa-layer-not-start").to_dict()
    assert data["verdict"] == "divergence" and data["complete"] is True
    assert {"examples", "elapsed_s", "subject", "profile", "replay_file", "scenario"} <= set(data)
    assert data["diagnosis"]["kind"] == dx.WRONG_ROWS
    assert data["diagnosis"]["sentence"].startswith("Stale cache")
    assert data["replay_command"] == "swafuzz replay reports/replays/x.json"
    assert Scenario.from_dict(data["scenario"]) == EXAMPLES["first-swa-layer-not-start"]
    json.dumps(data)


def test_the_reproduce_command_of_a_user_subject_names_it_since_files_never_import_code():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    report.subject, report.replay_file = "my_subject:Stale Cache", "reports/replays/my subject.json"
    assert report.replay_command == "swafuzz replay 'reports/replays/my subject.json' --subject 'my_subject:Stale Cache'"
    report.subject = "sglang:unified-metadata-merge@0.5.19"
    assert report.replay_command == "swafuzz replay 'reports/replays/my subject.json'"


def test_json_of_a_clean_run_has_no_diagnosis():
    data = passing().to_dict()
    assert data["verdict"] == "no divergence"
    assert "diagnosis" not in data and "replay_file" not in data
    assert data["features_covered"] == ["micro_batches"]


def test_markdown_is_a_pull_request_comment():
    text = render_markdown(diverging("pool-start-layer", "first-swa-layer-not-start"))
    assert text.startswith("### swafuzz fuzz: ❌ divergence in `pool-start-layer`")
    assert "> Stale cache" in text
    assert "`swafuzz replay reports/replays/x.json`" in text
    assert "<details><summary>Shrunk scenario</summary>" in text
    assert "| expected | `[" in text


def test_markdown_marks_an_interrupted_run_incomplete():
    text = render_markdown(passing(complete=False, interrupted_by="SIGTERM"))
    assert "⚠️" in text and "Incomplete: the run was interrupted by SIGTERM after 300 examples" in text


# ---- JUnit -----------------------------------------------------------------------------------------


def _junit_case(text: str) -> ET.Element:
    root = ET.fromstring(text.encode())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    (case,) = suite.findall("testcase")
    return root, suite, case


def test_junit_reports_a_divergence_as_a_failure():
    report = diverging("unified-metadata", "multi-step-draft")
    root, suite, case = _junit_case(render_junit(report))
    assert suite.get("tests") == "1" and suite.get("failures") == "1" and root.get("failures") == "1"
    assert case.get("classname") == "swafuzz.realistic" and case.get("name") == "unified-metadata"
    failure = case.find("failure")
    assert failure.get("type") == "wrong_rows"
    assert failure.get("message") == report.divergence.sentence
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["seed"] == "5" and properties["complete"] == "true"


def test_junit_of_clean_and_interrupted_runs():
    _, suite, case = _junit_case(render_junit(passing()))
    assert suite.get("failures") == "0" and case.find("failure") is None and case.find("skipped") is None
    _, suite, case = _junit_case(render_junit(passing(complete=False, interrupted_by="SIGINT")))
    assert suite.get("skipped") == "1" and "interrupted by SIGINT" in case.find("skipped").get("message")


def test_junit_escapes_what_a_subject_says():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    report.divergence = dx.Divergence(**{**report.divergence.to_dict(),
                                         "sentence": 'raised <Error> & "quotes" \x1b[31mred'})
    _, _, case = _junit_case(render_junit(report))
    assert case.find("failure").get("message") == 'raised <Error> & "quotes" \ufffd[31mred'


def test_junit_parses_with_a_junit_reader(tmp_path):
    junitparser = pytest.importorskip("junitparser")
    path = write_reports(diverging("pool-start-layer", "two-batch-overlap"), tmp_path)["junit"]
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert suite.tests == 1 and suite.failures == 1
    (case,) = list(suite)
    assert case.name == "pool-start-layer"
    (result,) = case.result
    assert isinstance(result, junitparser.Failure)
    assert "micro-batch 1's rows" in result.message


# ---- the outcome grid ------------------------------------------------------------------------------


@pytest.mark.parametrize("subject, example, outcome, mark", [
    ("pool-start-layer", "first-swa-layer-not-start", STALE_FORWARD, "F1"),
    ("pool-start-layer", "two-batch-overlap", OTHER_MICRO_BATCH, "MB1"),
    ("unified-metadata", "multi-step-draft", STALE_STEP, "S0"),
    ("unified-metadata", "graph-replay", STALE_CAPTURE, "G1"),
    ("unified-metadata", "ragged-extend", WRONG, "×"),
    ("unified-metadata", "ragged-extend-indivisible", ERROR, "!"),
])
def test_the_diverging_store_is_coloured_by_where_its_rows_came_from(subject, example, outcome, mark):
    report = diverging(subject, example)
    rows, cells = cells_from_divergence(report.scenario, report.divergence)
    bad = [c for c in cells if c.outcome not in (OK, NOT_RUN)]
    assert [(c.outcome, c.mark) for c in bad] == [(outcome, mark)]
    d = report.divergence
    assert (bad[0].forward, bad[0].draft_step, bad[0].micro_batch, bad[0].layer_id) == (
        d.forward, d.draft_step, d.micro_batch, d.layer_id)


def test_stores_before_the_divergence_passed_and_later_ones_never_ran():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    rows, cells = cells_from_divergence(report.scenario, report.divergence)
    assert [(r.forward, r.mode) for r in rows] == [(1, "decode"), (2, "decode")]
    grid = {(c.forward, c.layer_id): c for c in cells}
    assert set(grid) == {(1, 1), (1, 2), (2, 1), (2, 2)}  # layer 0 stores no SWA keys
    assert grid[1, 1].outcome == grid[1, 2].outcome == OK
    assert grid[2, 1].outcome == STALE_FORWARD
    assert grid[2, 2].outcome == NOT_RUN
    assert grid[1, 1].is_source and grid[1, 2].is_source and not grid[2, 2].is_source


def test_a_failure_before_the_first_layer_marks_the_whole_forward():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    report.divergence = dx.Divergence(kind=dx.RAISED, sentence="init_forward_metadata raised", forward=2,
                                      event=2, mode="decode", model="target", draft_step=0, micro_batch=0,
                                      layer_id=None, call=4)
    rows, cells = cells_from_divergence(report.scenario, report.divergence)
    outcomes = {(c.forward, c.layer_id): c.outcome for c in cells}
    assert outcomes[2, None] == ERROR
    assert outcomes[1, 1] == OK and outcomes[2, 1] == NOT_RUN
    assert '<th>init</th>' in render_html(report)


def test_outcome_of_names_every_stale_source():
    base = diverging("pool-start-layer", "first-swa-layer-not-start").divergence
    for source_kind, outcome in [(dx.OLD_MAPPING, "old_mapping"), (dx.DUMMY, "dummy"), (dx.UNKNOWN, WRONG)]:
        divergence = dx.Divergence(**{**base.to_dict(), "source": {"kind": source_kind, "phrase": "p"}})
        assert outcome_of(divergence)[0] == outcome
    timeout = dx.Divergence(**{**base.to_dict(), "kind": dx.TIMEOUT, "source": None})
    assert outcome_of(timeout)[:2] == (ERROR, "!")


# ---- HTML ------------------------------------------------------------------------------------------


def test_html_is_self_contained_and_draws_the_grid():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<script" not in page and "@import" not in page
    assert '<table class="grid">' in page
    assert page.count('class="failing"') == 1
    assert ">F1</td>" in page
    assert "forward 2 · decode" in page
    assert "Stale cache" in page


def test_html_escapes_what_a_subject_says():
    report = diverging("pool-start-layer", "first-swa-layer-not-start")
    report.divergence = dx.Divergence(**{**report.divergence.to_dict(), "sentence": "<script>alert(1)</script>"})
    assert "<script>alert" not in render_html(report)


def test_html_of_a_clean_run_shows_coverage_only():
    page = render_html(passing(complete=False, interrupted_by="SIGINT"))
    assert '<table class="grid">' not in page
    assert "Incomplete" in page and "micro_batches" in page


def test_write_reports_writes_every_format(tmp_path):
    written = write_reports(diverging("pool-start-layer", "two-batch-overlap"), tmp_path)
    assert {fmt: path.name for fmt, path in written.items()} == REPORT_FILES
    assert sorted(os.listdir(tmp_path)) == sorted(REPORT_FILES.values())
    assert json.loads(Path(written["json"]).read_text())["verdict"] == "divergence"


def test_a_flaky_divergence_says_how_often_its_replays_diverged_in_every_format():
    report = dataclasses.replace(diverging("pool-start-layer", "first-swa-layer-not-start"), replays=False,
                                 replays_run=3, replays_diverged=1)
    data = report.to_dict()
    assert (data["flaky"], data["replays"], data["replays_run"], data["replays_diverged"]) == (True, False, 3, 1)
    assert "**Flaky:** the shrunk scenario diverged in 1 of 3 replays" in render_markdown(report)
    assert "diverged in 1 of 3 replays" in render_html(report, [])
    steady = dataclasses.replace(report, replays=True, replays_diverged=3)
    assert not steady.to_dict()["flaky"] and "Flaky" not in render_markdown(steady)
