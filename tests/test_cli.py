"""The swafuzz command line: every subcommand, every exit code, the JSON contract, and the
round trip fuzz -> replay file -> replay -> emitted pytest file."""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import swafuzz
import swafuzz.tools
from swafuzz.search import campaign
from swafuzz import cli
from swafuzz.search import fuzz as fuzz_engine
from swafuzz.results import replay as replay_module
from swafuzz.results import reports as reports_module
from swafuzz import run_scenario
from swafuzz.search.fuzz import FuzzResult, Progress
from swafuzz.search.progress import ProgressLine, format_progress
from swafuzz.run.boundary import InputError
from swafuzz.subjects.builtin import Uncached
from swafuzz.subjects.registry import BUILTIN_SUBJECTS, BUILTIN_TABLE, SubjectInfo
from swafuzz.results.replay import Replay, load_replay, write_replay
from swafuzz.search.shard import WHOLE, seed_lane
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES

STALE_EXAMPLE = "first-swa-layer-not-start"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class FakeEngine:
    """Stands in for the fuzzing engine: reports progress, then finds ``example``'s
    divergence (when the subject has one) or nothing."""

    def __init__(self, example: str | None = None):
        self.example = example
        self.calls: list[dict] = []

    def fuzz(self, info, **options):
        self.calls.append(options)
        options["on_progress"](Progress(10, 0.5, options["budget_s"], 3, 0))
        found = FuzzResult(info.name, options["profile"], options["settings"] or "dev", examples=10,
                           elapsed_s=0.5, seed=options["seed"], coverage={"micro_batches": 3})
        if self.example is not None:
            scenario = EXAMPLES[self.example]
            found.scenario = scenario
            found.divergence = run_scenario(info.subject, scenario).divergence
            found.weakest_profile = "realistic"
            options["on_divergence"](found)
        return found

    def exhaustive(self, info, **options):
        self.calls.append(options)
        return self.fuzz(info, profile=options["profile"], settings="exhaustive", budget_s=None, seed=None,
                         on_progress=options["on_progress"], on_divergence=lambda found: None)


@pytest.fixture
def engine(monkeypatch):
    fake = FakeEngine()
    monkeypatch.setattr(fuzz_engine, "fuzz", fake.fuzz)
    monkeypatch.setattr(fuzz_engine, "exhaustive", fake.exhaustive)
    return fake


# ---- usage errors (exit 2) ---------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    ([], "COMMAND"),
    (["frobnicate"], "'frobnicate'"),
    (["fuzz"], "--subject"),
    (["fuzz", "--subject", "nope"], "unknown subject 'nope'; built-in subjects are uncached"),
    (["fuzz", "--subject", "no_such_module_xyz:Thing"], "cannot import module 'no_such_module_xyz'"),
    (["fuzz", "--subject", "swafuzz.subjects.builtin:NotThere"], "has no attribute 'NotThere'"),
    (["fuzz", "--subject", "swafuzz.api:Truth"], "'swafuzz.api:Truth' is the class Truth, which is not a swafuzz"),
    (["fuzz", "--subject", "uncached", "--budget", "0"], "must be more than 0 seconds"),
    (["fuzz", "--subject", "uncached", "--budget", "soon"], "expected a number of seconds"),
    (["fuzz", "--subject", "uncached", "--max-examples", "0"], "must be at least 1"),
    (["fuzz", "--subject", "uncached", "--workers", "0"], "must be at least 1"),
    (["fuzz", "--subject", "uncached", "--seed", "-3"], "must be at least 0"),
    (["fuzz", "--subject", "uncached", "--seed", str(2**63)], f"must be at most {2**63 - 1}"),
    (["fuzz", "--subject", "uncached", "--seed", "9" * 5000], "more than 19 digits"),
    (["fuzz", "--subject", "uncached", "--workers", "100000"], "must be at most 256"),
    (["fuzz", "--subject", "uncached", "--profile", "gentle"], "'gentle'"),
    (["fuzz", "--subject", "uncached", "--device", "tpu"], "--device 'tpu'"),
    (["fuzz", "--subject", "uncached", "--device", "mps"], "swafuzz runs on cpu or cuda"),
    (["replay"], "FILE"),
    (["exhaustive", "--subject", "uncached", "--max-layers", "x"], "expected a whole number"),
])
def test_usage_errors_exit_2_with_a_message(capsys, engine, tmp_path, argv, message):
    if argv[:1] in (["fuzz"], ["exhaustive"]) and "--subject" in argv:
        argv = [*argv, "--report-dir", str(tmp_path)]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert engine.calls == []


NOT_SUBJECTS = (
    "from swafuzz.subjects.builtin import Uncached\n\n\n"
    "class LooksLikeOne:\n"
    "    def swa_write_location(self, batch, layer_id):\n"
    "        return None\n\n\n"
    "def a_function(spec):\n"
    "    return Uncached(spec)\n\n\n"
    "an_instance = Uncached.__new__(Uncached)\n"
)


@pytest.mark.parametrize("command", ["fuzz", "exhaustive"])
@pytest.mark.parametrize("attr, what", [("LooksLikeOne", "the class LooksLikeOne"),
                                        ("a_function", "an object of type function"),
                                        ("an_instance", "an object of type Uncached")])
def test_a_user_subject_that_is_no_subject_class_is_told_so_in_one_line_and_exits_2(
        capsys, engine, tmp_path, monkeypatch, command, attr, what):
    (tmp_path / "not_subjects.py").write_text(NOT_SUBJECTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(capsys, command, "--subject", f"not_subjects:{attr}", "--report-dir", str(tmp_path))
    assert code == 2 and engine.calls == [] and out == ""
    assert err == (f"swafuzz {command}: error: 'not_subjects:{attr}' is {what}, which is not a swafuzz subject: "
                   "give a subclass of swafuzz.api.Subject (swafuzz.Subject) or a SubjectInfo\n")


def test_a_subject_of_an_unknown_api_version_exits_2_naming_the_versions_run(capsys, engine, tmp_path, monkeypatch):
    (tmp_path / "future_subject.py").write_text(
        "from swafuzz.subjects.builtin import Uncached\n\n\n"
        "class Future(Uncached):\n"
        "    api_version = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli(capsys, "fuzz", "--subject", "future_subject:Future", "--report-dir", str(tmp_path))
    assert code == 2 and engine.calls == []
    assert "Future targets subject API version 3; this harness runs versions 1, 2" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_exits_2(capsys, engine, tmp_path):
    code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--device", "cuda", "--report-dir", str(tmp_path))
    assert code == 2
    assert "no CUDA or ROCm device is available" in err and "--device cpu" in err


def test_an_unwritable_report_dir_exits_2(capsys, engine, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(blocker))
    assert code == 2 and "cannot create it" in err


def test_an_unknown_settings_profile_in_the_environment_exits_2(capsys, engine, tmp_path, monkeypatch):
    monkeypatch.setenv(fuzz_engine.SETTINGS_ENV, "turbo")
    code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))
    assert code == 2 and "turbo" in err


@pytest.mark.parametrize("argv", [["--help"], ["fuzz", "--help"], ["--version"]])
def test_help_and_version_exit_0(capsys, argv):
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "swafuzz" in out


def test_fuzz_help_documents_the_database_and_exit_codes(capsys):
    _, out, _ = run_cli(capsys, "fuzz", "--help")
    assert ".hypothesis-db" in out
    _, out, _ = run_cli(capsys, "--help")
    assert "0 no divergence, 1 divergence found, 2 usage or input error" in out


def test_a_harness_bug_is_not_reported_as_a_divergence(capsys, monkeypatch, tmp_path):
    def broken(info, **options):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(fuzz_engine, "fuzz", broken)
    code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))
    assert code == cli.EXIT_INTERNAL
    assert "internal error" in err and "engine exploded" in err


# ---- subjects ----------------------------------------------------------------------------------


def test_subjects_lists_every_builtin(capsys):
    code, out, _ = run_cli(capsys, "subjects")
    assert code == 0
    for info in BUILTIN_SUBJECTS:
        assert info.name in out
    assert "module:attr" in out


def test_subjects_json_is_a_list_of_subjects(capsys):
    code, out, _ = run_cli(capsys, "subjects", "--json")
    data = json.loads(out)
    assert code == 0
    builtins = [s for s in data if s["kind"] == "builtin"]
    assert [s["name"] for s in builtins] == [info.name for info in BUILTIN_SUBJECTS]
    assert {"name", "kind", "truth", "expected", "diverges_on", "summary"} <= set(data[0])
    assert {s["kind"] for s in data} <= {"builtin", "sglang"}


def subject_blocks(out: str) -> dict[str, list[str]]:
    """The text listing's lines by subject: its row, then the lines indented under it."""
    blocks: dict[str, list[str]] = {}
    for line in out.split("\n\n", 1)[0].splitlines()[1:]:
        if line.startswith(" "):
            blocks[list(blocks)[-1]].append(line.strip())
        else:
            blocks[line.split()[0]] = [line]
    return blocks


def test_subjects_text_says_every_field_that_json_lists(capsys):
    rows = json.loads(run_cli(capsys, "subjects", "--json")[1])
    code, out, _ = run_cli(capsys, "subjects")
    assert code == 0
    assert out.splitlines()[0].split() == ["NAME", "KIND", "TRUTH", "EXPECTED", "REQUIRES", "DIVERGES", "ON"]
    blocks = subject_blocks(out)
    assert list(blocks) == [row["name"] for row in rows]
    for row in rows:
        text = "\n".join(blocks[row["name"]])
        assert {"name", "kind", "truth", "expected", "diverges_on", "requires", "summary"} >= (
            set(row) - {"reached", "not_checked"})
        for key in ("kind", "truth", "expected"):
            assert row[key] in blocks[row["name"]][0].split(), (key, row)
        for key in ("diverges_on", "requires"):
            assert ", ".join(row[key]) in blocks[row["name"]][0], (key, row)
        assert f"design: {row['summary']}" in text
        if "reached" in row:
            assert f"reached: {row['reached']['sentence']}" in text
        for branch in row.get("not_checked", ()):
            assert f"not checked: {branch}" in text


def test_subjects_text_says_where_an_sglang_target_is_reached(capsys, monkeypatch):
    from swafuzz.subjects import registry

    target = {**BUILTIN_TABLE[0].to_dict(), "name": "sglang:some-target", "kind": "sglang",
              "reached": {"sentence": "Called from two places of the tree.", "sites": []}}
    monkeypatch.setattr(registry, "subject_listing", lambda: [BUILTIN_TABLE[0].to_dict(), target])
    code, out, _ = run_cli(capsys, "subjects")
    assert code == 0
    assert subject_blocks(out)["sglang:some-target"][1:] == [f"design: {target['summary']}",
                                                              "reached: Called from two places of the tree."]


def test_every_builtin_row_states_the_truth_requirements_and_summary_of_its_class():
    for row, info in zip(BUILTIN_TABLE, BUILTIN_SUBJECTS):
        assert (row.name, row.truth) == (info.name, info.truth)
        assert set(row.requires) == set(getattr(info.subject, "requires", ()))
        assert info.to_dict() == row.to_dict()


def test_subjects_json_carries_every_summary_whole(capsys):
    code, out, _ = run_cli(capsys, "subjects", "--json")
    assert code == 0
    for row in json.loads(out):
        assert row["summary"].endswith((".", ")")) and "\n" not in row["summary"], row


def test_a_user_subject_is_summarised_by_its_docstring_first_paragraph_whole():
    class Documented(Uncached):
        """Translates in every layer,
        over two lines.

        Details nobody lists."""

    assert SubjectInfo("mine", Documented, "unknown", kind="user").to_dict()["summary"] == (
        "Translates in every layer, over two lines.")


@pytest.mark.parametrize("argv", [
    ["--help"], ["fuzz", "--help"], ["gate", "--help"], ["subjects"], ["subjects", "--json"], [],
    ["frobnicate"], ["fuzz", "--subject", "uncached", "--profile", "gentle"],
    ["fuzz", "--subject", "uncached", "--settings", "weekly"], ["fuzz", "--subject", "uncached", "--seed", "-1"],
    ["fuzz", "--subject", "no-such-subject"], ["replay", "x.json", "--subject", "no-such-subject"],
])
def test_help_subjects_and_usage_errors_answer_without_importing_torch_or_hypothesis(argv, tmp_path):
    probe = ("import sys; from swafuzz.cli import main; code = main(sys.argv[1:]); "
             "heavy = sorted({'torch', 'hypothesis', 'numpy'} & set(sys.modules)); "
             "print('HEAVY', heavy, file=sys.stderr); sys.exit(code)")
    # no SGLang source: listing its targets binds them, which takes torch
    env = {key: value for key, value in os.environ.items() if not key.startswith("SWAFUZZ_")}
    outcome = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=tmp_path,
                             env={**env, "SWAFUZZ_SGLANG_SOURCE": ""}, timeout=120)
    if "subjects" in argv and importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: the listing binds its targets")
    assert outcome.returncode in (0, 2), outcome.stderr
    assert "HEAVY []" in outcome.stderr


@pytest.mark.parametrize("supervised", ["1", "0"], ids=["supervised", "one-process"])
@pytest.mark.parametrize("argv", [
    ["fuzz", "--subject", "uncached", "--budget", "-1"], ["gate", "--subject", "uncached", "--budget", "-1"],
    ["exhaustive", "--subject", "uncached", "--max-forwards", "0"], ["replay"],
    ["fuzz", "--subject", "no-such-subject"],
], ids=["fuzz", "gate", "exhaustive", "replay", "unknown-subject"])
def test_a_usage_error_is_printed_once_by_every_command(argv, supervised, tmp_path):
    outcome = subprocess.run([sys.executable, "-m", "swafuzz", *argv], capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "SWAFUZZ_SUPERVISOR": supervised}, timeout=120)
    assert outcome.returncode == 2, outcome.stderr
    assert outcome.stderr.count("error:") == 1, outcome.stderr
    assert outcome.stderr.count("usage:") <= 1, outcome.stderr


# ---- fuzz (with a stand-in engine) --------------------------------------------------------------


def test_fuzz_divergence_json_and_files(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--seed", "11", "--budget", "30",
                           "--report-dir", str(tmp_path), "--json")
    assert code == 1
    data = json.loads(out)  # exactly one JSON object on stdout
    assert data["verdict"] == "divergence" and data["complete"] is True
    assert data["subject"] == "pool-start-layer" and data["profile"] == "realistic"
    assert data["examples"] == 10 and data["elapsed_s"] == 0.5 and data["seed"] == 11
    assert data["diagnosis"]["kind"] == "wrong_rows" and data["diagnosis"]["sentence"].startswith("Stale cache")
    replay = load_replay(data["replay_file"])
    assert replay.subject == "pool-start-layer" and replay.seed == 11
    assert replay.scenario == EXAMPLES[STALE_EXAMPLE]
    assert {Path(p).name for p in data["reports"].values()} == {"summary.md", "report.json", "junit.xml", "report.html"}
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "divergence"
    (call,) = engine.calls
    assert call["database_dir"] == str(tmp_path / ".hypothesis-db")
    assert call["seed"] == 11 and call["budget_s"] == 30.0 and call["device"] == "cpu"


def test_fuzz_without_divergence_exits_0(capsys, engine, tmp_path):
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path),
                           "--database", str(tmp_path / "db"), "--settings", "nightly", "--profile", "adversarial")
    assert code == 0
    assert "no divergence in uncached" in out
    (call,) = engine.calls
    assert call["database_dir"] == str(tmp_path / "db")
    assert call["settings"] == "nightly" and call["profile"] == "adversarial"
    assert call["seed"] is None  # unseeded: the engine keeps failures in the database
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "no divergence"


def test_fuzz_ci_settings_default_to_seed_0(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--settings", "ci", "--report-dir", str(tmp_path))
    assert engine.calls[0]["seed"] == 0
    assert (tmp_path / "replays" / "pool-start-layer-realistic-seed0.json").exists()


def test_unseeded_workers_write_one_replay_file_each(capsys, engine, tmp_path):
    base = campaign.FuzzJob(subject="s", profile="realistic", settings="dev", seed=None, run="20260101-120000",
                       device="cpu", replay_dir=str(tmp_path), database_dir=str(tmp_path))
    jobs = [campaign._worker_job(base, i, 5, seed_lane(WHOLE, i, 2)) for i in range(2)]
    assert [(j.seed, j.run, j.max_examples) for j in jobs] == [(None, "20260101-120000-w0", 5),
                                                               (None, "20260101-120000-w1", 5)]
    # seeded workers take turns through the chunk seeds: 7, 9, 11, ... and 8, 10, 12, ...
    seeded = [campaign._worker_job(replace(base, seed=7), i, None, seed_lane(WHOLE, i, 2)) for i in range(2)]
    assert [(j.seed, j.seed_stride, j.run) for j in seeded] == [(7, 2, "seed7"), (8, 2, "seed8")]


def test_fuzz_accepts_a_user_subject_and_records_its_spec(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "swafuzz.subjects.builtin:PoolStartLayer",
                           "--report-dir", str(tmp_path), "--json")
    assert code == 1
    data = json.loads(out)
    assert data["subject"] == "swafuzz.subjects.builtin:PoolStartLayer" and data["subject_info"]["kind"] == "user"
    assert load_replay(data["replay_file"]).subject == "swafuzz.subjects.builtin:PoolStartLayer"


def test_json_stdout_stays_one_object_when_the_subject_prints(capsys, tmp_path, monkeypatch):
    (tmp_path / "chatty_subject.py").write_text(
        "from swafuzz.subjects.builtin import Uncached\n\n\n"
        "class Chatty(Uncached):\n"
        "    def swa_write_location(self, batch, layer_id):\n"
        "        print('debug: storing layer', layer_id)\n"
        "        return super().swa_write_location(batch, layer_id)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(capsys, "fuzz", "--subject", "chatty_subject:Chatty", "--max-examples", "5",
                             "--report-dir", str(tmp_path / "reports"), "--json")
    assert code == 0
    assert json.loads(out)["subject_info"]["summary"] == ""
    assert "debug: storing layer" in err


def test_a_full_disk_still_prints_the_finding_and_its_scenario_and_exits_1(capsys, engine, tmp_path, monkeypatch):
    engine.example = STALE_EXAMPLE

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(reports_module, "write_atomically", disk_full)
    monkeypatch.setattr(replay_module, "write_atomically", disk_full)
    code, out, err = run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--seed", "11",
                             "--report-dir", str(tmp_path))
    assert code == 1
    sentence = run_scenario(BUILTIN_SUBJECTS[4].subject, EXAMPLES[STALE_EXAMPLE]).divergence.sentence
    assert sentence in out and "replay file:" not in out
    assert "the replay file could not be written" in err
    assert f"the reports could not be written: {os.strerror(errno.ENOSPC)}" in err
    printed = out.split("scenario (no replay file holds it):\n", 1)[1]
    assert Scenario.from_dict(json.loads(printed)) == EXAMPLES[STALE_EXAMPLE]


# ---- gate and exhaustive ------------------------------------------------------------------------


def test_gate_is_the_ci_preset_and_prints_the_markdown(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    code, out, _ = run_cli(capsys, "gate", "--subject", "pool-start-layer", "--report-dir", str(tmp_path))
    assert code == 1
    assert out.startswith("### swafuzz gate: ❌ divergence in `pool-start-layer`")
    (call,) = engine.calls
    assert call["settings"] == "ci" and call["profile"] == "realistic"
    assert call["budget_s"] == cli.GATE_BUDGET_S and call["seed"] == 0
    assert (tmp_path / "junit.xml").exists() and (tmp_path / "summary.md").read_text() in out
    reports = next(line for line in out.splitlines() if line.startswith("  reports: "))
    assert all(str(tmp_path / name) in reports for name in ("summary.md", "report.json", "junit.xml", "report.html"))


def test_a_run_into_a_directory_another_run_is_writing_to_is_refused(capsys, engine, tmp_path):
    with campaign.writing_reports_in(tmp_path):  # as another run would, from its start to its reports
        code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))
    assert code == 2
    assert f"another swafuzz run (process {os.getpid()}) is writing its reports there" in err
    assert not (tmp_path / "report.json").exists()
    assert run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))[0] == 0


@pytest.mark.parametrize("command", ["fuzz", "exhaustive"])
@pytest.mark.parametrize("example", [None, STALE_EXAMPLE], ids=["clean", "divergence"])
def test_a_run_leaves_no_lock_file_in_its_report_folder(capsys, engine, tmp_path, command, example):
    engine.example = example
    code, _, _ = run_cli(capsys, command, "--subject", "pool-start-layer", "--report-dir", str(tmp_path))
    assert code == (1 if example else 0)
    assert (tmp_path / "report.json").exists()
    assert not (tmp_path / campaign.REPORT_DIR_LOCK).exists()


def test_a_run_that_ends_removes_only_its_own_lock_file(tmp_path):
    lock = tmp_path / campaign.REPORT_DIR_LOCK
    first, second = campaign.writing_reports_in(tmp_path), campaign.writing_reports_in(tmp_path)
    first.__enter__()
    lock.unlink()  # by hand, say: another run may take the directory now
    second.__enter__()
    first.__exit__(None, None, None)
    assert lock.exists()  # the second run's, which still keeps a third one out
    with pytest.raises(InputError, match="another swafuzz run"):
        with campaign.writing_reports_in(tmp_path):
            pass
    second.__exit__(None, None, None)
    assert not lock.exists()


def test_a_run_that_locks_a_lock_file_removed_meanwhile_takes_the_one_there_now(tmp_path, monkeypatch):
    lock = tmp_path / campaign.REPORT_DIR_LOCK
    lock.write_text("12345")  # left by an earlier run, which is ending now
    flock = campaign.fcntl.flock

    def the_earlier_run_ends_first(handle, operation):
        monkeypatch.setattr(campaign.fcntl, "flock", flock)
        lock.unlink()  # after this run opened the file, before it locked it
        flock(handle, operation)

    monkeypatch.setattr(campaign.fcntl, "flock", the_earlier_run_ends_first)
    with campaign.writing_reports_in(tmp_path):
        assert lock.read_text() == str(os.getpid())
        with pytest.raises(InputError, match=f"another swafuzz run \\(process {os.getpid()}\\)"):
            with campaign.writing_reports_in(tmp_path):
                pass


def test_a_run_into_a_directory_holding_another_runs_reports_says_it_replaces_them(capsys, engine, tmp_path):
    run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))
    code, _, err = run_cli(capsys, "gate", "--subject", "uncached", "--report-dir", str(tmp_path))
    assert code == 0
    assert "holds the reports of an earlier run (fuzz of uncached, finished " in err
    assert "this run replaces them" in err


def test_a_run_replacing_a_report_folders_reports_keeps_its_replay_files_and_says_so(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    argv = ("fuzz", "--subject", "pool-start-layer", "--seed", "0", "--report-dir", str(tmp_path), "--json")
    first = json.loads(run_cli(capsys, *argv)[1])["replay_file"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 1
    assert "this run replaces them and keeps the replay files in " + str(tmp_path / "replays") in err
    assert "numbering its own where one has its name (...-2.json)" in err
    second = json.loads(out)["replay_file"]
    assert Path(first).name == "pool-start-layer-realistic-seed0.json"
    assert Path(second).name == "pool-start-layer-realistic-seed0-2.json"
    assert load_replay(first).scenario == load_replay(second).scenario == EXAMPLES[STALE_EXAMPLE]
    assert json.loads((tmp_path / "report.json").read_text())["replay_file"] == second


def test_a_run_into_a_folder_holding_only_earlier_replay_files_says_it_keeps_them(capsys, engine, tmp_path,
                                                                                  replay_file):
    engine.example = STALE_EXAMPLE
    code, out, err = run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--seed", "0",
                             "--report-dir", str(tmp_path), "--json")
    assert code == 1 and replay_file.exists()
    assert (f"{tmp_path / 'replays'} holds replay files of earlier runs; this run keeps them, numbering its own "
            "where one has its name") in err
    assert "replaces" not in err


def test_a_run_into_a_fresh_report_folder_says_nothing_of_earlier_runs(capsys, engine, tmp_path):
    code, _, err = run_cli(capsys, "fuzz", "--subject", "uncached", "--report-dir", str(tmp_path))
    assert code == 0 and "note:" not in err


def test_gate_passes_and_takes_a_budget(capsys, engine, tmp_path):
    code, out, _ = run_cli(capsys, "gate", "--subject", "uncached", "--budget", "5", "--report-dir",
                           str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["verdict"] == "no divergence"
    assert engine.calls[0]["budget_s"] == 5.0
    assert engine.calls[0]["long_horizon"] is None  # as the settings profile says: ci draws none


def test_long_horizon_option_reaches_the_engine_from_fuzz_and_gate(capsys, engine, tmp_path):
    for command in ("fuzz", "gate"):
        run_cli(capsys, command, "--subject", "uncached", "--long-horizon", "--budget", "5",
                "--report-dir", str(tmp_path), "--json")
    assert [call["long_horizon"] for call in engine.calls] == [True, True]


def test_exhaustive_passes_its_bounds(capsys, engine, tmp_path):
    engine.example = STALE_EXAMPLE
    code, out, _ = run_cli(capsys, "exhaustive", "--subject", "pool-start-layer", "--max-forwards", "3",
                           "--max-layers", "2", "--max-micro-batches", "1", "--report-dir", str(tmp_path), "--json")
    assert code == 1
    call = engine.calls[0]
    assert (call["max_forwards"], call["max_layers"], call["max_micro_batches"]) == (3, 2, 1)
    assert call["profile"] == "adversarial"
    data = json.loads(out)
    assert Path(data["replay_file"]).name == "pool-start-layer-adversarial-exhaustive.json"


def test_exhaustive_for_real_on_a_tiny_scope(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "exhaustive", "--subject", "uncached", "--max-forwards", "1",
                           "--max-layers", "1", "--max-micro-batches", "1", "--report-dir", str(tmp_path), "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"] == "no divergence" and data["examples"] > 0
    assert data["scope"]["scenarios"] == data["examples"] and "draft_model" in data["scope"]["covered"]


def test_a_clean_exhaustive_run_prints_what_its_scope_covers_and_leaves_out(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "exhaustive", "--subject", "uncached", "--max-forwards", "1",
                           "--max-layers", "1", "--max-micro-batches", "1", "--report-dir", str(tmp_path))
    assert code == 0
    covers = next(line for line in out.splitlines() if line.strip().startswith("covers:"))
    leaves_out = next(line for line in out.splitlines() if line.strip().startswith("leaves out:"))
    assert "draft_model" in covers and "micro_batches" not in covers
    assert "micro_batches (not in the adversarial profile at these bounds)" in leaves_out
    assert "more than 1 micro-batches" in leaves_out


# ---- replay ------------------------------------------------------------------------------------


@pytest.fixture
def replay_file(tmp_path) -> Path:
    scenario = EXAMPLES[STALE_EXAMPLE]
    divergence = run_scenario(BUILTIN_SUBJECTS[4].subject, scenario).divergence
    assert BUILTIN_SUBJECTS[4].name == "pool-start-layer" and divergence is not None
    replay = Replay(subject="pool-start-layer", profile="realistic", scenario=scenario,
                    divergence=divergence, seed=3, settings="dev")
    return write_replay(replay, tmp_path / "replays")


def test_replay_exits_1_while_the_bug_is_there(capsys, replay_file):
    code, out, _ = run_cli(capsys, "replay", str(replay_file))
    assert code == 1
    assert "divergence still there in pool-start-layer" in out and "Stale cache" in out


def test_replay_exits_0_once_fixed(capsys, replay_file):
    code, out, _ = run_cli(capsys, "replay", str(replay_file), "--subject", "uncached")
    assert code == 0 and "fixed" in out


def test_replay_json(capsys, replay_file):
    code, out, _ = run_cli(capsys, "replay", str(replay_file), "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "divergence" and data["reproduced"] is True
    assert data["replay_file"] == str(replay_file) and data["examples"] == 1


def test_replay_says_when_the_divergence_changed(capsys, replay_file):
    data = json.loads(replay_file.read_text())
    data["diagnosis"]["layer_id"] = 2
    replay_file.write_text(json.dumps(data))
    code, out, _ = run_cli(capsys, "replay", str(replay_file))
    assert code == 1 and "but differently" in out


@pytest.mark.parametrize("damage, message", [
    (lambda d: {**d, "schema_version": 7}, "schema version 7"),
    (lambda d: {**d, "format": "other"}, "not a swafuzz replay file"),
    (lambda d: {**d, "scenario": {"events": [{"op": "explode"}]}}, "field 'scenario' is invalid"),
    (lambda d: {**d, "subject": "gone_module_xyz:Cls"}, "names code to import"),
    (lambda d: {**d, "scenario": {"events": [{"op": "finish", "request": 4}]}}, "cannot run"),
])
def test_bad_replay_files_exit_2_and_overwrite_nothing(capsys, replay_file, tmp_path, damage, message):
    replay_file.write_text(json.dumps(damage(json.loads(replay_file.read_text()))))
    emitted = tmp_path / "test_existing.py"
    emitted.write_text("# keep me\n")
    code, _, err = run_cli(capsys, "replay", str(replay_file), "--emit-pytest", str(emitted))
    assert code == 2 and message in err
    assert emitted.read_text() == "# keep me\n"


def test_replay_of_text_that_is_not_json_exits_2(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "swafuzz-replay", ')
    code, _, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and "not valid JSON" in err
    code, _, err = run_cli(capsys, "replay", str(tmp_path / "absent.json"))
    assert code == 2 and "no such replay file" in err




def test_round_trip_fuzz_replay_emitted_pytest(capsys, tmp_path, run_pytest_in_subprocess):
    """The real engine finds pool-start-layer's stale cache; every later step agrees."""
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--seed", "1",
                           "--max-examples", "300", "--report-dir", str(tmp_path), "--json")
    assert code == 1, out
    found = json.loads(out)
    replay_path = found["replay_file"]
    assert load_replay(replay_path).divergence.to_dict() == found["diagnosis"]

    emitted = tmp_path / "regression" / "test_stale.py"
    code, out, _ = run_cli(capsys, "replay", replay_path, "--emit-pytest", str(emitted))
    assert code == 1 and "still there" in out
    outcome, outcomes = run_pytest_in_subprocess(emitted)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    assert list(outcomes.values()) == ["failed"]

    code, _, _ = run_cli(capsys, "replay", replay_path, "--subject", "step-keyed-capture")
    assert code == 0


def test_real_fuzz_of_a_correct_subject_exits_0(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "uncached", "--max-examples", "25",
                           "--report-dir", str(tmp_path), "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"] == "no divergence" and data["examples"] == 25
    assert data["features_covered"]


# ---- workers -----------------------------------------------------------------------------------


def test_a_divergence_reported_again_while_shrinking_rewrites_the_same_replay_file(tmp_path):
    scenario = EXAMPLES[STALE_EXAMPLE]
    divergence = run_scenario(BUILTIN_SUBJECTS[4].subject, scenario).divergence
    log = campaign.DivergenceLog("pool-start-layer", "realistic", "dev", "cpu", tmp_path, "seed3")
    assert log.record(FuzzResult("s", "realistic", "dev", examples=4, elapsed_s=1.0)) is None
    first = log.record(FuzzResult("s", "realistic", "dev", examples=5, elapsed_s=1.0, divergence=divergence,
                                  scenario=scenario, seed=3))
    shrunk = EXAMPLES["pipeline-stage"]  # stands for the smaller scenario shrinking found
    again = log.write(shrunk, divergence, seed=3)
    assert again == first == log.path and list(tmp_path.iterdir()) == [first]
    recorded = load_replay(first)
    assert recorded.scenario == shrunk and recorded.seed == 3 and recorded.subject == "pool-start-layer"


def test_runs_writing_one_replay_directory_never_share_a_replay_file(tmp_path):
    scenario = EXAMPLES[STALE_EXAMPLE]
    divergence = run_scenario(BUILTIN_SUBJECTS[4].subject, scenario).divergence
    logs = [campaign.DivergenceLog("pool-start-layer", "realistic", "dev", "cpu", tmp_path, "20261201-101500")
            for _ in range(3)]  # unseeded runs started in the same second
    paths = [log.write(scenario, divergence) for log in logs]
    assert [path.name for path in paths] == [
        "pool-start-layer-realistic-20261201-101500.json", "pool-start-layer-realistic-20261201-101500-2.json",
        "pool-start-layer-realistic-20261201-101500-3.json"]
    assert all(load_replay(path).divergence == divergence for path in paths)


def test_merge_results_keeps_the_winner_and_adds_up_the_rest():
    scenario = EXAMPLES[STALE_EXAMPLE]
    divergence = run_scenario(BUILTIN_SUBJECTS[4].subject, scenario).divergence
    winner = FuzzResult("s", "realistic", "dev", examples=5, elapsed_s=2.0, divergence=divergence,
                        scenario=scenario, seed=8, coverage={"idle": 1, "micro_batches": 2})
    other = FuzzResult("s", "realistic", "dev", examples=7, elapsed_s=3.0, seed=9,
                       coverage={"idle": 4}, interrupted=True)
    merged = campaign.merge_results([other, winner], winner)
    assert merged.divergence == divergence and merged.seed == 8 and merged.scenario == scenario
    assert merged.examples == 12 and merged.elapsed_s == 3.0
    assert merged.coverage == {"idle": 5, "micro_batches": 2}
    assert not merged.interrupted


def test_workers_stop_at_the_first_divergence(capsys, tmp_path):
    # seed 1 finds it within a few examples; each worker may run 2000, which neither nears
    # once the first divergence stops them (the budget is only a net)
    code, out, _ = run_cli(capsys, "fuzz", "--subject", "pool-start-layer", "--workers", "2", "--seed", "1",
                           "--max-examples", "4000", "--budget", "600", "--report-dir", str(tmp_path), "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "divergence" and data["workers"] == 2
    assert data["seed"] in (1, 2)
    assert load_replay(data["replay_file"]).seed == data["seed"]
    assert len(data["examples_per_worker"]) == 2 and all(count < 2000 for count in data["examples_per_worker"])


# ---- bench -------------------------------------------------------------------------------------


def test_bench_hands_its_arguments_to_the_benchmark_runner(capsys, monkeypatch):
    seen = []
    fake = types.ModuleType("swafuzz.tools.bench")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "swafuzz.tools.bench", fake)
    monkeypatch.setattr(swafuzz.tools, "bench", fake, raising=False)
    assert cli.main(["bench", "--help", "--repeats", "3"]) == 0
    assert seen == [["--help", "--repeats", "3"]]


# ---- progress and interrupts ------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_draws_in_place_on_a_terminal_and_logs_a_line_per_interval_elsewhere():
    update = Progress(examples=120, elapsed_s=4.0, budget_s=10.0, features_covered=9, divergences=1)
    terminal, pipe, silent = Terminal(), io.StringIO(), Terminal()
    ProgressLine(terminal, min_interval_s=0).update(update)
    ProgressLine(silent, enabled=False).update(update)
    assert silent.getvalue() == ""
    log = ProgressLine(pipe, log_interval_s=10.0, clock=iter([0.0, 5.0, 10.0, 12.0, 20.5]).__next__)
    for _ in range(4):
        log.update(update)
    log.note("divergence: stale")
    assert pipe.getvalue().splitlines() == [format_progress(update)] * 2  # at 10 s and 20.5 s
    line = terminal.getvalue()
    assert line.startswith("\r") and "120 examples" in line and "30.0/s" in line
    assert "features 9/17" in line and "divergences 1" in line and "6s left" in line and "[####" in line


def test_progress_line_is_throttled_and_erased():
    clock = iter([0.0, 0.05, 1.0]).__next__
    stream = Terminal()
    line = ProgressLine(stream, min_interval_s=0.2, clock=clock)
    for examples in (1, 2, 3):
        line.update(Progress(examples, 1.0, None, 0, 0))
    assert stream.getvalue().count("\r") == 2  # the second update came too soon
    line.note("divergence: stale")
    line.close()
    assert "divergence: stale\n" in stream.getvalue()
    assert "swafuzz" in format_progress(Progress(5, 0.0, None, 0, 0))


def test_interrupt_watch_raises_once_then_only_notes():
    with campaign.InterruptWatch() as watch:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # noted, not raised
    assert watch.signal_name == "SIGTERM" and watch.exit_code == 143


def test_the_console_script_is_installed():
    script = shutil.which("swafuzz")
    if script is None:
        pytest.skip("the swafuzz script is not on PATH (scripts/install puts it there)")
    outcome = subprocess.run([script, "subjects", "--json"], capture_output=True, text=True, timeout=120)
    assert outcome.returncode == 0
    assert json.loads(outcome.stdout)


def test_an_interrupt_swallowed_where_it_landed_is_raised_again_between_examples():
    with campaign.InterruptWatch() as watch:
        try:  # as a garbage collector callback or a finalizer would
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        with pytest.raises(KeyboardInterrupt):
            watch.check()
        watch.disarm()
        watch.check()
    assert watch.exit_code == 130


def test_a_clean_exhaustive_run_states_equivalence_within_its_bounds(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "exhaustive", "--subject", "step-keyed-capture", "--max-forwards", "1",
                           "--max-layers", "1", "--report-dir", str(tmp_path))
    assert code == 0
    assert re.search(r"equivalent to the reference on all \d+ scenarios within the bounds: "
                     r"forwards <= 1, layers <= 1, micro-batches <= 2", out)


def test_an_interrupt_that_surfaces_as_another_exception_ends_the_run_as_interrupted():
    from hypothesis.errors import FlakyStrategyDefinition

    def start(progress):
        os.kill(os.getpid(), signal.SIGINT)  # lands mid-draw: Hypothesis calls the draw flaky
        raise FlakyStrategyDefinition("Inconsistent data generation!")

    with campaign.InterruptWatch(raise_first=False) as watch:
        result = campaign.run_until_interrupted(start, lambda examples, elapsed: ("partial", examples),
                                           lambda progress: None, watch)
    assert result == ("partial", 0)


def test_the_same_exception_without_an_interrupt_is_a_harness_failure():
    from hypothesis.errors import FlakyStrategyDefinition

    def start(progress):
        raise FlakyStrategyDefinition("Inconsistent data generation!")

    with campaign.InterruptWatch(raise_first=False) as watch, pytest.raises(FlakyStrategyDefinition):
        campaign.run_until_interrupted(start, lambda examples, elapsed: None, lambda progress: None, watch)


def test_a_closed_stdout_ends_quietly_with_the_result_code(replay_file):
    # as `swafuzz replay FILE | head -0` does: the reader is gone before anything is printed
    process = subprocess.Popen([sys.executable, "-m", "swafuzz", "replay", str(replay_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=120) == 1, err  # the divergence is still there
    assert err == ""


def test_an_interrupt_swallowed_by_a_finalizer_prints_no_traceback(monkeypatch):
    printed = []  # what would print "Exception ignored in ..." and a traceback
    monkeypatch.setattr(sys, "unraisablehook", printed.append)

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises here, where it cannot escape

    with campaign.InterruptWatch() as watch:
        Finalized()
        with pytest.raises(KeyboardInterrupt):
            watch.check()
    assert printed == []
