"""A bound target as one release runs it under given engine switch settings.

Its driver follows the switches it reads (:data:`.reachability.DRIVER_SWITCHES`), and the
subject carries ``realistic_exclusions``: the lifecycle features its release never takes
under those settings (:data:`.reachability.MODELLED_PATHS`), which the realistic profile
then never draws for it (:func:`swafuzz.fuzz.scenario_test`).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..registry import SubjectInfo
from .locate import RELEASES
from .reachability import EVERY_SCENARIO, driver_attributes, excluded_features
from .switches import SwitchSettings, settings_for
from .targets import Target


def configured(info: SubjectInfo, target: Target, switches: SwitchSettings) -> SubjectInfo:
    """``info`` with its subject following ``switches``. A target none of whose lifecycle the
    settings allow (:data:`EVERY_SCENARIO`) is the caller's to refuse."""
    attributes: dict[str, object] = dict(driver_attributes(target.name, switches))
    attributes["realistic_exclusions"] = excluded_features(target.name, switches) - {EVERY_SCENARIO}
    return dataclasses.replace(info, subject=type(info.subject.__name__, (info.subject,), attributes))


def as_released(info: SubjectInfo, target: Target, version: str | None,
                overrides: Mapping[str, bool] | None = None) -> SubjectInfo:
    """``info`` configured with its release's switches, at their defaults except
    ``overrides``; unchanged for a source that is no release read here (a checkout of
    another version)."""
    if version not in RELEASES:
        return info
    return configured(info, target, settings_for(version, overrides))
