"""Binding real SGLang functions so that they run on stand-in objects.

Two modes give the same result, a table of plain functions:

- ``import``: import the module from an installed ``sglang`` and take the class's real
  (unbound) functions. Each is re-created over a copy of its module's globals in which
  the names a target replaces (the key-store kernel, the metadata class its ``isinstance``
  checks test) point at stand-ins, so nothing outside the function is patched.
- ``source``: parse the file, take the ``def`` statements the entry methods reach (and the
  fields of a dataclass), and compile each against torch and the target's stand-ins. No
  SGLang module is executed, so GPU-only dependencies never load.

A class is bound whole, as the tree has it: a target names its entry methods (those the
driver calls), and every method of the class that they reach through ``self.<name>`` comes
with them, so a helper a pull request adds is simply there. What the stand-in object must
carry is read from the tree too: each ``self.<name>`` the reached methods read is a bound
method, an attribute the stand-in models, one the class's own ``__init__`` sets to a literal
(its value), one the reached methods assign themselves, or one the user supplies
(``--sglang-attr NAME=VALUE``). Global names resolve to the stand-ins, then to what the
user supplies, then to the same file's literal constants and plain functions.

Binding checks what it can before anything runs, and a failure raises one
:class:`BindError` that names every missing piece at once and how to supply it.
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
from typing import Any, Callable, Mapping

from .derived import ENGINE_MODEL, KNOWN, InitDerivation
from .locate import SourceTree
from ...errors import BindError, ImportModeUnavailable

MODES = ("source", "import")
# the global through which a function's deferred SGLang imports reach the stand-ins
LOCAL_IMPORTS = "__swafuzz_stand_ins__"


@dataclass(frozen=True)
class ClassCode:
    """One class to bind; ``role`` names the stand-in its methods run on.

    ``methods`` are the entry methods, which the class must define; ``if_defined`` are
    entry methods the driver calls only where the class defines them. On a stand-in
    (``role`` set) every method they reach comes along (:func:`bind`); a class without a
    role (a record, or code whose caller models the rest) gives just the methods named.
    """

    path: str  # inside the package: "sglang/srt/..."
    name: str
    methods: tuple[str, ...] = ()
    role: str | None = None
    dataclass_fields: bool = False  # also rebuild the class from its field list
    parameters: dict[str, str] = field(default_factory=dict)  # method -> a parameter it must take
    if_defined: tuple[str, ...] = ()
    required: bool = True  # False: a tree without the class binds without it

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
    methods: dict[str, Any]  # functions, and the staticmethod/classmethod/property objects
    fields: tuple[str, ...] = ()
    real: type | None = None  # the imported class itself (import mode)
    # attribute values read off the tree, each made fresh per object: for a stand-in role,
    # what __init__ sets to a literal (and what the user supplies); for a dataclass, the
    # defaults its fields declare
    defaults: dict[str, Callable[[], Any]] = field(default_factory=dict)
    # what __init__ assigns to each attribute, as source text, for the messages of gaps
    init_sources: dict[str, str] = field(default_factory=dict)
    # what __init__ derives from the engine model, for a stand-in that carries one
    derivation: InitDerivation | None = None

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
        return self.on_stand_in(base)

    def on_stand_in(self, base: type) -> type:
        """``base`` (a stand-in) with the bound methods and the tree's attribute values,
        which the stand-in gives where it models no value of its own."""
        defaults = {**getattr(base, "tree_defaults", {}), **self.defaults}
        return type(self.name, (base,), {**self.methods, "tree_defaults": defaults,
                                         "tree_derivation": self.derivation})


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
    supplied: Mapping[str, Any] | None = None,
) -> Binding:
    """Bind ``code`` from ``tree``.

    ``stand_ins`` are the global names the functions get instead of SGLang's (source mode
    gets only these, torch and builtins); ``stand_in_attributes`` lists, per role, the
    attributes the stand-in object models; ``supplied`` are values the user gives for names
    the tree's code reads and swafuzz cannot derive (``self.<name>`` of a role, or a global).
    Every piece that is missing is named in one :class:`BindError`.
    """
    if mode not in MODES:
        raise BindError(f"unknown binding mode {mode!r}; modes are {', '.join(MODES)}")
    label = f"{tree.label} ({mode} mode)"
    supplied = dict(supplied or {})
    binder = (_SourceBinder(tree, label, stand_ins, supplied) if mode == "source"
              else _ImportBinder(label, stand_ins))
    gaps = _Gaps(label)
    helpers: dict[str, types.FunctionType] = {}
    for item in code:
        if isinstance(item, FunctionCode):
            # in order, so that a helper may call the helpers listed before it
            function = gaps.attempt(binder.function, item)
            if function is not None:
                helpers[item.name] = function
                binder.add_helpers({item.name: function})
    classes: dict[str, BoundClass] = {}
    for item in code:
        if isinstance(item, ClassCode):
            modelled = stand_in_attributes[item.role] if item.role is not None else frozenset()
            bound = binder.bound_class(item, gaps, modelled)
            if bound is None:
                continue
            if item.role is not None:
                gaps.extend(_settle_self_reads(item, bound, modelled, supplied))
            classes[item.name] = bound
    gaps.raise_if_any()
    return Binding(label, tree.version, mode, classes, helpers)


class _Gaps:
    """The pieces a binding lacks, gathered so that one error names them all."""

    def __init__(self, label: str):
        self.label = label
        self.found: list[str] = []

    def attempt(self, make: Callable[..., Any], *args: Any) -> Any:
        try:
            return make(*args)
        except ImportModeUnavailable:
            raise  # the whole mode is unavailable: the caller falls back to source mode
        except BindError as exc:
            self.found.append(str(exc))
            return None

    def extend(self, gaps: list[str]) -> None:
        self.found.extend(gaps)

    def raise_if_any(self) -> None:
        found = list(dict.fromkeys(self.found))
        if len(found) == 1:
            raise BindError(f"{self.label}: {found[0]}")
        if found:
            raise BindError(f"{self.label}: {len(found)} pieces are missing:\n"
                            + "\n".join(f"  - {gap}" for gap in found))


# what a gap of a value says to do about it
SUPPLY_HINT = "supply it with --sglang-attr {name}=VALUE (a Python literal)"


# ---- source mode ---------------------------------------------------------------------------

# decorators a bound method may carry: they wrap the plain function, which binds as any other
_PLAIN_DECORATORS = {"staticmethod": staticmethod, "classmethod": classmethod, "property": property}


class _SourceBinder:
    def __init__(self, tree: SourceTree, label: str, stand_ins: dict[str, Any], supplied: dict[str, Any]):
        import torch

        self.tree = tree
        self.label = label
        self.stand_ins = stand_ins
        self.supplied = supplied
        self.namespace: dict[str, Any] = {
            "torch": torch, "__name__": "swafuzz_sglang_bound", LOCAL_IMPORTS: stand_ins, **stand_ins,
        }
        # one global namespace per file: each file's own constants and functions are its own
        self.file_namespaces: dict[str, dict[str, Any]] = {}
        self.modules: dict[str, ast.Module] = {}
        self.compiling: set[tuple[str, str]] = set()  # module functions being bound, against cycles

    def add_helpers(self, helpers: dict[str, Callable]) -> None:
        self.namespace.update(helpers)
        for namespace in self.file_namespaces.values():
            namespace.update(helpers)

    def function(self, item: FunctionCode) -> types.FunctionType:
        module = self._module(item.path, f"{item.name}()")
        node = _find(module.body, ast.FunctionDef, item.name)
        if node is None:
            raise BindError(f"{item.path} has no function {item.name}()")
        return self._compile(item.path, node, item.name)

    def bound_class(self, item: ClassCode, gaps: _Gaps, modelled: frozenset[str]) -> BoundClass | None:
        module = gaps.attempt(self._module, item.path, f"{item.name}.{(item.methods or ('',))[0]}")
        if module is None:
            return None
        class_node = _find(module.body, ast.ClassDef, item.name)
        if class_node is None:
            if item.required:
                gaps.extend([f"{item.path} has no class {item.name}"])
            return None
        defined = {n.name: n for n in class_node.body if isinstance(n, ast.FunctionDef)}
        gaps.extend([f"{item.name} has no method {name}() (in {item.path})"
                     for name in item.methods if name not in defined])
        entries = [n for n in (*item.methods, *item.if_defined) if n in defined]
        methods = {}
        for name in _reached(defined, entries, modelled) if item.role is not None else entries:
            node = defined[name]
            if name in item.parameters:
                arguments = node.args
                gaps.attempt(_require_parameter, item, name, [
                    a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                ])
            method = gaps.attempt(self._method, item, node)
            if method is not None:
                methods[name] = method
        defaults: dict[str, Callable[[], Any]] = {}
        fields: tuple[str, ...] = ()
        if item.dataclass_fields:
            declared = _dataclass_fields(class_node)
            fields = tuple(declared)
            defaults = {name: make for name, make in declared.items() if make is not None}
            if not fields:
                gaps.extend([f"{item.name} declares no dataclass fields (in {item.path})"])
        derivation = None
        if item.role is not None and "__init__" in defined:
            defaults, derivation = _init_values(defined["__init__"], modelled)
        return BoundClass(item.name, methods, fields, defaults=defaults,
                          init_sources=_init_sources(defined.get("__init__")), derivation=derivation)

    def _method(self, item: ClassCode, node: ast.FunctionDef) -> Any:
        wrappers = []
        for decorator in node.decorator_list:
            wrapper = _PLAIN_DECORATORS.get(ast.unparse(decorator))
            if wrapper is None:
                decorators = ", ".join(ast.unparse(d) for d in node.decorator_list)
                raise BindError(f"{item.name}.{node.name} is decorated ({decorators}); only plain "
                                "functions, staticmethods, classmethods and properties bind")
            wrappers.append(wrapper)
        plain = copy.copy(node)
        plain.decorator_list = []
        method: Any = self._compile(item.path, plain, f"{item.name}.{node.name}")
        method.swafuzz_source.decorator_list = node.decorator_list  # a staticmethod has no self
        for wrapper in reversed(wrappers):
            method = wrapper(method)
        return method

    def _module(self, path: str, wanted: str) -> ast.Module:
        if path not in self.modules:
            text = self.tree.read(path)
            if text is None:
                raise BindError(f"has no file {path}, so no {wanted}")
            filename = self.tree.location(path)
            # tracebacks through bound code then show SGLang's own lines
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            self.modules[path] = ast.parse(text, filename=filename)
        return self.modules[path]

    def _file_namespace(self, path: str) -> dict[str, Any]:
        if path not in self.file_namespaces:
            self.file_namespaces[path] = dict(self.namespace)
        return self.file_namespaces[path]

    def _compile(self, path: str, node: ast.FunctionDef, qualname: str) -> types.FunctionType:
        if node.decorator_list:
            decorators = ", ".join(ast.unparse(d) for d in node.decorator_list)
            raise BindError(f"{qualname} is decorated ({decorators}); only plain functions bind")
        node = _without_annotations(node)
        node = self._local_imports_from_stand_ins(node, qualname)
        namespace = self._file_namespace(path)
        missing = []
        for name in sorted(_global_names(node) | _default_names(node)):
            if name not in namespace and not hasattr(builtins, name) and not self._resolve(path, name, namespace):
                missing.append(name)
        if missing:
            raise BindError(
                f"{qualname} uses {', '.join(missing)}, which swafuzz has no stand-in for: "
                + SUPPLY_HINT.format(name=missing[0])
            )
        code = compile(ast.Module(body=[node], type_ignores=[]), self.tree.location(path), "exec")
        defined: dict[str, Any] = {}
        exec(code, namespace, defined)  # runs the def statement only
        function = defined[node.name]
        function.__qualname__ = qualname
        # frames of it then name the class too, as an imported method's do
        function.__code__ = function.__code__.replace(co_qualname=qualname)
        function.swafuzz_source = node  # for the self-attribute check
        return function

    def _resolve(self, path: str, name: str, namespace: dict[str, Any]) -> bool:
        """Give ``name`` a value from what the user supplied, else from the file itself (a
        literal constant, or a plain function that binds in turn); False when neither has it."""
        if name in self.supplied:
            namespace[name] = self.supplied[name]
            return True
        module = self.modules[path]
        constants = _module_literals(module)
        if name in constants:
            namespace[name] = constants[name]
            return True
        node = _find(module.body, ast.FunctionDef, name)
        if node is None or (path, name) in self.compiling:
            return False
        self.compiling.add((path, name))
        try:
            namespace[name] = self._compile(path, node, name)
        except BindError:
            return False
        finally:
            self.compiling.discard((path, name))
        return True

    def _local_imports_from_stand_ins(self, node: ast.FunctionDef, qualname: str) -> ast.FunctionDef:
        """``from sglang... import name`` inside a function (SGLang defers GPU-only imports
        that way) takes ``name`` from the stand-ins when the function runs."""
        stand_ins = self.stand_ins

        class Rewrite(ast.NodeTransformer):
            def visit_ImportFrom(self, statement: ast.ImportFrom):
                if not (statement.module or "").startswith("sglang"):
                    return statement
                assignments = []
                for alias in statement.names:
                    if alias.name not in stand_ins:
                        raise BindError(
                            f"{qualname} imports {alias.name} from {statement.module}, which "
                            f"swafuzz has no stand-in for"
                        )
                    lookup = ast.Subscript(ast.Name(LOCAL_IMPORTS, ast.Load()), ast.Constant(alias.name), ast.Load())
                    assignments.append(ast.Assign([ast.Name(alias.asname or alias.name, ast.Store())], lookup))
                return [ast.copy_location(a, statement) for a in assignments]

        return ast.fix_missing_locations(Rewrite().visit(node))


def _find(body: list[ast.stmt], kind: type, name: str):
    return next((n for n in body if isinstance(n, kind) and n.name == name), None)


def _self_name(node: ast.FunctionDef) -> str | None:
    arguments = [*node.args.posonlyargs, *node.args.args]
    if not arguments or any(ast.unparse(d) == "staticmethod" for d in node.decorator_list):
        return None
    return arguments[0].arg


def _self_attributes(node: ast.FunctionDef, context: type) -> set[str]:
    """The ``self.<name>`` that ``node`` reads (``context`` ast.Load) or assigns (ast.Store)."""
    self_name = _self_name(node)
    return {
        n.attr for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        and n.value.id == self_name and isinstance(n.ctx, context)
    }


def _reached(defined: dict[str, ast.FunctionDef | None], entries: list[str], modelled: frozenset[str]) -> list[str]:
    """``entries`` and every method of the class they reach through ``self.<name>``, but
    for those the stand-in models itself (a method whose source cannot be read reaches
    nothing further)."""
    reached: dict[str, None] = {}
    pending = list(entries)
    while pending:
        name = pending.pop(0)
        if name in reached:
            continue
        reached[name] = None
        node = defined[name]
        if node is not None:
            pending.extend(sorted((_self_attributes(node, ast.Load) & set(defined)) - modelled))
    return list(reached)


def _literal(node: ast.expr) -> Callable[[], Any] | None:
    """A maker of ``node``'s value when it is a literal (``dict()``, ``list()`` and ``set()``
    included), else None. Each call makes a fresh value: a container is never shared."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("dict", "list", "set", "tuple") and not node.args and not node.keywords):
        return {"dict": dict, "list": list, "set": set, "tuple": tuple}[node.func.id]
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return lambda: copy.deepcopy(value)


def _init_assignments(init: ast.FunctionDef | None) -> list[tuple[str, ast.expr]]:
    """``self.<name> = value`` statements of ``__init__``'s own body, in order."""
    if init is None:
        return []
    self_name = _self_name(init)
    found = []
    for statement in init.body:
        targets = (statement.targets if isinstance(statement, ast.Assign)
                   else [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value else [])
        for target in targets:
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == self_name):
                found.append((target.attr, statement.value))
    return found


def _init_literals(init: ast.FunctionDef) -> dict[str, Callable[[], Any]]:
    # the last assignment of a name in __init__ is the value the object starts with
    literals: dict[str, Callable[[], Any] | None] = {}
    for name, value in _init_assignments(init):
        literals[name] = _literal(value)
    return {name: make for name, make in literals.items() if make is not None}


def _init_values(init: ast.FunctionDef, modelled: frozenset[str]
                 ) -> tuple[dict[str, Callable[[], Any]], InitDerivation | None]:
    """What a stand-in gets of ``__init__``'s values: its literals, and where the stand-in
    carries an engine model, what ``__init__`` derives from it (which then replaces the
    literal: a later ``if`` may set the attribute again)."""
    literals = _init_literals(init)
    if ENGINE_MODEL not in modelled:
        return literals, None
    derivation = InitDerivation(init, modelled)
    return {name: make for name, make in literals.items() if not derivation.derives(name)}, derivation


def _init_sources(init: ast.FunctionDef | None) -> dict[str, str]:
    return {name: ast.unparse(value) for name, value in _init_assignments(init)}


def _module_literals(module: ast.Module) -> dict[str, Any]:
    constants = {}
    for statement in module.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            make = _literal(statement.value)
            if make is not None:
                constants[statement.targets[0].id] = make()
    return constants


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


def _default_names(node: ast.FunctionDef) -> set[str]:
    """The names a function's default values read: the ``def`` statement evaluates them in
    the file's namespace (``multiples_of=PAGE_INDEX_ALIGNED_SIZE``), outside the body's scope."""
    arguments = node.args
    defaults = [d for d in (*arguments.defaults, *arguments.kw_defaults) if d is not None]
    return {n.id for d in defaults for n in ast.walk(d) if isinstance(n, ast.Name)}


def _dataclass_fields(node: ast.ClassDef) -> dict[str, Callable[[], Any] | None]:
    """Each field in order with a maker of its declared default (None where it has none
    swafuzz can make: a required field, or a factory other than a builtin container)."""
    fields: dict[str, Callable[[], Any] | None] = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and "ClassVar" not in ast.unparse(statement.annotation)):
            continue
        if statement.target.id in fields:
            continue  # a field declared twice is one field, at its first place (0.5.22's DSV4Metadata)
        fields[statement.target.id] = _field_default(statement.value)
    return fields


def _field_default(value: ast.expr | None) -> Callable[[], Any] | None:
    if value is None:
        return None
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
        keywords = {k.arg: k.value for k in value.keywords}
        if "default" in keywords:
            return _literal(keywords["default"])
        factory = keywords.get("default_factory")
        if isinstance(factory, ast.Name) and factory.id in ("dict", "list", "set", "tuple"):
            return {"dict": dict, "list": list, "set": set, "tuple": tuple}[factory.id]
        return None
    return _literal(value)


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
            raise BindError(f"{item.module} has no function {item.name}()")
        return function

    def bound_class(self, item: ClassCode, gaps: _Gaps, modelled: frozenset[str]) -> BoundClass | None:
        module = self._import(item.module)
        cls = getattr(module, item.name, None)
        if not isinstance(cls, type):
            if item.required:
                gaps.extend([f"{item.module} has no class {item.name}"])
            return None
        defined = {name: value for name, value in cls.__dict__.items() if _plain_function(value) is not None}
        gaps.extend([f"{item.name} has no method {name}() (in {item.module})"
                     for name in item.methods if name not in defined])
        nodes = {name: _function_ast(_plain_function(value)) for name, value in defined.items()}
        entries = [n for n in (*item.methods, *item.if_defined) if n in defined]
        methods = {}
        for name in _reached(nodes, entries, modelled) if item.role is not None else entries:
            function = _plain_function(defined[name])
            if name in item.parameters:
                gaps.attempt(_require_parameter, item, name, list(inspect.signature(function).parameters))
            methods[name] = _rewrapped(defined[name], self._rebind(function))
        fields: tuple[str, ...] = ()
        defaults: dict[str, Callable[[], Any]] = {}
        if item.dataclass_fields:
            declared = dataclasses.fields(cls)
            fields = tuple(f.name for f in declared)
            defaults = {f.name: _import_default(f) for f in declared if _import_default(f) is not None}
        init = nodes.get("__init__")
        derivation = None
        if item.role is not None and init is not None:
            defaults, derivation = _init_values(init, modelled)
        return BoundClass(item.name, methods, fields, real=cls if item.dataclass_fields else None,
                          defaults=defaults, init_sources=_init_sources(init), derivation=derivation)

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


def _plain_function(value: Any) -> types.FunctionType | None:
    """The function a class attribute wraps, where it is one that binds."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if inspect.isfunction(value) else None


def _rewrapped(original: Any, function: types.FunctionType) -> Any:
    if isinstance(original, (staticmethod, classmethod)):
        return type(original)(function)
    if isinstance(original, property):
        return property(function, original.fset, original.fdel)
    return function


def _import_default(declared: dataclasses.Field) -> Callable[[], Any] | None:
    if declared.default is not dataclasses.MISSING:
        value = declared.default
        return lambda: copy.deepcopy(value)
    if declared.default_factory is not dataclasses.MISSING:
        return declared.default_factory
    return None


# ---- checks shared by both modes -----------------------------------------------------------


def _function_ast(function: types.FunctionType) -> ast.FunctionDef | None:
    node = getattr(function, "swafuzz_source", None)
    if node is not None:
        return node
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    except (OSError, TypeError, SyntaxError):
        return None


def _require_parameter(item: ClassCode, method: str, taken: list[str]) -> None:
    parameter = item.parameters.get(method)
    if parameter is not None and parameter not in taken:
        raise BindError(f"{item.name}.{method}({', '.join(taken)}) does not take {parameter!r}")


def _settle_self_reads(item: ClassCode, bound: BoundClass, attributes: frozenset[str],
                       supplied: dict[str, Any]) -> list[str]:
    """Give the stand-in every ``self.<name>`` the bound methods read that it can have:
    a supplied value joins the tree's own defaults. The gaps are the reads left without
    one, each saying where the tree sets it and how to supply it."""
    nodes = {name: _function_ast(_plain_function(m) or m) for name, m in bound.methods.items()}
    nodes = {name: node for name, node in nodes.items() if node is not None}
    assigned = set().union(*(_self_attributes(node, ast.Store) for node in nodes.values()))
    gaps = []
    for name, node in nodes.items():
        read = _self_attributes(node, ast.Load) - attributes - set(bound.methods) - set(bound.defaults)
        for attribute in sorted(read):
            if attribute in supplied:
                value = supplied[attribute]
                bound.defaults[attribute] = lambda value=value: copy.deepcopy(value)
            elif bound.derivation is not None and bound.derivation.derives(attribute):
                continue
            elif attribute not in assigned:
                source = bound.init_sources.get(attribute)
                where = f" (its __init__ sets it to {source})" if source else ""
                reason = bound.derivation.why_not(attribute) if bound.derivation is not None else None
                if source and reason:
                    where = (f" (its __init__ sets it to {source}, which reads {reason}: swafuzz derives what "
                             f"comes from {KNOWN}, and no model of the engine knows this)")
                gaps.append(f"{item.name}.{name} reads self.{attribute}, which the stand-in {item.role} "
                            f"does not provide{where}: {SUPPLY_HINT.format(name=attribute)}")
    return gaps
