"""The pytest plugin: a subject gated from an engine's own test suite with plain pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import swafuzz.commands  # noqa: F401 - see below
from swafuzz.cli import main as swafuzz
from swafuzz.strategies.features import ALL_FEATURES

pytest_plugins = ["pytester"]
# torch and the fuzzing modules are imported above, at collection: pytester drops the modules a
# test imported when the test ends, and torch cannot be loaded a second time in one process

PLUGIN = ("-p", "swafuzz.pytest_plugin", "-p", "no:cacheprovider")
# a short search for the equivalent subjects: a passing gate is only as strong as its search,
# but here it is the plumbing under test
SHORT_PROFILE = """
from hypothesis import settings

import swafuzz.search.fuzz  # registers the swafuzz-* profiles

settings.register_profile("short", settings.get_profile("swafuzz-ci"), max_examples=25)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(SHORT_PROFILE)
    return pytester


def _replay_file(pytester: pytest.Pytester, subject: str, profile: str = "realistic") -> Path:
    return pytester.path / "reports" / "replays" / f"{subject}-{profile}-pytest.json"


def test_a_diverging_subject_fails_with_the_diagnosis_sentence_and_the_replay_command(suite, capsys):
    result = suite.runpytest_subprocess(*PLUGIN, "--swafuzz-subject", "pool-start-layer",
                                        "--hypothesis-profile", "swafuzz-ci")
    result.assert_outcomes(failed=1)
    replay_file = _replay_file(suite, "pool-start-layer")
    sentence = json.loads(replay_file.read_text())["diagnosis"]["sentence"]
    output = result.stdout.str()
    assert sentence in output
    assert "swafuzz replay reports/replays/pool-start-layer-realistic-pytest.json" in output
    assert "git apply" not in output  # no patch offered against swafuzz's own source
    # the command it prints reproduces the divergence
    assert swafuzz(["replay", str(replay_file)]) == 1
    assert sentence in capsys.readouterr().out


# Hypothesis prints its statistics as prose that changes between its releases; what swafuzz
# hands it is data: one hypothesis.event per feature a scenario exercises, recorded here
RECORD_EVENTS = """
import json

import hypothesis

_event = hypothesis.event


def _recorded(value, *args, **kwargs):
    with open("events.jsonl", "a") as events:
        events.write(json.dumps(value) + "\\n")
    return _event(value, *args, **kwargs)


hypothesis.event = _recorded
"""


def test_an_equivalent_subject_passes_and_its_statistics_count_scenario_features(suite):
    suite.makeconftest(SHORT_PROFILE + RECORD_EVENTS)
    result = suite.runpytest_subprocess(*PLUGIN, "--swafuzz-subject", "uncached", "--hypothesis-profile", "short")
    result.assert_outcomes(passed=1)
    assert not (suite.path / "reports").exists()
    events = {json.loads(line) for line in (suite.path / "events.jsonl").read_text().splitlines()}
    assert events and events <= set(ALL_FEATURES)


def test_the_plugin_adds_nothing_and_changes_nothing_unless_asked(pytester):
    suite = pytester
    # nor does it import the fuzzing machinery (torch and all) in a session that does not ask
    suite.makepyfile(test_plain="import sys\n\ndef test_one():\n    assert 'torch' not in sys.modules\n")
    with_plugin = suite.runpytest_subprocess(*PLUGIN, "--collect-only", "-q")
    without = suite.runpytest_subprocess("-p", "no:swafuzz.pytest_plugin", "-p", "no:cacheprovider",
                                         "--collect-only", "-q")
    collected = [line for line in with_plugin.stdout.lines if "::" in line]
    assert collected == ["test_plain.py::test_one"]
    assert collected == [line for line in without.stdout.lines if "::" in line]
    suite.runpytest_subprocess(*PLUGIN).assert_outcomes(passed=1)
    assert not (suite.path / "reports").exists()


def test_each_subject_and_profile_is_one_test_and_k_selects_among_them(suite):
    result = suite.runpytest_subprocess(
        *PLUGIN, "--collect-only", "-q", "--swafuzz-subject", "uncached", "--swafuzz-subject", "step-keyed",
        "--swafuzz-profile", "realistic", "--swafuzz-profile", "adversarial", "-k", "not step",
    )
    assert [line for line in result.stdout.lines if "::" in line] == [
        "swafuzz::uncached[realistic]", "swafuzz::uncached[adversarial]",
    ]


@pytest.mark.parametrize("argv,message", [
    (("--swafuzz-subject", "no-such-subject"), "--swafuzz-subject no-such-subject"),
    (("--swafuzz-subject", "uncached", "--swafuzz-profile", "gentle"), "--swafuzz-profile gentle"),
])
def test_an_unknown_subject_or_profile_is_a_usage_error(suite, argv, message):
    result = suite.runpytest_subprocess(*PLUGIN, *argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_hypothesis_seed_makes_a_run_repeat_exactly(suite):
    shrunk = []
    for _ in range(2):
        result = suite.runpytest_subprocess(*PLUGIN, "--swafuzz-subject", "pool-layer0",
                                            "--hypothesis-profile", "swafuzz-dev", "--hypothesis-seed", "11")
        result.assert_outcomes(failed=1)
        shrunk.append(json.loads(_replay_file(suite, "pool-layer0").read_text()))
        _replay_file(suite, "pool-layer0").unlink()
    assert shrunk[0] == shrunk[1]


def test_xdist_distributes_the_tests(suite):
    # PYTEST_XDIST_WORKER names the worker process a test runs in (pytest-xdist sets it)
    suite.makeconftest(SHORT_PROFILE + """
import os


def pytest_runtest_setup(item):
    with open("workers.txt", "a") as workers:
        workers.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
""")
    result = suite.runpytest_subprocess(
        *PLUGIN, "-n", "2", "--swafuzz-subject", "pool-start-layer", "--swafuzz-subject", "uncached",
        "--hypothesis-profile", "swafuzz-ci",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*swafuzz replay reports/replays/pool-start-layer-realistic-pytest.json*"])
    assert set((suite.path / "workers.txt").read_text().split()) <= {"gw0", "gw1"}


def test_fuzz_test_gives_a_test_file_an_ordinary_hypothesis_test(suite):
    suite.makepyfile(test_gate="""
        from hypothesis import settings

        from swafuzz.pytest_plugin import fuzz_test

        test_pool_cache = fuzz_test("pool-no-invalidate", settings=settings(max_examples=300))
        test_reference = fuzz_test("uncached-ring", profile="adversarial")


        def test_both_are_plain_hypothesis_tests():
            for test in (test_pool_cache, test_reference):
                assert callable(test.hypothesis.inner_test)
                assert callable(test.hypothesis.fuzz_one_input)  # what HypoFuzz drives
    """)
    result = suite.runpytest_subprocess(*PLUGIN, "--hypothesis-profile", "short")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*reproduce:   swafuzz replay reports/replays/pool-no-invalidate-realistic-pytest.json*"])


def _installed_with_entry_point() -> bool:
    return any(ep.value == "swafuzz.pytest_plugin" for ep in entry_points(group="pytest11"))


@pytest.mark.skipif(not _installed_with_entry_point(),
                    reason="swafuzz is not installed here with its pytest11 entry point (scripts/install does that)")
def test_installing_swafuzz_turns_the_plugin_on_through_its_entry_point(suite):
    outcome = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "--swafuzz-subject", "uncached"],
        cwd=suite.path, capture_output=True, text=True, timeout=300, env={**os.environ},
    )
    assert outcome.returncode == 0, outcome.stderr
    assert "swafuzz::uncached[realistic]" in outcome.stdout.splitlines()


def test_a_failure_the_cli_saved_is_the_first_example_the_pytest_gate_runs(pytester, capsys):
    database = pytester.path / "shared-db"
    assert swafuzz(["fuzz", "--subject", "pool-start-layer", "--settings", "dev", "--max-examples", "2000",
                    "--database", str(database), "--report-dir", str(pytester.path / "nightly")]) == 1
    # only the reuse phase runs: the gate can fail only on an example read from the database
    pytester.makeconftest(f"""
        from hypothesis import Phase, settings
        from hypothesis.database import DirectoryBasedExampleDatabase

        import swafuzz.search.fuzz  # registers the swafuzz-* profiles

        settings.register_profile("shared", settings.get_profile("swafuzz-dev"), phases=[Phase.reuse],
                                  database=DirectoryBasedExampleDatabase({str(database)!r}))
    """)
    result = pytester.runpytest_subprocess(*PLUGIN, "--swafuzz-subject", "pool-start-layer",
                                           "--hypothesis-profile", "shared")
    result.assert_outcomes(failed=1)


def test_a_fuzzer_driving_fuzz_one_input_as_hypofuzz_does_finds_the_divergence(tmp_path):
    import random

    from swafuzz.search.fuzz import Diverged
    from swafuzz.pytest_plugin import fuzz_test

    test = fuzz_test("pool-start-layer", report_dir=tmp_path)
    buffers = random.Random(0)
    with pytest.raises(Diverged) as found:
        for _ in range(2000):
            test.hypothesis.fuzz_one_input(buffers.randbytes(2000))
    recorded = json.loads((tmp_path / "replays" / "pool-start-layer-realistic-pytest.json").read_text())
    assert recorded["diagnosis"]["sentence"] == str(found.value)
