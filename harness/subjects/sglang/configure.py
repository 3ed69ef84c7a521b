"""A bound target as its tree runs it under given engine switch settings.

Its driver follows the switches it reads (:data:`.reachability.DRIVER_SWITCHES`), the bound
code reads the same settings through its ``envs`` (:class:`.drivers.EngineEnvironment`), and
the subject carries

- ``target_modes``: the forward modes in which the tree's own code calls the target under
  those settings (:mod:`.callsites`; None where that reading is unconfirmed: every mode the
  driver models); in the others the engine stores through another path, which is not the
  code under test, and the driver answers for it;
- ``call_sites``: that reading, which the reports print beside the verdict;
- ``zero_rows``: whether a forward with no rows on a rank reaches the layers' SWA stores
  (:func:`.engine_features.zero_row_forwards`); where the tree's layers return first, the
  driver stores nothing for one, as SGLang does;
- ``realistic_exclusions``: the lifecycle features (restriction terms) the tree never takes
  under those settings: the engine features its DeepSeek-V4 does not reach
  (:mod:`.engine_features`) and the paths the target's driver models that the settings leave
  (:data:`.reachability.MODELLED_PATHS`); the realistic profile then never draws them for it,
  and a divergence that needs one is not realistic (:func:`swafuzz.search.fuzz.scenario_test`).
"""

from __future__ import annotations

import dataclasses
from ..info import SubjectInfo
from . import callsites, engine_features
from .locate import SourceTree
from .reachability import EVERY_SCENARIO, driver_attributes, excluded_features
from .switches import SwitchSettings
from .targets import Target


def configured(info: SubjectInfo, target: Target, tree: SourceTree, switches: SwitchSettings) -> SubjectInfo:
    """``info`` (bound from ``tree``) with its subject following ``switches``. A target none
    of whose lifecycle the settings allow (:data:`EVERY_SCENARIO`) is the caller's to refuse."""
    reading = callsites.read(tree, target.called_as, switches)
    attributes: dict[str, object] = dict(driver_attributes(target.name, switches))
    attributes["realistic_exclusions"] = (excluded_features(target.name, switches) - {EVERY_SCENARIO}
                                          | engine_features.unreached(tree, switches))
    attributes["target_modes"] = reading.modes
    attributes["call_sites"] = reading
    attributes["zero_rows"] = engine_features.zero_row_forwards(tree, switches)
    subject = type(info.subject.__name__, (info.subject,), attributes)
    subject.environment.settings = switches
    return dataclasses.replace(info, subject=subject)
