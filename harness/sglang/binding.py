"""Binding real SGLang functions so that they run on stand-in objects.

Two modes give the same result, a table of plain functions:

- ``import``: import the module from an installed ``sglang`` and take the class's real
  (unbound) functions. Each is re-created over a copy of its module's globals in which
  the names a target replaces (the key-store kernel, the metadata class its ``isinstance``
  checks test) point at stand-ins, so nothing outside the function is patched.
- ``source``: parse the file, take only the ``def`` statements asked for (and the field
  names of a dataclass), and compile each against torch and the target's stand-ins. No
  SGLang module is executed, so GPU-only dependencies never load.

Binding checks what it can before anything runs: the file, class and method exist, every
global name a compiled function uses has a value, every ``self.<name>`` a method reads is a
bound method or an attribute of the stand-in, and any parameter the target relies on is
there. A failure raises :class:`BindError` naming what is missing and where.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import importlib
import importlib.util
import inspect
import linecache
import symtable
import sys
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from ..executor import SubjectError
from .locate import SourceTree

MODES = ("source", "import")
# the global through which a function's deferred SGLang imports reach the stand-ins
LOCAL_IMPORTS = "__swafuzz_stand_ins__"


class BindError(SubjectError):
    """A target cannot be bound from this SGLang source."""


class ImportModeUnavailable(BindError):
    """The installed package cannot be imported (its GPU-only dependencies are missing)."""


@dataclass(frozen=True)
class ClassCode:
    """Methods to take from one class; ``role`` names the stand-in they run on."""

    path: str  # inside the package: "sglang/srt/..."
    name: str
    methods: tuple[str, ...] = ()
    role: str | None = None
    dataclass_fields: bool = False  # also rebuild the class from its field list
    parameters: dict[str, str] = field(default_factory=dict)  # method -> a parameter it must take

    @property
    def module(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")


@dataclass(frozen=True)
class FunctionCode:
    """A module-level helper that bound methods call by name."""

    path: str
    name: str

    @property
    def module(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")


@dataclass
class BoundClass:
    name: str
    methods: dict[str, types.FunctionType]
    fields: tuple[str, ...] = ()
    real: type | None = None  # the imported class itself (import mode)

    def build(self, base: type) -> type:
        """A class that runs the bound methods: the real dataclass in import mode, else a
        dataclass rebuilt from the field names, else ``base`` with the methods added."""
        if self.real is not None and self.fields:
            return self.real
        if self.fields:
            return dataclasses.make_dataclass(
                self.name, [(name, Any, dataclasses.field(default=None)) for name in self.fields],
                namespace=dict(self.methods),
            )
        return type(self.name, (base,), dict(self.methods))


@dataclass
class Binding:
    """Everything one target needs from one SGLang source."""

    label: str  # "sglang 0.5.14 wheel (source mode)"
    version: str | None
    mode: str
    classes: dict[str, BoundClass]
    functions: dict[str, types.FunctionType] = field(default_factory=dict)  # the FunctionCode items


def bind(
    tree: SourceTree,
    code: tuple[ClassCode | FunctionCode, ...],
    stand_ins: dict[str, Any],
    stand_in_attributes: dict[str, frozenset[str]],
    mode: str = "source",
) -> Binding:
    """Bind ``code`` from ``tree``.

    ``stand_ins`` are the global names the functions get instead of SGLang's (source mode
    gets only these, torch and builtins); ``stand_in_attributes`` lists, per role, the
    attributes the stand-in object carries.
    """
    if mode not in MODES:
        raise BindError(f"unknown binding mode {mode!r}; modes are {', '.join(MODES)}")
    label = f"{tree.label} ({mode} mode)"
    binder = _SourceBinder(tree, label, stand_ins) if mode == "source" else _ImportBinder(label, stand_ins)
    helpers: dict[str, types.FunctionType] = {}
    for item in code:
        if isinstance(item, FunctionCode):
            # in order, so that a helper may call the helpers listed before it
            helpers[item.name] = binder.function(item)
            binder.add_helpers({item.name: helpers[item.name]})
    classes: dict[str, BoundClass] = {}
    for item in code:
        if isinstance(item, ClassCode):
            bound = binder.bound_class(item)
            if item.role is not None:
                _check_self_reads(label, item, bound, stand_in_attributes[item.role])
            classes[item.name] = bound
    return Binding(label, tree.version, mode, classes, helpers)


# ---- source mode ---------------------------------------------------------------------------


class _SourceBinder:
    def __init__(self, tree: SourceTree, label: str, stand_ins: dict[str, Any]):
        import torch

        self.tree = tree
        self.label = label
        self.stand_ins = stand_ins
        self.namespace: dict[str, Any] = {
            "torch": torch, "__name__": "swafuzz_sglang_bound", LOCAL_IMPORTS: stand_ins, **stand_ins,
        }
        self.modules: dict[str, ast.Module] = {}

    def add_helpers(self, helpers: dict[str, Callable]) -> None:
        self.namespace.update(helpers)

    def function(self, item: FunctionCode) -> types.FunctionType:
        module = self._module(item.path, f"{item.name}()")
        node = _find(module.body, ast.FunctionDef, item.name)
        if node is None:
            raise BindError(f"{self.label}: {item.path} has no function {item.name}()")
        return self._compile(item.path, node, item.name)

    def bound_class(self, item: ClassCode) -> BoundClass:
        module = self._module(item.path, f"{item.name}.{(item.methods or ('',))[0]}")
        class_node = _find(module.body, ast.ClassDef, item.name)
        if class_node is None:
            raise BindError(f"{self.label}: {item.path} has no class {item.name}")
        methods = {}
        for name in item.methods:
            node = _find(class_node.body, ast.FunctionDef, name)
            if node is None:
                raise BindError(f"{self.label}: {item.name} has no method {name}() (in {item.path})")
            arguments = node.args
            _require_parameter(self.label, item, name, [
                a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            ])
            methods[name] = self._compile(item.path, node, f"{item.name}.{name}")
        fields = _dataclass_fields(class_node) if item.dataclass_fields else ()
        if item.dataclass_fields and not fields:
            raise BindError(f"{self.label}: {item.name} declares no dataclass fields (in {item.path})")
        return BoundClass(item.name, methods, fields)

    def _module(self, path: str, wanted: str) -> ast.Module:
        if path not in self.modules:
            text = self.tree.read(path)
            if text is None:
                raise BindError(f"{self.label} has no file {path}, so no {wanted}")
            filename = self.tree.location(path)
            # tracebacks through bound code then show SGLang's own lines
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            self.modules[path] = ast.parse(text, filename=filename)
        return self.modules[path]

    def _compile(self, path: str, node: ast.FunctionDef, qualname: str) -> types.FunctionType:
        if node.decorator_list:
            decorators = ", ".join(ast.unparse(d) for d in node.decorator_list)
            raise BindError(f"{self.label}: {qualname} is decorated ({decorators}); only plain functions bind")
        node = _without_annotations(node)
        node = self._local_imports_from_stand_ins(path, node, qualname)
        missing = sorted(
            name for name in _global_names(node)
            if name not in self.namespace and not hasattr(builtins, name)
        )
        if missing:
            raise BindError(
                f"{self.label}: {qualname} uses {', '.join(missing)}, which swafuzz has no "
                f"stand-in for"
            )
        code = compile(ast.Module(body=[node], type_ignores=[]), self.tree.location(path), "exec")
        defined: dict[str, Any] = {}
        exec(code, self.namespace, defined)  # runs the def statement only
        function = defined[node.name]
        function.__qualname__ = qualname
        function.swafuzz_source = node  # for the self-attribute check
        return function


    def _local_imports_from_stand_ins(self, path: str, node: ast.FunctionDef, qualname: str) -> ast.FunctionDef:
        """``from sglang... import name`` inside a function (SGLang defers GPU-only imports
        that way) takes ``name`` from the stand-ins when the function runs."""
        stand_ins, label = self.stand_ins, self.label

        class Rewrite(ast.NodeTransformer):
            def visit_ImportFrom(self, statement: ast.ImportFrom):
                if not (statement.module or "").startswith("sglang"):
                    return statement
                assignments = []
                for alias in statement.names:
                    if alias.name not in stand_ins:
                        raise BindError(
                            f"{label}: {qualname} imports {alias.name} from {statement.module}, which "
                            f"swafuzz has no stand-in for"
                        )
                    lookup = ast.Subscript(ast.Name(LOCAL_IMPORTS, ast.Load()), ast.Constant(alias.name), ast.Load())
                    assignments.append(ast.Assign([ast.Name(alias.asname or alias.name, ast.Store())], lookup))
                return [ast.copy_location(a, statement) for a in assignments]

        return ast.fix_missing_locations(Rewrite().visit(node))


def _find(body: list[ast.stmt], kind: type, name: str):
    return next((n for n in body if isinstance(n, kind) and n.name == name), None)


def _without_annotations(node: ast.FunctionDef) -> ast.FunctionDef:
    # annotations name SGLang types that are never imported here; they do not run
    # a deep copy keeps SGLang's line numbers, so tracebacks point into its file
    node = copy.deepcopy(node)
    arguments = node.args
    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                arguments.vararg, arguments.kwarg]:
        if arg is not None:
            arg.annotation = None
    node.returns = None
    return node


def _global_names(node: ast.FunctionDef) -> set[str]:
    table = symtable.symtable(ast.unparse(node), "<bound>", "exec")
    names: set[str] = set()
    pending = list(table.get_children())
    while pending:
        scope = pending.pop()
        if isinstance(scope, symtable.Function):
            names.update(scope.get_globals())
        pending.extend(scope.get_children())
    return names


def _dataclass_fields(node: ast.ClassDef) -> tuple[str, ...]:
    # a field declared twice is one field, at its first place (0.5.22's DSV4Metadata does so)
    return tuple(dict.fromkeys(
        statement.target.id
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and "ClassVar" not in ast.unparse(statement.annotation)
    ))


# ---- import mode ---------------------------------------------------------------------------


# an import that failed fails again in this process; trying costs seconds, so remember it
_IMPORT_FAILURES: dict[tuple[str, str | None], str] = {}


class _ImportBinder:
    def __init__(self, label: str, stand_ins: dict[str, Any]):
        self.label = label
        self.stand_ins = stand_ins

    def add_helpers(self, helpers: dict[str, Callable]) -> None:
        pass  # the real module globals already hold them

    def function(self, item: FunctionCode) -> types.FunctionType:
        module = self._import(item.module)
        function = getattr(module, item.name, None)
        if not inspect.isfunction(function):
            raise BindError(f"{self.label}: {item.module} has no function {item.name}()")
        return function

    def bound_class(self, item: ClassCode) -> BoundClass:
        module = self._import(item.module)
        cls = getattr(module, item.name, None)
        if not isinstance(cls, type):
            raise BindError(f"{self.label}: {item.module} has no class {item.name}")
        methods = {}
        for name in item.methods:
            function = cls.__dict__.get(name)
            if not inspect.isfunction(function):
                raise BindError(f"{self.label}: {item.name} has no method {name}() (in {item.module})")
            _require_parameter(self.label, item, name, list(inspect.signature(function).parameters))
            methods[name] = self._rebind(function)
        fields = tuple(f.name for f in dataclasses.fields(cls)) if item.dataclass_fields else ()
        return BoundClass(item.name, methods, fields, real=cls if item.dataclass_fields else None)

    def _import(self, module_name: str) -> types.ModuleType:
        # keyed by where the package lives: another sys.path may hold another sglang
        package = importlib.util.find_spec(module_name.partition(".")[0])
        key = (module_name, package.origin if package else None)
        failure = _IMPORT_FAILURES.get(key)
        if failure is None:
            loaded = set(sys.modules)
            try:
                return importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - any import failure means: use source mode
                # a failed package import leaves its finished submodules behind without their
                # parent, and the next attempt would fail with a KeyError instead of the cause
                for name in set(sys.modules) - loaded:
                    del sys.modules[name]
                failure = _IMPORT_FAILURES[key] = f"{type(exc).__name__}: {exc}"
        raise ImportModeUnavailable(f"{self.label}: cannot import {module_name}: {failure}")

    def _rebind(self, function: types.FunctionType) -> types.FunctionType:
        replaced = {k: v for k, v in self.stand_ins.items() if k in function.__code__.co_names}
        if not replaced:
            return function
        rebound = types.FunctionType(
            function.__code__, {**function.__globals__, **replaced}, function.__name__,
            function.__defaults__, function.__closure__,
        )
        rebound.__kwdefaults__ = function.__kwdefaults__
        rebound.__qualname__ = function.__qualname__
        return rebound


# ---- checks shared by both modes -----------------------------------------------------------


def _function_ast(function: types.FunctionType) -> ast.FunctionDef | None:
    node = getattr(function, "swafuzz_source", None)
    if node is not None:
        return node
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    except (OSError, TypeError, SyntaxError):
        return None


def _require_parameter(label: str, item: ClassCode, method: str, taken: list[str]) -> None:
    parameter = item.parameters.get(method)
    if parameter is not None and parameter not in taken:
        raise BindError(f"{label}: {item.name}.{method}({', '.join(taken)}) does not take {parameter!r}")


def _check_self_reads(label: str, item: ClassCode, bound: BoundClass, attributes: frozenset[str]) -> None:
    available = attributes | set(bound.methods)
    for name, function in bound.methods.items():
        node = _function_ast(function)
        if node is None:
            continue
        self_name = node.args.args[0].arg if node.args.args else "self"
        read = {
            n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == self_name and isinstance(n.ctx, ast.Load)
        }
        missing = sorted(read - available)
        if missing:
            raise BindError(
                f"{label}: {item.name}.{name} reads self.{', self.'.join(missing)}, which the "
                f"stand-in {item.role} does not provide"
            )
