"""Where a tree's own code calls a target, and in which forward modes.

A target's verdict holds for the forward modes in which the engine calls it, and those are
read off the tree itself, not off a table per release: every call of the target's entry
method (:attr:`Target.called_as`) in the files of :data:`CALLER_FILES`; the conditions of the
``if`` statements (and conditional expressions) around the call, with each local name they
use replaced by what the function assigned it; and, for a call inside a method that its own
file calls (``self.method(...)``), the modes at those calls in turn. A method no file read
calls is an entry of the engine's and is taken as reached in every mode.

A condition is read as a formula over three kinds of atom:

- the forward mode's predicates (``forward_batch.forward_mode.is_decode_or_idle()``), each
  evaluated per mode from the tree's own ``ForwardMode`` methods;
- the run's engine switches (``envs.NAME.get()`` of a switch in the run's settings: one of
  :data:`.switches.SWITCHES` the tree declares, or one the run sets), directly or through a
  small function of the tree that returns one (``is_unified_kv_fp8()``), which is read in
  turn;
- anything else (a device check, a model flag, ``x is not None``, an environment variable
  the run leaves to the deployment), which may be either.

A call site reaches a mode when some choice of the unknowns makes its condition hold in that
mode; the same text is the same unknown wherever it appears, so ``unified and fuse_verify``
followed by ``elif unified:`` is read as the exclusive branches they are. Where the tree
cannot be read so (a file or ``ForwardMode`` that is not there, no call site, a condition
with too many unknowns), the reading is *unconfirmed*, says why, and the driver keeps every
mode it models.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Iterator

from ...api import ForwardMode
from .locate import SourceTree
from .switches import SwitchSettings
from ...errors import Unreadable

PACKAGE = "sglang/srt/"
MODEL_FILE = "sglang/srt/models/deepseek_v4.py"
CALLER_FILES = (
    MODEL_FILE,
    "sglang/srt/layers/attention/deepseek_v4_backend.py",
    "sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py",
)
# the DSpark draft model of DeepSeek-V4 (0.5.16+): its draft blocks store through the
# backend's getters from this file alone, and no code of CALLER_FILES runs in them
DSPARK_MODEL_FILE = "sglang/srt/models/deepseek_v4_dspark.py"
FORWARD_MODE_FILE = "sglang/srt/model_executor/forward_batch_info.py"

# swafuzz's modes as SGLang's ForwardMode members: a multi-step draft runs DECODE forwards;
# draft extend is DRAFT_EXTEND, or DRAFT_EXTEND_V2 where a tree has only that; a DSpark
# draft block is a TARGET_VERIFY forward of the draft model
MODE_MEMBERS: dict[ForwardMode, tuple[str, ...]] = {
    ForwardMode.DECODE: ("DECODE",),
    ForwardMode.DRAFT_DECODE: ("DECODE",),
    ForwardMode.IDLE: ("IDLE",),
    ForwardMode.TARGET_VERIFY: ("TARGET_VERIFY",),
    ForwardMode.EXTEND: ("EXTEND",),
    ForwardMode.DRAFT_EXTEND: ("DRAFT_EXTEND", "DRAFT_EXTEND_V2"),
    ForwardMode.DRAFT_BLOCK: ("TARGET_VERIFY",),
}
# the modes whose forwards run the code of each file read: the DSpark draft model's, and
# DeepSeek-V4's (CALLER_FILES)
DSPARK_MODES = frozenset({ForwardMode.DRAFT_BLOCK})
MODEL_MODES = frozenset(MODE_MEMBERS) - DSPARK_MODES
MAX_UNKNOWNS = 32  # a condition with more is not one this reading can vouch for
MAX_DEPTH = 4  # functions read through to find a switch, callers followed up


# ---- formulas ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Atom:
    kind: str  # "mode" (a ForwardMode predicate) or "unknown"
    key: str  # the predicate's name, or the unknown's source text


# a formula: True/False, an Atom, or ("not", f), ("and", f, g), ("or", f, g)
Formula = object


def _not(f: Formula) -> Formula:
    return (not f) if isinstance(f, bool) else ("not", f)


def _and(f: Formula, g: Formula) -> Formula:
    if f is False or g is False:
        return False
    return g if f is True else f if g is True else ("and", f, g)


def _or(f: Formula, g: Formula) -> Formula:
    if f is True or g is True:
        return True
    return g if f is False else f if g is False else ("or", f, g)


def _atoms(f: Formula) -> Iterator[Atom]:
    if isinstance(f, Atom):
        yield f
    elif isinstance(f, tuple):
        for part in f[1:]:
            yield from _atoms(part)


def _assign(f: Formula, values: dict[Atom, bool]) -> Formula:
    """``f`` with the atoms of ``values`` replaced by them, simplified."""
    if isinstance(f, bool):
        return f
    if isinstance(f, Atom):
        return values.get(f, f)
    if f[0] == "not":
        return _not(_assign(f[1], values))
    combine = _and if f[0] == "and" else _or
    return combine(_assign(f[1], values), _assign(f[2], values))


def _satisfiable(f: Formula) -> bool:
    """Whether some choice of ``f``'s atoms makes it true (each atom tried both ways, the
    formula simplified after each choice, which keeps the conditions of one function small)."""
    if isinstance(f, bool):
        return f
    atom = next(_atoms(f))
    return _satisfiable(_assign(f, {atom: True})) or _satisfiable(_assign(f, {atom: False}))


# ---- what a call site reaches ---------------------------------------------------------------


@dataclass(frozen=True)
class CallSite:
    path: str  # relative to sglang/srt/
    function: str  # Class.method
    line: int
    guards: tuple[str, ...]  # the conditions around the call, as written
    modes: frozenset[ForwardMode]

    def describe(self, with_modes: bool = True) -> str:
        where = f"{self.path}:{self.function} line {self.line}"
        when = f" when {' and '.join(f'`{g}`' for g in self.guards)}" if self.guards else ""
        return f"{where}{when}" + (f" ({_mode_names(self.modes)})" if with_modes else "")


@dataclass(frozen=True)
class Reading:
    """What the tree says of the calls of ``called_as`` under one run's switches."""

    called_as: tuple[str, ...]
    sites: tuple[CallSite, ...]
    unconfirmed: str | None = None  # why the reading is not to be trusted, if it is not

    @property
    def modes(self) -> frozenset[ForwardMode] | None:
        """The modes some call site reaches; None when unconfirmed (every mode modelled)."""
        if self.unconfirmed is not None:
            return None
        return frozenset().union(*(site.modes for site in self.sites))

    def describe(self) -> str:
        names = " or ".join(self.called_as)
        if self.unconfirmed is not None:
            return f"reachability unconfirmed: {self.unconfirmed}"
        several = len(self.sites) > 1
        return (f"{names} is called in {_mode_names(self.modes)} forwards, from "
                + "; ".join(site.describe(with_modes=several) for site in self.sites))

    def to_dict(self) -> dict:
        return {
            "called_as": list(self.called_as),
            "modes": None if self.modes is None else sorted(mode.value for mode in self.modes),
            "unconfirmed": self.unconfirmed,
            "sites": [{"path": s.path, "function": s.function, "line": s.line, "guards": list(s.guards),
                       "modes": sorted(mode.value for mode in s.modes)} for s in self.sites],
        }


def _mode_names(modes: frozenset[ForwardMode]) -> str:
    named = [mode.value for mode in ForwardMode if mode in modes]
    return ", ".join(named) if named else "no forward mode"


def read(tree: SourceTree, called_as: tuple[str, ...], switches: SwitchSettings) -> Reading:
    """The call sites of ``called_as`` in ``tree`` and the modes each reaches under ``switches``."""
    try:
        return _Reader(tree, switches).read(called_as)
    except Unreadable as exc:
        return Reading(called_as, (), unconfirmed=str(exc))


class _Reader:
    context: type[_Context]  # how a condition is read (set below, once _Context is defined)

    def __init__(self, tree: SourceTree, switches: SwitchSettings):
        self.tree = tree
        self.switches = switches
        self.members, self.predicates = _mode_predicates(tree)
        self.modules: dict[str, ast.Module | None] = {}
        self.reached_memo: dict[tuple[str, str], frozenset[ForwardMode]] = {}
        self.unconfirmed: list[str] = []

    def read(self, called_as: tuple[str, ...]) -> Reading:
        sites = []
        for path in (*CALLER_FILES, DSPARK_MODEL_FILE):
            module = self._module(path)
            if module is None:
                continue
            for function, call in _calls(module, set(called_as)):
                if function.name in called_as:
                    continue  # the target calling itself (a fallback, a retry) is no caller
                sites.append(self._site(path, module, function, call))
        if not any(site.path != DSPARK_MODEL_FILE.removeprefix(PACKAGE) for site in sites):
            raise Unreadable(f"no call of {' or '.join(called_as)} in "
                             + ", ".join(p.removeprefix(PACKAGE) for p in CALLER_FILES))
        unconfirmed = "; ".join(dict.fromkeys(self.unconfirmed)) or None
        return Reading(called_as, tuple(sites), unconfirmed)

    def _module(self, path: str) -> ast.Module | None:
        if path not in self.modules:
            text = self.tree.read(path)
            self.modules[path] = None if text is None else _parsed(text)
        return self.modules[path]

    def _site(self, path: str, module: ast.Module, function: ast.FunctionDef, call: ast.Call) -> CallSite:
        guards, condition = self._condition(path, module, function, call)
        modes = self._modes(condition, f"{path}:{call.lineno}", _domain(path)) & self._reached(path, module, function, 0)
        return CallSite(path.removeprefix(PACKAGE), _qualname(function), call.lineno, guards, modes)

    def _reached(self, path: str, module: ast.Module, function: ast.FunctionDef, depth: int) -> frozenset[ForwardMode]:
        """The modes in which ``function`` runs: where its file calls it, else every mode."""
        key = (path, _qualname(function))
        if key in self.reached_memo:
            return self.reached_memo[key]
        every = _domain(path)
        self.reached_memo[key] = every  # a call cycle adds nothing
        callers = [] if depth >= MAX_DEPTH else [
            (caller, call) for caller, call in _calls(module, {function.name})
            if _is_self_call(call) and _same_class(caller, function) and caller is not function]
        if callers:
            reached = frozenset().union(*(
                self._modes(self._condition(path, module, caller, call)[1], f"{path}:{call.lineno}", every)
                & self._reached(path, module, caller, depth + 1)
                for caller, call in callers))
        else:
            reached = every
        self.reached_memo[key] = reached
        return reached

    def _modes(self, condition: Formula, where: str, domain: frozenset[ForwardMode]) -> frozenset[ForwardMode]:
        """The modes of ``domain`` in which ``condition`` can hold."""
        unknowns = {a for a in _atoms(condition) if a.kind == "unknown"}
        if len(unknowns) > MAX_UNKNOWNS:
            self.unconfirmed.append(f"the condition at {where.removeprefix(PACKAGE)} has {len(unknowns)} unknowns")
            return domain
        reached = set()
        for mode in domain:
            fixed = {atom: self._mode_value(mode, atom) for atom in _atoms(condition) if atom.kind == "mode"}
            if _satisfiable(_assign(condition, fixed)):
                reached.add(mode)
        return frozenset(reached)

    def _mode_value(self, mode: ForwardMode, atom: Atom) -> bool:
        if atom.key.startswith("=="):
            return atom.key == f"=={self.members[mode]}"
        return self.predicates[mode][atom.key]

    # ---- a call's condition within its function ----

    def _condition(self, path: str, module: ast.Module, function: ast.FunctionDef,
                   call: ast.AST) -> tuple[tuple[str, ...], Formula]:
        guards: list[str] = []
        condition: Formula = True
        context = self.context(self, path, module, function, call.lineno)
        child, node = call, call.parent
        while node is not None:
            test, holds = None, True
            if isinstance(node, ast.If) and child is not node.test:
                test, holds = node.test, child in node.body
            elif isinstance(node, ast.IfExp) and child is not node.test:
                test, holds = node.test, child is node.body
            elif isinstance(node, ast.While) and child is not node.test and child in node.body:
                test = node.test
            # an earlier `if cond: return` in the same block leaves the rest under not cond
            left = [earlier.test for earlier in _earlier_statements(node, child) if isinstance(earlier, ast.If)
                    and not earlier.orelse and _leaves(earlier.body)] if isinstance(child, ast.stmt) else []
            for test_passed, holding in [(test, holds)] * (test is not None) + [(t, False) for t in left]:
                read = context.formula(test_passed)
                condition = _and(condition, read if holding else _not(read))
                guards.append(ast.unparse(test_passed) if holding else f"not ({ast.unparse(test_passed)})")
            if node is function:
                break
            child, node = node, node.parent
        return tuple(reversed(guards)), condition


class _Context:
    """Reads an expression of one function, at one line, as a formula."""

    def __init__(self, reader: _Reader, path: str, module: ast.Module, function: ast.FunctionDef,
                 line: int, depth: int = 0):
        self.reader, self.path, self.module, self.function = reader, path, module, function
        self.line, self.depth = line, depth
        self.resolving: set[str] = set()

    def formula(self, node: ast.expr) -> Formula:
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BoolOp):
            combine = _and if isinstance(node.op, ast.And) else _or
            result = self.formula(node.values[0])
            for value in node.values[1:]:
                result = combine(result, self.formula(value))
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _not(self.formula(node.operand))
        if isinstance(node, ast.IfExp):
            test = self.formula(node.test)
            return _or(_and(test, self.formula(node.body)), _and(_not(test), self.formula(node.orelse)))
        if isinstance(node, ast.Name):
            return self._local(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and self._is_forward_mode(node.left)
                and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
                and _member_name(node.comparators[0]) is not None):
            same = Atom("mode", f"=={_member_name(node.comparators[0])}")
            return same if isinstance(node.ops[0], (ast.Eq, ast.Is)) else _not(same)
        return Atom("unknown", ast.unparse(node))

    def _is_forward_mode(self, node: ast.expr) -> bool:
        """``forward_batch.forward_mode``, or a local assigned it."""
        if _is_forward_mode(node):
            return True
        if isinstance(node, ast.Name):
            assigned = _assignments(self.function, node.id, self.line)
            return len(assigned) == 1 and _is_forward_mode(assigned[0])
        return False

    def _local(self, node: ast.Name) -> Formula:
        assigned = _assignments(self.function, node.id, self.line)
        if len(assigned) != 1 or node.id in self.resolving:
            return Atom("unknown", node.id)
        self.resolving.add(node.id)
        try:
            return self.formula(assigned[0])
        finally:
            self.resolving.discard(node.id)

    def _call(self, node: ast.Call) -> Formula:
        func = node.func
        if isinstance(func, ast.Attribute) and self._is_forward_mode(func.value):
            if not _default_arguments(node):
                return Atom("unknown", ast.unparse(node))
            if func.attr not in self.reader.predicates[ForwardMode.DECODE]:
                raise Unreadable(f"ForwardMode in {FORWARD_MODE_FILE.removeprefix(PACKAGE)} has no "
                                 f"plain predicate {func.attr}(), which {_qualname(self.function)} calls")
            return Atom("mode", func.attr)
        switch = _switch_read(node)
        if switch is not None and self.reader.switches.get(switch) is not None:
            return self.reader.switches.get(switch)
        if isinstance(func, ast.Name) and not node.args and not node.keywords and self.depth < MAX_DEPTH:
            returned = self._returned_by(func.id)
            if returned is not None:
                return returned
        return Atom("unknown", ast.unparse(node))

    def _returned_by(self, name: str) -> Formula | None:
        """What a function of the tree that ``name`` names returns, where it is a chain of
        ``if test: return value`` ending in ``return value``; None where it is not."""
        found = _imported_function(self.reader, self.path, self.module, self.function, name)
        if found is None:
            return None
        path, module, function = found
        inner = type(self)(self.reader, path, module, function, function.end_lineno or 0, self.depth + 1)
        return inner._returns(_without_docstring(function.body))

    def _returns(self, body: list[ast.stmt]) -> Formula | None:
        if not body:
            return None
        first, rest = body[0], body[1:]
        if isinstance(first, ast.Return) and first.value is not None:
            return self.formula(first.value)
        if isinstance(first, ast.If) and not first.orelse and _leaves(first.body):
            then, otherwise = self._returns(first.body), self._returns(rest)
            if then is None or otherwise is None:
                return None
            test = self.formula(first.test)
            return _or(_and(test, then), _and(_not(test), otherwise))
        if isinstance(first, ast.Expr):  # a log line, a docstring
            return self._returns(rest)
        return None


_Reader.context = _Context


def _domain(path: str) -> frozenset[ForwardMode]:
    """The modes whose forwards run the code of ``path``."""
    return DSPARK_MODES if path == DSPARK_MODEL_FILE else MODEL_MODES


# ---- the tree's ForwardMode ---------------------------------------------------------------------


def _mode_predicates(tree: SourceTree) -> tuple[dict[ForwardMode, str], dict[ForwardMode, dict[str, bool]]]:
    """The ForwardMode member of each swafuzz mode, and each of ForwardMode's predicates
    (``is_decode_or_idle()``, called without arguments) per mode, read from the tree's
    ForwardMode class."""
    text = tree.read(FORWARD_MODE_FILE)
    if text is None:
        raise Unreadable(f"the tree has no {FORWARD_MODE_FILE.removeprefix(PACKAGE)}, so no ForwardMode")
    enum = next((node for node in ast.parse(text).body
                 if isinstance(node, ast.ClassDef) and node.name == "ForwardMode"), None)
    if enum is None:
        raise Unreadable(f"{FORWARD_MODE_FILE.removeprefix(PACKAGE)} defines no ForwardMode")
    members = {target.id for statement in enum.body if isinstance(statement, ast.Assign)
               for target in statement.targets if isinstance(target, ast.Name)}
    methods = {node.name: node for node in enum.body if isinstance(node, ast.FunctionDef)}
    chosen, predicates = {}, {}
    for mode, candidates in MODE_MEMBERS.items():
        member = next((name for name in candidates if name in members), None)
        if member is None:
            raise Unreadable(f"ForwardMode has none of {', '.join(candidates)} (swafuzz's {mode.value} forwards)")
        evaluate = _MemberPredicates(methods, member)
        chosen[mode] = member
        predicates[mode] = {name: value for name in methods
                            if (value := evaluate.predicate(name)) is not None}
    return chosen, predicates


class _MemberPredicates:
    """Evaluates ForwardMode's methods for one member: comparisons of ``self`` with members,
    calls of other predicates, and boolean operators over them; arguments at their defaults."""

    def __init__(self, methods: dict[str, ast.FunctionDef], member: str):
        self.methods, self.member = methods, member
        self.evaluating: set[str] = set()

    def predicate(self, name: str) -> bool | None:
        method = self.methods[name]
        body = _without_docstring(method.body)
        if name in self.evaluating or len(body) != 1 or not isinstance(body[0], ast.Return):
            return None
        self.evaluating.add(name)
        try:
            return self._value(body[0].value, _parameter_defaults(method))
        finally:
            self.evaluating.discard(name)

    def _value(self, node: ast.expr | None, parameters: dict[str, object]) -> bool | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and isinstance(parameters.get(node.id), bool):
            return parameters[node.id]
        if isinstance(node, ast.BoolOp):
            values = [self._value(value, parameters) for value in node.values]
            if None in values:
                return None
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            value = self._value(node.operand, parameters)
            return None if value is None else not value
        if isinstance(node, ast.IfExp):
            test = self._value(node.test, parameters)
            return None if test is None else self._value(node.body if test else node.orelse, parameters)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_self(node.func.value)
                and node.func.attr in self.methods and not node.args and not node.keywords):
            return self.predicate(node.func.attr)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and _is_self(node.left):
            op, right = node.ops[0], node.comparators[0]
            if isinstance(op, (ast.Eq, ast.NotEq)) and _member_name(right) is not None:
                return (_member_name(right) == self.member) == isinstance(op, ast.Eq)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                names = [_member_name(element) for element in right.elts]
                if None not in names:
                    return (self.member in names) == isinstance(op, ast.In)
        return None


# ---- small readings of the syntax ---------------------------------------------------------------


# CPython hands every parsed tree the same instances of these context and operator nodes: a
# ``parent`` on one would tie every tree in the process (the binder's too) to this one
_SHARED_NODES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> ast.Module:
    """The module with each node's ``parent``, its calls by name (``calls``) and each
    function's bindings by name (``bindings``): read once per text, as every target and
    switch setting reads the same few files."""
    module = ast.parse(text)
    module.parent = None
    module.calls = {}
    for node in ast.walk(module):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _SHARED_NODES):
                child.parent = node
    for node in ast.walk(module):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            function = _enclosing_function(node)
            if name is not None and function is not None:
                module.calls.setdefault(name, []).append((function, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.bindings = {}
    for node in ast.walk(module):
        function = None if isinstance(node, (ast.Module, *_SHARED_NODES)) else _enclosing_function(node)
        if function is None:
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                simple = isinstance(target, ast.Name)
                for name in {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}:
                    function.bindings.setdefault(name, []).append((node.lineno, node.value if simple else None))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            value = node.value if isinstance(node, ast.AnnAssign) else None
            if isinstance(node.target, ast.Name):
                function.bindings.setdefault(node.target.id, []).append((node.lineno, value))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if isinstance(item.optional_vars, ast.Name):
                    function.bindings.setdefault(item.optional_vars.id, []).append((node.lineno, None))
    return module


def _enclosing_function(node: ast.AST) -> ast.FunctionDef | None:
    node = node.parent
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node = node.parent
    return node


def _calls(module: ast.Module, names: set[str]) -> Iterator[tuple[ast.FunctionDef, ast.Call]]:
    """Every call of a method or function named in ``names``, with the function it is in."""
    for name in sorted(names):
        yield from module.calls.get(name, ())


def _qualname(function: ast.FunctionDef) -> str:
    parts, node = [function.name], function.parent
    while node is not None:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(node.name)
        node = node.parent
    return ".".join(reversed(parts))


def _owner_class(function: ast.FunctionDef) -> ast.ClassDef | None:
    return function.parent if isinstance(function.parent, ast.ClassDef) else None


def _same_class(caller: ast.FunctionDef, function: ast.FunctionDef) -> bool:
    owner = _owner_class(function)
    node = caller
    while node is not None and node is not owner:
        node = node.parent
    return owner is not None and node is owner


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_self_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and _is_self(call.func.value)


def _is_forward_mode(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "forward_mode"


def _default_arguments(call: ast.Call) -> bool:
    return not call.args and not call.keywords


def _member_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ForwardMode":
        return node.attr
    return None


def _switch_read(call: ast.Call) -> str | None:
    """NAME of ``envs.NAME.get()``."""
    func = call.func
    if (isinstance(func, ast.Attribute) and func.attr == "get" and not call.args
            and isinstance(func.value, ast.Attribute) and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "envs"):
        return func.value.attr
    return None


def _parameter_defaults(method: ast.FunctionDef) -> dict[str, object]:
    arguments = method.args
    positional = arguments.posonlyargs + arguments.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(arguments.defaults):]], arguments.defaults))
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
    return {name: node.value for name, node in defaults.items() if isinstance(node, ast.Constant)}


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def _leaves(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


def _earlier_statements(block_owner: ast.AST, statement: ast.stmt) -> list[ast.stmt]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(block_owner, field, None)
        if isinstance(block, list) and statement in block:
            return block[: block.index(statement)]
    return []


def _assignments(function: ast.FunctionDef, name: str, before_line: int) -> list[ast.expr]:
    """The values ``name`` is assigned in ``function`` (not in a function nested in it) before
    ``before_line``; empty where any binding of it is not a plain ``name = value`` (a loop
    variable, an unpacking, an augmented assignment) or it is a parameter: an unknown."""
    arguments = function.args
    if name in {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}:
        return []
    bindings = [(line, value) for line, value in function.bindings.get(name, ()) if line < before_line]
    if any(value is None for _, value in bindings):
        return []
    return [value for _, value in bindings]


def _imported_function(reader: _Reader, path: str, module: ast.Module, function: ast.FunctionDef,
                       name: str) -> tuple[str, ast.Module, ast.FunctionDef] | None:
    """The function ``name`` means in ``function``: one defined at the top of its file, or
    one imported (in the function or at the top) from another file of the tree."""
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return path, module, node
    imports = [node for node in ast.walk(function) if isinstance(node, ast.ImportFrom)]
    imports += [node for node in module.body if isinstance(node, ast.ImportFrom)]
    for statement in imports:
        for alias in statement.names:
            if (alias.asname or alias.name) != name or not (statement.module or "").startswith("sglang"):
                continue
            other = statement.module.replace(".", "/") + ".py"
            found = reader._module(other)
            if found is None:
                return None
            for node in found.body:
                if isinstance(node, ast.FunctionDef) and node.name == alias.name:
                    return other, found, node
            return None
    return None
