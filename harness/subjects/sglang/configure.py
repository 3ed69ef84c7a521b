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
- ``draft_blocks``: how the driver makes a DSpark draft block's metadata
  (:class:`.drivers.DraftBlocks`), with ``draft_block_code``, the tree's draft-block metadata
  init where the driver runs it (:class:`.producers.DraftBlockCode`), and
  ``drafts_in_blocks``: whether the search draws DSpark draft models, which it does where the
  tree's DSpark model calls the target and the driver can make the blocks' metadata;
- ``raw_verify_drafters`` (the merge target's): the drafters whose target-verify graph
  replays the tree prepares from raw inputs, which the graph rebuilds the ring rows from,
  rather than by merging eagerly built metadata;
- ``realistic_exclusions``: the lifecycle features (restriction terms) the tree never takes
  under those settings: the engine features its DeepSeek-V4 does not reach
  (:mod:`.engine_features`) and the paths the target's driver models that the settings leave
  (:data:`.reachability.MODELLED_PATHS`); the realistic profile then never draws them for it,
  and a divergence that needs one is not realistic (:func:`swafuzz.search.fuzz.scenario_test`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools

from ...api import ForwardMode
from ..info import SubjectInfo
from . import callsites, engine_features
from .binding import BindError
from .drivers import DSPARK, OTHER_DRAFTER, DraftBlocks
from .locate import SourceTree
from .producers import DraftBlockCode, bind_draft_block_code
from .reachability import EVERY_SCENARIO, driver_attributes, excluded_features, parsed
from .switches import SwitchSettings
from .targets import HIP_BACKEND_FILE, POOL_FILE, Target


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
    stores_blocks = reading.modes is None or ForwardMode.DRAFT_BLOCK in reading.modes
    if target.draft_blocks is DraftBlocks.BUILT_BY_TREE:
        code, absent = _draft_block_code(tree, info.subject.binding.mode)
        attributes["draft_block_code"], attributes["draft_block_absent"] = code, absent
        attributes["draft_blocks"] = DraftBlocks.BUILT_BY_TREE if code is not None else None
        attributes["drafts_in_blocks"] = code is not None and stores_blocks
    elif target.draft_blocks is DraftBlocks.AS_VERIFY:
        unread = _draft_ring_on_hip(tree)
        attributes["draft_blocks"] = None if unread else DraftBlocks.AS_VERIFY
        attributes["drafts_in_blocks"] = stores_blocks and not unread
        attributes["draft_block_absent"] = unread
    else:
        attributes["draft_block_absent"] = (f"{target.subject_name} runs none: swafuzz makes a DSpark draft "
                                            "block's metadata for get_swa_out_cache_loc only")
    if hasattr(info.subject, "raw_verify_drafters"):
        attributes["raw_verify_drafters"] = _raw_verify_drafters(tree)
    subject = type(info.subject.__name__, (info.subject,), attributes)
    subject.environment.settings = switches
    return dataclasses.replace(info, subject=subject)


@functools.lru_cache(maxsize=32)  # every configuration of a tree's target binds it once
def _draft_block_code(tree: SourceTree, mode: str) -> tuple[DraftBlockCode | None, str]:
    """The tree's DSpark draft-block metadata init, or None and why the driver has none."""
    try:
        return bind_draft_block_code(tree, mode), ""
    except BindError as exc:
        return None, f"{tree.label} has no DSpark draft-block metadata init the driver can run ({exc})"


VERIFY_INIT = "init_forward_metadata_target_verify"
RAW_VERIFY_METADATA = "DSV4RawVerifyMetadata"
DSPARK_TEST = "is_dspark"


@functools.lru_cache(maxsize=32)
def _raw_verify_drafters(tree: SourceTree) -> frozenset[str]:
    """The drafters for which the HIP backend's target-verify init, called by the replay prep
    of the target-verify bucket, returns raw inputs that the graph rebuilds the metadata from:
    none where it returns no ``DSV4RawVerifyMetadata`` (up to 0.5.19), DSpark's where that
    return sits under a test of ``is_dspark`` (0.5.20+), and every drafter where it sits under
    no test or another one, which this reading cannot tell apart (no merge is then claimed)."""
    _, module = parsed(tree, HIP_BACKEND_FILE)
    init = next((node for node in ast.walk(module) if isinstance(node, ast.FunctionDef)
                 and node.name == VERIFY_INIT), None) if module is not None else None
    if init is None:
        return frozenset()
    raw_returns = [node for node in ast.walk(init) if isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
                   and ast.unparse(node.value.func).endswith(RAW_VERIFY_METADATA)]
    if not raw_returns:
        return frozenset()
    guards = [node.test for node in ast.walk(init) if isinstance(node, ast.If)
              and any(ret in ast.walk(node) for ret in raw_returns)]
    if guards and all(DSPARK_TEST in ast.unparse(guard) for guard in guards):
        return frozenset({DSPARK})
    return frozenset({DSPARK, OTHER_DRAFTER})


# what decides that the HIP backend's DSpark draft keeps no ring of its own: the backend
# reads none, and the pool's gate for one leaves HIP out (0.5.23) or is not there
DRAFT_RING_GATE = "uses_draft_swa_ring"
DRAFT_RING_SIZE_FIELD = "swa_req_ring_size"


@functools.lru_cache(maxsize=32)
def _draft_ring_on_hip(tree: SourceTree) -> str:
    """Why the HIP backend's DSpark draft blocks may keep rows of their own in ``tree`` (a
    draft ring, which the HIP drivers do not model), or "" where they cannot: then a block's
    metadata is a target-verify forward's, as every release from 0.5.16 to 0.5.23 has it."""
    _, backend = parsed(tree, HIP_BACKEND_FILE)
    if backend is not None and any(isinstance(node, ast.Attribute) and node.attr == DRAFT_RING_SIZE_FIELD
                                   for node in ast.walk(backend)):
        return (f"{tree.label}: the HIP backend reads the DSpark draft ring ({DRAFT_RING_SIZE_FIELD}), whose rows "
                "swafuzz does not model for it")
    _, pool = parsed(tree, POOL_FILE)
    gate = next((node for node in ast.walk(pool) if isinstance(node, ast.FunctionDef)
                 and node.name == DRAFT_RING_GATE), None) if pool is not None else None
    if gate is not None and not any(isinstance(node, ast.Name) and node.id == "_is_hip" for node in ast.walk(gate)):
        return (f"{tree.label}: {POOL_FILE}'s {DRAFT_RING_GATE} does not leave HIP out, so a HIP DSpark draft may "
                "keep a ring of its own, which swafuzz does not model for it")
    return ""

