"""Which engine features a tree's DeepSeek-V4 reaches, read from the tree itself.

The realistic profile draws lifecycle features an engine may take (two micro-batches, a
pipeline stage, graph replays, ...); a given release's DeepSeek-V4 takes only some of them.
Each reading here looks at the release's own files, as :mod:`.callsites` does for the forward
modes of a target's call sites, and names the restriction terms
(:data:`swafuzz.strategies.features.RESTRICTION_TERMS`) the tree never takes under the run's
switches; the realistic profile of an SGLang subject then draws none of them
(:mod:`.configure`), and a divergence that needs one is not realistic.

Conditions are read as :mod:`.callsites` reads them (forward-mode predicates evaluated from the
tree's ``ForwardMode``, the run's switches, anything else either way), with two additions: a
``self.method(...)`` whose body returns a condition is read through, and
``global_forward_mode`` is a forward mode like ``forward_mode``. A reading the tree does not
allow (a file, class or function that is not there, a shape not recognised) is
*unconfirmed*, says why, and excludes nothing: the feature is drawn as before.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass

from ...api import ForwardMode
from ...errors import Unreadable
from ...reference import GRAPH_MODES as SCENARIO_GRAPH_MODES
from ...strategies.features import (
    DRAFT_EXTEND, DRAFT_MODEL, DRAFT_MULTISTEP, FIRST_SWA_LAYER_NOT_START, GRAPH_REPLAY, IDLE, MICRO_BATCHES,
    NON_SWA_LAYERS, PIPELINE_STAGE, in_mode, together,
)
from . import callsites
from .locate import SourceTree
from .switches import REQUEST_WINDOW_SWITCH, SwitchSettings

PACKAGE = callsites.PACKAGE
MODEL_FILE = callsites.MODEL_FILE
DRAFT_MODEL_FILE = "sglang/srt/models/deepseek_v4_nextn.py"
BACKEND_FILE = "sglang/srt/layers/attention/deepseek_v4_backend.py"
MODEL_CLASS = "DeepseekV4Model"
BACKEND_CLASS = "DeepseekV4AttnBackend"
BUCKET_CLASS = "_GraphBucket"
# where the backend keeps the metadata captured per bucket and batch size
CAPTURED_BUCKETS = "cuda_graph_metadata_of_bucket_and_bs"
# the graph runners that prepare a replay (before 0.5.14: the one runner file)
RUNNER_FILES = ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
                "sglang/srt/model_executor/cuda_graph_runner.py")
RAW_METADATA = "Raw"  # in the class a builder returns when the graph rebuilds the metadata
# the micro-batch split of two-batch overlap: the model's method that runs the layers on it
MICRO_BATCH_SPLIT = "tbo_children"
# a condition that holds only on a single pipeline stage
SINGLE_STAGE = re.compile(r"pp_group\.world_size == 1$")
# a prep branch of a bucket taken by the DSpark draft worker only, and how it is keyed here
DSPARK_DRAFT_TEST = "is_dspark_draft"
DSPARK_BRANCH = "+dspark"
# the modes the lifecycle replays graphs in (SGLang runs a DSpark draft block as a target-verify forward)
GRAPH_MODES = tuple(ForwardMode(mode) for mode in SCENARIO_GRAPH_MODES)
# the server's check of what DeepSeek-V4.1 (the model of the request window) supports
V41_VALIDATION_FILE = "sglang/srt/arg_groups/deepseek_v4_hook.py"
V41_VALIDATION = "validate_deepseek_v41_features"
# what a refused feature's condition tests, and the terms it takes from the profile: the
# engine model's draft is DeepSeek-V4's MTP draft, which "speculative decoding other than
# DSpark" refuses
V41_REFUSALS = (
    (("speculative_algorithm", "DSPARK"), frozenset({DRAFT_MODEL, DRAFT_EXTEND, DRAFT_MULTISTEP})),
    (("enable_two_batch_overlap",), frozenset({MICRO_BATCHES})),
    (("pp_size",), frozenset({PIPELINE_STAGE})),
)


@dataclass(frozen=True)
class FeatureReading:
    """What a tree says of one engine feature the realistic profile draws."""

    feature: str  # as the profile names it
    unreached: frozenset[str]  # the restriction terms the tree never takes
    where: str  # what was read: file:function line N, relative to sglang/srt/
    says: str  # the reading, in a sentence
    unconfirmed: str | None = None  # why the tree could not be read so (nothing is excluded)

    def describe(self) -> str:
        if self.unconfirmed is not None:
            return f"{self.feature}: unconfirmed ({self.unconfirmed}); drawn anyway"
        return f"{self.feature}: {self.says} ({self.where})"


# what a reading finds: the terms the tree never takes, where it read, and what it says
Found = tuple[frozenset[str], str, str]


def _unconfirmed(feature: str, why: str) -> FeatureReading:
    return FeatureReading(feature, frozenset(), "", "", unconfirmed=why)


@functools.lru_cache(maxsize=32)  # every target of a tree asks under the same switches
def read(tree: SourceTree, switches: SwitchSettings) -> tuple[FeatureReading, ...]:
    """Every engine feature's reading in ``tree`` under ``switches``."""
    try:
        reader = _Reader(tree, switches)
    except Unreadable as exc:
        reason = str(exc)
        return tuple(_unconfirmed(feature, reason) for feature in FEATURES)
    readings = []
    for feature, reading in FEATURES.items():
        try:
            unreached_terms, where, says = reading(reader)
        except Unreadable as exc:
            readings.append(_unconfirmed(feature, str(exc)))
            continue
        readings.append(FeatureReading(feature, frozenset(unreached_terms), where, says))
    return tuple(readings)


def unreached(tree: SourceTree, switches: SwitchSettings) -> frozenset[str]:
    """The restriction terms ``tree`` never takes under ``switches``."""
    return frozenset().union(*(reading.unreached for reading in read(tree, switches)))


# ---- reading conditions ----------------------------------------------------------------------


class _Context(callsites._Context):
    def _is_forward_mode(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "global_forward_mode":
            return True
        if isinstance(node, ast.Name) and node.id == "forward_mode" and _parameter(self.function, node.id):
            return True
        return super()._is_forward_mode(node)

    def _call(self, node: ast.Call) -> callsites.Formula:
        func = node.func
        if isinstance(func, ast.Attribute) and callsites._is_self(func.value) and self.depth < callsites.MAX_DEPTH:
            method = _sibling(self.function, func.attr)
            if method is not None:
                inner = type(self)(self.reader, self.path, self.module, method, method.end_lineno or 0,
                                   self.depth + 1)
                returned = inner._returns(_returning(method.body))
                if returned is not None:
                    return returned
        return super()._call(node)


class _Reader(callsites._Reader):
    context = _Context

    def module(self, path: str) -> ast.Module:
        module = self._module(path)
        if module is None:
            raise Unreadable(f"the tree has no {path.removeprefix(PACKAGE)}")
        return module

    def modes_where(self, condition: callsites.Formula, also: dict[str, bool] | None = None) -> frozenset[ForwardMode]:
        """The modes in which ``condition`` can hold, with the unknowns whose text matches a
        key of ``also`` (a regular expression) fixed to its value."""
        fixed_unknowns = {atom: value for atom in callsites._atoms(condition) if atom.kind == "unknown"
                          for pattern, value in (also or {}).items() if re.search(pattern, atom.key)}
        reached = set()
        for mode in callsites.MODEL_MODES:  # every reading here is of DeepSeek-V4's own code
            fixed = {atom: self._mode_value(mode, atom) for atom in callsites._atoms(condition) if atom.kind == "mode"}
            if callsites._satisfiable(callsites._assign(condition, {**fixed, **fixed_unknowns})):
                reached.add(mode)
        return frozenset(reached)


def _parameter(function: ast.FunctionDef, name: str) -> bool:
    arguments = function.args
    return name in {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}


def _sibling(function: ast.FunctionDef, name: str) -> ast.FunctionDef | None:
    """The method ``name`` of the class ``function`` is a method of."""
    owner = function.parent
    return _defined(owner, name) if isinstance(owner, ast.ClassDef) else None


def _defined(owner: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((node for node in owner.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _returning(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that decide what it returns: imports, assignments (read
    where their names are used) and ``if`` blocks that return nothing left out."""
    kept = []
    for statement in callsites._without_docstring(body):
        if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            continue
        if isinstance(statement, ast.If) and not any(isinstance(n, ast.Return) for n in ast.walk(statement)):
            continue
        kept.append(statement)
    return kept


def _class(module: ast.Module, name: str, path: str) -> ast.ClassDef:
    found = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if found is None:
        raise Unreadable(f"{path.removeprefix(PACKAGE)} defines no {name}")
    return found


def _method(owner: ast.ClassDef, name: str, path: str) -> ast.FunctionDef:
    found = _defined(owner, name)
    if found is None:
        raise Unreadable(f"{path.removeprefix(PACKAGE)} defines no {owner.name}.{name}")
    return found


def _where(path: str, function: ast.FunctionDef, line: int) -> str:
    return f"{path.removeprefix(PACKAGE)}:{callsites._qualname(function)} line {line}"


def _mode_names(modes) -> str:
    return ", ".join(mode.value for mode in ForwardMode if mode in modes) or "no forward mode"


# ---- the readings ----------------------------------------------------------------------------


def _two_batch_overlap(reader: _Reader) -> Found:
    """The model runs its layers on two micro-batches where one of its methods calls another
    that runs them on the split batch (``tbo_children``); the conditions around that call (and
    the modes in which the model reaches the calling method) say in which modes, and whether
    on a pipeline stage."""
    module = reader.module(MODEL_FILE)
    model = _class(module, MODEL_CLASS, MODEL_FILE)
    forward = _method(model, "forward", MODEL_FILE)
    methods = [node for node in model.body if isinstance(node, ast.FunctionDef)]
    splitting = {node.name for node in methods if node.name != "forward" and MICRO_BATCH_SPLIT in ast.unparse(node)}
    calls = [(method, call) for method in methods if method.name not in splitting for call in ast.walk(method)
             if isinstance(call, ast.Call) and callsites._is_self_call(call) and call.func.attr in splitting
             and isinstance(call.parent, (ast.Assign, ast.Expr))]
    if not calls:
        return (
            frozenset({MICRO_BATCHES}), _where(MODEL_FILE, forward, forward.lineno),
            f"no method of {MODEL_CLASS} runs its layers on a split batch: no two-batch overlap")
    sites, modes, staged = [], frozenset(), frozenset()
    for method, call in calls:
        guards, condition = reader._condition(MODEL_FILE, module, method, call)
        reached = reader._reached(MODEL_FILE, module, method, 0)
        modes |= reader.modes_where(condition) & reached
        staged |= reader.modes_where(condition, {SINGLE_STAGE.pattern: False}) & reached
        when = f" when {' and '.join(f'`{g}`' for g in guards)}" if guards else ""
        sites.append(f"{_where(MODEL_FILE, method, call.lineno)} calls {call.func.attr}{when}")
    terms = {in_mode(MICRO_BATCHES, mode.value) for mode in callsites.MODEL_MODES if mode not in modes}
    if not staged:
        terms.add(together(MICRO_BATCHES, PIPELINE_STAGE))
    if not modes:
        terms = {MICRO_BATCHES}
    says = (f"two-batch overlap in {_mode_names(modes)} forwards"
            + ("" if staged else ", on a single pipeline stage only"))
    return frozenset(terms), "; ".join(sites), says


def _layer_construction(reader: _Reader) -> tuple[ast.FunctionDef, ast.Assign, ast.Call]:
    """The statement of the model's ``__init__`` that builds the stage's layers and its
    ``start_layer``."""
    model = _class(reader.module(MODEL_FILE), MODEL_CLASS, MODEL_FILE)
    init = _method(model, "__init__", MODEL_FILE)
    for node in ast.walk(init):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and any("self.start_layer" in ast.unparse(target) for target in node.targets)):
            return init, node, node.value
    raise Unreadable(f"{MODEL_CLASS}.__init__ in {MODEL_FILE.removeprefix(PACKAGE)} builds no start_layer from a call")


def _pipeline_stage(reader: _Reader) -> Found:
    """A stage's layers come from a pipeline rank where the call that builds them is told
    the rank, or is the pipeline variant of the builder."""
    init, statement, call = _layer_construction(reader)
    builder = ast.unparse(call.func)
    ranked = any(keyword.arg in ("pp_rank", "pp_size") for keyword in call.keywords) or "pp" in builder.split("_")
    where = _where(MODEL_FILE, init, statement.lineno)
    if ranked:
        return (frozenset(), where,
                f"{builder} builds the layers of this pipeline rank, from its start_layer")
    raise Unreadable(f"{where}: {builder} is told no pipeline rank; whether a stage starts past layer 0 "
                     "is not read further")


def _layers_without_swa_stores(reader: _Reader) -> Found:
    """Every layer of a stage stores SWA keys where the layer builder's factory builds one
    class for every index (no layer of another kind)."""
    init, statement, call = _layer_construction(reader)
    factory = next((arg for arg in call.args if isinstance(arg, ast.Lambda)), None)
    where = _where(MODEL_FILE, init, statement.lineno)
    if factory is None or not isinstance(factory.body, ast.Call):
        raise Unreadable(f"{where}: the layer factory is not one class built for every index")
    built = ast.unparse(factory.body.func)
    return (
        frozenset({NON_SWA_LAYERS, FIRST_SWA_LAYER_NOT_START}), where,
        f"every layer index builds {built}, so every layer of a stage stores SWA keys as the first does")


def _graph_replay(reader: _Reader) -> Found:
    """The backend keeps captured metadata per graph bucket; ``_GraphBucket.of`` says which
    forward modes have one (its ``if`` tests), and a mode with none replays no graph."""
    module = reader.module(BACKEND_FILE)
    of = _method(_class(module, BUCKET_CLASS, BACKEND_FILE), "of", BACKEND_FILE)
    context = _Context(reader, BACKEND_FILE, module, of, of.end_lineno or 0)
    tests = [node.test for node in of.body if isinstance(node, ast.If) and callsites._leaves(node.body)]
    if not tests:
        raise Unreadable(f"{BUCKET_CLASS}.of in {BACKEND_FILE.removeprefix(PACKAGE)} tests no forward mode")
    condition: callsites.Formula = False
    for test in tests:
        condition = callsites._or(condition, context.formula(test))
    modes = _with_draft_blocks(reader.modes_where(condition)) & frozenset(GRAPH_MODES)
    terms = frozenset(in_mode(GRAPH_REPLAY, mode.value) for mode in GRAPH_MODES if mode not in modes)
    return (terms, _where(BACKEND_FILE, of, of.lineno),
            f"a graph bucket for {_mode_names(modes)} forwards"
            + ("" if modes else ": no graph replay where the profile replays graphs"))


def _with_draft_blocks(modes: frozenset[ForwardMode]) -> frozenset[ForwardMode]:
    """``modes`` with DSpark draft blocks where target-verify is among them: the DSpark draft
    worker runs a block as a target-verify forward of its model, on the same backend."""
    return modes | {ForwardMode.DRAFT_BLOCK} if ForwardMode.TARGET_VERIFY in modes else modes


def _metadata_merge(reader: _Reader) -> Found:
    """Before a graph replay the runner calls the backend's replay prep, which builds the
    replayed bucket's metadata outside the graph (one branch per bucket) and hands it to the
    method that ``copy_``s it into the metadata captured for that bucket. A mode the profile
    replays merges there where the prep has a branch for its bucket (``_GraphBucket.of``);
    what the branch's builder returns under the run's switches says whether that is the
    metadata itself or the raw inputs (``DSV4Raw...``) the graph rebuilds it from. A mode
    whose bucket has no branch replays nothing: the prep has nothing to merge for it."""
    module = reader.module(BACKEND_FILE)
    backend = _class(module, BACKEND_CLASS, BACKEND_FILE)
    methods = {node.name: node for node in backend.body if isinstance(node, ast.FunctionDef)}
    merges = {name for name, method in methods.items()
              if CAPTURED_BUCKETS in ast.unparse(method) and _calls_named(method, "copy_")}
    preps = [method for method in methods.values()
             if any(_is_bucket_of(call) for call in _calls(method)) and _calls_named(method, *merges)]
    if not preps:
        raise Unreadable(f"no method of {BACKEND_CLASS} in {BACKEND_FILE.removeprefix(PACKAGE)} takes a "
                         f"{BUCKET_CLASS} and merges into {CAPTURED_BUCKETS}")
    prep = preps[0]
    builders = _bucket_builders(prep)
    built = {target for target, _, _ in builders.values()}
    # the merge every bucket's branch leads to: a call in the prep's own body (a branch may
    # merge its own way and return, as 0.5.23's early verify metadata does)
    merge_call = next((statement.value for statement in prep.body
                       if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                       and isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr in merges
                       and any(isinstance(node, ast.Name) and node.id in built for node in ast.walk(statement))), None)
    if merge_call is None:
        raise Unreadable(f"{BACKEND_CLASS}.{prep.name} in {BACKEND_FILE.removeprefix(PACKAGE)} merges none of the "
                         "metadata its bucket branches build")
    merge = methods[merge_call.func.attr]
    copy = _calls_named(merge, "copy_")[0]
    sites = [_where(BACKEND_FILE, prep, merge_call.lineno), _where(BACKEND_FILE, merge, copy.lineno),
             _replay_caller(reader, prep.name)]
    by_bucket: dict[str | None, list[ForwardMode]] = {}
    buckets = _buckets_of_modes(reader, module)
    for mode in GRAPH_MODES:
        bucket = buckets.get(mode)
        if mode in callsites.DSPARK_MODES and f"{bucket}{DSPARK_BRANCH}" in builders:
            bucket += DSPARK_BRANCH
        by_bucket.setdefault(bucket, []).append(mode)
    terms, said = set(), []
    for bucket, modes in by_bucket.items():
        names = " and ".join(mode.value for mode in modes)
        if bucket not in builders:
            terms |= {in_mode(GRAPH_REPLAY, mode.value) for mode in modes}
            said.append(f"{names}: no branch of {prep.name} builds {'its' if len(modes) == 1 else 'their'} "
                        "bucket, so no graph replays there")
            continue
        _, builder, line = builders[bucket]
        kinds, returned = _built(reader, module, methods.get(builder), builder)
        sites += [_where(BACKEND_FILE, prep, line), returned]
        said.append(f"{names} replays: {builder} builds the {bucket.removesuffix(DSPARK_BRANCH)} bucket's "
                    f"metadata{' for the DSpark draft' if bucket.endswith(DSPARK_BRANCH) else ''} outside the graph "
                    f"({kinds}) and {merge.name} merges it with copy_ into the captured metadata")
    return frozenset(terms), "; ".join(dict.fromkeys(sites)), "; ".join(said)


def _calls(node: ast.AST) -> list[ast.Call]:
    return [call for call in ast.walk(node) if isinstance(call, ast.Call)]


def _calls_named(node: ast.AST, *names: str) -> list[ast.Call]:
    """The calls ``X.name(...)`` in ``node`` of any of ``names``, in source order."""
    found = [call for call in _calls(node) if isinstance(call.func, ast.Attribute) and call.func.attr in names]
    return sorted(found, key=lambda call: (call.lineno, call.col_offset))


def _is_bucket_of(call: ast.Call) -> bool:
    return ast.unparse(call.func) == f"{BUCKET_CLASS}.of"


def _replay_caller(reader: _Reader, name: str) -> str:
    """Where a graph runner calls the prep ``name`` before a replay (a call not marked
    ``in_capture``)."""
    for path in RUNNER_FILES:
        module = reader._module(path)
        for call in _calls_named(module, name) if module is not None else ():
            if any(keyword.arg == "in_capture" for keyword in call.keywords):
                continue
            function = callsites._enclosing_function(call)
            return (_where(path, function, call.lineno) if function is not None
                    else f"{path.removeprefix(PACKAGE)} line {call.lineno}")
    raise Unreadable(f"no graph runner ({', '.join(p.removeprefix(PACKAGE) for p in RUNNER_FILES)}) calls "
                     f"{name} before a replay")


def _bucket_builders(prep: ast.FunctionDef) -> dict[str, tuple[str, str, int]]:
    """Per bucket the prep has a branch for (``if bucket == _GraphBucket.NAME``, without
    further tests; the first such branch that builds), the name that branch last assigns a
    ``self`` method's result to (what it hands on; earlier calls work out its inputs), that
    method, and the line."""
    found: dict[str, tuple[str, str, int]] = {}
    for node in ast.walk(prep):
        test = node.test if isinstance(node, ast.If) else None
        suffix = ""
        if (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and len(test.values) == 2
                and DSPARK_DRAFT_TEST in ast.unparse(test.values[1])):
            # the DSpark draft worker's own branch of its bucket (0.5.22+)
            test, suffix = test.values[0], DSPARK_BRANCH
        if not (isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq)
                and ast.unparse(test.comparators[0]).startswith(f"{BUCKET_CLASS}.")):
            continue
        built = [(statement.targets[0].id, statement.value.func.attr, statement.lineno) for statement in node.body
                 if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                 and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call)
                 and callsites._is_self_call(statement.value)]
        if built:
            bucket = ast.unparse(test.comparators[0]).removeprefix(f"{BUCKET_CLASS}.").lower()
            found.setdefault(bucket + suffix, built[-1])
    return found


def _buckets_of_modes(reader: _Reader, module: ast.Module) -> dict[ForwardMode, str]:
    """The bucket ``_GraphBucket.of`` returns for each forward mode (its ``if`` tests in
    order, as :func:`_graph_replay` reads them)."""
    of = _method(_class(module, BUCKET_CLASS, BACKEND_FILE), "of", BACKEND_FILE)
    buckets: dict[ForwardMode, str] = {}
    for node in ast.walk(of):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
            _, condition = reader._condition(BACKEND_FILE, module, of, node)
            for mode in _with_draft_blocks(reader.modes_where(condition)):
                buckets.setdefault(mode, node.value.attr.lower())
    return buckets


def _built(reader: _Reader, module: ast.Module, builder: ast.FunctionDef | None, name: str) -> tuple[str, str]:
    """What ``builder`` returns under the run's switches (the metadata, the raw inputs the
    graph rebuilds it from, or either), and where it first returns one."""
    if builder is None:
        raise Unreadable(f"{BACKEND_FILE.removeprefix(PACKAGE)} defines no {BACKEND_CLASS}.{name}")
    kinds, lines = set(), []
    for node in ast.walk(builder):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            _, condition = reader._condition(BACKEND_FILE, module, builder, node)
            if reader.modes_where(condition):
                kinds.add("raw" if RAW_METADATA in ast.unparse(node.value.func) else "full")
                lines.append(node.lineno)
    if not kinds:
        raise Unreadable(f"{BACKEND_CLASS}.{name} returns no metadata this reading recognises")
    said = {frozenset({"full"}): "the metadata itself",
            frozenset({"raw"}): "raw inputs only, from which the graph rebuilds the rest",
            }.get(frozenset(kinds), "the metadata itself or raw inputs, by a setting the tree leaves to the server")
    return said, _where(BACKEND_FILE, builder, min(lines))


def _idle_under_dp_attention(reader: _Reader) -> Found:
    """Idle forwards come from data-parallel attention: the model reads whether it is on."""
    module = reader.module(MODEL_FILE)
    for node in ast.walk(module):
        name = (node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                else node.attr if isinstance(node, ast.Attribute) else None)
        if name in ("is_dp_attention_enabled", "attn_dp_size"):
            function = callsites._enclosing_function(node)
            where = (_where(MODEL_FILE, function, node.lineno) if function is not None
                     else f"{MODEL_FILE.removeprefix(PACKAGE)} line {node.lineno}")
            return (frozenset(), where,
                    f"the model reads {name}: data-parallel attention runs idle ranks")
    return (frozenset({IDLE}), MODEL_FILE.removeprefix(PACKAGE),
            "the model never reads data-parallel attention: no idle forwards")


def _draft_model(reader: _Reader) -> Found:
    """Draft extend and a draft model beside the target: the tree has DeepSeek-V4's draft
    model (an ``EntryClass`` in its next-n file) and the backend builds draft-extend metadata."""
    draft = reader._module(DRAFT_MODEL_FILE)
    entry = None if draft is None else next(
        (node for node in draft.body if isinstance(node, ast.Assign)
         and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets)), None)
    if entry is None:
        return (frozenset({DRAFT_MODEL, DRAFT_EXTEND}), DRAFT_MODEL_FILE.removeprefix(PACKAGE),
                "no DeepSeek-V4 draft model: no draft model and no draft-extend forwards")
    backend = reader.module(BACKEND_FILE)
    handles = next((node for node in ast.walk(backend) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("is_draft_extend")), None)
    where = f"{DRAFT_MODEL_FILE.removeprefix(PACKAGE)} line {entry.lineno}"
    if handles is None:
        return (frozenset({DRAFT_EXTEND}), where,
                "a draft model, but the backend never builds draft-extend metadata")
    function = callsites._enclosing_function(handles)
    return (frozenset(), f"{where}; {_where(BACKEND_FILE, function, handles.lineno)}",
            f"the draft model is {ast.unparse(entry.value)} and the backend builds draft-extend metadata")


def _refused_under_request_window(reader: _Reader) -> Found:
    """Under the request window the model is DeepSeek-V4.1 (the server refuses the switch for
    any other), and the server's DeepSeek-V4.1 validation refuses features it does not
    support: each is a ``("feature", condition)`` pair of ``validate_deepseek_v41_features``,
    read by what its condition tests."""
    if not reader.switches.get(REQUEST_WINDOW_SWITCH):
        return (frozenset(), V41_VALIDATION_FILE.removeprefix(PACKAGE),
                f"{REQUEST_WINDOW_SWITCH} is off, so the run need not be DeepSeek-V4.1: none of its refusals apply")
    module = reader.module(V41_VALIDATION_FILE)
    validate = next((node for node in module.body if isinstance(node, ast.FunctionDef)
                     and node.name == V41_VALIDATION), None)
    if validate is None:
        raise Unreadable(f"{V41_VALIDATION_FILE.removeprefix(PACKAGE)} defines no {V41_VALIDATION}")
    terms, refused = set(), []
    for pair in ast.walk(validate):
        if not (isinstance(pair, ast.Tuple) and len(pair.elts) == 2 and isinstance(pair.elts[0], ast.Constant)
                and isinstance(pair.elts[0].value, str)):
            continue
        condition = ast.unparse(pair.elts[1])
        for tested, excluded in V41_REFUSALS:
            if all(word in condition for word in tested):
                terms |= excluded
                refused.append(pair.elts[0].value)
    if not refused:
        raise Unreadable(f"{V41_VALIDATION} in {V41_VALIDATION_FILE.removeprefix(PACKAGE)} refuses none of "
                         "the features the profile draws")
    return (frozenset(terms), _where(V41_VALIDATION_FILE, validate, validate.lineno),
            f"under {REQUEST_WINDOW_SWITCH} DeepSeek-V4.1 refuses {', '.join(refused)}")


def _multi_step_draft(reader: _Reader) -> Found:
    """Multi-step draft decode: the backend has a multi-step variant for the draft worker."""
    backend = reader.module(BACKEND_FILE)
    found = next((node for node in backend.body if isinstance(node, ast.ClassDef) and "MultiStep" in node.name), None)
    if found is None:
        return (frozenset({DRAFT_MULTISTEP}), BACKEND_FILE.removeprefix(PACKAGE),
                "the backend has no multi-step variant: one draft step per forward")
    where = f"{BACKEND_FILE.removeprefix(PACKAGE)}:{found.name} line {found.lineno}"
    return (frozenset(), where,
            f"{found.name} runs the draft steps of one forward")


FEATURES = {
    "two micro-batches, layers interleaved": _two_batch_overlap,
    "pipeline stage (start_layer > 0)": _pipeline_stage,
    "hybrid layers (first SWA layer need not be start_layer)": _layers_without_swa_stores,
    "graph capture and replay with padding": _graph_replay,
    "metadata merge before replay, buckets prepared outside the graph": _metadata_merge,
    "idle forwards (metadata init skipped under speculative decoding)": _idle_under_dp_attention,
    "draft model beside the target; draft-extend forwards": _draft_model,
    "multi-step draft decode": _multi_step_draft,
    "features DeepSeek-V4.1 refuses under the request window": _refused_under_request_window,
}


# ---- whether a forward with no rows reaches the SWA store --------------------------------------

# the calls by which a layer stores SWA keys or asks where to (the target's entry points)
SWA_STORE_CALLS = ("get_swa_out_cache_loc", "store_cache")
# where AttnTpContext.use_input_scattered lives (before 0.5.21: layers/communicator.py)
INPUT_SCATTERED_FILES = ("sglang/srt/layers/layer_boundary/adapters/attention.py",
                         "sglang/srt/layers/communicator.py")


@dataclass(frozen=True)
class ZeroRowReading:
    """Whether a forward with no rows on this rank reaches a layer's SWA store, read from the
    layer's ``forward``: None where the tree cannot be read so (``says`` then tells why)."""

    reaches_store: bool | None
    says: str


@functools.lru_cache(maxsize=32)
def zero_row_forwards(tree: SourceTree, switches: SwitchSettings) -> ZeroRowReading:
    """SGLang's DeepSeek-V4 layers return before storing when their rank has no rows
    (0.5.20+ ``MQALayer.forward``: ``x.shape[0] == 0`` while the input is not scattered, and
    it is scattered only in extend forwards). A tree without that return hands its store
    an idle forward's zero rows, where the request window's layout refuses them."""
    try:
        return _read_zero_rows(_Reader(tree, switches))
    except Unreadable as exc:
        return ZeroRowReading(None, f"unconfirmed: {exc}")


def _read_zero_rows(reader: _Reader) -> ZeroRowReading:
    module = reader.module(MODEL_FILE)
    layers = [node for node in module.body if isinstance(node, ast.ClassDef)
              and _defined(node, "forward") is not None and _calls_named(node, *SWA_STORE_CALLS)]
    if len(layers) != 1:
        raise Unreadable(f"{MODEL_FILE.removeprefix(PACKAGE)} has {len(layers)} classes that both store SWA keys "
                         "and define forward, not one")
    forward = _defined(layers[0], "forward")
    statements = callsites._without_docstring(forward.body)
    for index, statement in enumerate(statements):
        if not _zero_row_test(statement):
            continue
        where = _where(MODEL_FILE, forward, statement.lineno)
        if index and not all(isinstance(s, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom))
                             for s in statements[:index]):
            raise Unreadable(f"{where} returns on no rows after other statements, which are not read")
        scattered = _read_scattered_guard(reader, statement.test)
        return ZeroRowReading(False, f"{callsites._qualname(forward)} returns before storing when its rank has no "
                                     f"rows ({where}{scattered})")
    if any(_is_no_rows(node) for node in ast.walk(forward)):
        raise Unreadable(f"{_where(MODEL_FILE, forward, forward.lineno)} tests for no rows other than by "
                         "returning first")
    return ZeroRowReading(True, f"{callsites._qualname(forward)} does not return before storing when its rank has "
                                f"no rows ({_where(MODEL_FILE, forward, forward.lineno)})")


def _zero_row_test(statement: ast.stmt) -> bool:
    """An ``if`` that only returns (after asserts), one of whose conjuncts is a test for no rows."""
    if not (isinstance(statement, ast.If) and not statement.orelse and isinstance(statement.body[-1], ast.Return)
            and all(isinstance(s, ast.Assert) for s in statement.body[:-1])):
        return False
    return any(_is_no_rows(part) for part in _conjuncts(statement.test))


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    return list(test.values) if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]


def _is_no_rows(node: ast.AST) -> bool:
    """``x.shape[0] == 0`` or ``x.numel() == 0``."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value == 0):
        return False
    left = ast.unparse(node.left)
    return left.endswith(".shape[0]") or left.endswith(".numel()")


def _read_scattered_guard(reader: _Reader, test: ast.expr) -> str:
    """What the guard's other conjuncts say of an idle forward: only "the input is not
    scattered" is read, through ``use_input_scattered``, which must ask for an extend."""
    others = [part for part in _conjuncts(test) if not _is_no_rows(part)]
    if not others:
        return ""
    unscattered = (len(others) == 1 and isinstance(others[0], ast.UnaryOp) and isinstance(others[0].op, ast.Not)
                   and ast.unparse(others[0].operand).endswith(".input_scattered"))
    if not unscattered:
        raise Unreadable(f"the return on no rows also tests `{ast.unparse(test)}`, which is not read")
    found = [(path, node) for path in INPUT_SCATTERED_FILES if (module := reader._module(path)) is not None
             for node in ast.walk(module) if isinstance(node, ast.FunctionDef) and node.name == "use_input_scattered"]
    path, decides = found[0] if found else (INPUT_SCATTERED_FILES[0], None)
    returned = None if decides is None else next(
        (node.value for node in ast.walk(decides) if isinstance(node, ast.Return)), None)
    extend_only = returned is not None and any(
        isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute) and part.func.attr == "is_extend"
        for part in _conjuncts(returned))
    if not extend_only:
        files = " or ".join(p.removeprefix(PACKAGE) for p in INPUT_SCATTERED_FILES)
        raise Unreadable(f"whether an idle forward's input is scattered is not read (no use_input_scattered "
                         f"in {files} asks for an extend)")
    return f"; its input is scattered only in extend forwards, {_where(path, decides, decides.lineno)}"
