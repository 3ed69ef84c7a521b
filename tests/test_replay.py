"""Replay files: the schema round trip, strict loading, deterministic re-runs, emitted tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from swafuzz import run_scenario
from swafuzz.subjects.registry import resolve_subject
from swafuzz.results.replay import (
    FORMAT,
    SCHEMA_VERSION,
    Replay,
    ReplayError,
    emit_pytest,
    load_replay,
    render_pytest,
    run_replay,
    same_divergence,
    write_replay,
)
from swafuzz.strategies.examples import EXAMPLES

STALE_EXAMPLE = "first-swa-layer-not-start"


def recorded(subject: str = "pool-start-layer", example: str = STALE_EXAMPLE, **fields) -> Replay:
    """A replay of what ``pool-start-layer`` does on a hand-written bug-class scenario."""
    scenario = EXAMPLES[example]
    divergence = run_scenario(resolve_subject("pool-start-layer").subject, scenario).divergence
    assert divergence is not None
    return Replay(subject=subject, profile="realistic", scenario=scenario, divergence=divergence,
                  seed=7, settings="dev", **fields)


# ---- schema --------------------------------------------------------------------------------


def test_round_trip_through_a_file_is_exact(tmp_path):
    replay = recorded()
    path = write_replay(replay, tmp_path)
    assert path.name == "pool-start-layer-realistic-seed7.json"
    assert load_replay(path) == replay
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["schema_version"] == SCHEMA_VERSION
    assert {"harness_version", "subject", "profile", "seed", "scenario", "diagnosis"} <= set(data)


def test_a_later_divergence_of_the_same_run_replaces_the_file(tmp_path):
    first = write_replay(recorded(), tmp_path)
    second = write_replay(recorded(example="two-batch-overlap"), tmp_path)
    assert first == second
    assert load_replay(second).scenario == EXAMPLES["two-batch-overlap"]
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left behind


def test_an_enumerated_divergence_is_named_after_its_settings(tmp_path):
    path = write_replay(recorded(), tmp_path)
    enumerated = Replay(**{**recorded().__dict__, "seed": None, "settings": "exhaustive"})
    assert write_replay(enumerated, tmp_path).name == "pool-start-layer-realistic-exhaustive.json"
    assert path.exists()


def _write_json(tmp_path: Path, data) -> Path:
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _good() -> dict:
    return recorded().to_dict()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=99), "schema version 99"),
        (lambda d: d.update(schema_version=0), "schema version 0"),
        (lambda d: d.pop("schema_version"), "schema version None"),
        (lambda d: d.update(format="something-else"), "not a swafuzz replay file"),
        (lambda d: d.pop("subject"), "field 'subject'"),
        (lambda d: d.update(seed="seven"), "field 'seed'"),
        (lambda d: d.update(seed=True), "field 'seed'"),
        (lambda d: d["scenario"].update(events="none"), "field 'scenario' is invalid"),
        (lambda d: d["scenario"]["config"].update(start_layer=9), "start_layer"),
        (lambda d: d.update(diagnosis=[]), "field 'diagnosis' must be an object"),
        (lambda d: d["diagnosis"].update(colour="red"), "unknown key(s) 'colour'"),
        (lambda d: d["diagnosis"].pop("layer_id"), "field 'diagnosis' is incomplete"),
        (lambda d: d["diagnosis"].update(sentence=None), "diagnosis.sentence"),
    ],
)
def test_malformed_files_are_rejected_with_the_reason(tmp_path, mutate, message):
    data = _good()
    mutate(data)
    path = _write_json(tmp_path, data)
    with pytest.raises(ReplayError) as caught:
        load_replay(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_an_unknown_schema_version_says_which_versions_are_read(tmp_path):
    data = {**_good(), "schema_version": 2, "harness_version": "9.0.0"}
    with pytest.raises(ReplayError, match=r"written by swafuzz 9\.0\.0.*reads schema version 1"):
        load_replay(_write_json(tmp_path, data))


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON (line 1, column 2"),
    ("[1, 2]", "expected a JSON object, got list"),
    ("", "not valid JSON"),
])
def test_files_that_are_not_replay_json_are_rejected(tmp_path, text, message):
    with pytest.raises(ReplayError, match=message.replace("(", r"\(")):
        load_replay(_write_json(tmp_path, text))


def test_a_missing_file_is_a_replay_error(tmp_path):
    with pytest.raises(ReplayError, match="no such replay file"):
        load_replay(tmp_path / "absent.json")


# ---- re-running ------------------------------------------------------------------------------


def test_replay_reproduces_the_recorded_divergence_every_time():
    replay = recorded()
    for _ in range(3):
        result = run_replay(replay)
        assert result.divergence is not None
        assert same_divergence(result.divergence, replay.divergence)
        assert result.divergence == replay.divergence


def test_replay_against_a_correct_subject_passes():
    assert run_replay(recorded(), subject="uncached").passed
    assert run_replay(recorded(subject="step-keyed-capture")).passed


def test_same_divergence_compares_the_failure_and_its_store():
    a = recorded().divergence
    moved = recorded(example="two-batch-overlap").divergence
    assert same_divergence(a, a)
    assert not same_divergence(a, moved)


# ---- emitted pytest files ----------------------------------------------------------------------


USER_SUBJECT = '''
    """A user's subject living outside the harness."""
    from swafuzz.subjects.builtin import PoolStartLayer


    class MyCachedPool(PoolStartLayer):
        """The pool-level cache, as a user would ship it."""
'''


def test_emitted_tests_are_standalone_and_fail_exactly_while_the_bug_is_there(tmp_path, run_pytest_in_subprocess):
    """One pytest run over three emitted files: a built-in subject with the bug, the same
    scenario against a correct subject, and a user's module:attr subject with the bug."""
    (tmp_path / "my_subjects.py").write_text(textwrap.dedent(USER_SUBJECT))
    tests = tmp_path / "regressions"
    buggy = emit_pytest(recorded(), tests / "test_buggy.py", source="reports/replays/x.json")
    emit_pytest(recorded(subject="uncached"), tests / "test_fixed.py", source="x.json")
    user = recorded(subject="my_subjects:MyCachedPool")
    assert "SUBJECT = 'my_subjects:MyCachedPool'" in render_pytest(user, source="x.json")
    emit_pytest(user, tests / "test_user.py", source="x.json")
    text = buggy.read_text()
    assert "import hypothesis" not in text and "from hypothesis" not in text

    outcome, outcomes = run_pytest_in_subprocess(tests, extra_path=tmp_path)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    assert {name.split("::")[0]: result for name, result in outcomes.items()} == {
        "test_buggy.py": "failed", "test_fixed.py": "passed", "test_user.py": "failed"}
    assert "Stale cache" in outcome.stdout


def test_emitted_test_keeps_any_sentence_inside_comments():
    hostile = recorded().divergence.__class__(**{**recorded().divergence.to_dict(),
                                                 "sentence": 'raised ValueError: """ \\x \' end'})
    text = render_pytest(Replay(**{**recorded().__dict__, "divergence": hostile}), source="a\nb.json")
    compile(text, "emitted.py", "exec")


def test_a_replay_file_naming_a_subject_by_its_former_module_path_still_replays(tmp_path):
    # before swafuzz was one installed package, its built-ins lived in a top-level "harness"
    old = recorded(subject="harness.builtin:PoolStartLayer")
    path = write_replay(old, tmp_path)
    found = run_replay(load_replay(path), subject="harness.builtin:PoolStartLayer").divergence
    assert found == old.divergence
    assert resolve_subject("harness.builtin:PoolStartLayer").subject is resolve_subject("pool-start-layer").subject
