"""A profile restricted to the lifecycle features one engine configuration allows.

A profile says what an engine may do in general; a given engine build with given switch
settings may lack some of it (a release whose graph replay takes another metadata path).
:func:`scenarios_without` draws the profile's scenarios that exercise none of the excluded
terms, so such a run never draws what that engine cannot do. A term is a feature (a name of
:mod:`swafuzz.strategies.features`), a per-forward feature in one forward mode
(``micro_batches@decode``), two features together (``micro_batches+pipeline_stage``), or
``non_swa_layers``: :data:`~swafuzz.strategies.features.RESTRICTION_TERMS`. Which terms a
configuration excludes is the caller's knowledge.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from ..reference import Scenario

from .features import RESTRICTION_TERMS, restriction_terms_of
from .scenarios import scenarios


def scenarios_without(
    profile: str, excluded: frozenset[str], long_horizon: bool = False, compressed: bool = False,
    draft_blocks: bool = False,
) -> st.SearchStrategy[Scenario]:
    """Scenarios of ``profile`` in which no term of ``excluded`` occurs (``compressed``,
    ``draft_blocks``: as :func:`~swafuzz.strategies.scenarios.scenarios` says)."""
    unknown = sorted(set(excluded) - set(RESTRICTION_TERMS))
    if unknown:
        raise ValueError(f"unknown lifecycle feature(s) {', '.join(unknown)}; features and terms are "
                         f"{', '.join(RESTRICTION_TERMS)}")
    if not excluded:
        return scenarios(profile, long_horizon, compressed=compressed, draft_blocks=draft_blocks)
    return _without(profile, frozenset(excluded), long_horizon, compressed, draft_blocks)


@lru_cache(maxsize=None)  # one strategy per restriction: a fuzz run asks for it on every chunk
def _without(profile: str, excluded: frozenset[str], long_horizon: bool,
             compressed: bool, draft_blocks: bool) -> st.SearchStrategy[Scenario]:
    # the strategy leaves out what it can while drawing (an engine without pipeline stages
    # draws none rather than rejecting three draws in four); the filter keeps the rest out,
    # and shrinking stays inside the restriction
    return scenarios(profile, long_horizon, excluded, compressed, draft_blocks).filter(
        lambda scenario: not (restriction_terms_of(scenario) & excluded))
