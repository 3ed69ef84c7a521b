"""Search settings are Hypothesis settings profiles, chosen either way: --settings or Hypothesis's."""

from __future__ import annotations

import pytest
from hypothesis import Verbosity, settings

from swafuzz.search.fuzz import SETTINGS_PROFILES, fuzz, settings_profile
from swafuzz.subjects.registry import resolve_subject


def test_the_pytest_plugin_knows_the_profile_names_without_importing_the_engine():
    from swafuzz.search import fuzz as engine
    from swafuzz import pytest_plugin

    assert pytest_plugin.PROFILE_PREFIX == engine.PROFILE_PREFIX


def test_each_settings_profile_is_a_registered_hypothesis_profile():
    for name in ("dev", "ci", "nightly", "repro"):
        assert settings.get_profile(f"swafuzz-{name}") is SETTINGS_PROFILES[name].settings
    assert settings.get_profile("swafuzz-ci").derandomize
    assert settings.get_profile("swafuzz-ci").database is None
    assert settings.get_profile("swafuzz-dev").database is not None
    assert settings.get_profile("swafuzz-repro").verbosity is Verbosity.verbose
    assert all(settings.get_profile(f"swafuzz-{name}").deadline is None for name in SETTINGS_PROFILES)


@pytest.fixture
def loaded_profile():
    previous = settings.default
    yield settings.load_profile
    settings.register_profile("restored-after-test", previous)
    settings.load_profile("restored-after-test")


def test_a_loaded_hypothesis_profile_chooses_the_settings(loaded_profile, monkeypatch):
    monkeypatch.delenv("SWAFUZZ_SETTINGS", raising=False)
    loaded_profile("swafuzz-ci")
    assert settings_profile(None).name == "ci"
    result = fuzz(resolve_subject("uncached"), max_examples=5)
    assert (result.settings, result.seed) == ("ci", 0)


def test_settings_option_and_environment_come_before_the_loaded_profile(loaded_profile, monkeypatch):
    loaded_profile("swafuzz-ci")
    monkeypatch.setenv("SWAFUZZ_SETTINGS", "repro")
    assert settings_profile(None).name == "repro"
    assert settings_profile("swafuzz-nightly").name == "nightly"


def test_a_seeded_run_repeats_exactly_and_still_saves_its_failure_for_unseeded_runs(tmp_path):
    info = resolve_subject("pool-start-layer")
    seeded = [fuzz(info, settings="dev", seed=4, max_examples=2000, database_dir=str(tmp_path)) for _ in range(2)]
    assert seeded[0].divergence is not None
    assert seeded[0].examples_to_divergence == seeded[1].examples_to_divergence > 1  # no replay
    assert seeded[0].scenario == seeded[1].scenario
    unseeded = fuzz(info, settings="dev", max_examples=2000, database_dir=str(tmp_path))
    assert unseeded.examples_to_divergence == 1
    assert unseeded.scenario == seeded[0].scenario
