"""The input boundary: whatever a replay file, a scenario or an output path holds, swafuzz
either accepts it or refuses it with exit code 2 and one line naming the file, the field
and the limit, in bounded time and memory, without running code the file names and without
touching the file."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import resource
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swafuzz import cli, run_scenario
from swafuzz.run.boundary import MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_JSON_DEPTH, InputError, parse_json
from swafuzz.subjects.registry import resolve_subject
from swafuzz.results.replay import Replay, ReplayError, load_replay, write_replay
from swafuzz.reference import LIMITS, EngineState, Scenario, ScenarioError, replay_events
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.scenarios import ADVERSARIAL, scenarios

STALE_EXAMPLE = "first-swa-layer-not-start"


def recorded(**fields) -> Replay:
    scenario = EXAMPLES[STALE_EXAMPLE]
    divergence = run_scenario(resolve_subject("pool-start-layer").subject, scenario).divergence
    return Replay(**{"subject": "pool-start-layer", "profile": "realistic", "scenario": scenario,
                     "divergence": divergence, "seed": 3, "settings": "dev", **fields})


GOOD = recorded().to_dict()


def written(tmp_path: Path, data: dict | str | bytes, name: str = "crafted.json") -> Path:
    path = tmp_path / name
    if isinstance(data, dict):
        data = json.dumps(data)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def with_config(**config) -> dict:
    data = copy.deepcopy(GOOD)
    data["scenario"]["config"].update(config)
    return data


def with_events(*events) -> dict:
    data = copy.deepcopy(GOOD)
    data["scenario"]["events"] += list(events)
    return data


def replay_refused(capsys, path: Path, *options: str, naming: str | None = None) -> str:
    """Runs ``swafuzz replay``; it must exit 2 with one line on stderr naming the file (the
    replay file unless told), nothing on stdout, and leave the replay file as it was."""
    before = path.read_bytes() if path.is_file() else None
    code = cli.main(["replay", str(path), *options])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert (naming or str(path)) in err
    if before is not None:
        assert path.read_bytes() == before, "the input was changed"
    return err


# ---- replay files beyond a limit ---------------------------------------------------------------


@pytest.mark.parametrize("data, field, limit", [
    (with_config(end_layer=10**30), "scenario.config.end_layer", "MAX_INT_DIGITS"),
    (with_config(full_pool_size=10**30), "scenario.config.full_pool_size", "MAX_INT_DIGITS"),
    (json.dumps({**GOOD, "seed": 0}).replace('"seed": 0', '"seed": ' + "7" * 5000), "seed", "MAX_INT_DIGITS"),
    (with_config(end_layer=10**9), "config.end_layer", "end_layer"),
    (with_config(full_pool_size=10**9), "config.full_pool_size", "full_pool_size"),
    (with_config(full_page_size=10**9, full_pool_size=2 * 10**9), "config.full_page_size", "full_page_size"),
    (with_config(graph_batch_sizes=[10**9]), "config.graph_batch_sizes", "graph_batch_sizes"),
    (with_config(graph_batch_sizes=list(range(1, 5000))), "config.graph_batch_sizes", "list_length"),
    (with_config(num_req_slots=10**8), "config.num_req_slots", "num_req_slots"),
    (with_config(num_req_slots=4096, sliding_window=4096), "config.num_req_slots", "ring_rows"),
    (with_events({"op": "forward", "mode": "idle", "pad": 10**9}), "events[3].pad", "pad"),
    (with_events({"op": "admit", "count": 10**6}), "events[3].count", "count"),
    (with_events(*[{"op": "clear"}] * 20000), "scenario.events", "events"),
    (with_events({"op": "forward", "requests": [0], "steps": 10**4, "mode": "draft"}), "events[3].steps", "steps"),
])
def test_a_replay_file_beyond_a_limit_exits_2_naming_file_field_and_limit(capsys, tmp_path, data, field, limit):
    err = replay_refused(capsys, written(tmp_path, data))
    assert field in err and limit in err


@pytest.mark.parametrize("config, events, limit", [
    ({"end_layer": 1024, "full_pool_size": 4096, "swa_pool_size": 4096},
     [{"op": "admit", "count": 1}] + [{"op": "forward", "requests": [0]}] * 65, "stores"),
    ({"end_layer": 1024, "full_pool_size": 2**16, "swa_pool_size": 2**16},
     [{"op": "admit", "count": 1}, {"op": "forward", "mode": "extend", "requests": [0], "tokens": [4200]}],
     "checked_rows"),
    ({}, [{"op": "admit", "count": 2}, {"op": "forward", "mode": "extend", "requests": [0, 1],
                                         "tokens": [65536, 65536]}], "forward_rows"),
    ({"full_pool_size": 2**20, "swa_pool_size": 2**20},
     [{"op": "admit", "count": 1}] + [{"op": "forward", "requests": [0]}] * 40, "pool_work"),
    ({"swa_pool_size": 2**20}, [{"op": "register_mapping"}] * 3, "remapped_pages"),
])
def test_what_a_scenario_adds_up_to_is_bounded_before_it_runs(config, events, limit):
    with pytest.raises(ScenarioError, match=f"exceeds the limit {limit} = {LIMITS[limit]}"):
        Scenario.from_dict({"config": config, "events": events})


def test_every_configuration_size_has_a_limit_applied_to_programmatic_configs_too():
    from swafuzz.reference import EngineConfig

    for name, value in EngineConfig().to_dict().items():
        if isinstance(value, bool):
            continue
        assert name in LIMITS, f"config.{name} has no limit"
        too_big = (LIMITS[name] + 1,) if isinstance(value, list) else LIMITS[name] + 1
        with pytest.raises(ScenarioError, match=f"config.{name}: .*exceeds the limit"):
            EngineConfig(**{**EngineConfig().__dict__, name: too_big}).validate()


def test_every_size_an_event_or_mutation_holds_has_a_limit():
    # a new field gets its entry in LIMITS, and, if it multiplies the work of a forward, its
    # share in what swafuzz.reference.scenario._check_work adds up
    from swafuzz.reference import Event, Mutation

    for kind in (Event, Mutation):
        for field in dataclasses.fields(kind):
            if field.name in ("op", "mode", "mutation") or isinstance(field.default, bool):
                continue
            assert field.name in LIMITS, f"{kind.__name__}.{field.name} has no limit"


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, f"nested 100000 deep exceeds the limit MAX_JSON_DEPTH = {MAX_JSON_DEPTH}"),
    ('{"a": NaN}', "NaN is not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_json_beyond_what_a_replay_file_holds_is_refused_before_it_is_built(capsys, tmp_path, text, message):
    assert message in replay_refused(capsys, written(tmp_path, text))


def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(capsys, tmp_path):
    path = written(tmp_path, b" " * (MAX_FILE_BYTES + 1))
    assert "MAX_FILE_BYTES" in replay_refused(capsys, path)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_only_regular_files_are_read(capsys, tmp_path, kind):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")  # reading it would never end
    assert "regular file" in replay_refused(capsys, path)


@pytest.mark.parametrize("field", ["harness_version", "profile", "settings", "subject", "device"])
def test_a_line_break_in_a_name_cannot_smuggle_code_into_an_emitted_test(capsys, tmp_path, field):
    # the emitted test records these in comments: a line break would end the comment
    data = {**GOOD, field: "0.1.0\nimport os; os.system('echo owned')\n#"}
    emitted = tmp_path / "test_regression.py"
    err = replay_refused(capsys, written(tmp_path, data), "--emit-pytest", str(emitted))
    assert f"field '{field}' must be printable text" in err and "MAX_NAME_LENGTH" in err
    assert not emitted.exists()


def test_a_long_string_is_shown_shortened_in_the_message(capsys, tmp_path):
    err = replay_refused(capsys, written(tmp_path, {**GOOD, "format": "x" * 100_000 + "\n"}))
    assert len(err) < 400


def test_a_recorded_sentence_cannot_write_escape_sequences_to_the_terminal(capsys, tmp_path):
    data = recorded(subject="uncached").to_dict()  # replays as fixed, printing the recorded sentence
    data["diagnosis"]["sentence"] = "Stale\x1b[2J\x1b]0;owned\x07 cache"
    assert cli.main(["replay", str(written(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "Stale\\x1b[2J" in out


# ---- no code from a file -------------------------------------------------------------------------


TRIPWIRE = '''
import pathlib
pathlib.Path(__file__).with_name("imported").write_text("the module ran")
from swafuzz.subjects.builtin import PoolStartLayer as Stale
'''


@pytest.fixture
def tripwire(tmp_path, monkeypatch) -> Path:
    (tmp_path / "tripwire_subject.py").write_text(TRIPWIRE)
    monkeypatch.chdir(tmp_path)  # the working directory is where user subjects are looked for
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "imported"
    sys.modules.pop("tripwire_subject", None)


@pytest.mark.parametrize("subject", ["tripwire_subject:Stale", "this:x", "os:system"])
def test_a_replay_file_never_imports_the_module_it_names(capsys, tmp_path, tripwire, subject):
    path = write_replay(recorded(subject=subject), tmp_path / "replays")
    err = replay_refused(capsys, path)
    assert "names code to import" in err and f"--subject {subject!r}" in err
    assert not tripwire.exists()
    with pytest.raises(ReplayError, match="names code to import"):
        from swafuzz.results.replay import run_replay

        run_replay(load_replay(path))
    assert not tripwire.exists()


def test_a_release_a_replay_file_names_is_fetched_as_a_wheel_never_built(monkeypatch, tmp_path):
    # building a source distribution runs its setup code; `sglang:<target>@<version>` may
    # come from a file
    from swafuzz.subjects.sglang import locate

    commands = []

    def refuse(command, **options):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "no matching distribution")

    monkeypatch.setattr(locate.subprocess, "run", refuse)
    with pytest.raises(locate.SglangUnavailable):
        locate.fetch_wheel("0.0.1", tmp_path, download=True)
    assert "--only-binary=:all:" in commands[0]


def test_the_person_loads_user_code_with_subject_on_the_command_line(capsys, tmp_path, tripwire):
    path = write_replay(recorded(subject="tripwire_subject:Stale"), tmp_path / "replays")
    code = cli.main(["replay", str(path), "--subject", "tripwire_subject:Stale"])
    assert code == 1, capsys.readouterr()
    assert tripwire.exists()


def test_a_user_subject_is_found_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_only_subject.py").write_text("from swafuzz.subjects.builtin import Uncached as Mine\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert resolve_subject("cwd_only_subject:Mine").kind == "user"
    finally:
        sys.modules.pop("cwd_only_subject", None)


# ---- output paths --------------------------------------------------------------------------------


@pytest.fixture
def replay_file(tmp_path) -> Path:
    return write_replay(recorded(), tmp_path / "replays")


@pytest.mark.parametrize("target, message", [
    (lambda tmp: "/proc/no-such-dir/test_x.py", "--emit-pytest /proc/no-such-dir/test_x.py: cannot create it"),
    (lambda tmp: str(tmp), "is a directory"),
    (lambda tmp: str(tmp / "replays" / "pool-start-layer-realistic-seed3.json"), "is the input file"),
])
def test_an_unusable_emit_pytest_path_exits_2_before_the_replay_runs(capsys, tmp_path, replay_file, target, message):
    emitted = target(tmp_path)
    assert message in replay_refused(capsys, replay_file, "--emit-pytest", emitted, naming=emitted)


@pytest.mark.parametrize("directory, message", [
    ("/proc/no-such-dir", "--database /proc/no-such-dir: cannot create it"),
    ("/dev/null", "--database /dev/null: cannot create it"),
])
def test_an_unusable_database_directory_exits_2(capsys, tmp_path, directory, message):
    code = cli.main(["fuzz", "--subject", "uncached", "--report-dir", str(tmp_path), "--database", directory])
    out, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_the_database_environment_variable_is_used_and_checked_like_the_option(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SWAFUZZ_DATABASE", "/proc/no-such-dir")
    code = cli.main(["fuzz", "--subject", "uncached", "--report-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "$SWAFUZZ_DATABASE /proc/no-such-dir: cannot create it" in err, err
    monkeypatch.setenv("SWAFUZZ_DATABASE", str(tmp_path / "shared-db"))
    code = cli.main(["fuzz", "--subject", "pool-start-layer", "--report-dir", str(tmp_path / "reports"),
                     "--max-examples", "300"])
    capsys.readouterr()
    assert code == 1
    assert any((tmp_path / "shared-db").iterdir())  # the failure was saved where the variable says


# ---- the loader and the scenario builder, fuzzed ----------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.integers() | st.sampled_from(sorted({v + d for v in LIMITS.values() for d in (-1, 0, 1)})),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    yield path


@st.composite
def mutated_replays(draw) -> dict:
    """A valid replay file with a few places replaced, removed or given a near-limit size."""
    data = copy.deepcopy(GOOD)
    data["scenario"] = draw(st.sampled_from(list(EXAMPLES.values())) | scenarios(ADVERSARIAL)).to_dict()
    for _ in range(draw(st.integers(1, 3))):
        places = sorted(set(_leaves(data)) - {()}, key=repr)
        *parent_path, key = draw(st.sampled_from(places))
        parent = data
        for step in parent_path:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[key]
        else:
            parent[key] = draw(json_values)
    return data


# far above what any bounded scenario takes, far below what one beyond the limits took (the
# unbounded loader reached tens of gigabytes)
PEAK_MEMORY_MB = 4096


def check_loads_or_is_refused(path: Path) -> None:
    try:
        replay = load_replay(path)
    except ReplayError as exc:
        message = str(exc)
        assert message.startswith(str(path)) and "\n" not in message and len(message) < 2000
    else:
        try:
            for _plan in replay_events(EngineState(replay.scenario.config), replay.scenario.events):
                pass  # the engine model allocates and plans every forward
        except ScenarioError as exc:
            assert str(exc).startswith("events[")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mb < PEAK_MEMORY_MB, f"peak resident memory {peak_mb:.0f} MB"


# a generous bound per example, not a speed target: unbounded, one file hung for minutes
FUZZ = settings(max_examples=150, deadline=timedelta(seconds=30), suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=mutated_replays() | json_values | st.builds(
    lambda scenario: {**GOOD, "scenario": scenario}, json_values))
def test_any_json_either_loads_into_a_runnable_scenario_or_is_refused(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzzed") / "replay.json"
    path.write_text(json.dumps(data))
    check_loads_or_is_refused(path)


@FUZZ
@given(data=st.binary(max_size=200) | st.builds(
    lambda text, at, junk: (text[:at] + junk + text[at:]), st.just(json.dumps(GOOD).encode()),
    st.integers(0, len(json.dumps(GOOD))), st.binary(max_size=8)))
def test_any_bytes_either_load_or_are_refused(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzzed") / "replay.json"
    path.write_bytes(data)
    check_loads_or_is_refused(path)


def test_parse_json_names_where_a_long_integer_sits():
    with pytest.raises(InputError, match=rf"x: a\[1\]\.b: an integer of 30 digits .* MAX_INT_DIGITS = {MAX_INT_DIGITS}"):
        parse_json(b'{"a": [1, {"b": ' + b"9" * 30 + b"}]}", "x")
