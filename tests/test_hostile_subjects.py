"""Specification of what a broken or hostile subject comes to: a divergence of its own kind,
never a pass, an exit, a crash or a finding that cannot be kept.

Each row of :data:`HOSTILE` is a small subject, a scenario that exposes it, and the kind
and words of the divergence it must get (in the manner of PyTorch's OpInfo tables). Every
row also checks what any divergence must be: one printable sentence of bounded length,
a bounded traceback and stored values, and a replay file that reads back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

from swafuzz import Subject, run_scenario
from swafuzz.search import campaign
from swafuzz.run import executor, guard
from swafuzz.subjects.builtin import Uncached
from swafuzz.run.diagnosis import MAX_STORED_VALUES
from swafuzz.search.fuzz import fuzz
from swafuzz.reference import Scenario
from swafuzz.subjects.registry import resolve_subject
from swafuzz.results.replay import Replay, load_replay, write_replay
from swafuzz.strategies.examples import EXAMPLES

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


_TWO = {"op": "admit", "count": 2}
EAGER = _scenario({"start_layer": 0, "end_layer": 2},
                  [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]}])
GRAPH = _scenario({"start_layer": 0, "end_layer": 2, "graph_batch_sizes": [4]},
                  [_TWO, {"op": "forward", "requests": [0, 1], "graph": True},
                   {"op": "forward", "requests": [0, 1], "graph": True}])
LARGE_POOL = _scenario({"start_layer": 0, "end_layer": 2, "full_pool_size": 8192},
                       [_TWO, {"op": "forward", "requests": [0, 1]}, {"op": "forward", "requests": [0, 1]}])
REREGISTERED = EXAMPLES["register-then-skip-start"]
DRAFT = EXAMPLES["multi-step-draft"]
OVERLAP = EXAMPLES["two-batch-overlap"]


# ---- subjects that raise ---------------------------------------------------------------


def _raises_in(hook: str, exc: Callable[[], BaseException]) -> type[Subject]:
    """Right everywhere, but ``hook`` raises a fresh ``exc()``."""

    def raising(self, *args):
        raise exc()

    return type(f"RaisesIn_{hook}", (Uncached,), {hook: raising})


def _raises_on_lookup(name: str, exc: Callable[[], BaseException]) -> type[Subject]:
    """Right everywhere, but looking up its method ``name`` raises a fresh ``exc()``."""

    def lookup(self, attr):
        if attr == name:
            raise exc()
        return object.__getattribute__(self, attr)

    return type(f"RaisesOnLookup_{name}", (Uncached,), {"__getattribute__": lookup})


class _Custom(BaseException):
    """An exception of the subject's own that ``except Exception`` does not catch."""


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message")


_BADLY_NAMED = type("Bad\nName\x1b[31m", (Exception,), {})


# ---- subjects that write into what they are given -----------------------------------------


class _ZeroesOutCacheLocAtLastLayer(Uncached):
    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        if batch.forward_id == 2 and layer_id == 1:
            batch.out_cache_loc.zero_()
        return rows


class _ZeroesOutCacheLocThenReadsIt(Uncached):
    """Zeroes the locations at layer 0 of forward 2: layer 1 translates the zeros."""

    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        if batch.forward_id == 2 and layer_id == 0:
            batch.out_cache_loc.zero_()
        return rows


class _WritesPositionsThroughNumpy(Uncached):
    """A write that leaves the tensor's version alone."""

    def swa_write_location(self, batch, layer_id):
        batch.positions.numpy()[:] += 1
        return super().swa_write_location(batch, layer_id)


class _WritesSeqLensCpu(Uncached):
    def init_forward_metadata(self, batch):
        batch.seq_lens_cpu[1] = 99


class _RepointsOutCacheLoc(Uncached):
    def swa_write_location(self, batch, layer_id):
        batch.out_cache_loc = batch.out_cache_loc.clone()
        return super().swa_write_location(batch, layer_id)


class _DeletesPositions(Uncached):
    def init_forward_metadata(self, batch):
        del batch.positions


class _WritesPrefixLensInDraftStep1(Uncached):
    def swa_write_location(self, batch, layer_id):
        if batch.draft_step == 1:
            batch.extend_prefix_lens.fill_(-1)
        return super().swa_write_location(batch, layer_id)


class _WipesMappingThroughNumpy(Uncached):
    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        self.mapping.numpy()[1:] = 0
        return rows


class _WritesTheMappingItWasFirstHanded(Uncached):
    """Keeps the first mapping it is handed, and writes into it once a newer one is registered."""

    through_numpy = False

    def register_mapping(self, mapping):
        self.__dict__.setdefault("first", mapping)
        super().register_mapping(mapping)

    def swa_write_location(self, batch, layer_id):
        if self.first is not self.mapping:
            if self.through_numpy:
                self.first.numpy()[:2] = 7
            else:
                self.first[:2] = 7
        return super().swa_write_location(batch, layer_id)


class _WritesTheMappingItWasFirstHandedThroughNumpy(_WritesTheMappingItWasFirstHanded):
    through_numpy = True


class _WipesMappingThroughData(Uncached):
    """A write through ``.data``, which has a version counter of its own."""

    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        self.mapping.data[1:] = 0
        return rows


class _ResizesMappingAtCapture(Uncached):
    def init_capture_metadata(self, batch):
        self.mapping.resize_(1)


class _DropsPositionsInCapture(Uncached):
    def init_graph_metadata(self, batch):
        if batch.in_graph:
            batch.positions = None


class _WritesStaticLocationsAtReplay(Uncached):
    def init_replay_metadata(self, batch):
        batch.out_cache_loc[0] = 5


class _CapturesAWriteIntoPositions(Uncached):
    """The captured work writes into a static input, and so does every replay."""

    def swa_write_location(self, batch, layer_id):
        if batch.in_graph:
            batch.positions.add_(1)
        return super().swa_write_location(batch, layer_id)


# ---- answers a harness could choke on ------------------------------------------------------


class _Booby(torch.Tensor):
    """A tensor whose every operation raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("reading this answer is an error")


class _ReturnsBooby(Uncached):
    def swa_write_location(self, batch, layer_id):
        return super().swa_write_location(batch, layer_id).as_subclass(_Booby)


class _ReturnsFake(Uncached):
    def swa_write_location(self, batch, layer_id):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            return torch.empty(2, dtype=torch.int32)


def _returns(make: Callable[[], torch.Tensor], name: str) -> type[Subject]:
    return type(name, (Uncached,), {"swa_write_location": lambda self, batch, layer_id: make()})


_TERA_ROWS = 2**40


class _FloatOnlyInCapture(Uncached):
    def swa_write_location(self, batch, layer_id):
        rows = super().swa_write_location(batch, layer_id)
        return rows.float() if batch.in_graph else rows


@dataclass(frozen=True)
class Hostile:
    name: str
    subject: type[Subject]
    scenario: Scenario
    kind: str
    says: str  # a part of the sentence
    options: dict[str, Any] = field(default_factory=dict)  # for run_scenario


HOSTILE = [
    # every exception is the subject's, at every call
    Hostile("system-exit", _raises_in("swa_write_location", lambda: SystemExit(3)), EAGER, "raised",
            "At forward 1 (decode), layer 0, swa_write_location raised SystemExit: 3."),
    Hostile("keyboard-interrupt-of-its-own", _raises_in("init_forward_metadata", KeyboardInterrupt), EAGER,
            "raised", "init_forward_metadata raised KeyboardInterrupt."),
    Hostile("generator-exit", _raises_in("register_mapping", GeneratorExit), EAGER, "raised",
            "register_mapping raised GeneratorExit."),
    Hostile("custom-base-exception", _raises_in("__init__", lambda: _Custom("mine")), EAGER, "raised",
            "RaisesIn___init__(spec) raised _Custom: mine."),
    Hostile("raises-in-capture-metadata", _raises_in("init_capture_metadata", SystemExit), GRAPH, "raised",
            "init_capture_metadata raised SystemExit."),
    Hostile("raises-in-graph-metadata", _raises_in("init_graph_metadata", _Custom), GRAPH, "raised",
            "init_graph_metadata (graph warm-up) raised _Custom."),
    Hostile("raises-in-replay-metadata", _raises_in("init_replay_metadata", KeyboardInterrupt), GRAPH, "raised",
            "init_replay_metadata raised KeyboardInterrupt."),
    Hostile("raises-the-budget-stop", _raises_in("swa_write_location", lambda: executor.DeadlinePassed(0)), EAGER,
            "raised", "swa_write_location raised DeadlinePassed: the deadline passed after 0 checked stores."),
    Hostile("raises-the-timeout", _raises_in("swa_write_location", guard.SubjectTimeout), EAGER, "raised",
            "swa_write_location raised SubjectTimeout."),
    Hostile("raises-in-a-thread", _raises_in("swa_write_location", SystemExit), OVERLAP, "raised",
            "swa_write_location raised SystemExit.", {"threads": True}),
    # looking up a method is the subject's code (its __getattribute__)
    Hostile("raises-as-register-mapping-is-looked-up",
            _raises_on_lookup("register_mapping", lambda: RuntimeError("hidden")), EAGER, "raised",
            "register_mapping raised RuntimeError: hidden."),
    Hostile("exits-as-init-forward-metadata-is-looked-up", _raises_on_lookup("init_forward_metadata", SystemExit),
            EAGER, "raised", "init_forward_metadata raised SystemExit."),
    Hostile("interrupts-as-swa-write-location-is-looked-up",
            _raises_on_lookup("swa_write_location", KeyboardInterrupt), EAGER, "raised",
            "At forward 1 (decode), swa_write_location raised KeyboardInterrupt."),
    Hostile("interrupts-as-capture-metadata-is-looked-up",
            _raises_on_lookup("init_capture_metadata", KeyboardInterrupt), GRAPH, "raised",
            "init_capture_metadata raised KeyboardInterrupt."),
    Hostile("interrupts-as-a-graph-warm-up-looks-it-up",
            _raises_on_lookup("init_graph_metadata", KeyboardInterrupt), GRAPH, "raised",
            "init_graph_metadata (graph warm-up) raised KeyboardInterrupt."),
    Hostile("interrupts-as-a-thread-looks-it-up", _raises_on_lookup("swa_write_location", KeyboardInterrupt),
            OVERLAP, "raised", "swa_write_location raised KeyboardInterrupt.", {"threads": True}),
    # a subject's text is rendered, never trusted
    Hostile("message-str-raises", _raises_in("swa_write_location", _Unprintable), EAGER, "raised",
            "raised _Unprintable (its message could not be read: str() raised RuntimeError)."),
    Hostile("megabyte-message", _raises_in("swa_write_location", lambda: ValueError("\x1b[2J" + "x" * 5_000_000)),
            EAGER, "raised", "raised ValueError: '\\x1b[2Jxxx"),
    Hostile("badly-named-exception", _raises_in("swa_write_location", lambda: _BADLY_NAMED("m")), EAGER, "raised",
            "raised 'Bad\\nName\\x1b[31m': m."),
    # inputs are checked after the subject had them
    Hostile("zeroes-out-cache-loc", _ZeroesOutCacheLocAtLastLayer, EAGER, "wrote_input",
            "By the end of forward 2 (decode), the subject had written into out_cache_loc (rows 0-1): in SGLang "
            "this tensor is shared by every later layer and the allocator."),
    Hostile("zeroes-out-cache-loc-then-reads-it", _ZeroesOutCacheLocThenReadsIt, EAGER, "wrote_input",
            "By forward 2 (decode), layer 1, the subject had written into out_cache_loc (rows 0-1)"),
    Hostile("writes-positions-through-numpy", _WritesPositionsThroughNumpy, EAGER, "wrote_input",
            "By the end of forward 1 (decode), the subject had written into positions (rows 0-1)"),
    Hostile("writes-seq-lens-cpu", _WritesSeqLensCpu, EAGER, "wrote_input", "written into seq_lens_cpu (row 1)"),
    Hostile("repoints-out-cache-loc", _RepointsOutCacheLoc, EAGER, "wrote_input",
            "replaced the batch's out_cache_loc with another tensor"),
    Hostile("deletes-positions", _DeletesPositions, EAGER, "wrote_input",
            "replaced the batch's positions with nothing"),
    Hostile("writes-prefix-lens-in-draft-step-1", _WritesPrefixLensInDraftStep1, DRAFT, "wrote_input",
            "By the end of forward 1 (draft), draft step 1, the subject had written into extend_prefix_lens"),
    Hostile("writes-out-cache-loc-in-a-thread", _ZeroesOutCacheLocAtLastLayer, OVERLAP, "wrote_input",
            "written into out_cache_loc", {"threads": True}),
    Hostile("wipes-mapping-through-numpy", _WipesMappingThroughNumpy, EAGER, "wrote_input",
            "By forward 1 (decode), layer 1, the subject had written into the target model's mapping (rows 1-2)"),
    Hostile("wipes-a-large-mapping-through-numpy", _WipesMappingThroughNumpy, LARGE_POOL, "wrote_input",
            "By forward 1 (decode), layer 1, the subject had written into the target model's mapping (rows 1-"),
    Hostile("wipes-a-large-mapping-through-data", _WipesMappingThroughData, LARGE_POOL, "wrote_input",
            "By forward 1 (decode), layer 1, the subject had written into the target model's mapping (rows 1-"),
    Hostile("wipes-a-small-mapping-through-data", _WipesMappingThroughData, EAGER, "wrote_input",
            "By forward 1 (decode), layer 1, the subject had written into the target model's mapping (rows 1-2)"),
    Hostile("writes-an-earlier-mapping", _WritesTheMappingItWasFirstHanded, REREGISTERED, "wrote_input",
            "the subject had written into the target model's earlier mapping (rows 0-1)"),
    Hostile("writes-an-earlier-mapping-through-numpy", _WritesTheMappingItWasFirstHandedThroughNumpy, REREGISTERED,
            "wrote_input", "the subject had written into the target model's earlier mapping (rows 0-1)"),
    Hostile("resizes-mapping-at-capture", _ResizesMappingAtCapture, GRAPH, "wrote_input",
            "the subject had resized the target model's mapping from shape"),
    Hostile("drops-positions-in-capture", _DropsPositionsInCapture, GRAPH, "wrote_input",
            "By the graph capture for forward 1 (decode), the subject had replaced the batch's positions with None"),
    Hostile("writes-static-locations-at-replay", _WritesStaticLocationsAtReplay, GRAPH, "wrote_input",
            "By the end of forward 1 (decode), the subject had written into out_cache_loc (row 0)"),
    Hostile("captures-a-write-into-positions", _CapturesAWriteIntoPositions, GRAPH, "wrote_input",
            "By the graph capture for forward 1 (decode), the subject had written into positions (rows 0-3)"),
    # answers are read only through what a hostile tensor cannot subvert
    Hostile("subclass-whose-operations-raise", _ReturnsBooby, EAGER, "non_tensor",
            "swa_write_location returned a _Booby (a tensor subclass), not a torch.Tensor."),
    Hostile("subclass-in-a-thread", _ReturnsBooby, OVERLAP, "non_tensor", "(a tensor subclass)", {"threads": True}),
    Hostile("subclass-in-capture", _ReturnsBooby, GRAPH, "non_tensor", "(a tensor subclass)"),
    Hostile("fake-tensor", _ReturnsFake, EAGER, "non_tensor", "returned a FakeTensor (a tensor subclass)"),
    Hostile("tera-rows-through-stride-0",
            _returns(lambda: torch.zeros(1, dtype=torch.int32).expand(_TERA_ROWS), "TeraRows"), EAGER,
            "wrong_length", f"swa_write_location returned shape ({_TERA_ROWS},) for 2 rows."),
    Hostile("tera-rows-in-a-thread",
            _returns(lambda: torch.zeros(1, dtype=torch.int32).expand(_TERA_ROWS), "TeraRows"), OVERLAP,
            "wrong_length", f"returned shape ({_TERA_ROWS},) for 1 rows.", {"threads": True}),
    Hostile("tera-cells-in-two-dimensions",
            _returns(lambda: torch.zeros(1, 1, dtype=torch.int32).expand(2**20, 2**20), "TeraCells"), EAGER,
            "wrong_length", "returned shape (1048576, 1048576) for 2 rows."),
    Hostile("three-million-rows", _returns(lambda: torch.arange(3_000_000, dtype=torch.int32), "Millions"), EAGER,
            "wrong_length", "returned shape (3000000,) for 2 rows."),
    Hostile("tera-rows-of-nan",
            _returns(lambda: torch.full((1,), float("nan")).expand(_TERA_ROWS), "TeraNaN"), EAGER,
            "wrong_dtype", "swa_write_location returned torch.float32, not torch.int32."),
    Hostile("float-only-in-capture", _FloatOnlyInCapture, GRAPH, "wrong_dtype",
            "At forward 1 (decode), layer 0, swa_write_location returned torch.float32, not torch.int32."),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_a_hostile_subject_is_a_divergence_of_its_kind_that_a_replay_file_keeps(case, tmp_path):
    result = run_scenario(case.subject, case.scenario, timeout_s=5.0, **case.options)
    d = result.divergence
    assert d is not None, f"{case.name} passed"
    assert (d.kind, case.says in d.sentence) == (case.kind, True), d.sentence
    assert d.sentence.isprintable() and len(d.sentence) < 2 * guard.MAX_MESSAGE_CHARS
    assert len(d.detail) < guard.MAX_DETAIL_CHARS + 200
    assert all(len(values or ()) <= MAX_STORED_VALUES for values in (d.actual, d.expected))
    kept = load_replay(write_replay(Replay("module:Hostile", "hand-written", case.scenario, d), tmp_path))
    assert kept.divergence == d


# ---- subjects that must stay clean ---------------------------------------------------------


CORRECT = ["uncached", "uncached-ring", "step-keyed-capture", "step-keyed-capture-ring"]


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_builtin_passes_every_hand_written_scenario_with_its_inputs_untouched(name):
    subject = resolve_subject(name).subject
    for label, scenario in {**EXAMPLES, "eager": EAGER, "graph": GRAPH}.items():
        result = run_scenario(subject, scenario)
        assert result.passed, (label, result.divergence.sentence)


@pytest.mark.parametrize("name", CORRECT)
@pytest.mark.parametrize("profile", ["realistic", "adversarial"])
def test_a_correct_builtin_stays_clean_when_fuzzed(name, profile):
    result = fuzz(resolve_subject(name), profile=profile, settings="ci", seed=3, max_examples=15)
    assert result.divergence is None, result.divergence.sentence
    assert result.checks > 0


def _lowest_recursion_limit() -> None:
    """Sets the lowest recursion limit Python accepts where it is called from."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    while True:
        try:
            sys.setrecursionlimit(depth)
            return
        except RecursionError:
            depth += 1


class _LowersRecursionLimit(Uncached):
    """Lowers the limit as far as it goes after its answer at the stage's last layer: what
    the harness does after the forward runs under that limit unless it restores it."""

    def swa_write_location(self, batch, layer_id):
        rows = self.answer(batch, layer_id)
        if self.lowers(layer_id):
            _lowest_recursion_limit()
        return rows

    def answer(self, batch, layer_id):
        return super().swa_write_location(batch, layer_id)

    def lowers(self, layer_id):
        return layer_id == self.spec.end_layer - 1


class _LowersRecursionLimitAndErrs(_LowersRecursionLimit):
    """Every answer is wrong, given under the lowest limit: the diagnosis runs after it."""

    def answer(self, batch, layer_id):
        return super().answer(batch, layer_id) + 1

    def lowers(self, layer_id):
        return True


@pytest.mark.parametrize("scenario", [EAGER, GRAPH, DRAFT], ids=["eager", "graph", "draft"])
def test_a_subject_lowering_the_recursion_limit_is_judged_by_its_answers_alone(scenario):
    limit = sys.getrecursionlimit()
    assert run_scenario(_LowersRecursionLimit, scenario).passed
    d = run_scenario(_LowersRecursionLimitAndErrs, scenario).divergence
    assert d is not None and d.kind == "wrong_rows" and "at forward 1 (" in d.sentence.lower(), d
    assert sys.getrecursionlimit() == limit


# ---- what a subject leaves of torch's state ---------------------------------------------------


_LEFT_BEHIND: list[Callable[[], None]] = []  # how the test undoes what a subject left


def _entered(context: Any) -> None:
    context.__enter__()
    _LEFT_BEHIND.append(lambda: context.__exit__(None, None, None))


def _set(setter: Callable[[Any], None], getter: Callable[[], Any], value: Any) -> None:
    before = getter()
    setter(value)
    _LEFT_BEHIND.append(lambda: setter(before))


class _EqualFunctionMode(torch.overrides.TorchFunctionMode):
    """Finds every two tensors equal."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.Tensor.equal):
            return True
        return func(*args, **(kwargs or {}))


class _EqualDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.equal.default:
            return True
        return func(*args, **(kwargs or {}))


LEFT_BEHIND = {
    "inference-mode": lambda: _entered(torch.inference_mode()),
    "no-grad": lambda: _entered(torch.no_grad()),
    "function-mode-finding-all-equal": lambda: _entered(_EqualFunctionMode()),
    "dispatch-mode-finding-all-equal": lambda: _entered(_EqualDispatchMode()),
    "default-device-meta": lambda: _entered(torch.device("meta")),
    "default-dtype": lambda: _set(torch.set_default_dtype, torch.get_default_dtype, torch.float64),
    "deterministic-algorithms": lambda: _set(torch.use_deterministic_algorithms,
                                             torch.are_deterministic_algorithms_enabled, True),
    "threads": lambda: _set(torch.set_num_threads, torch.get_num_threads, 3),
}


def _torch_state() -> tuple:
    return (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(), torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
            torch.get_num_threads())


@pytest.fixture
def torch_state_undone():
    """Undoes what a subject left of torch's state, whatever the harness did about it."""
    before = _torch_state()
    yield before
    while _LEFT_BEHIND:
        try:
            _LEFT_BEHIND.pop()()
        except Exception:  # noqa: BLE001 - a mode the harness popped already
            pass
    while torch._C._len_torch_function_stack() > before[0]:
        torch._C._pop_torch_function_stack()
    while torch._C._len_torch_dispatch_stack() > before[1]:
        torch._C._pop_torch_dispatch_stack(None)


def _leaves(name: str, hook: str, wrong: bool = False) -> type[Subject]:
    """Right (or one row off, ``wrong``) everywhere; ``hook`` leaves ``name`` behind at its first call."""

    def hooked(self, *args):
        result = getattr(Uncached, hook)(self, *args)
        if not self.__dict__.get("left"):
            self.left = True
            LEFT_BEHIND[name]()
        return result + 1 if wrong and hook == "swa_write_location" else result

    def answer(self, batch, layer_id):
        return Uncached.swa_write_location(self, batch, layer_id) + (1 if wrong else 0)

    return type(f"Leaves_{name}", (Uncached,), {"swa_write_location": answer, hook: hooked})


@pytest.mark.parametrize("hook", ["register_mapping", "init_forward_metadata", "swa_write_location"])
@pytest.mark.parametrize("name", LEFT_BEHIND)
def test_what_a_subject_leaves_of_torchs_state_changes_neither_its_verdict_nor_the_callers_state(
        name, hook, torch_state_undone):
    right = run_scenario(_leaves(name, hook), EAGER)
    assert right.passed, right.divergence.sentence
    assert _torch_state() == torch_state_undone
    d = run_scenario(_leaves(name, hook, wrong=True), EAGER).divergence
    assert d is not None and d.kind == "wrong_rows", d
    assert _torch_state() == torch_state_undone


@pytest.mark.parametrize("name", LEFT_BEHIND)
def test_what_a_subject_leaves_of_torchs_state_in_graph_capture_changes_no_verdict(name, torch_state_undone):
    assert run_scenario(_leaves(name, "init_capture_metadata"), GRAPH).passed
    d = run_scenario(_leaves(name, "init_capture_metadata", wrong=True), GRAPH).divergence
    assert d is not None and d.kind == "wrong_rows", d
    assert _torch_state() == torch_state_undone


def test_what_a_subject_module_leaves_of_torchs_state_as_it_is_imported_is_undone(
        tmp_path, monkeypatch, torch_state_undone):
    (tmp_path / "leaves_on_import.py").write_text(textwrap.dedent("""
        import torch

        from swafuzz.subjects.builtin import Uncached

        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.device("meta").__enter__()


        class Subject(Uncached):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    _LEFT_BEHIND.extend([lambda: torch.set_default_dtype(torch_state_undone[4]),
                         lambda: torch.set_grad_enabled(torch_state_undone[2])])
    info = resolve_subject("leaves_on_import:Subject")
    assert _torch_state() == torch_state_undone
    assert run_scenario(info.subject, EAGER).passed


# ---- a real interrupt still interrupts -------------------------------------------------------


class _SignalsItself(Uncached):
    """Sends itself a signal while it runs, as a person pressing Ctrl-C would."""

    signum = signal.SIGINT

    def swa_write_location(self, batch, layer_id):
        os.kill(os.getpid(), self.signum)
        time.sleep(5)  # bounded: the signal lands before it ends
        return super().swa_write_location(batch, layer_id)


class _TermsItself(_SignalsItself):
    signum = signal.SIGTERM


def test_a_sigint_during_a_subject_call_interrupts_the_run():
    with pytest.raises(KeyboardInterrupt):
        run_scenario(_SignalsItself, EAGER)


@pytest.mark.parametrize("subject", [_SignalsItself, _TermsItself], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_subject_call_interrupts_a_watched_run(subject):
    with campaign.InterruptWatch() as watch, pytest.raises(KeyboardInterrupt):
        run_scenario(subject, EAGER)
    assert watch.signum == subject.signum


# ---- a subject that is hostile before it runs ------------------------------------------------


def _swafuzz_fuzz(tmp_path, module: str, source: str, attr: str = "Subject") -> subprocess.CompletedProcess:
    """``swafuzz fuzz --subject module:attr`` as a user runs it, ``module`` written from ``source``."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "swafuzz", "fuzz", "--subject", f"{module}:{attr}", "--settings",
                           "ci", "--max-examples", "2", "--report-dir", "reports"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


_META = """
    from swafuzz.subjects.builtin import Uncached


    class RaisesOn(type(Uncached)):
        names = ()  # the attributes whose reading raises (empty: every one)

        def __getattribute__(cls, name):
            names = type.__getattribute__(cls, "names")
            if not names or name in names:
                raise {exc}(name)
            return super().__getattribute__(name)


    class Subject(Uncached, metaclass=RaisesOn):
        names = {names!r}
"""


@pytest.mark.parametrize("source, raised", [
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise GeneratorExit('done')", "GeneratorExit: done"),
    ("class Mine(BaseException):\n    pass\n\nraise Mine('its own')", "Mine: its own"),
    ("class Shouting(Exception):\n    def __str__(self):\n        raise KeyboardInterrupt\n\nraise Shouting()",
     "Shouting (its message could not be read: str() raised KeyboardInterrupt)"),
    ("""
     from swafuzz.subjects.builtin import Uncached


     class Base(Uncached):
         def __init_subclass__(cls, **options):
             raise KeyboardInterrupt


     class Subject(Base):
         pass
     """, "KeyboardInterrupt"),
    ("""
     from swafuzz.subjects.builtin import Uncached


     class Generic(Uncached):
         def __class_getitem__(cls, item):
             raise RuntimeError(f"no {item}")


     Subject = Generic[int]
     """, "RuntimeError: no <class 'int'>"),
    ("def __getattr__(name):\n    raise KeyboardInterrupt", "KeyboardInterrupt"),
    (_META.format(exc="RuntimeError", names=()), "RuntimeError: __class__"),
    (_META.format(exc="KeyboardInterrupt", names=("truth",)), "KeyboardInterrupt: truth"),
    (_META.format(exc="RuntimeError", names=("__name__",)), "RuntimeError: __name__"),
    (_META.format(exc="RuntimeError", names=("requires",)), "RuntimeError: requires"),
    (_META.format(exc="RuntimeError", names=("__doc__",)), "RuntimeError: __doc__"),
    ("""
     class Unshowable:
         def __repr__(self):
             raise KeyboardInterrupt


     Subject = Unshowable()
     """, "Unshowable"),
    ("""
     from swafuzz.subjects.builtin import Uncached


     class Generic(Uncached):
         def __class_getitem__(cls, item):
             return Generic.Booby()

         class Booby:
             def __getattribute__(self, name):
                 raise KeyboardInterrupt(name)


     Subject = Generic[int]
     """, "KeyboardInterrupt"),
], ids=["keyboard-interrupt-at-import", "generator-exit-at-import", "base-exception-of-its-own-at-import",
        "message-raises-keyboard-interrupt", "init-subclass-raises", "class-getitem-raises",
        "module-getattr-raises", "metaclass-raises-on-every-attribute", "metaclass-interrupts-on-truth",
        "metaclass-raises-on-its-name", "metaclass-raises-on-requires", "metaclass-raises-on-its-docstring",
        "repr-interrupts", "class-getitem-returns-what-interrupts-on-reading"])
def test_a_subject_that_raises_as_it_is_loaded_exits_2_with_one_line_naming_it_and_what_it_raised(
        tmp_path, source, raised):
    done = _swafuzz_fuzz(tmp_path, "loads_badly", source)
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert "loads_badly:Subject" in done.stderr and raised in done.stderr, done.stderr


def test_a_sigint_while_the_subject_module_is_imported_interrupts_the_run(tmp_path):
    done = _swafuzz_fuzz(tmp_path, "interrupted_import", """
        import os, signal, time

        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)  # bounded: the signal lands before it ends
    """)
    assert done.returncode == 130, done.stderr
    assert "interrupted by SIGINT" in done.stderr
