"""The attribute sets of SGLang's own classes, read from a release's source.

A stand-in replaces one of SGLang's objects (a pool, a backend, a metadata record) and
carries only the attributes the bound code reads. :func:`attributes` reads what the real
class defines (class-level names and annotations, methods and properties, and every
``self.<name>`` its methods assign), so a test can hold each stand-in to the class it
replaces: a stand-in attribute the release's class lacks means the bound code is being fed
something SGLang never has.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .binding import BindError
from .locate import SourceTree


@dataclass(frozen=True)
class RealClass:
    """Where the class a stand-in replaces lives (a base class elsewhere is listed too)."""

    path: str
    name: str

    def __str__(self) -> str:
        return f"{self.name} ({self.path})"


def attributes(tree: SourceTree, classes: tuple[RealClass, ...]) -> frozenset[str]:
    """Every attribute the ``classes`` (a class and the bases it inherits them from) define
    in ``tree``; raises :class:`BindError` when a class is missing."""
    found: set[str] = set()
    for real in classes:
        text = tree.read(real.path)
        if text is None:
            raise BindError(f"{tree.label} has no file {real.path}, so no class {real.name}")
        node = next(
            (n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == real.name), None
        )
        if node is None:
            raise BindError(f"{tree.label}: {real.path} has no class {real.name}")
        found |= _class_attributes(node)
    return frozenset(found)


def _class_attributes(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(statement.name)
            names |= _self_assignments(statement)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
        elif isinstance(statement, ast.Assign):
            names |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
    return names


def _self_assignments(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = method.args.posonlyargs + method.args.args
    if not arguments:
        return set()
    self_name = arguments[0].arg
    return {
        n.attr for n in ast.walk(method)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name) and n.value.id == self_name
    }
