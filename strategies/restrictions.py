"""A profile restricted to the lifecycle features one engine configuration allows.

A profile says what an engine may do in general; a given engine build with given switch
settings may lack some of it (a release whose graph replay takes another metadata path).
:func:`scenarios_without` draws the profile's scenarios that exercise none of the excluded
features (names of :mod:`swafuzz.strategies.features`), so such a run never draws what that
engine cannot do. Which features a configuration excludes is the caller's knowledge.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from ..reference import Scenario

from .features import ALL_FEATURES, features_of
from .scenarios import scenarios


def scenarios_without(
    profile: str, excluded: frozenset[str], long_horizon: bool = False,
) -> st.SearchStrategy[Scenario]:
    """Scenarios of ``profile`` in which no feature of ``excluded`` occurs."""
    unknown = sorted(set(excluded) - set(ALL_FEATURES))
    if unknown:
        raise ValueError(f"unknown lifecycle feature(s) {', '.join(unknown)}; features are {', '.join(ALL_FEATURES)}")
    if not excluded:
        return scenarios(profile, long_horizon)
    return _without(profile, frozenset(excluded), long_horizon)


@lru_cache(maxsize=None)  # one strategy per restriction: a fuzz run asks for it on every chunk
def _without(profile: str, excluded: frozenset[str], long_horizon: bool) -> st.SearchStrategy[Scenario]:
    # rejection keeps the profile's distribution over what remains, and shrinking stays
    # inside the restriction; each rejected draw costs one more draw
    return scenarios(profile, long_horizon).filter(lambda scenario: not (features_of(scenario) & excluded))
