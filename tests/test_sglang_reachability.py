"""The table of SGLang call paths (harness/subjects/sglang/reachability.py) against the releases.

Every route cites hops (``file:function``) and what each says or does not say; these tests
read each release's wheel and fail when a cited function is gone, moved, or no longer says
what the verdict rests on. Releases checked: those of ``$SWAFUZZ_SGLANG_TEST_VERSIONS`` (as
in the binding tests) and any release already in the wheel cache; one that cannot be
downloaded is skipped with the reason.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from conftest import edited_release

from swafuzz.subjects.sglang import locate
from swafuzz.subjects.sglang.reachability import (
    ALL_QUESTIONS,
    COMPRESSED_QUESTIONS,
    DRIVER_SWITCHES,
    MODEL,
    MODELLED_PATHS,
    PACKAGE,
    Hop,
    Route,
    function_source,
    question,
    releases,
    route_problems,
)
from swafuzz.api import ForwardMode
from swafuzz.subjects.sglang import callsites
from swafuzz.subjects.sglang.switches import SWITCHES, declared_default, parse_override, settings_of, switch
from swafuzz.subjects.sglang.targets import target

TEST_VERSIONS_ENV = "SWAFUZZ_SGLANG_TEST_VERSIONS"
DEFAULT_TEST_VERSIONS = ("0.5.12", "0.5.19", "0.5.23")
REQUESTED = tuple(
    v.strip() for v in os.environ.get(TEST_VERSIONS_ENV, ",".join(DEFAULT_TEST_VERSIONS)).split(",") if v.strip()
)
CHECKED = tuple(v for v in locate.RELEASES if v in REQUESTED)


@functools.lru_cache(maxsize=None)
def _tree(version: str) -> locate.SourceTree | str:
    try:
        return locate.wheel(version)
    except locate.SglangUnavailable as exc:
        return f"no sglang {version} wheel: {exc}"


def _cases():
    for item in ALL_QUESTIONS:
        for number, route in enumerate(item.routes):
            for version in route.releases:
                if version in CHECKED:
                    label = f"{item.key}-{number}-{version}"
                    yield pytest.param(item.key, number, version, id=label)


@pytest.mark.parametrize("key,number,version", list(_cases()))
def test_each_cited_call_path_reads_as_cited_in_its_release(key, number, version):
    tree = _tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    route = question(key).routes[number]
    assert route_problems(tree, route) == []


@pytest.mark.parametrize("item", ALL_QUESTIONS, ids=lambda q: q.key)
def test_every_release_has_exactly_one_default_reading_of_every_problem(item):
    for version in locate.RELEASES:
        defaults = [r for r in item.routes_for(version) if r.setting is None]
        assert len(defaults) == 1, f"{item.key} in {version}: {len(defaults)} default routes"


def test_a_reached_route_cites_the_code_it_passes_through():
    for item in ALL_QUESTIONS:
        for route in item.routes:
            if route.reached:
                # a kernel's C++ source is read whole: the checker parses Python only
                assert all(hop.function or not hop.path.endswith(".py") for hop in route.hops), (
                    f"{item.key}: a reached path cites whole Python files")
                assert len(route.hops) >= 2


def test_a_route_scoped_to_some_targets_cites_only_their_code():
    for item in ALL_QUESTIONS:
        for route in item.routes:
            if route.targets is not None:
                assert set(route.targets) <= set(item.targets), f"{item.key}: a route for a target it does not ask of"


def test_the_request_window_idle_route_cites_each_getter_for_its_own_target_only():
    item = question("skipped-metadata-init-idle")
    switched = {target: [r for r in item.routes_for("0.5.22", target) if r.reached]
                for target in ("cuda-swa-out-cache-loc", "hip-swa-out-cache-loc", "hip-unified-swa-loc")}
    assert "DeepseekV4AttnBackend.get_swa_out_cache_loc" in switched["cuda-swa-out-cache-loc"][0].cited()
    assert "DeepseekV4HipRadixBackend.get_swa_out_cache_loc" in switched["hip-swa-out-cache-loc"][0].cited()
    assert "DeepseekV4AttnBackend" not in switched["hip-swa-out-cache-loc"][0].cited()
    assert switched["hip-unified-swa-loc"] == []  # the ring getter reads no request window
    # 0.5.21's HIP getter has no request window, so nothing reaches it there
    assert item.verdict("0.5.21", "hip-swa-out-cache-loc")[0] == "not reached"
    assert item.verdict("0.5.21", "cuda-swa-out-cache-loc")[0] == "reachable off-default"


def test_questions_about_compressed_values_ask_of_no_target_and_have_keys_of_their_own():
    assert all(item.targets == () for item in COMPRESSED_QUESTIONS)
    keys = [item.key for item in ALL_QUESTIONS]
    assert len(keys) == len(set(keys))
    assert {question(item.key) for item in COMPRESSED_QUESTIONS} == set(COMPRESSED_QUESTIONS)


def test_the_fixed_draft_pad_reading_fails_on_a_planner_that_pads_otherwise():
    route = question("compress-plan-fixed-draft-pad").routes_for("0.5.12")[0]
    planner = route.hops[-1]
    tree = edited_release("0.5.12", planner.file, "kMaxMTPDraftTokens = 4", "kMaxMTPDraftTokens = 8",
                          "an 8-token draft pad")
    assert route.reached and route_problems(tree, route) == [
        f"{planner}: does not mention 'kMaxMTPDraftTokens = 4'"]


def test_releases_are_ordered_with_their_post_releases():
    assert releases("0.5.12", "0.5.13") == ("0.5.12", "0.5.12.post1", "0.5.13")
    assert locate.release_key("0.5.15.post1") < locate.release_key("0.5.16")
    with pytest.raises(ValueError, match="not a release number"):
        locate.release_key("0.5.x")


# ---- the checker itself, on a checkout of our own ----------------------------------------------

MODEL_WITH_OVERLAP = """
class DeepseekV4Model:
    def forward(self, batch):
        for i in range(self.start_layer, self.end_layer):
            pass
        return model_forward_maybe_tbo(batch)

    class Inner:
        def helper(self):
            def nested():
                return 1
            return nested
"""


def _checkout(root: Path, text: str) -> locate.SourceTree:
    file = root / PACKAGE / MODEL
    file.parent.mkdir(parents=True)
    file.write_text(text)
    return locate.SourceTree(root, "checkout")


def test_a_route_the_code_contradicts_is_reported_hop_by_hop(tmp_path):
    tree = _checkout(tmp_path, MODEL_WITH_OVERLAP)
    route = Route(("9.9.9",), False, (
        Hop(MODEL, lacks=("tbo",)),
        Hop(MODEL, "DeepseekV4Model.forward", mentions=("self.start_layer", "layer_loop")),
        Hop(MODEL, "DeepseekV4Model.backward"),
    ), "a reading that no longer holds")
    assert route_problems(tree, route) == [
        f"{MODEL}: mentions 'tbo'",
        f"{MODEL}:DeepseekV4Model.forward: does not mention 'layer_loop'",
        f"{MODEL}:DeepseekV4Model.backward: not found",
    ]


def test_a_hop_outside_sglang_srt_is_read_from_the_package_root(tmp_path):
    tree = _checkout(tmp_path, MODEL_WITH_OVERLAP)
    kernel = tmp_path / "sglang" / "kernels" / "plan.cuh"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("constexpr int32_t kPad = 4;\n")
    route = Route(("9.9.9",), False, (
        Hop("sglang/kernels/plan.cuh", mentions=("kPad = 4",), lacks=("kPad = 8",)),
        Hop("sglang/kernels/absent.cuh"),
        Hop(MODEL, "DeepseekV4Model.forward", mentions=("self.start_layer",)),
    ), "a kernel constant and the model's loop")
    assert route_problems(tree, route) == ["sglang/kernels/absent.cuh: not found"]
    assert Hop(MODEL).file == PACKAGE + MODEL and Hop("sglang/kernels/plan.cuh").file == "sglang/kernels/plan.cuh"


def test_nested_functions_are_found_by_their_dotted_names(tmp_path):
    tree = _checkout(tmp_path, MODEL_WITH_OVERLAP)
    assert function_source(tree, Hop(MODEL, "DeepseekV4Model.Inner.helper.nested")).startswith("def nested")
    assert function_source(tree, Hop("models/absent.py", "f")) is None


# ---- engine switches ---------------------------------------------------------------------------


def _switch_cases():
    for item in SWITCHES:
        for version in CHECKED:
            yield pytest.param(item.name, version, id=f"{item.name}-{version}")


@pytest.mark.parametrize("name,version", list(_switch_cases()))
def test_each_switch_default_is_the_one_the_release_declares(name, version):
    tree = _tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    assert declared_default(tree, switch(name)) == switch(name).default(version)


def test_a_route_that_needs_a_setting_sets_a_switch_against_its_default():
    for item in ALL_QUESTIONS:
        for route in item.routes:
            if route.setting is None:
                continue
            for version in route.releases:
                matching = [s for s in SWITCHES if s.default(version) is not None
                            and s.setting(not s.default(version)) == route.setting]
                assert matching, f"{item.key} in {version}: {route.setting} is no switch against its default"


def test_switch_defaults_are_read_from_declarations(tmp_path):
    environ = tmp_path / "sglang" / "srt" / "environ.py"
    environ.parent.mkdir(parents=True)
    environ.write_text("class Envs:\n    SGLANG_PREP_IN_CUDA_GRAPH = EnvBool(False)\n")
    tree = locate.SourceTree(tmp_path, "checkout")
    assert declared_default(tree, switch("SGLANG_PREP_IN_CUDA_GRAPH")) is False
    assert declared_default(tree, switch("SGLANG_OPT_CACHE_SWA_TRANSLATION")) is None


# ---- what the switches decide for the drivers ----------------------------------------------------


def _has_target(name: str, version: str) -> bool:
    item = target(name)
    key = locate.release_key(version)
    return key >= locate.release_key(item.first) and (item.last is None or key <= locate.release_key(item.last))


def _switch_reading_cases():
    readings = [(f"modelled-{n}", p.switch, p.targets, p.hops) for n, p in enumerate(MODELLED_PATHS)]
    readings += [(f"driver-{n}", d.switch, d.targets, d.hops) for n, d in enumerate(DRIVER_SWITCHES)]
    for label, name, targets, hops in readings:
        for version in CHECKED:
            if switch(name).default(version) is not None and any(_has_target(t, version) for t in targets):
                yield pytest.param(hops, version, id=f"{label}-{version}")


@pytest.mark.parametrize("hops,version", list(_switch_reading_cases()))
def test_where_a_release_decides_by_a_switch_reads_as_cited(hops, version):
    tree = _tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    assert route_problems(tree, Route((version,), False, hops, "")) == []


def test_a_modelled_path_names_a_switch_and_targets_that_exist():
    for path in MODELLED_PATHS:
        assert any(switch(path.switch).default(v) is not None for v in locate.RELEASES), path.switch
        assert all(target(name) for name in path.targets)
    for item in DRIVER_SWITCHES:
        assert any(switch(item.switch).default(v) is not None for v in locate.RELEASES), item.switch
        # a driver follows the switch through its class attribute, or reads the run's settings
        assert item.attribute is None or all(hasattr(target(name).driver, item.attribute) for name in item.targets)


# ---- the call sites read from a release agree with the table ------------------------------------

# what each mode question is about: the forward modes whose reading of the getter it answers
MODE_QUESTION_MODES = {
    "ring-getter-in-verify": {ForwardMode.TARGET_VERIFY},
    "ring-getter-in-extend": {ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND},
}


def _ring_cases():
    for version in CHECKED:
        if _has_target("hip-unified-swa-loc", version):
            for key in MODE_QUESTION_MODES:
                yield pytest.param(key, version, id=f"{key}-{version}")


@pytest.mark.parametrize("key,version", list(_ring_cases()))
def test_the_modes_read_from_a_releases_call_sites_are_the_tables(key, version):
    tree = _tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    verdict, routes = question(key).verdict(version)
    modes = MODE_QUESTION_MODES[key]
    called_as = target("hip-unified-swa-loc").called_as

    def read(*settings: str) -> frozenset[ForwardMode]:
        reading = callsites.read(tree, called_as, settings_of(tree, dict(map(parse_override, settings))))
        assert reading.unconfirmed is None, reading.unconfirmed
        return reading.modes & modes

    assert bool(read()) == (verdict == "reachable")
    for route in routes:
        if route.setting is not None:
            assert bool(read(route.setting)) == route.reached
