"""Attributes a class's ``__init__`` derives from what the engine model knows.

SGLang's DeepSeek-V4 backends set much of their state in ``__init__`` from the worker they
serve: whether it is the draft worker (``model_runner.is_draft_worker``), the speculative
settings (``get_spec().speculative_eagle_topk``, ``speculative_num_draft_tokens``, the
algorithm's ``is_dspark()``), the engine switches (``envs.NAME.get()``), and from each other
(``self.is_dspark_draft = self.is_draft_worker and self.is_dspark``). swafuzz's engine model
knows each of those for every backend it builds: the model the backend serves (target or
draft), the scenario's draft token count and whether it decodes speculatively, and the run's
switches. So where the code reads such an attribute, its value is the ``__init__``'s own
expression evaluated on the engine model (:class:`InitDerivation`), never a value to supply.

What no model of the engine can know (the checkpoint's config, the parallel layout, the
loaded model's modules) stays underivable, with the reason, and is supplied with
``--sglang-attr``.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

from ...errors import ModelGap, StandInGap

# the stand-in attribute that carries the engine model (an EngineModel): a role whose stand-in
# has it gets the attributes its __init__ derives
ENGINE_MODEL = "engine_model"
KNOWN = ("the worker's role, the speculative settings (top-k, draft token count, algorithm), the engine "
         "switches, and whether a pool serves a draft worker")

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


@dataclass(frozen=True)
class EngineModel:
    """What the engine model knows about the worker a backend serves."""

    role: str  # "target" or "draft": the model (and so the worker) the backend serves
    speculative: bool
    num_draft_tokens: int
    environment: Any  # the run's ``envs`` (the drivers' EngineEnvironment)
    dspark: bool = False  # the speculative algorithm is DSpark (its draft model drafts in blocks), not MTP

    @property
    def topk(self) -> int:
        # DeepSeek-V4's MTP runs chains of top-k 1; without speculation the setting is unset
        return 1 if self.speculative else 0

    def runner(self) -> "_Facts":
        """The model runner as an ``__init__`` reads it: the worker's role, and the
        speculative algorithm (DeepSeek-V4's EAGLE-style MTP, or DSpark)."""
        algorithm = _Facts("model_runner.spec_algorithm", {
            "is_none": _Predicate(not self.speculative), "is_eagle": _Predicate(self.speculative and not self.dspark),
            "is_dspark": _Predicate(self.dspark),
        })
        return _Facts("model_runner", {"is_draft_worker": self.role == "draft", "spec_algorithm": algorithm})

    def arguments(self) -> dict[str, Any]:
        """The constructor arguments the model knows, by SGLang's parameter names: the pool
        is built for a draft worker or not (``DeepSeekV4TokenToKVPool(is_draft_worker=...)``)."""
        return {"is_draft_worker": self.role == "draft"}

    def speculative_settings(self) -> "_Facts":
        """What ``get_spec()`` gives: the server's speculative arguments."""
        return _Facts("get_spec()", {"speculative_eagle_topk": self.topk,
                                     "speculative_num_draft_tokens": self.num_draft_tokens})


class _Facts:
    """An engine object of which the model knows some attributes. Kept by the stand-in
    (``self.model_runner = model_runner``), it is a stand-in too: what it does not know is
    a gap of swafuzz, as on any stand-in."""

    def __init__(self, path: str, known: dict[str, Any]):
        self.path, self.known = path, known

    def read(self, name: str) -> Any:
        if name not in self.known:
            raise Underivable(f"{self.path}.{name}")
        return self.known[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("path", "known"):
            raise AttributeError(name)
        if name not in self.known:
            raise StandInGap(f"SGLang code read {self.path}.{name}, which swafuzz does not model")
        return self.known[name]


@dataclass(frozen=True)
class _Predicate:
    """A method of an engine object that the model answers (``spec_algorithm.is_dspark()``)."""

    value: bool

    def __call__(self) -> bool:
        return self.value


class Underivable(Exception):
    """An expression reads something no model of the engine knows; the message names it."""


class _ProbeEnvironment:
    """The switches while checking what is derivable: any switch reads as off."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def get(self) -> bool:
        return False


_PROBE = EngineModel("target", True, 2, _ProbeEnvironment())


class InitDerivation:
    """The ``self.<name>`` assignments of ``init`` (an ``__init__``), evaluated on an engine
    model. ``modelled``: the attributes the stand-in object carries itself, which the
    expressions may read (``self.topk``, a parameter of the same name)."""

    def __init__(self, init: ast.FunctionDef, modelled: frozenset[str]):
        self.init = init
        self.modelled = modelled
        arguments = init.args
        names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
        self.self_name = names[0] if names else "self"
        self.parameters = set(names[1:])
        # what is derivable, read once on a probe model: a name maps to None, or to why not
        self.reasons = _Interpreter(self, None, _PROBE, probing=True).run()

    def derives(self, name: str) -> bool:
        return name in self.reasons and self.reasons[name] is None

    def why_not(self, name: str) -> str | None:
        """Why ``__init__``'s value of ``name`` cannot be derived (None: it can, or it does
        not set ``name``)."""
        return self.reasons.get(name)

    def values(self, obj: Any, model: EngineModel) -> dict[str, Any]:
        """Every derivable attribute's value for ``obj``, a stand-in built for ``model``."""
        found = _Interpreter(self, obj, model, probing=False).run()
        return {name: value for name, value in found.items() if not isinstance(value, Underivable)}


class _Interpreter:
    """Runs ``__init__``'s body as far as it reads the engine model: assignments, ``if``
    statements whose test it can evaluate (probing takes both branches), asserts and bare
    calls skipped; an attribute set anywhere else is underivable."""

    def __init__(self, derivation: InitDerivation, obj: Any, model: EngineModel, probing: bool):
        self.d, self.obj, self.model, self.probing = derivation, obj, model, probing
        self.attributes: dict[str, Any] = {}  # name -> value, or Underivable
        self.locals: dict[str, Any] = {}

    def run(self) -> dict[str, Any]:
        self._block(self.d.init.body)
        if self.probing:
            return {name: (str(value) if isinstance(value, Underivable) else None)
                    for name, value in self.attributes.items()}
        return self.attributes

    def _block(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self._statement(statement)

    def _statement(self, statement: ast.stmt) -> None:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if statement.value is None:
                return
            value = self._value(statement.value)
            for target in targets:
                self._assign(target, value)
        elif isinstance(statement, ast.If):
            try:
                test = self._eval(statement.test)
            except Underivable as why:
                self._unknown(statement, why)
                return
            if self.probing:
                self._block(statement.body)
                self._block(statement.orelse)
            else:
                self._block(statement.body if test else statement.orelse)
        elif not isinstance(statement, (ast.Assert, ast.Expr, ast.Pass)):
            self._unknown(statement, Underivable(f"a {type(statement).__name__.lower()} statement"))

    def _value(self, node: ast.expr) -> Any:
        try:
            return self._eval(node)
        except Underivable as why:
            return why
        except ModelGap as gap:  # a switch the tree does not declare: that attribute alone goes without
            return Underivable(str(gap))

    def _assign(self, target: ast.expr, value: Any) -> None:
        if self._is_self(target):
            self.attributes[target.attr] = value
        elif isinstance(target, ast.Name):
            self.locals[target.id] = value

    def _unknown(self, statement: ast.stmt, why: Underivable) -> None:
        """Every name ``statement`` assigns takes the reason it cannot be run."""
        for node in ast.walk(statement):
            if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Store):
                self._assign(node, why)

    def _is_self(self, node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == self.d.self_name)

    def _eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            values = [self._eval(e) for e in node.elts]
            return tuple(values) if isinstance(node, ast.Tuple) else values
        if self._is_self(node):
            return self._self_read(node.attr)
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            owner = self._eval(node.value)
            if isinstance(owner, _Facts):
                return owner.read(node.attr)
            raise Underivable(ast.unparse(node))
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.BoolOp):
            # probing reads every operand, so that what is derivable does not hang on the probe's values
            values = [self._eval(operand) for operand in node.values] if self.probing else None
            value = self._eval(node.values[0]) if values is None else values[0]
            for index, operand in enumerate(node.values[1:], 1):
                if (not value) if isinstance(node.op, ast.And) else value:
                    break
                value = self._eval(operand) if values is None else values[index]
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            value = self._eval(node.operand)
            return (not value) if isinstance(node.op, ast.Not) else self._checked(operator.sub, 0, value, node)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._checked(_BINARY[type(node.op)], self._eval(node.left), self._eval(node.right), node)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                if type(op) not in _COMPARE:
                    raise Underivable(ast.unparse(node))
                right = self._eval(right_node)
                if not self._checked(_COMPARE[type(op)], left, right, node):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            test = self._eval(node.test)
            if self.probing:
                body, orelse = self._eval(node.body), self._eval(node.orelse)
                return body if test else orelse
            return self._eval(node.body) if test else self._eval(node.orelse)
        raise Underivable(ast.unparse(node))

    def _call(self, node: ast.Call) -> Any:
        """The calls an ``__init__`` reads the engine through: ``get_spec()``, a predicate
        of the speculative algorithm, a switch's ``get()``, ``getattr`` of a known fact."""
        function = ast.unparse(node.func)
        if function == "get_spec" and not node.args and not node.keywords:
            return self.model.speculative_settings()
        if function == "getattr" and len(node.args) in (2, 3) and not node.keywords \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            owner = self._eval(node.args[0])
            if isinstance(owner, _Facts):
                return owner.read(node.args[1].value)
        elif isinstance(node.func, ast.Attribute) and not node.args and not node.keywords:
            switch = node.func.value
            if (node.func.attr == "get" and isinstance(switch, ast.Attribute) and isinstance(switch.value, ast.Name)
                    and switch.value.id == "envs"):
                return getattr(self.model.environment, switch.attr).get()  # the run's setting
            method = self._eval(node.func)
            if isinstance(method, _Predicate):
                return method.value
        raise Underivable(ast.unparse(node))

    @staticmethod
    def _checked(op, left: Any, right: Any, node: ast.expr) -> Any:
        try:
            return op(left, right)
        except Exception:  # noqa: BLE001 - a value of the probe the real one would not have
            raise Underivable(ast.unparse(node)) from None

    def _self_read(self, name: str) -> Any:
        if name in self.attributes:
            value = self.attributes[name]
            if isinstance(value, Underivable):
                raise value
            return value
        if name in self.d.modelled:
            return 0 if self.probing else getattr(self.obj, name)
        raise Underivable(f"self.{name}")

    def _name(self, name: str) -> Any:
        if name == "model_runner" and name in self.d.parameters:
            return self.model.runner()
        if name in self.d.parameters and name in self.model.arguments():
            return self.model.arguments()[name]
        if name in self.locals:
            value = self.locals[name]
            if isinstance(value, Underivable):
                raise value
            return value
        if name in self.d.parameters and name in self.d.modelled:  # passed in, and carried as such
            return self._self_read(name)
        raise Underivable(name)
