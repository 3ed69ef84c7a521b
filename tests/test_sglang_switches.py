"""Engine switches as configuration, the realistic profile per release, and the matrix's verdicts.

A release's switches resolve to its defaults unless a run overrides them; the realistic
profile of a target then draws only the lifecycle features the release takes under those
settings; a divergence is judged against the release's defaults (reachable off-default
names the setting it needs), and the rendered matrix answers, per release and historical
problem, whether the problem is reachable, citing the call paths and the divergences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import released_tree
from hypothesis import HealthCheck, find, given, settings

from swafuzz.run.diagnosis import EARLIER_FORWARD, EARLIER_STEP, GRAPH_CAPTURE, UNIFORM_REPEAT, Divergence
from swafuzz.results.replay import Replay, ReplayError, load_replay, write_replay
from swafuzz.subjects.sglang import locate, reachability
from swafuzz.tools.sglang_matrix import (
    EXAMPLES_COLUMN,
    Cell,
    Finding,
    Matrix,
    main,
    reachability as judge,
    render,
)
from swafuzz.subjects.sglang.tree_checks import (
    ABSENT,
    GAP,
    PRODUCER,
    RIGHT,
    WRONG,
    TreeCheck,
    check_producers,
    first_wrong_row,
    producer_batches,
)
from swafuzz.subjects.sglang.configure import configured
from swafuzz.subjects.sglang.runner_steps import Verdict
from swafuzz.subjects.sglang.reachability import (
    COMPRESSED_QUESTIONS,
    PROBLEMS,
    Question,
    Route,
    driver_attributes,
    excluded_features,
    question,
)
from swafuzz.subjects.sglang.switches import parse_override, settings_for
from swafuzz.subjects.sglang.targets import target
from swafuzz.reference import Scenario
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import GRAPH_REPLAY, features_of, restriction_terms_of
from swafuzz.strategies.restrictions import scenarios_without

PREP = "SGLANG_PREP_IN_CUDA_GRAPH"
CACHE = "SGLANG_OPT_CACHE_SWA_TRANSLATION"
WINDOW = "--enable-encoder-swa-bounded-replay"
TAIL = "--enable-decoder-swa-bounded-replay"


# ---- switch settings -----------------------------------------------------------------------


def test_a_release_runs_with_its_own_defaults_unless_a_switch_is_overridden():
    assert settings_for("0.5.12").to_dict() == {PREP: True, CACHE: True}
    assert settings_for("0.5.19").to_dict() == {}
    assert settings_for("0.5.23").to_dict() == {"SGLANG_DSV4_UNIFIED_KV_FP8": False, WINDOW: False, TAIL: False}
    overridden = settings_for("0.5.17", {PREP: False, CACHE: False})
    # an override of a switch the release lacks does not apply to it
    assert overridden.to_dict() == {PREP: False}
    assert overridden.off_default() == ("SGLANG_PREP_IN_CUDA_GRAPH=0",)
    assert overridden.label() == "SGLANG_PREP_IN_CUDA_GRAPH=0 (not the default)"
    assert settings_for("0.5.17", {PREP: True}).off_default() == ()
    with pytest.raises(ValueError, match="unknown engine switch"):
        settings_for("0.5.17", {"SGLANG_NO_SUCH": True})


@pytest.mark.parametrize("text,parsed", [
    ("SGLANG_PREP_IN_CUDA_GRAPH=0", (PREP, False)),
    ("SGLANG_OPT_CACHE_SWA_TRANSLATION=1", (CACHE, True)),
    ("enable-encoder-swa-bounded-replay=1", (WINDOW, True)),
    ("--enable-encoder-swa-bounded-replay=0", (WINDOW, False)),
    ("enable-decoder-swa-bounded-replay=1", (TAIL, True)),
])
def test_a_switch_override_names_a_switch_and_zero_or_one(text, parsed):
    assert parse_override(text) == parsed


@pytest.mark.parametrize("text,message", [
    ("SGLANG_PREP_IN_CUDA_GRAPH", "write SGLANG_PREP_IN_CUDA_GRAPH=1 or SGLANG_PREP_IN_CUDA_GRAPH=0"),
    ("SGLANG_PREP_IN_CUDA_GRAPH=yes", "write SGLANG_PREP_IN_CUDA_GRAPH=1"),
    ("PREP=1", "unknown engine switch 'PREP'; switches are SGLANG_PREP_IN_CUDA_GRAPH"),
])
def test_a_malformed_switch_override_is_refused_with_the_switches_named(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_override(text)


def test_the_matrix_command_line_refuses_a_malformed_switch_with_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--versions", "0.5.17", "--switch", "SGLANG_PREP_IN_CUDA_GRAPH=maybe"])
    assert exited.value.code == 2
    assert "write SGLANG_PREP_IN_CUDA_GRAPH=1 or SGLANG_PREP_IN_CUDA_GRAPH=0" in capsys.readouterr().err


# ---- the realistic profile per release -------------------------------------------------------


# the graph replays the in-graph preparation switch decides: the decode bucket's
DECODE_BUCKET = set(reachability.DECODE_BUCKET_REPLAYS)


@pytest.mark.parametrize("name,version,overrides,excluded", [
    # the merge's decode graph replay is the eager merge, taken only with in-graph preparation off
    ("unified-metadata-merge", "0.5.17", {}, DECODE_BUCKET),
    ("unified-metadata-merge", "0.5.17", {PREP: False}, set()),
    ("unified-metadata-merge", "0.5.19", {PREP: False}, DECODE_BUCKET),  # the switch is gone
    # the getter's decode graph replay is the in-graph prep's, the default and only path from 0.5.18
    ("hip-unified-swa-loc", "0.5.17", {}, set()),
    ("hip-unified-swa-loc", "0.5.17", {PREP: False}, DECODE_BUCKET),
    ("hip-unified-swa-loc", "0.5.19", {}, set()),
    ("cuda-swa-out-cache-loc", "0.5.23", {}, set()),
    # under the request window the driver runs the getter over the tree's own window
    ("cuda-swa-out-cache-loc", "0.5.23", {WINDOW: True}, set()),
    ("cuda-swa-out-cache-loc", "0.5.17", {WINDOW: True}, set()),
    ("pool-fused-store", "0.5.12", {PREP: False, CACHE: False}, set()),
])
def test_each_release_settings_exclude_the_features_its_engine_does_not_take(name, version, overrides, excluded):
    assert excluded_features(name, settings_for(version, overrides)) == excluded


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(scenarios_without("realistic", excluded_features("unified-metadata-merge", settings_for("0.5.17"))))
def test_the_realistic_profile_of_a_release_with_in_graph_prep_on_never_replays_a_decode_graph_for_the_merge(
        scenario):
    assert not restriction_terms_of(scenario) & DECODE_BUCKET


def test_the_realistic_profile_replays_graphs_for_the_merge_once_in_graph_prep_is_off():
    excluded = excluded_features("unified-metadata-merge", settings_for("0.5.17", {PREP: False}))
    replaying = find(scenarios_without("realistic", excluded), lambda s: GRAPH_REPLAY in features_of(s),
                     settings=settings(database=None))
    assert any(event.graph for event in replaying.events)


def test_a_restriction_names_only_known_features():
    with pytest.raises(ValueError, match="unknown lifecycle feature"):
        scenarios_without("realistic", frozenset({"graph replays"}))


def test_a_release_named_on_the_command_line_is_fuzzed_realistically_as_it_runs_by_default():
    if "0.5.17" not in locate.cached_releases():
        pytest.skip("needs the sglang 0.5.17 wheel in the cache")
    import swafuzz.subjects.sglang as sglang
    from swafuzz.search.fuzz import fuzz

    info = sglang.resolve("sglang:unified-metadata-merge@0.5.17")
    assert DECODE_BUCKET <= info.subject.realistic_exclusions
    realistic = fuzz(info, profile="realistic", settings="ci", max_examples=60, seed=0)
    assert realistic.divergence is None and realistic.examples == 60
    adversarial = fuzz(info, profile="adversarial", settings="ci", max_examples=60, seed=0)
    assert adversarial.divergence is not None and adversarial.divergence.source["kind"] == GRAPH_CAPTURE


def test_the_pool_driver_follows_the_translation_cache_switch():
    pool = "pool-fused-store"
    assert driver_attributes(pool, settings_for("0.5.12")) == {"cache_swa_translation": True}
    assert driver_attributes(pool, settings_for("0.5.12", {CACHE: False})) == {"cache_swa_translation": False}
    assert driver_attributes("unified-metadata-merge", settings_for("0.5.17", {PREP: False})) == {}


def _pool_cache_run(overrides: dict[str, bool] | None = None):
    """The 0.5.12 pool cache target on a stage whose first SWA layer is not its start layer."""
    try:
        tree = locate.wheel("0.5.12")
    except locate.SglangUnavailable as exc:
        pytest.skip(f"no sglang 0.5.12 wheel: {exc}")
    from swafuzz.run.executor import run_scenario

    item = target("pool-fused-store")
    subject = configured(item.info(tree, "source"), item, tree, settings_for("0.5.12", overrides)).subject
    return run_scenario(subject, EXAMPLES["first-swa-layer-not-start"])


def test_the_pool_cache_problem_disappears_with_the_translation_cache_switched_off():
    assert not _pool_cache_run().passed
    assert _pool_cache_run({CACHE: False}).passed


# ---- replay files record the switches ------------------------------------------------------------


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


GRAPH_DECODE = _scenario({"start_layer": 0, "end_layer": 2, "graph_batch_sizes": [2]}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1], "graph": True},
    {"op": "forward", "requests": [0, 1], "graph": True},
])
GRAPH_PERMUTED = _scenario({"start_layer": 0, "end_layer": 2, "graph_batch_sizes": [2]}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1], "graph": True},
    {"op": "forward", "requests": [0, 1], "graph": True, "layers": [1, 0]},
])
RAGGED_EXTEND = _scenario({"start_layer": 0, "end_layer": 2}, [
    {"op": "admit", "count": 2}, {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [1, 3]},
])
DRAFT_STEPS = _scenario({"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 3}, [
    {"op": "admit", "count": 2}, {"op": "forward", "mode": "draft", "requests": [0, 1], "steps": 2},
])
FIRST_SWA_NOT_START = _scenario({"start_layer": 0, "end_layer": 3, "non_swa_layers": [0]}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]},
])
FIRST_SWA_NOT_START_GRAPH = _scenario(
    {"start_layer": 0, "end_layer": 3, "non_swa_layers": [0], "graph_batch_sizes": [2]}, [
        {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1], "graph": True},
        {"op": "forward", "requests": [0, 1], "graph": True},
    ])
PIPELINE_STAGE_DECODE = _scenario({"start_layer": 2, "end_layer": 4}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]},
])
SKIPPED_DECODE_INIT = _scenario({"start_layer": 0, "end_layer": 2}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]},
    {"op": "forward", "requests": [0, 1], "skip_init": True},
])
SKIPPED_IDLE_INIT = _scenario({"start_layer": 0, "end_layer": 2, "speculative": True, "num_draft_tokens": 2}, [
    {"op": "admit", "count": 2}, {"op": "forward", "requests": [0, 1]},
    {"op": "forward", "mode": "idle", "skip_init": True, "pad": 2},
])
PLAIN_DECODE = _scenario({"start_layer": 0, "end_layer": 2}, [
    {"op": "admit", "count": 1}, {"op": "forward", "requests": [0]},
])


def _divergence(scenario: Scenario, source: str | None, kind: str = "wrong_rows", detail: str = "") -> Divergence:
    event = len(scenario.events) - 1
    return Divergence(kind, "a sentence", forward=1, event=event, mode=scenario.events[event].mode, model="target",
                      draft_step=0, micro_batch=None, layer_id=1, call=0,
                      source=None if source is None else {"kind": source}, detail=detail)


def test_a_replay_file_records_the_engine_switches_its_run_used(tmp_path: Path):
    replay = Replay("sglang:unified-metadata-merge@0.5.17", "realistic", GRAPH_DECODE,
                    _divergence(GRAPH_DECODE, GRAPH_CAPTURE), seed=0, engine_switches={PREP: False})
    path = write_replay(replay, tmp_path)
    assert json.loads(path.read_text())["engine_switches"] == {PREP: False}
    assert load_replay(path).engine_switches == {PREP: False}
    plain = write_replay(Replay("uncached", "realistic", GRAPH_DECODE, _divergence(GRAPH_DECODE, None)), tmp_path)
    assert "engine_switches" not in json.loads(plain.read_text())


def _pool_cache_replay(tmp_path: Path, engine_switches: dict[str, bool] | None) -> Path:
    """A replay file of the 0.5.12 pool cache's stale first SWA layer, found at the defaults."""
    found = _pool_cache_run()
    assert found.divergence is not None
    replay = Replay("sglang:pool-fused-store@0.5.12", "realistic", EXAMPLES["first-swa-layer-not-start"],
                    found.divergence, engine_switches=engine_switches)
    return write_replay(replay, tmp_path)


@pytest.fixture
def no_switches_in_environment(monkeypatch):
    # the command line hands switches to workers through the environment; restore it after
    from swafuzz.subjects.sglang import SWITCHES_ENV

    monkeypatch.delenv(SWITCHES_ENV, raising=False)


@pytest.mark.usefixtures("no_switches_in_environment")
def test_a_replay_runs_with_the_engine_switches_its_file_records(tmp_path: Path):
    from swafuzz.cli import main as swafuzz

    assert swafuzz(["replay", str(_pool_cache_replay(tmp_path, None))]) == 1
    assert swafuzz(["replay", str(_pool_cache_replay(tmp_path, {CACHE: False}))]) == 0


@pytest.mark.usefixtures("no_switches_in_environment")
def test_a_switch_given_on_the_command_line_wins_over_the_replay_file(tmp_path: Path):
    from swafuzz.cli import main as swafuzz

    path = _pool_cache_replay(tmp_path, {CACHE: False})
    assert swafuzz(["replay", str(path), "--sglang-switch", f"{CACHE}=1"]) == 1


@pytest.mark.usefixtures("no_switches_in_environment")
def test_a_fuzz_run_with_a_switch_set_finds_what_the_release_reaches_only_so_and_its_replay_file_says_so(
        tmp_path: Path):
    if "0.5.17" not in locate.cached_releases():
        pytest.skip("needs the sglang 0.5.17 wheel in the cache")
    from swafuzz.cli import main as swafuzz

    args = ["fuzz", "--subject", "sglang:unified-metadata-merge@0.5.17", "--settings", "ci", "--seed", "0",
            "--max-examples", "200", "--report-dir", str(tmp_path), "--json"]
    assert swafuzz(args + ["--sglang-switch", f"{PREP}=0"]) == 1
    (path,) = (tmp_path / "replays").glob("*.json")
    assert load_replay(path).engine_switches == {PREP: False}
    assert swafuzz(["replay", str(path)]) == 1


@pytest.mark.parametrize("args, message", [
    (["--subject", "sglang:pool-fused-store@0.5.12", "--sglang-switch", "NO_SUCH=1"], "unknown engine switch"),
    (["--subject", "sglang:pool-fused-store@0.5.12", "--sglang-switch", "SGLANG_NO_SUCH=1"],
     "declares no boolean SGLANG_NO_SUCH"),
    (["--subject", "sglang:pool-fused-store@0.5.12", "--sglang-switch", f"{CACHE}=yes"], "write"),
    (["--subject", "uncached", "--sglang-switch", f"{CACHE}=0"], "not an sglang:<target> subject"),
])
@pytest.mark.usefixtures("no_switches_in_environment")
def test_a_switch_that_cannot_apply_is_refused_with_exit_code_2(args, message, capsys, tmp_path: Path):
    from swafuzz.cli import main as swafuzz

    if isinstance(tree := released_tree("0.5.12"), str) and "sglang:" in args[1]:
        pytest.skip(tree)

    assert swafuzz(["fuzz", *args, "--max-examples", "1", "--report-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", [[PREP], {PREP: 0}, {"x\n": True}])
def test_a_replay_file_with_malformed_engine_switches_is_refused(tmp_path: Path, value):
    replay = Replay("uncached", "realistic", GRAPH_DECODE, _divergence(GRAPH_DECODE, None))
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({**replay.to_dict(), "engine_switches": value}))
    with pytest.raises(ReplayError, match="engine_switches"):
        load_replay(path)


# ---- verdicts ------------------------------------------------------------------------------------


def _finding(name, version, scenario, source, switches=None, column="realistic", **divergence) -> Finding:
    return Finding(version, target(name), column, _divergence(scenario, source, **divergence), scenario,
                   Path("replay.json"), switches=switches)


VERDICTS = [
    # (target, release, scenario, source of the wrong rows, run's switches, verdict, the reason names)
    ("unified-metadata-merge", "0.5.17", GRAPH_DECODE, GRAPH_CAPTURE, None,
     "reachable off-default", ("only with SGLANG_PREP_IN_CUDA_GRAPH=0", "UnifiedKvMetadata.copy_")),
    ("unified-metadata-merge", "0.5.17", GRAPH_DECODE, GRAPH_CAPTURE, {PREP: False},
     "reachable off-default", ("only with SGLANG_PREP_IN_CUDA_GRAPH=0",)),
    # a path the release does not have is not reached, whatever profile found it
    ("unified-metadata-merge", "0.5.19", GRAPH_DECODE, GRAPH_CAPTURE, None,
     "not reached", ("never takes the path", "always from 0.5.18, the replay merges raw metadata")),
    ("unified-metadata-merge", "0.5.19", GRAPH_PERMUTED, GRAPH_CAPTURE, None,
     "not reached", ("never takes the path", "always from 0.5.18, the replay merges raw metadata")),
    ("unified-metadata-merge", "0.5.17", GRAPH_PERMUTED, GRAPH_CAPTURE, None,
     "adversarial only", ("layers skipped, permuted or repeated",)),
    # no problem named, but a graph replay through the merge the release never does
    ("unified-metadata-merge", "0.5.19", GRAPH_DECODE, None, None,
     "not reached", ("never takes the path", "UnifiedKvMetadata.copy_")),
    ("unified-metadata-merge", "0.5.17", GRAPH_DECODE, None, None,
     "unconfirmed", ("with SGLANG_PREP_IN_CUDA_GRAPH=0", "no SGLang call path")),
    ("hip-unified-swa-loc", "0.5.17", RAGGED_EXTEND, UNIFORM_REPEAT, None,
     "not reached", ("[ring-getter-in-extend]",)),
    ("pool-fused-store", "0.5.12", FIRST_SWA_NOT_START, EARLIER_FORWARD, None,
     "not reached", ("[pool-cache-first-swa-layer]",)),
    # under a graph the never-refreshed pool cache hands out the capture's rows: the same problem
    ("pool-fused-store", "0.5.12", FIRST_SWA_NOT_START_GRAPH, GRAPH_CAPTURE, None,
     "not reached", ("[pool-cache-first-swa-layer]",)),
    # the release refreshes at the stage's start_layer: a stale stage is not claimed as the layer-0 problem
    ("pool-fused-store", "0.5.12", PIPELINE_STAGE_DECODE, EARLIER_FORWARD, None,
     "unconfirmed", ("no SGLang call path",)),
    # the idle problem is about idle forwards; a skip on a decode forward is no engine's
    ("hip-unified-swa-loc", "0.5.19", SKIPPED_DECODE_INIT, EARLIER_FORWARD, None,
     "adversarial only", ("metadata init skipped on a decode forward",)),
    ("hip-unified-swa-loc", "0.5.19", SKIPPED_IDLE_INIT, EARLIER_FORWARD, None,
     "not reached", ("[skipped-metadata-init-idle]",)),
    ("pool-fused-store", "0.5.12", PLAIN_DECODE, None, {CACHE: False},
     "unconfirmed", ("with SGLANG_OPT_CACHE_SWA_TRANSLATION=0",)),
    ("hip-unified-swa-loc", "0.5.19", DRAFT_STEPS, EARLIER_STEP, None,
     "not reached", ("speculative_num_steps > 1",)),
]


@pytest.mark.parametrize("name,version,scenario,source,overrides,verdict,named", VERDICTS)
def test_divergences_are_judged_against_the_release_defaults(name, version, scenario, source, overrides, verdict,
                                                             named):
    switches = None if overrides is None else settings_for(version, overrides)
    judged, why = judge(_finding(name, version, scenario, source, switches))
    assert judged == verdict, why
    for text in named:
        assert text in why


def _with_route(monkeypatch, key: str, route: Route) -> None:
    item = question(key)
    monkeypatch.setitem(reachability._BY_KEY, key, Question(item.key, item.title, item.targets, (route,)))


@pytest.mark.parametrize("setting,overrides,verdict", [
    (None, None, "reachable"),
    (None, {PREP: False}, "reachable"),  # a switch the getter's decode path does not need
    ("SGLANG_PREP_IN_CUDA_GRAPH=0", None, "reachable off-default"),
])
def test_only_a_cited_path_with_the_default_settings_makes_a_divergence_reachable(monkeypatch, setting, overrides,
                                                                                  verdict):
    route = Route(("0.5.17",), True, (reachability.RING_GETTER_ON_DECODE,), "a reading that reaches it", setting)
    _with_route(monkeypatch, "multi-step-draft-ring-rows", route)
    switches = None if overrides is None else settings_for("0.5.17", overrides)
    judged, why = judge(_finding("hip-unified-swa-loc", "0.5.17", DRAFT_STEPS, EARLIER_STEP, switches))
    assert judged == verdict, why
    assert "a reading that reaches it" in why and "MQALayer._forward_prepare" in why


# ---- the rendered matrix -------------------------------------------------------------------------


def _matrix(overrides=None) -> Matrix:
    merge = target("unified-metadata-merge")
    cell = Cell("0.5.17", merge, bound=True, runs={EXAMPLES_COLUMN: "1/11 diverge", "realistic": "no divergence"})
    cell.findings.append(Finding("0.5.17", merge, EXAMPLES_COLUMN, _divergence(GRAPH_DECODE, GRAPH_CAPTURE),
                                 GRAPH_DECODE, Path("/tmp/r/merge.json"), "graph-replay", settings_for("0.5.17")))
    late = Cell("0.5.19", merge, bound=True, runs={EXAMPLES_COLUMN: "1/11 diverge"})
    late.findings.append(Finding("0.5.19", merge, EXAMPLES_COLUMN, _divergence(GRAPH_DECODE, GRAPH_CAPTURE),
                                 GRAPH_DECODE, Path("/tmp/r/late.json"), "graph-replay", settings_for("0.5.19")))
    producers = {
        "0.5.17": [TreeCheck(PRODUCER, "expand_x", RIGHT, owner="HipBackend", batches=48),
                   TreeCheck(PRODUCER, "attach_y", WRONG, "pf_cu_q: got [0, 0], want [0, 1]", "HipBackend", 3),
                   TreeCheck(PRODUCER, "expand_z", ABSENT, "sglang 0.5.17 wheel (source mode): HipBackend has no expand_z"),
                   TreeCheck(PRODUCER, "fill_w", GAP, "sglang 0.5.17 wheel (source mode): fill_w imports a kernel, "
                                                       "which swafuzz has no stand-in for")],
        "0.5.19": [TreeCheck(PRODUCER, "expand_x", RIGHT, owner="HipBackend", batches=48)],
    }
    steps = {
        "0.5.17": [Verdict("HIP UnifiedKvMetadata.copy_", ("swa_loc is reference-assigned: the captured graph "
                                                             "keeps the previous rows",)),
                   Verdict("CUDA DSV4AttnMetadata.copy_"),
                   Verdict("_install_early_verify_metadata", absent="no such method")],
        "0.5.19": [Verdict("CUDA DSV4AttnMetadata.copy_")],
    }
    return Matrix(["0.5.17", "0.5.19"], [cell, late], {}, "ci", 10, 0, 1.0, overrides=overrides or {},
                  producers=producers, runner_steps=steps)


def _row(text: str, heading_key: str, version: str) -> dict[str, str]:
    """The cells of ``version``'s row in the table whose header names ``heading_key``."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| release |") and heading_key in line)
    names = [c.strip() for c in lines[header].strip("|").split(" | ")]
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if cells[0] == version:
            return dict(zip(names, cells))
    raise AssertionError(f"no row {version} under {heading_key}")


def _numbered(text: str, version: str) -> int:
    """The number of the divergence the report lists for ``version`` alone."""
    return int(re.search(rf'^(\d+)\. <a id="d\d+"></a>.*, {re.escape(version)}: ', text, re.MULTILINE).group(1))


def test_the_report_answers_per_release_whether_each_historical_problem_is_reachable():
    text = render(_matrix(), Path("/tmp/sglang-matrix.md"))
    early = _row(text, "`assign-listed-ring-rows`", "0.5.17")
    assert set(early) == {"release", *(f"`{item.key}`" for item in PROBLEMS)}
    assigned = early["`assign-listed-ring-rows`"]
    assert assigned.startswith("**reachable off-default** with SGLANG_PREP_IN_CUDA_GRAPH=0 ([P")
    number = _numbered(text, "0.5.17")
    assert "by default not reached ([P" in assigned and f"divergences [#{number}](#d{number})" in assigned
    # 0.5.19 merges a DSpark draft block's graph metadata with the assign-listed copy_
    late = _row(text, "`assign-listed-ring-rows`", "0.5.19")["`assign-listed-ring-rows`"]
    number = _numbered(text, "0.5.19")
    assert late.startswith("**reachable** ([P") and f"divergences [#{number}](#d{number})" in late
    assert _row(text, "`assign-listed-ring-rows`", "0.5.19")["`pool-cache-first-swa-layer`"].startswith("not reached")
    # every citation and divergence link lands on an anchor of the report
    for anchor in set(re.findall(r"\]\(#([pd]\d+)\)", text)):
        assert f'<a id="{anchor}"></a>' in text, anchor


def test_the_report_answers_per_release_which_compressed_kv_history_problems_it_reaches():
    text = render(_matrix(), Path("/tmp/sglang-matrix.md"))
    section = text.split("## Compressed-KV history by release", 1)[1].split("\n## ", 1)[0]
    assert all(f"- `{item.key}`: {item.title}" in section for item in COMPRESSED_QUESTIONS)
    for version in ("0.5.17", "0.5.19"):
        row = _row(section, "`compress-plan-fixed-draft-pad`", version)
        assert set(row) == {"release", *(f"`{item.key}`" for item in COMPRESSED_QUESTIONS)}
        for item in COMPRESSED_QUESTIONS:
            verdict, routes = item.verdict(version)
            cell = row[f"`{item.key}`"]
            assert cell.startswith(f"**{verdict}**" if verdict == "reachable" else verdict), cell
            marks = re.findall(r"\[(P\d+)\]\(#p\d+\)", cell)
            assert len(marks) == len(routes)
            for mark, route in zip(marks, routes):
                assert f'<a id="{mark.lower()}"></a>{mark}: {route.why}: {route.cited()}' in section
    # the verify write plan's fixed pad of 4 draft tokens is gone from 0.5.18
    assert _row(section, "`compress-plan-fixed-draft-pad`", "0.5.17")["`compress-plan-fixed-draft-pad`"].startswith(
        "**reachable** ([P")
    assert _row(section, "`compress-plan-fixed-draft-pad`", "0.5.19")["`compress-plan-fixed-draft-pad`"].startswith(
        "not reached ([P")
    # each call path is listed once, under the first table that cites it
    swa = text.split("## Historical problems by release", 1)[1].split("## Compressed-KV history by release", 1)[0]
    listed = re.compile(r'<a id="(p\d+)"></a>')
    assert listed.findall(section) and not set(listed.findall(swa)) & set(listed.findall(section))


def test_the_report_has_a_producer_column_per_release_naming_the_wrong_the_absent_and_the_unchecked():
    text = render(_matrix(), Path("/tmp/sglang-matrix.md"))
    row = _row(text, "producers", "0.5.17")
    assert row["producers"] == "**wrong**: `attach_y`"
    assert row["`expand_x`"] == "right on 48 batches (`HipBackend`)"
    assert row["`attach_y`"] == "**wrong** (`HipBackend`): pf_cu_q: got [0, 0], want [0, 1]"
    assert row["`expand_z`"] == "absent: HipBackend has no expand_z"
    assert row["`fill_w`"] == "not checked: fill_w imports a kernel, which swafuzz has no stand-in for"
    later = _row(text, "producers", "0.5.19")
    assert later["producers"] == "all right (1 of 4 run)" and later["`attach_y`"] == "not named"


def test_the_report_has_a_graph_runner_step_column_per_release_naming_the_stale_row():
    text = render(_matrix(), Path("/tmp/sglang-matrix.md"))
    row = _row(text, "`CUDA DSV4AttnMetadata.copy_`", "0.5.17")
    assert row["`HIP UnifiedKvMetadata.copy_`"].startswith("**stale**: swa_loc is reference-assigned")
    assert row["`CUDA DSV4AttnMetadata.copy_`"] == "kept"
    assert row["`_install_early_verify_metadata`"] == "absent"
    later = _row(text, "`CUDA DSV4AttnMetadata.copy_`", "0.5.19")
    assert later["`HIP UnifiedKvMetadata.copy_`"] == "absent" and later["`CUDA DSV4AttnMetadata.copy_`"] == "kept"


def test_the_report_names_the_switch_settings_of_a_run_that_overrides_them():
    default = render(_matrix(), Path("/tmp/sglang-matrix.md"))
    assert "- engine switches: each release's defaults" in default and "Settings of this run" not in default
    text = render(_matrix({PREP: False}), Path("/tmp/sglang-matrix.md"))
    assert "except SGLANG_PREP_IN_CUDA_GRAPH=0 wherever a release has the switch" in text
    assert "| 0.5.17 | SGLANG_PREP_IN_CUDA_GRAPH=0 (not the default) |" in text
    assert "| 0.5.19 | no engine switch |" in text


@pytest.mark.parametrize("problem,named", [
    ("req_pool_indices_repeated: got [3, 3, 1, 1], want [3, 3, 3, 1]",
     "req_pool_indices_repeated row 2: got 1, want 3 (4 rows, 4 wanted)"),
    ("pf_cu_q: got [0, 0], want [0, 0, 2]", "pf_cu_q row 2: got no row, want 2 (2 rows, 3 wanted)"),
    ("pf_state_slot: got NoneType, want [5, 5]", "pf_state_slot: got NoneType, want [5, 5]"),
])
def test_a_wrong_producer_is_named_by_its_first_wrong_row(problem, named):
    assert first_wrong_row(problem) == named


def test_the_producer_batches_cover_decode_verify_ragged_extend_prefill_padding_and_idle_after_live():
    batches = producer_batches(seed=0)
    kinds = {kind for kind, _, _ in batches}
    assert kinds == {"decode", "verify", "ragged extend", "prefill", "padded", "idle after a live forward"}
    for kind, batch, _ in batches:
        assert (batch.padding > 0) == (kind in ("padded", "idle after a live forward"))
        if kind == "idle after a live forward":
            assert batch.is_idle and not batch.previous.is_idle
            batch = batch.previous
        counts = batch.extend_seq_lens.tolist()
        assert len(set(batch.req_pool_indices.tolist())) == len(counts)
        if kind in ("decode", "idle after a live forward"):
            assert set(counts) == {1}
        elif kind == "verify":
            assert len(set(counts)) == 1 and counts[0] > 1
        elif len(counts) > 1:
            assert len(set(counts)) > 1
        if kind == "prefill":
            assert set(batch.extend_prefix_lens.tolist()) == {0}
    assert any(max(b.extend_prefix_lens.tolist()) > 0 for k, b, _ in batches if k == "ragged extend")
    assert [b.extend_seq_lens.tolist() for _, b, _ in producer_batches(seed=0)] == [
        b.extend_seq_lens.tolist() for _, b, _ in batches]


def test_the_matrix_finds_the_assign_listed_rows_only_with_in_graph_prep_off_and_records_the_setting(tmp_path):
    if "0.5.17" not in locate.cached_releases():
        pytest.skip("needs the sglang 0.5.17 wheel in the cache")
    from swafuzz.tools.sglang_matrix import SWITCHED_COLUMN, run_matrix

    matrix = run_matrix(["0.5.17"], max_examples=150, replay_dir=tmp_path)
    (merge,) = [c for c in matrix.cells if c.target.name == "unified-metadata-merge"]
    assert "no graph_replay" in merge.runs["realistic"]
    assert not [f for f in merge.findings if f.column == "realistic"]
    (switched,) = [f for f in merge.findings if f.column == SWITCHED_COLUMN]
    assert switched.divergence.source["kind"] == GRAPH_CAPTURE
    verdict, why = judge(switched)
    assert verdict == "reachable off-default" and "only with SGLANG_PREP_IN_CUDA_GRAPH=0" in why
    assert load_replay(switched.replay).engine_switches == {PREP: False}
    assert matrix.producers["0.5.17"] and all(c.outcome != WRONG for c in matrix.producers["0.5.17"])


UNIFORM_PREFILL_EXPANSION = """
import torch

class DeepseekV4HipRadixBackend:
    def expand_prefill_casually(self, num_tokens, seq_lens, extend_seq_lens, req_pool_indices, padded_num_tokens):
        return None, req_pool_indices.repeat_interleave(num_tokens // req_pool_indices.shape[0])
"""


def test_a_producer_that_assumes_equal_counts_is_named_wrong_at_its_first_ragged_batch(tmp_path: Path):
    from swafuzz.subjects.sglang.producers import PREFILL_EXPANSION, VERIFY_EXPANSION
    from swafuzz.subjects.sglang.targets import HIP_BACKEND_FILE

    file = tmp_path / HIP_BACKEND_FILE
    file.parent.mkdir(parents=True)
    file.write_text(UNIFORM_PREFILL_EXPANSION)
    checks = {c.name: c for c in check_producers(locate.SourceTree(tmp_path, "checkout"))}
    wrong = checks[PREFILL_EXPANSION]
    assert wrong.owner == "DeepseekV4HipRadixBackend" and wrong.outcome == WRONG
    # decode-like and verify-like batches have equal counts: the first wrong one is ragged
    assert re.fullmatch(r"req_pool_indices_repeated row \d+: got \d+, want \d+ \(\d+ rows, \d+ wanted\) "
                        r"\(ragged extend batch: request slots .*, window \d+\)", wrong.detail), wrong.detail
    assert wrong.batches > 24
    assert checks[VERIFY_EXPANSION].outcome == ABSENT
