"""Reachability read from a tree: where its own code calls a target, and in which forward modes.

Each tree here is a few lines written for the test (no SGLang code): a ForwardMode whose
predicates compare ``self`` with its members, a model that calls a getter under conditions,
and an environ.py declaring switches. The readings of the released wheels are held to the
matrix's call-path table in tests/test_sglang_reachability.py.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from swafuzz.api import ForwardMode
from swafuzz.subjects.sglang import BindError, bind_target, callsites, locate
from swafuzz.subjects.sglang.drivers import EngineEnvironment, StandInGap
from swafuzz.subjects.sglang.switches import ENVIRON, parse_override, settings_of
from swafuzz.subjects.sglang.targets import target

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick

FORWARD_MODE = '''
from enum import IntEnum, auto

class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND = auto()

    def is_decode(self):
        return self == ForwardMode.DECODE

    def is_idle(self):
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self):
        return self.is_decode() or self.is_idle()

    def is_target_verify(self):
        return self == ForwardMode.TARGET_VERIFY

    def is_extend(self, include_draft=False):
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY) or (include_draft and self == ForwardMode.DRAFT_EXTEND)
'''
ENVIRONMENT = '''
class Envs:
    SGLANG_STORE_VERIFY_BY_GETTER = EnvBool(False)
    SGLANG_SPLIT = EnvInt(4)
'''
DECODE_ARM = {ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.IDLE}


def _tree(tmp_path: Path, model: str, forward_mode: str | None = FORWARD_MODE, **more: str) -> locate.SourceTree:
    files = {callsites.MODEL_FILE: model, ENVIRON: ENVIRONMENT, **more}
    if forward_mode is not None:
        files[callsites.FORWARD_MODE_FILE] = forward_mode
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    return locate.SourceTree(tmp_path, "checkout")


def _read(tree: locate.SourceTree, *switches: str) -> callsites.Reading:
    return callsites.read(tree, ("get_rows",), settings_of(tree, dict(map(parse_override, switches))))


def test_a_call_under_a_mode_check_reaches_only_the_modes_it_allows(tmp_path):
    tree = _tree(tmp_path, '''
        class Layer:
            def forward(self, forward_batch, backend):
                is_decode = forward_batch.forward_mode.is_decode_or_idle()
                fused = is_decode and self.use_fused
                if fused:
                    rows = backend.get_rows(forward_batch)
    ''')
    reading = _read(tree)
    assert reading.unconfirmed is None and reading.modes == DECODE_ARM
    (site,) = reading.sites
    assert (site.path, site.function, site.line, site.guards) == ("models/deepseek_v4.py", "Layer.forward", 7, ("fused",))
    assert reading.describe() == ("get_rows is called in decode, draft, idle forwards, from "
                                  "models/deepseek_v4.py:Layer.forward line 7 when `fused`")


def test_exclusive_branches_are_read_as_exclusive(tmp_path):
    # the same unknown in both tests: the elif runs only where the first test failed
    tree = _tree(tmp_path, '''
        def forward(forward_batch, backend, unified):
            verify = forward_batch.forward_mode.is_target_verify()
            if unified and (verify or forward_batch.forward_mode.is_decode()):
                if unified and verify:
                    pass
                elif unified:
                    backend.get_rows(forward_batch)
    ''')
    assert _read(tree).modes == {ForwardMode.DECODE, ForwardMode.DRAFT_DECODE}


def test_a_switch_decides_by_the_value_the_run_sets_and_is_open_where_it_sets_none(tmp_path):
    gate = '''
        from sglang.srt.environ import envs

        def verify_by_getter():
            if not envs.SGLANG_STORE_VERIFY_BY_GETTER.get():
                return False
            return True
    '''
    tree = _tree(tmp_path, '''
        from sglang.srt.gates import verify_by_getter

        def forward(forward_batch, backend):
            mode = forward_batch.forward_mode
            if mode.is_decode_or_idle() or (mode.is_target_verify() and verify_by_getter()):
                backend.get_rows(forward_batch)
    ''', **{"sglang/srt/gates.py": gate})
    assert _read(tree, "SGLANG_STORE_VERIFY_BY_GETTER=0").modes == DECODE_ARM
    assert _read(tree, "SGLANG_STORE_VERIFY_BY_GETTER=1").modes == DECODE_ARM | {ForwardMode.TARGET_VERIFY}
    # a variable that is no known switch and that the run leaves alone is a deployment's to set
    assert _read(tree).modes == DECODE_ARM | {ForwardMode.TARGET_VERIFY}


def test_a_method_called_from_its_class_is_reached_where_its_callers_are(tmp_path):
    tree = _tree(tmp_path, '''
        class Layer:
            def forward(self, forward_batch, backend):
                if forward_batch.forward_mode.is_extend():
                    return self.prefill(forward_batch)
                if forward_batch.forward_mode == ForwardMode.IDLE:
                    return None
                self.store(forward_batch, backend)

            def store(self, forward_batch, backend):
                return backend.get_rows(forward_batch)
    ''')
    assert _read(tree).modes == {ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.DRAFT_EXTEND}


def test_a_tree_that_cannot_be_read_is_unconfirmed_and_says_why(tmp_path):
    model = "def forward(forward_batch, backend):\n    backend.get_rows(forward_batch)\n"
    no_mode = _read(_tree(tmp_path / "a", model, forward_mode=None))
    assert no_mode.modes is None and "no model_executor/forward_batch_info.py" in no_mode.unconfirmed
    uncalled = _read(_tree(tmp_path / "b", "def forward(forward_batch):\n    pass\n"))
    assert uncalled.modes is None and "no call of get_rows in models/deepseek_v4.py" in uncalled.unconfirmed
    assert uncalled.describe().startswith("reachability unconfirmed: ")


def test_a_tree_declares_its_own_switches_and_their_defaults(tmp_path):
    tree = _tree(tmp_path, "")
    settings = settings_of(tree)
    assert settings.to_dict() == {}  # it declares none of the known switches
    assert settings.environment_value("SGLANG_STORE_VERIFY_BY_GETTER") is False
    assert settings.environment_value("SGLANG_SPLIT") == 4
    flipped = settings_of(tree, {"SGLANG_STORE_VERIFY_BY_GETTER": True})
    assert flipped.off_default() == ("SGLANG_STORE_VERIFY_BY_GETTER=1",)
    with pytest.raises(ValueError, match="declares no boolean SGLANG_ABSENT"):
        settings_of(tree, {"SGLANG_ABSENT": True})
    with pytest.raises(ValueError, match=r"it declares SGLANG_SPLIT = 4"):
        settings_of(tree, {"SGLANG_SPLIT": True})


def test_bound_code_reads_the_runs_switches_through_its_envs(tmp_path):
    tree = _tree(tmp_path, "")
    environment = EngineEnvironment()
    environment.settings = settings_of(tree, {"SGLANG_STORE_VERIFY_BY_GETTER": True})
    assert environment.SGLANG_STORE_VERIFY_BY_GETTER.get() is True
    assert environment.SGLANG_SPLIT.get() == 4
    with pytest.raises(StandInGap, match="envs.SGLANG_ABSENT"):
        environment.SGLANG_ABSENT.get()


def test_a_switch_the_tree_does_not_declare_is_refused_when_it_binds(tmp_path):
    tree = _tree(tmp_path, "")
    with pytest.raises(BindError, match="declares no boolean SGLANG_ABSENT"):
        bind_target(target("hip-unified-swa-loc"), tree, "source", switches={"SGLANG_ABSENT": True})


def test_reading_a_tree_leaves_no_mark_on_the_nodes_every_parsed_tree_shares(tmp_path):
    # CPython gives every tree the same Load, And, Add, Eq... nodes: a parent set on one would
    # chain any later tree (the binder's copies among them) to the modules read here
    tree = _tree(tmp_path, '''
        def forward(forward_batch, backend):
            if forward_batch.forward_mode.is_decode() and not backend.off:
                backend.get_rows(forward_batch + 1)
    ''')
    assert _read(tree).modes == {ForwardMode.DECODE, ForwardMode.DRAFT_DECODE}
    other = ast.parse("x = not (a and b == c + d)").body[0].value
    shared = [other.operand.op, other.operand.values[1].ops[0], other.operand.values[1].comparators[0].op,
              other.operand.values[0].ctx, other.op]
    assert [node for node in shared if hasattr(node, "parent")] == []
