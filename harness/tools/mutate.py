"""Mutation figures: how many plausible bugs of a correct design the search finds, and how fast.

A green gate means something only if the search would have found a bug that was there.
:func:`derive_mutants` reads a subject's Python source (its class, the classes it inherits
from outside swafuzz's API, and the module-level functions their methods call) with
:mod:`ast` and makes one *mutant* per place where one operator of :data:`OPERATORS` applies:
the kinds of mistakes cached write locations are known for (a dropped guard, a cache key
missing a component, a reset left out, the window where the ring belongs, an off-by-one in
ring arithmetic, a reference kept where a copy was meant). A mutant is named by its operator,
the function it changes and the place's number in it (``drop-key-element/StepKeyed._key/2``),
and carries a unified diff of the source it changes; nothing is written into the subject's
files: the changed function is compiled into a subclass of the subject, in a copy of its
module's globals. An SGLang target (``sglang:<target>[@<version>]``) is mutated in the
functions its binding runs, by the same operators; each such mutant is the tree with the one
edit, read in place and bound as any tree is (:func:`tree_mutant_subject`).

:func:`mutate` fuzzes the unmutated subject first (it must pass: a subject that diverges
makes no figures), then every mutant with its own budget (and, where given, its own number
of scenarios: whichever runs out first ends the search), the realistic profile for the
first half and the adversarial one for the rest (or the profiles given, never drawing the
features excluded: the scope a subject is meant to be right on). A mutant is *killed* only
when the unmutated subject passes the shrunk scenario that the mutant failed. All of it runs
in a worker process (spawned once per subject, again after a mutant ended it): a mutant that
ends or hangs its process is killed if the unmutated subject passes the scenario it was
running, else *not runnable*, as is one that does not compile or bind, raises on
construction, or reaches code swafuzz's stand-ins do not model. Survivors that a person has
judged equivalent (a list keyed by mutant id, each with its reason;
:data:`BUILTIN_EQUIVALENTS` for the built-in subjects and SGLang targets) are left out of
the kill rate.
"""

from __future__ import annotations

import __future__
import ast
import dataclasses
import difflib
import inspect
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any, Callable, Iterator

import torch

from ..reference import EngineConfig, Scenario
from ..strategies.profiles import ADVERSARIAL, REALISTIC

from ..api import ModelSpec, Subject
from ..run.boundary import InputError, describe_path, parse_json, read_regular_file, show
from ..search.campaign import CAMPAIGN_TORCH_THREADS
from ..names import MUTANT_BUDGET_S, SUPERVISOR_SWITCH_ENV
from ..run.executor import UnmodelledPath, run_scenario
from ..search.fuzz import fuzz
from ..run.guard import describe_exception
from ..subjects.registry import SubjectInfo, resolve_subject
from ..results.reports import write_atomically
from ..process.channel import keep_scenarios_in, last_scenario
from ..run.diagnosis import EXITED, HUNG, KILLED
from ..run.unread import Unread, attributes_read

# a mutant's call that loops forever costs this much of its budget, not the harness's 10 s
CALL_TIMEOUT_S = 2.0
# past its budget, a mutant's process still shrinks, replays three times and checks the
# unmutated subject; one that has not answered by then is ended as hung
WORKER_GRACE_S = 30.0
CHECK_LIMIT_S = 60.0
WORKER_START_LIMIT_S = 300.0  # torch's import on a loaded machine
PROFILE_ORDER = (REALISTIC, ADVERSARIAL)  # each mutant's search, in this order
BUILTIN_EQUIVALENTS = Path(__file__).with_name("equivalent_mutants.json")
REPORT_FILES = ("mutants.md", "mutants.json")

# outcomes of a mutant
KILLED_STATUS, SURVIVED, EQUIVALENT, NOT_RUNNABLE = "killed", "survived", "equivalent", "not runnable"
NEVER_READ = "never read"  # a survivor whose edit only changes values nothing reads
UNKNOWN_CAUSE = "unknown"  # the diagnosis's catch-all: no candidate explains the wrong rows
# a mutant's scenario the unmutated subject fails too: a divergence of the subject itself
ORIGINAL_DIVERGES = "unmutated subject diverges"
# outcomes of the unmutated subject
PASSES, DIVERGES = "passes", "diverges"


# ---- reading the source ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Function:
    """A function of the subject's source that a mutant may change."""

    module: str  # the module's name (for an SGLang tree: the file's dotted path)
    path: str  # the file: on disk, or inside an SGLang tree (``sglang/srt/...``)
    lines: tuple[str, ...]  # the whole file, line ends kept
    node: ast.FunctionDef
    owner: str | None  # the class defining it, None for a module-level function

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.node.name}" if self.owner else self.node.name

    @property
    def first_line(self) -> int:
        return min([self.node.lineno, *(d.lineno for d in self.node.decorator_list)])


def _module_source(module: ModuleType) -> tuple[str, tuple[str, ...], ast.Module] | None:
    try:
        path = inspect.getsourcefile(module)
        text = Path(path).read_text(encoding="utf-8") if path else None
    except (OSError, TypeError, UnicodeDecodeError):
        return None
    if text is None:
        return None
    try:
        return path, tuple(text.splitlines(keepends=True)), ast.parse(text)
    except SyntaxError:
        return None


def _source_classes(subject: type) -> list[type]:
    """The subject's class and those it inherits from whose source is the subject's own
    (not swafuzz's API, not ``object``)."""
    return [cls for cls in subject.__mro__
            if cls is not object and cls.__module__ != Subject.__module__ and "." not in cls.__qualname__]


def _defining_class(subject: type, name: str) -> type | None:
    return next((cls for cls in subject.__mro__ if name in vars(cls)), None)


def _functions(subject: type) -> list[_Function]:
    """The methods the subject runs (those its MRO resolves to, in classes of its own
    source), then the module-level functions of those modules that they call, directly
    or through each other."""
    found: list[_Function] = []
    sources: dict[str, tuple[str, tuple[str, ...], ast.Module] | None] = {}
    for cls in _source_classes(subject):
        module = sys.modules.get(cls.__module__)
        if module is None:
            continue
        if module.__name__ not in sources:
            sources[module.__name__] = _module_source(module)
        source = sources[module.__name__]
        if source is None:
            continue
        path, lines, tree = source
        class_node = next((node for node in tree.body if isinstance(node, ast.ClassDef)
                           and node.name == cls.__qualname__), None)
        for node in class_node.body if class_node is not None else ():
            if (isinstance(node, ast.FunctionDef) and isinstance(vars(cls).get(node.name), FunctionType)
                    and _defining_class(subject, node.name) is cls):
                found.append(_Function(module.__name__, path, lines, node, cls.__qualname__))
    for module_name, source in sources.items():
        if source is not None:
            module = sys.modules[module_name]
            found += _called_helpers(module_name, source, found, lambda name, module=module: (
                isinstance(vars(module).get(name), FunctionType) and vars(module)[name].__module__ == module.__name__))
    return found


def _called_helpers(module: str, source: tuple[str, tuple[str, ...], ast.Module], methods: list[_Function],
                    is_helper: Callable[[str], bool] = lambda name: True) -> list[_Function]:
    """The module-level functions of ``source`` (those ``is_helper`` accepts) that the
    ``methods`` of that module call, directly or through each other."""
    path, lines, tree = source
    helpers = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and is_helper(node.name)}
    wanted = [_names_loaded(f.node) for f in methods if f.module == module]
    reached: list[str] = []
    while wanted:
        for name in sorted(wanted.pop() & set(helpers) - set(reached)):
            reached.append(name)
            wanted.append(_names_loaded(helpers[name]))
    return [_Function(module, path, lines, helpers[name], None) for name in reached]


def _names_loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


# ---- the operators ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Edit:
    """Replace the source of ``node`` (from its ``lineno``/``col_offset`` to its
    ``end_lineno``/``end_col_offset``: lines from 1, columns in UTF-8 bytes) with ``text``."""

    node: ast.AST
    text: str
    description: str


def _tokens(name: str) -> set[str]:
    return set(name.lower().split("_"))


def _identifiers(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr


def _mentions(node: ast.AST, words: set[str]) -> bool:
    return any(_tokens(name) & words for name in _identifiers(node))


RING_WORDS = {"ring"}
POSITION_WORDS = {"pos", "position", "positions"}
LAYER_BOUNDS = ("start_layer", "first_swa_layer")  # ModelSpec's, and 0
EMPTY_CALLS = {"dict", "list", "set", "tuple", "empty", "new_empty"}


class _Text:
    """Source segments of one function's file."""

    def __init__(self, function: _Function):
        self.lines = function.lines

    def __call__(self, node: ast.AST) -> str:
        # what ast.get_source_segment gives, cut from the lines already split (it splits
        # the whole file on every call, which a file of thousands of lines makes slow)
        if getattr(node, "end_lineno", None) is None:
            return ast.unparse(node)
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return self.lines[first].encode()[node.col_offset:node.end_col_offset].decode()
        parts = [self.lines[first].encode()[node.col_offset:].decode(), *self.lines[first + 1:last],
                 self.lines[last].encode()[:node.end_col_offset].decode()]
        return "".join(parts) or ast.unparse(node)


def _guard_tests(node: ast.AST) -> Iterator[ast.expr]:
    for n in ast.walk(node):
        if isinstance(n, (ast.If, ast.IfExp, ast.While)):
            yield n.test


def negate_guard(function: _Function, text: _Text) -> Iterator[_Edit]:
    """An ``if`` test, or one operand of a boolean operation, negated."""
    for test in _guard_tests(function.node):
        yield _Edit(test, f"not ({text(test)})", f"the condition `{text(test)}` negated")
    for n in ast.walk(function.node):
        if isinstance(n, ast.BoolOp):
            for operand in n.values:
                yield _Edit(operand, f"not ({text(operand)})", f"the operand `{text(operand)}` negated")


def drop_guard(function: _Function, text: _Text) -> Iterator[_Edit]:
    """One operand of a boolean operation left out; an ``if`` test of one condition
    replaced by ``True``."""
    for test in _guard_tests(function.node):
        if not isinstance(test, ast.BoolOp):
            yield _Edit(test, "True", f"the condition `{text(test)}` dropped (always true)")
    for n in ast.walk(function.node):
        if isinstance(n, ast.BoolOp):
            joiner = " and " if isinstance(n.op, ast.And) else " or "
            for index, operand in enumerate(n.values):
                rest = [text(value) for i, value in enumerate(n.values) if i != index]
                yield _Edit(n, f"({joiner.join(rest)})", f"the operand `{text(operand)}` dropped")


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 0


def layer_bound(function: _Function, text: _Text) -> Iterator[_Edit]:
    """A layer bound (the stage's ``start_layer``, its ``first_swa_layer``, or 0 compared
    with a layer) replaced by each of the others."""
    bounds = [n for n in ast.walk(function.node) if isinstance(n, ast.Attribute) and n.attr in LAYER_BOUNDS]
    base = text(bounds[0].value) if bounds else "self.spec"
    for n in bounds:
        for other in LAYER_BOUNDS:
            if other != n.attr:
                yield _Edit(n, f"{text(n.value)}.{other}", f"`{text(n)}` replaced by `{other}`")
        yield _Edit(n, "0", f"`{text(n)}` replaced by layer 0")
    for n in ast.walk(function.node):
        if isinstance(n, ast.Compare):
            operands = [n.left, *n.comparators]
            for operand in operands:
                if _is_zero(operand) and any(_mentions(o, {"layer"}) for o in operands if o is not operand):
                    for bound in LAYER_BOUNDS:
                        yield _Edit(operand, f"{base}.{bound}", f"layer 0 replaced by `{base}.{bound}`")


def _key_tuples(node: ast.AST) -> Iterator[ast.Tuple]:
    keyed_function = bool(_tokens(node.name) & {"key"})
    for n in ast.walk(node):
        candidates: list[ast.AST] = []
        if isinstance(n, ast.Return) and keyed_function and n.value is not None:
            candidates.append(n.value)
        elif isinstance(n, ast.Assign) and any(_mentions(t, {"key"}) for t in n.targets):
            candidates.append(n.value)
        elif isinstance(n, ast.Compare) and _mentions(n, {"key"}):
            candidates += [n.left, *n.comparators]
        elif isinstance(n, ast.Subscript):
            candidates.append(n.slice)
        yield from (c for c in candidates if isinstance(c, ast.Tuple) and len(c.elts) >= 2)


def drop_key_element(function: _Function, text: _Text) -> Iterator[_Edit]:
    """One component of a cache key (a tuple returned by a ``*key*`` function, assigned
    to or compared with a key, or indexing a cache) left out."""
    for key in _key_tuples(function.node):
        for index, element in enumerate(key.elts):
            rest = [text(e) for i, e in enumerate(key.elts) if i != index]
            shown = f"({rest[0]},)" if len(rest) == 1 else f"({', '.join(rest)})"
            yield _Edit(key, shown, f"`{text(element)}` dropped from the key")


def _is_empty(value: ast.AST) -> bool:
    if isinstance(value, ast.Constant):
        return value.value is None
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return not value.elts
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        return name in EMPTY_CALLS
    return False


def _is_reset(statement: ast.stmt) -> bool:
    if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
        return _is_empty(statement.value)
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        return isinstance(func, ast.Attribute) and func.attr == "clear"
    return isinstance(statement, ast.Delete)


def drop_reset(function: _Function, text: _Text) -> Iterator[_Edit]:
    """An invalidation or reset left out: an assignment of None or an empty value, a
    ``.clear()``, a ``del``."""
    for n in ast.walk(function.node):
        if isinstance(n, ast.stmt) and n is not function.node and _is_reset(n):
            yield _Edit(n, "pass", f"`{text(n)}` left out")


def _attributes(function: _Function) -> set[str]:
    tree = ast.parse("".join(function.lines))
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


# the words of a name that is a ring size or a sliding window and nothing else: every word
# of it must be one of them, so that SGLang's `request_window` (the per-request window of
# bounded replay) or `_dspark_swa_ring_out_cache_loc` (a ring's locations) are neither,
# while the unified-KV pool's `unified_swa_ring_size` and `unified_swa_window` are;
# and in lower case, as attributes are (`Truth.RING` is an enum member)
RING_SIZE_WORDS = {"ring", "size", "swa", "req", "unified"}
WINDOW_SIZE_WORDS = {"sliding", "window", "size", "swa", "unified"}


def _names_size(name: str, word: str, vocabulary: set[str]) -> bool:
    words = _tokens(name) - {""}
    return name.islower() and word in words and words <= vocabulary


def _unified(name: str) -> bool:
    return "unified" in _tokens(name)


def ring_window(function: _Function, text: _Text) -> Iterator[_Edit]:
    """An attribute naming the ring size read as one naming the sliding window, and the
    other way round (ModelSpec's ``ring`` and ``sliding_window``, and any other attribute
    of the module named only so)."""
    seen = _attributes(function) | {"ring", "sliding_window"}
    rings = sorted(name for name in seen if _names_size(name, "ring", RING_SIZE_WORDS))
    windows = sorted(name for name in seen if _names_size(name, "window", WINDOW_SIZE_WORDS))
    for n in ast.walk(function.node):
        if isinstance(n, ast.Attribute):
            others = windows if n.attr in rings else rings if n.attr in windows else []
            # a unified pool's ring size and window pair with each other, not with a model's
            for other in (o for o in others if _unified(o) == _unified(n.attr)):
                yield _Edit(n, f"{text(n.value)}.{other}", f"`{text(n)}` replaced by `.{other}`")


def off_by_one(function: _Function, text: _Text) -> Iterator[_Edit]:
    """One more or one less on an operand of ring or position arithmetic (a ``%``, or an
    operation on a ring size or positions)."""
    words = RING_WORDS | POSITION_WORDS
    for n in ast.walk(function.node):
        if isinstance(n, ast.BinOp):
            for operand in (n.left, n.right):
                if isinstance(n.op, ast.Mod) or _mentions(operand, words):
                    for sign in ("+", "-"):
                        yield _Edit(operand, f"({text(operand)} {sign} 1)",
                                    f"`{text(operand)}` {sign} 1")


def copy_prefix(function: _Function, text: _Text) -> Iterator[_Edit]:
    """A slice's end one short: ``x[:n]`` copies ``x[:n - 1]``."""
    for n in ast.walk(function.node):
        if isinstance(n, ast.Slice) and n.upper is not None:
            yield _Edit(n.upper, f"({text(n.upper)} - 1)", f"the slice ends at `{text(n.upper)} - 1`")


def assign_instead_of_copy(function: _Function, text: _Text) -> Iterator[_Edit]:
    """``x.copy_(y)`` as ``x = y`` (the object re-pointed, not written in place), and a
    ``.clone()`` left out (the caller's tensor kept)."""
    for n in ast.walk(function.node):
        if (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                and n.value.func.attr == "copy_" and len(n.value.args) == 1
                and isinstance(n.value.func.value, (ast.Name, ast.Attribute, ast.Subscript))):
            target, value = text(n.value.func.value), text(n.value.args[0])
            yield _Edit(n, f"{target} = {value}", f"`{text(n)}` assigned instead of copied")
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "clone"
                and not n.args and not n.keywords):
            yield _Edit(n, text(n.func.value), f"`.clone()` of `{text(n.func.value)}` left out")


def swap_arguments(function: _Function, text: _Text) -> Iterator[_Edit]:
    """Two arguments of one call, both positional or both named, of the same syntactic kind
    (two names, two attributes, two calls...), given in each other's place."""
    for n in ast.walk(function.node):
        if not isinstance(n, ast.Call) or any(k.arg is None for k in n.keywords):
            continue
        names = [None] * len(n.args) + [k.arg for k in n.keywords]
        values = [*n.args, *(k.value for k in n.keywords)]
        parts = [_argument(name, text(value)) for name, value in zip(names, values)]
        for i in range(len(values)):
            for j in range(i + 1, len(values)):
                a, b = values[i], values[j]
                if ((names[i] is None) != (names[j] is None) or type(a) is not type(b)
                        or isinstance(a, ast.Starred) or text(a) == text(b)):
                    continue
                swapped = list(parts)
                swapped[i], swapped[j] = _argument(names[i], text(b)), _argument(names[j], text(a))
                yield _Edit(n, f"{text(n.func)}({', '.join(swapped)})",
                            f"`{text(a)}` and `{text(b)}` swapped in `{text(n.func)}(...)`")


def _argument(name: str | None, value: str) -> str:
    return value if name is None else f"{name}={value}"


OPERATORS: dict[str, Callable[[_Function, _Text], Iterator[_Edit]]] = {
    "negate-guard": negate_guard,
    "drop-guard": drop_guard,
    "layer-bound": layer_bound,
    "drop-key-element": drop_key_element,
    "drop-reset": drop_reset,
    "ring-window": ring_window,
    "off-by-one": off_by_one,
    "copy-prefix": copy_prefix,
    "assign-instead-of-copy": assign_instead_of_copy,
    "swap-arguments": swap_arguments,
}


# ---- mutants ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    id: str  # operator/function/number: stable while the function itself is unchanged
    operator: str
    module: str
    owner: str | None  # the class whose method it changes; None for a module-level function
    function: str
    path: str
    line: int
    description: str
    source: str  # the changed function, dedented
    diff: str
    # where the edit goes in the file: (line, column, end line, end column) as ast gives
    # them (lines from 1, columns in UTF-8 bytes), and the text it puts there
    span: tuple[int, int, int, int] = (0, 0, 0, 0)
    replacement: str = ""
    # an SGLang target's subject name (``sglang:<target>[@<version>]``) when the function is
    # bound from that tree: the mutant is the tree with this file edited, bound again
    tree_subject: str | None = None
    # why the edit changes only values nothing reads (:mod:`swafuzz.run.unread`), if it does:
    # should the mutant survive, that is why no search could kill it
    never_read: str | None = None

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.function}" if self.owner else self.function

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "operator": self.operator, "function": self.qualname, "path": self.path,
                "line": self.line, "description": self.description, "diff": self.diff}


def derive_mutants(subject: type, operators: tuple[str, ...] | None = None) -> list[Mutant]:
    """Every mutant of ``subject``'s source, by function and then by operator."""
    return _mutants_of(_functions(subject), operators)


def _mutants_of(functions: list[_Function], operators: tuple[str, ...] | None,
                tree_subject: str | None = None) -> list[Mutant]:
    mutants = []
    attributes = attributes_read(f.node for f in functions)
    for function in functions:
        text, reading = _Text(function), Unread(function.node, attributes)
        for operator in operators or tuple(OPERATORS):
            edits = OPERATORS[operator](function, text)
            for number, edit in enumerate(_distinct(edits), 1):
                mutants.append(_mutant(function, operator, number, edit, tree_subject,
                                       _never_read(reading, edit)))
    return mutants


def _never_read(reading: Unread, edit: _Edit) -> str | None:
    statement = reading.statement_at(edit.node)
    if statement not in reading.unread:
        return None
    stores = ", ".join(f"`{store}`" for store in reading.stores_of(statement))
    return (f"line {statement.lineno} stores only into {stores or 'nothing'}, which nothing the subject "
            f"returns, calls or stores for a read depends on")


# ---- SGLang targets -------------------------------------------------------------------------
#
# A target's functions are SGLang's, bound from a tree of files (a release's wheel or a
# checkout) onto stand-ins. A mutant of one is that tree with the function's file edited,
# read in place (every other file stays the tree's, so its call sites and switch defaults
# read as the unmutated target's), and bound the ordinary way, with the same engine
# switches and supplied values as the unmutated target.


def _sglang_tree(spec: str) -> tuple[Any, Any]:
    """The target ``spec`` (``sglang:<target>[@<version>]``) names and the tree it binds,
    found as :func:`swafuzz.subjects.sglang.resolve` finds them."""
    from ..subjects import sglang
    from ..subjects.sglang import locate

    bare, _, version = spec.partition("@")
    item = sglang.target(bare)
    try:
        tree = locate.wheel(version) if version else sglang.default_source()
    except locate.SglangUnavailable as exc:
        raise sglang.BindError(f"no SGLang for {spec!r}: {exc}") from None
    if tree is None:
        raise sglang.BindError(f"no SGLang for {spec!r}: give --sglang-source PATH or a release")
    return item, tree


def _tree_functions(spec: str, binding: Any) -> list[_Function]:
    """The functions of ``spec``'s tree that its binding runs: every method bound on a class
    (the entry methods and those they reach), the module-level functions it binds, then the
    functions of the same files that those call."""
    from ..subjects.sglang.binding import ClassCode, FunctionCode

    item, tree = _sglang_tree(spec)
    found: list[_Function] = []
    sources: dict[str, tuple[str, tuple[str, ...], ast.Module]] = {}
    for code in item.code:
        if isinstance(code, ClassCode):
            bound = binding.classes.get(code.name)
            names = set(bound.methods) if bound is not None else set()
        else:
            names = {code.name} if isinstance(code, FunctionCode) and code.name in binding.functions else set()
        text = tree.read(code.path) if names else None
        if text is None:
            continue
        if code.path not in sources:
            sources[code.path] = (code.path, tuple(text.splitlines(keepends=True)), ast.parse(text))
        _, lines, module = sources[code.path]
        body = module.body
        if isinstance(code, ClassCode):
            owner = next((node for node in body if isinstance(node, ast.ClassDef) and node.name == code.name), None)
            body = owner.body if owner is not None else []
        for node in body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                found.append(_Function(code.module, code.path, lines, node,
                                       code.name if isinstance(code, ClassCode) else None))
    stood_in = _stood_in(binding)
    for path, source in sources.items():
        module = path.removesuffix(".py").replace("/", ".")
        taken = {f.node.name for f in found if f.module == module and f.owner is None} | stood_in
        found += _called_helpers(module, source, found, lambda name, taken=taken: name not in taken)
    return found


def _stood_in(binding: Any) -> set[str]:
    """The global names the bound functions get from swafuzz's stand-ins in place of the
    tree's own (``_grouped_asm_enabled``): a mutant of the tree's function would never run."""
    bound = [*binding.functions.values(), *(m for c in binding.classes.values() for m in c.methods.values())]
    names = set()
    for method in bound:
        function = getattr(method, "fget", None) or getattr(method, "__func__", method)
        for name, value in getattr(function, "__globals__", {}).items():
            if str(getattr(value, "__module__", "")).startswith("swafuzz."):
                names.add(name)
    return names


def derive_tree_mutants(spec: str, binding: Any, operators: tuple[str, ...] | None = None) -> list[Mutant]:
    """Every mutant of the SGLang functions that ``binding`` (the unmutated target
    ``spec``'s) runs, by function and then by operator, made by the same operators."""
    return _mutants_of(_tree_functions(spec, binding), operators, tree_subject=spec)


def tree_mutant_subject(mutant: Mutant) -> type:
    """The subject of ``mutant``'s target bound from its tree with the mutant's file edited
    (every other file, the model and engine files the call sites are read from included,
    read as the unmutated target reads them). Raises BindError when the edited tree does
    not bind."""
    from ..subjects import sglang
    from ..subjects.sglang import locate

    item, tree = _sglang_tree(mutant.tree_subject)
    text = tree.read(mutant.path)
    if text is None:
        raise sglang.BindError(f"{tree.label} has no file {mutant.path}")
    edited = locate.EditedTree(tree.root, tree.origin, mutant.path,
                               "".join(spliced(text.splitlines(keepends=True), mutant.span, mutant.replacement)),
                               mutant.id)
    try:
        return sglang.bind_target(item, edited, "source", name=mutant.id).subject
    except sglang.BindError as exc:  # named as the mutant, not as the tree it edits
        raise sglang.BindError(str(exc).removeprefix(f"{edited.label} (source mode): ")) from None


def _distinct(edits: Iterator[_Edit]) -> Iterator[_Edit]:
    seen = set()
    for edit in edits:
        where = (edit.node.lineno, edit.node.col_offset, edit.node.end_lineno, edit.node.end_col_offset, edit.text)
        if where not in seen:
            seen.add(where)
            yield edit


def spliced(lines: list[str] | tuple[str, ...], span: tuple[int, int, int, int], text: str) -> list[str]:
    """``lines`` (line ends kept) with the source at ``span`` replaced by ``text``."""
    line, column, end_line, end_column = span
    first, last = lines[line - 1].encode(), lines[end_line - 1].encode()
    joined = (first[:column] + text.encode() + last[end_column:]).decode()
    return [*lines[:line - 1], joined, *lines[end_line:]]


def _mutant(function: _Function, operator: str, number: int, edit: _Edit, tree_subject: str | None = None,
            never_read: str | None = None) -> Mutant:
    lines, node = list(function.lines), edit.node
    span = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
    changed = spliced(lines, span, edit.text)
    end = function.node.end_lineno - (node.end_lineno - node.lineno)
    body = changed[function.first_line - 1:end]
    indent = function.node.col_offset
    source = "".join(line[indent:] if not line[:indent].strip() else line.lstrip() for line in body)
    mutant_id = f"{operator}/{function.qualname}/{number}"
    shown = function.path if tree_subject else _shown_path(function.path)
    diff = "".join(difflib.unified_diff(lines, changed, fromfile=shown, tofile=f"{shown} ({mutant_id})", n=2))
    return Mutant(mutant_id, operator, function.module, function.owner, function.node.name, shown,
                  node.lineno, edit.description, source, diff, span, edit.text, tree_subject, never_read)


def _shown_path(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive
        return path


def mutant_class(subject: type, mutant: Mutant) -> type:
    """A subclass of ``subject`` that runs ``mutant``'s function instead of the original.

    The function is compiled in a copy of its module's globals; the module's own functions
    and the subject's methods from that module are rebound to the copy, so a changed helper
    is the one they call. A changed method keeps ``super()`` meaning what it meant in its
    class. Raises what compiling or defining the function raises."""
    module = sys.modules[mutant.module]
    namespace = dict(vars(module))
    for name, value in vars(module).items():
        if isinstance(value, FunctionType) and value.__module__ == module.__name__ and value.__qualname__ == name:
            namespace[name] = _rebound(value, namespace)
    changed = _compiled(mutant, namespace)
    if mutant.owner is None:
        namespace[mutant.function] = changed
    methods: dict[str, Any] = {}
    for cls in _source_classes(subject):
        if cls.__module__ != module.__name__:
            continue
        for name, value in vars(cls).items():
            if isinstance(value, FunctionType) and _defining_class(subject, name) is cls:
                methods[name] = _rebound(value, namespace)
    if mutant.owner is not None:
        methods[mutant.function] = changed
    return type(subject.__name__, (subject,), {**methods, "__module__": subject.__module__,
                                              "__qualname__": subject.__qualname__, "__doc__": subject.__doc__})


def _rebound(function: FunctionType, namespace: dict[str, Any]) -> FunctionType:
    rebound = FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                           function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    rebound.__dict__.update(function.__dict__)
    return rebound


_SCOPE = "__mutant_scope__"


def _compiled(mutant: Mutant, namespace: dict[str, Any]) -> FunctionType:
    # a method is compiled in a class body, which gives a super() call its __class__ cell;
    # the cell is then pointed at the class the method was written in
    source = mutant.source
    if mutant.owner is not None:
        source = f"class {_SCOPE}:\n" + "".join(f"    {line}" for line in source.splitlines(keepends=True))
    code = compile(source, f"<mutant {mutant.id}>", "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    scope: dict[str, Any] = {}
    exec(code, namespace, scope)  # noqa: S102 - the subject's own source, one expression changed
    if mutant.owner is None:
        changed = scope[mutant.function]
    else:
        changed = vars(scope[_SCOPE])[mutant.function]
        owner = getattr(sys.modules[mutant.module], mutant.owner)
        for name, cell in zip(changed.__code__.co_freevars, changed.__closure__ or ()):
            if name == "__class__":
                cell.cell_contents = owner
    if not isinstance(changed, FunctionType):
        raise TypeError(f"{mutant.qualname} is no longer a plain function once changed")
    return changed


# ---- examining one mutant ---------------------------------------------------------------------


@dataclass
class Outcome:
    """What fuzzing one mutant (or, with ``mutant`` None, the unmutated subject) came to."""

    mutant: Mutant | None
    status: str
    profile: str | None = None  # the profile whose search killed it
    time_to_kill_s: float | None = None  # from the start of its search to the divergence first seen
    kind: str | None = None  # the divergence's kind
    sentence: str | None = None  # the divergence, or why it is not runnable
    scenario: dict | None = None  # the shrunk scenario
    equivalent_reason: str | None = None
    elapsed_s: float = 0.0
    # where the diagnosis says the wrong value came from (its source kind; "unknown" is the
    # catch-all), or the divergence's kind where it names no source
    cause: str | None = None

    @property
    def names_a_cause(self) -> bool:
        return self.cause is not None and self.cause != UNKNOWN_CAUSE

    def to_dict(self) -> dict[str, Any]:
        return {**(self.mutant.to_dict() if self.mutant else {}), "status": self.status, "profile": self.profile,
                "time_to_kill_s": self.time_to_kill_s, "kind": self.kind, "cause": self.cause,
                "sentence": self.sentence,
                "scenario": self.scenario, "equivalent_reason": self.equivalent_reason,
                "elapsed_s": self.elapsed_s}


def _construction_spec(device: str) -> ModelSpec:
    return ModelSpec.of(EngineConfig(), "target", torch.device(device))


def examine(subject: type, mutant: Mutant | None, budget_s: float, seed: int, device: str = "cpu", *,
            profiles: tuple[str, ...] = PROFILE_ORDER, exclude: frozenset[str] = frozenset(),
            max_examples: int | None = None) -> Outcome:
    """Fuzz ``mutant`` (None: ``subject`` itself) for ``budget_s``, split evenly over
    ``profiles`` in their order (the realistic profile for the first half, the adversarial
    one for what is left), never drawing the features ``exclude`` names; a divergence kills
    the mutant when ``subject`` passes its shrunk scenario. ``max_examples`` bounds the
    scenarios too, split over the profiles as the budget is: each search stops at whichever
    bound it reaches first, so with a budget that never binds a seed gives one outcome on a
    fast machine and a busy one alike."""
    started = time.monotonic()
    tested = subject
    if mutant is not None and mutant.tree_subject is not None:
        from ..subjects.sglang import BindError

        try:
            tested = tree_mutant_subject(mutant)
        except BindError as exc:  # the edited tree lacks what the target needs
            return Outcome(mutant, NOT_RUNNABLE, sentence=f"it does not bind: {exc}",
                           elapsed_s=time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - an edit that leaves no valid Python
            return Outcome(mutant, NOT_RUNNABLE, sentence=f"it does not compile: {describe_exception(exc)}",
                           elapsed_s=time.monotonic() - started)
    elif mutant is not None:
        try:
            tested = mutant_class(subject, mutant)
        except Exception as exc:  # noqa: BLE001 - a mutant that does not compile is not runnable
            return Outcome(mutant, NOT_RUNNABLE, sentence=f"it does not compile: {describe_exception(exc)}")
    if mutant is not None:
        try:
            tested(_construction_spec(device))
        except BaseException as exc:  # noqa: BLE001 - the mutant's code, whatever it raises
            return Outcome(mutant, NOT_RUNNABLE, sentence=f"it raises on construction: {describe_exception(exc)}",
                           elapsed_s=time.monotonic() - started)
    info = SubjectInfo(subject.__name__ if mutant is None else mutant.id, tested, expected="unknown", kind="mutant")
    searched = time.monotonic()  # binding an SGLang tree is not the search's time
    for number, profile in enumerate(profiles, 1):
        until = budget_s * number / len(profiles)
        offset = time.monotonic() - searched
        share = None if max_examples is None else (max_examples * number // len(profiles)
                                                   - max_examples * (number - 1) // len(profiles))
        if until - offset <= 0 or share == 0:
            continue
        try:
            result = fuzz(info, profile=profile, settings="ci", seed=seed, budget_s=until - offset, device=device,
                          max_examples=share, timeout_s=CALL_TIMEOUT_S, exclude=exclude)
        except UnmodelledPath as gap:  # a path swafuzz's stand-ins lack: says nothing of the mutant
            return Outcome(mutant, NOT_RUNNABLE, sentence=f"it reaches code swafuzz does not model: {gap}",
                           elapsed_s=time.monotonic() - started)
        if result.divergence is not None:
            divergence = result.divergence
            found = Outcome(mutant, DIVERGES, profile, offset + (result.first_divergence_s or result.elapsed_s),
                            divergence.kind, divergence.sentence, result.scenario.to_dict(),
                            cause=(divergence.source or {}).get("kind", divergence.kind))
            if mutant is not None:
                passes = original_passes(subject, result.scenario.to_dict(), device)
                found.status = KILLED_STATUS if passes else ORIGINAL_DIVERGES
            found.elapsed_s = time.monotonic() - started
            return found
    return Outcome(mutant, PASSES if mutant is None else SURVIVED, elapsed_s=time.monotonic() - started)


def original_passes(subject: type, scenario: dict, device: str = "cpu") -> bool:
    return run_scenario(subject, Scenario.from_dict(scenario), device=device, timeout_s=CALL_TIMEOUT_S).passed


# ---- the worker process ------------------------------------------------------------------------


@dataclass
class _Lost:
    """A worker that ended, or was ended, before it answered."""

    kind: str  # exited, killed, hung (the supervisor's names)
    how: str
    scenario: dict | None  # the last scenario it announced
    elapsed_s: float


def _serve(connection: Any, spec: str, device: str, scenario_file: Path) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a run stops
    sys.stdout = sys.stderr  # the parent's stdout carries the report
    torch.set_num_threads(CAMPAIGN_TORCH_THREADS)
    subject = resolve_subject(spec).subject
    keep_scenarios_in(scenario_file)
    connection.send(("done", None))  # ready
    while True:
        try:
            request, arguments = connection.recv()
        except EOFError:
            return
        answer = (examine(subject, *arguments[:3], device=device, **arguments[3]) if request == "examine"
                  else original_passes(subject, *arguments, device=device))
        connection.send(("done", answer))


class _Worker:
    """The process that runs one subject's mutants, one after another, started again after
    one of them ended it."""

    def __init__(self, spec: str, device: str):
        self.spec, self.device = spec, device
        self.process: Any = None
        self.connection: Any = None
        self._files = tempfile.TemporaryDirectory(prefix="swafuzz-mutant-")  # removed with this object
        self.scenario_file = Path(self._files.name) / "worker.scenario"

    def ask(self, request: str, arguments: tuple, limit_s: float) -> Any:
        """The worker's answer, or :class:`_Lost` when it ends or overruns ``limit_s``
        (counted from when it is ready: its start-up, imports included, is not the mutant's)."""
        if self.process is None:
            context = multiprocessing.get_context("spawn")  # CUDA cannot be used after fork
            self.connection, theirs = context.Pipe()
            self.process = context.Process(target=_serve, args=(theirs, self.spec, self.device, self.scenario_file),
                                           daemon=True, name="swafuzz-mutant")
            self.process.start()
            theirs.close()
            ready = self._reply(WORKER_START_LIMIT_S)
            if isinstance(ready, _Lost):
                return ready
        self.scenario_file.unlink(missing_ok=True)  # the last request's
        self.connection.send((request, arguments))
        return self._reply(limit_s)

    def _reply(self, limit_s: float) -> Any:
        started = time.monotonic()
        deadline = started + limit_s
        while time.monotonic() < deadline:
            if not self.connection.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                if self.process.is_alive():
                    continue
                if not self.connection.poll():
                    return self._lost(None, started)
            try:
                kind, payload = self.connection.recv()
            except (EOFError, OSError):
                return self._lost(None, started)
            if kind == "done":
                return payload
        return self._lost(f"it did not answer within {limit_s:g} s", started)

    def _lost(self, overran: str | None, started: float) -> _Lost:
        code = self.close()
        scenario = last_scenario(self.scenario_file)
        if overran is not None:
            kind, how = HUNG, f"was ended: {overran}"
        elif code is not None and code < 0:
            kind, how = KILLED, f"was killed by {signal.Signals(-code).name}"
        else:
            kind, how = EXITED, f"exited with status {code}"
        return _Lost(kind, how, scenario and scenario.to_dict(), time.monotonic() - started)

    def close(self) -> int | None:
        """Ends the process; its exit status (negative: the signal that ended it)."""
        if self.process is None:
            return None
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        code = self.process.exitcode
        self.connection.close()
        self.process = self.connection = None
        return code


class _InProcess:
    """The same answers without a worker (``SWAFUZZ_SUPERVISOR=0``, for a debugger)."""

    def __init__(self, spec: str, device: str):
        self.subject, self.device = resolve_subject(spec).subject, device

    def ask(self, request: str, arguments: tuple, limit_s: float) -> Any:
        if request == "examine":
            return examine(self.subject, *arguments[:3], device=self.device, **arguments[3])
        return original_passes(self.subject, *arguments, device=self.device)

    def close(self) -> None:
        pass


def nearest_rank(ordered: list[float], fraction: float) -> float | None:
    """The value of sorted ``ordered`` that ``fraction`` of them are at or below (None if empty)."""
    return ordered[math.ceil(fraction * len(ordered)) - 1] if ordered else None


# ---- a mutation run -----------------------------------------------------------------------------


def search_bound(budget_s: float, max_examples: int | None) -> str:
    """Each mutant's search bound, as a phrase: ``20 s``, or ``20 s or 200 examples``."""
    return f"{budget_s:g} s" + (f" or {max_examples} examples" if max_examples is not None else "")


@dataclass
class MutationReport:
    subject: str
    budget_s: float
    seed: int
    baseline: Outcome  # the unmutated subject's own search
    outcomes: list[Outcome] = field(default_factory=list)
    elapsed_s: float = 0.0
    equivalents_listed: int = 0
    # listed as equivalent, yet killed: the list is wrong about them
    wrongly_listed: list[str] = field(default_factory=list)
    profiles: tuple[str, ...] = PROFILE_ORDER  # each search's, in order
    exclude: tuple[str, ...] = ()  # lifecycle features no search drew
    max_examples: int | None = None  # scenarios per search, at most (None: the budget alone)

    def count(self, status: str) -> int:
        return sum(outcome.status == status for outcome in self.outcomes)

    @property
    def killed_by_profile(self) -> dict[str, int]:
        return {profile: sum(o.status == KILLED_STATUS and o.profile == profile for o in self.outcomes)
                for profile in (REALISTIC, ADVERSARIAL)}

    @property
    def counted(self) -> int:
        """Mutants the kill rate is over: runnable, not judged equivalent, and not surviving
        because nothing reads what their edit changes."""
        return len(self.outcomes) - self.count(NOT_RUNNABLE) - self.count(EQUIVALENT) - self.count(NEVER_READ)

    @property
    def kill_rate(self) -> float | None:
        return self.count(KILLED_STATUS) / self.counted if self.counted else None

    @property
    def times_to_kill(self) -> list[float]:
        return sorted(o.time_to_kill_s for o in self.outcomes if o.status == KILLED_STATUS)

    def time_to_kill(self) -> dict[str, float | None]:
        times = self.times_to_kill
        if not times:
            return {"median_s": None, "p90_s": None, "max_s": None}
        return {"median_s": statistics.median(times), "p90_s": nearest_rank(times, 0.9), "max_s": times[-1]}

    @property
    def survivors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in (SURVIVED, ORIGINAL_DIVERGES)]

    @property
    def passed(self) -> bool:
        """The unmutated subject passed and every mutant that counts was killed."""
        return self.baseline.status == PASSES and not self.survivors

    def diagnosis(self) -> dict[str, Any]:
        """How many kills the diagnosis names a cause for, overall and per operator, and the
        kills it does not (the catch-all's)."""
        killed = [o for o in self.outcomes if o.status == KILLED_STATUS]
        by_operator: dict[str, list[int]] = {}
        for outcome in killed:
            counts = by_operator.setdefault(outcome.mutant.operator, [0, 0])
            counts[0] += outcome.names_a_cause
            counts[1] += 1
        named = sum(o.names_a_cause for o in killed)
        return {"named": named, "killed": len(killed), "share": named / len(killed) if killed else None,
                "by_operator": {op: {"named": n, "killed": k} for op, (n, k) in sorted(by_operator.items())},
                "catch_all": [o.mutant.id for o in killed if not o.names_a_cause]}

    def headline(self) -> str:
        if self.baseline.status == NOT_RUNNABLE:
            return (f"swafuzz mutate: the unmutated {self.subject} cannot be run here, so its mutants make no "
                    f"figures: {self.baseline.sentence}")
        if self.baseline.status != PASSES:
            return (f"swafuzz mutate: the unmutated {self.subject} diverges, so its mutants make no figures "
                    f"({len(self.outcomes)} run)")
        rate = f"{self.kill_rate:.0%}" if self.kill_rate is not None else "-"
        by_profile = ", ".join(f"{profile} {count}" for profile, count in self.killed_by_profile.items())
        named = self.diagnosis()
        return (f"swafuzz mutate: {self.count(KILLED_STATUS)} of {self.counted} mutants of {self.subject} killed "
                f"({rate}; {by_profile}), {len(self.survivors)} survived, {self.count(EQUIVALENT)} equivalent, "
                f"{self.count(NEVER_READ)} never read, "
                f"{self.count(NOT_RUNNABLE)} not runnable, of {len(self.outcomes)} made; the diagnosis names the "
                f"cause of {named['named']} of {named['killed']} kills")

    def scope(self) -> str:
        """The searches, as a phrase: ``realistic, then adversarial``, and the features left out."""
        searched = ", then ".join(self.profiles)
        return searched + (f"; never drawing {', '.join(self.exclude)}" if self.exclude else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "swafuzz-mutants", "subject": self.subject, "budget_s": self.budget_s,
            "max_examples": self.max_examples, "seed": self.seed,
            "elapsed_s": self.elapsed_s, "passed": self.passed, "profiles": list(self.profiles),
            "exclude": list(self.exclude), "unmutated": self.baseline.to_dict(),
            "made": len(self.outcomes), "killed": self.count(KILLED_STATUS), "killed_by_profile": self.killed_by_profile,
            "survived": len(self.survivors), "equivalent": self.count(EQUIVALENT), "never_read": self.count(NEVER_READ),
            "not_runnable": self.count(NOT_RUNNABLE), "counted": self.counted, "kill_rate": self.kill_rate,
            "time_to_kill": self.time_to_kill(), "diagnosis": self.diagnosis(),
            "wrongly_listed_equivalent": self.wrongly_listed,
            "mutants": [outcome.to_dict() for outcome in self.outcomes],
        }

    def markdown(self) -> str:
        times = self.time_to_kill()
        shown = {name: "-" if value is None else f"{value:.2f} s" for name, value in times.items()}
        lines = [f"# Mutants of `{self.subject}`", "", self.headline().removeprefix("swafuzz mutate: ") + ".", "",
                 f"Budget {search_bound(self.budget_s, self.max_examples)} per mutant ({self.scope()}), "
                 f"seed {self.seed}; "
                 f"the unmutated subject {self.baseline.status}.", "",
                 "| figure | value |", "|---|---|"]
        rows = {"made": len(self.outcomes), "killed (realistic)": self.killed_by_profile[REALISTIC],
                "killed (adversarial)": self.killed_by_profile[ADVERSARIAL], "survived": len(self.survivors),
                "equivalent (left out of the rate)": self.count(EQUIVALENT),
                "never read (left out of the rate)": self.count(NEVER_READ), "not runnable": self.count(NOT_RUNNABLE),
                "kill rate": "-" if self.kill_rate is None else f"{self.kill_rate:.1%}",
                "time to kill, median": shown["median_s"], "time to kill, p90": shown["p90_s"],
                "time to kill, max": shown["max_s"]}
        lines += [f"| {name} | {value} |" for name, value in rows.items()]
        if self.baseline.status != PASSES:
            lines += ["", "## The unmutated subject diverges", "", self.baseline.sentence or ""]
        sections = ((SURVIVED, "Survivors"), (ORIGINAL_DIVERGES, "Scenarios the unmutated subject fails too"),
                    (EQUIVALENT, "Equivalent (reviewed)"), (NEVER_READ, "Never read (survivors whose edit changes "
                                                            "only values nothing reads)"),
                    (NOT_RUNNABLE, "Not runnable"))
        for status, title in sections:
            listed = [o for o in self.outcomes if o.status == status]
            if listed:
                lines += ["", f"## {title}", ""]
            for outcome in listed:
                reason = outcome.equivalent_reason or outcome.sentence
                lines += [f"### `{outcome.mutant.id}`", "", f"{outcome.mutant.description}"
                          + (f": {reason}" if reason else "."), "", "```diff", outcome.mutant.diff.rstrip(), "```", ""]
        if self.wrongly_listed:
            lines += ["", "Listed as equivalent but killed: " + ", ".join(f"`{m}`" for m in self.wrongly_listed)]
        killed = [o for o in self.outcomes if o.status == KILLED_STATUS]
        if killed:
            lines += ["", "## Killed", "", "| mutant | profile | time to kill | divergence | cause named |",
                      "|---|---|---|---|---|"]
            lines += [f"| `{o.mutant.id}` | {o.profile} | {o.time_to_kill_s:.2f} s | {o.kind} | "
                      f"{o.cause if o.names_a_cause else 'no (catch-all)'} |" for o in killed]
        return "\n".join(lines).rstrip() + "\n"

    def write(self, directory: Path) -> list[Path]:
        markdown, data = (directory / name for name in REPORT_FILES)
        return [write_atomically(markdown, self.markdown()),
                write_atomically(data, json.dumps(self.to_dict(), indent=2) + "\n")]


def load_equivalents(path: str | os.PathLike) -> dict[str, str]:
    """A reviewed list of equivalent mutants: a JSON object of mutant id to the reason."""
    name = describe_path(path)
    data = parse_json(read_regular_file(path, "list of equivalent mutants"), name)
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InputError(f"{name}: expected a JSON object of mutant id to the reason it is equivalent, "
                         f"got {show(data)}")
    return data


def builtin_equivalents(subject: str) -> dict[str, str]:
    lists = json.loads(BUILTIN_EQUIVALENTS.read_text(encoding="utf-8"))
    return lists.get(subject, {})


def mutate(spec: str, *, budget_s: float = MUTANT_BUDGET_S, max_examples: int | None = None, seed: int = 0,
           device: str = "cpu", equivalents: dict[str, str] | None = None, operators: tuple[str, ...] | None = None,
           profiles: tuple[str, ...] = PROFILE_ORDER, exclude: frozenset[str] = frozenset(),
           isolated: bool | None = None, on_outcome: Callable[[int, int, Outcome], None] | None = None,
           ) -> MutationReport:
    """Fuzz the unmutated subject ``spec``, then each of its mutants (see the module's text).

    An ``sglang:<target>[@<version>]`` is mutated in the SGLang functions its binding runs,
    each mutant the tree with one edit (:func:`tree_mutant_subject`).
    ``profiles`` share each search's budget, and its ``max_examples`` where given, in their
    order; a search stops at whichever of the two it reaches first. ``exclude`` names
    lifecycle features no search draws (the scope the subject is meant to be right on).
    ``equivalents`` (mutant id to reason) defaults to the reviewed list of a built-in subject
    or SGLang target. ``isolated`` (default: unless ``SWAFUZZ_SUPERVISOR=0``) runs them in a
    worker process. ``on_outcome(number, total, outcome)`` sees each mutant's outcome as it
    comes."""

    started = time.monotonic()
    if not profiles or any(profile not in PROFILE_ORDER for profile in profiles):
        raise InputError(f"profiles must be some of {', '.join(PROFILE_ORDER)}, got {show(profiles)}")
    info = resolve_subject(spec)
    if equivalents is None:
        equivalents = builtin_equivalents(info.name) if info.kind in ("builtin", "sglang") else {}
    if info.kind == "sglang":
        mutants = derive_tree_mutants(spec, info.subject.binding, operators)
    else:
        mutants = derive_mutants(info.subject, operators)
    if not mutants:  # a figure over no mutants would pass a search nothing has measured
        raise InputError(f"no mutants of {show(spec)}: its source cannot be read, or no operator "
                         f"({', '.join(operators or OPERATORS)}) applies to it")
    if isolated is None:
        isolated = os.environ.get(SUPERVISOR_SWITCH_ENV, "1") != "0"
    runner = (_Worker if isolated else _InProcess)(spec, device)
    try:
        search = {"profiles": tuple(profiles), "exclude": frozenset(exclude), "max_examples": max_examples}
        baseline = _outcome(runner, None, budget_s, seed, search)
        report = MutationReport(spec, budget_s, seed, baseline, equivalents_listed=len(equivalents),
                                profiles=tuple(profiles), exclude=tuple(sorted(exclude)), max_examples=max_examples)
        if baseline.status == PASSES:
            for number, mutant in enumerate(mutants, 1):
                outcome = _outcome(runner, mutant, budget_s, seed, search)
                if outcome.status == SURVIVED and mutant.id in equivalents:
                    outcome.status, outcome.equivalent_reason = EQUIVALENT, equivalents[mutant.id]
                elif outcome.status == SURVIVED and mutant.never_read:
                    outcome.status, outcome.sentence = NEVER_READ, mutant.never_read
                elif outcome.status == KILLED_STATUS and mutant.id in equivalents:
                    report.wrongly_listed.append(mutant.id)
                report.outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(number, len(mutants), outcome)
    finally:
        runner.close()
    report.elapsed_s = time.monotonic() - started
    return report


def _outcome(runner: _Worker | _InProcess, mutant: Mutant | None, budget_s: float, seed: int,
             search: dict[str, Any]) -> Outcome:
    answer = runner.ask("examine", (mutant, budget_s, seed, search), budget_s + WORKER_GRACE_S)
    if not isinstance(answer, _Lost):
        return answer
    sentence = f"The process running it {answer.how}"
    lost = Outcome(mutant, DIVERGES, kind=answer.kind, sentence=sentence, scenario=answer.scenario,
                   time_to_kill_s=answer.elapsed_s, elapsed_s=answer.elapsed_s)
    if mutant is None:
        return lost
    if answer.scenario is None:
        return dataclasses.replace(lost, status=NOT_RUNNABLE, sentence=f"{sentence} before it ran a scenario",
                                   kind=None, time_to_kill_s=None)
    passes = runner.ask("check", (answer.scenario,), CHECK_LIMIT_S)
    lost.status = KILLED_STATUS if passes is True else ORIGINAL_DIVERGES
    return lost
