"""Statements whose values nothing reads: where a mutant's edit cannot reach a write location.

A subject is judged by what its functions return and by the attributes it stores that are
read again: by another of its functions, or by swafuzz (the SGLang stand-ins read a record's
fields by name). A statement that only stores into locals feeding such statements, or into
attributes that nothing reads, changes nothing the harness can see, so a mutant that edits
only it survives every search. Examples: the attention read streams that SGLang's HIP
metadata producer builds beside the SWA ring rows; no write location reads them.

The reading is static and conservative, and it is used only to explain survivors, never to
skip a mutant: a statement counts as read when its value might be. Calls, ``return``,
``raise``, assertions, subscript stores (an alias may share the tensor) and nested
definitions are read; an assignment is read when one of its targets is a local that a read
statement loads (to a fixed point) or an attribute whose name a function of the subject, or
any swafuzz code, loads or spells as a string; a compound statement is read when any
statement inside it is. A function that reads names it computes (``getattr`` with a
computed name, ``vars``, ``locals``, ``__dict__``, ``exec``) turns the reading off.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterable, Iterator

_ALWAYS_READ = (ast.Return, ast.Raise, ast.Assert, ast.Delete, ast.Break, ast.Continue, ast.Global,
                ast.Nonlocal, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_STORES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom)
_COMPUTED_READS = {"vars", "locals", "globals", "eval", "exec", "asdict", "astuple", "attrgetter"}


def attributes_read(functions: Iterable[ast.FunctionDef]) -> set[str] | None:
    """The attribute names that ``functions`` or swafuzz's own code read; None when a
    function reads attributes by computed names (then any attribute may be read)."""
    names = set(_swafuzz_names())
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute):
                if node.attr == "__dict__":
                    return None
                if isinstance(node.ctx, ast.Load):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and node.id in _COMPUTED_READS:
                return None
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                if len(node.args) < 2 or not isinstance(node.args[1], ast.Constant):
                    return None
                names.add(str(node.args[1].value))
    return names


@functools.cache
def _swafuzz_names() -> frozenset[str]:
    # every attribute swafuzz touches and every identifier it spells as a string (its
    # stand-ins name a record's fields in tuples), read from its own source
    names: set[str] = set()
    for path in Path(__file__).parents[1].rglob("*.py"):  # the whole package
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return frozenset(names)


class Unread:
    """The statements of one function whose values nothing reads (see the module's text)."""

    def __init__(self, function: ast.FunctionDef, attributes: set[str] | None):
        self.parent: dict[ast.stmt, ast.stmt | None] = {}
        self.unread: set[ast.stmt] = set()
        if attributes is None or any(isinstance(n, ast.Name) and n.id in _COMPUTED_READS
                                     for n in ast.walk(function)):
            return
        self._attributes = attributes
        self._declared = {name for n in ast.walk(function) if isinstance(n, (ast.Global, ast.Nonlocal))
                          for name in n.names}
        statements = list(self._statements(function.body, None))
        read: set[ast.stmt] = set()
        loaded: set[str] = set()
        changed = True
        while changed:  # a fixed point: a read statement's loads make the stores of those names read
            changed = False
            for statement in statements:
                if statement in read or _is_compound(statement) or not self._is_read(statement, loaded):
                    continue
                changed = True
                node: ast.stmt | None = statement
                while node is not None and node not in read:
                    read.add(node)
                    loaded |= _loads(node)
                    node = self.parent[node]
        self.unread = set(statements) - read

    def _statements(self, body: list[ast.stmt], parent: ast.stmt | None) -> Iterator[ast.stmt]:
        for statement in body:
            self.parent[statement] = parent
            yield statement
            if _is_compound(statement):
                for block in _blocks(statement):
                    yield from self._statements(block, statement)

    def _is_read(self, statement: ast.stmt, loaded: set[str]) -> bool:
        if isinstance(statement, ast.Pass) or (isinstance(statement, ast.Expr)
                                               and isinstance(statement.value, ast.Constant)):
            return False
        if isinstance(statement, ast.AnnAssign) and statement.value is None:
            return False
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            return any((alias.asname or alias.name.partition(".")[0]) in loaded | self._declared
                       for alias in statement.names)
        if isinstance(statement, _STORES):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            return any(self._target_read(target, loaded) for target in targets)
        return True  # _ALWAYS_READ, calls, and whatever this reading does not know

    def _target_read(self, target: ast.expr, loaded: set[str]) -> bool:
        if isinstance(target, ast.Name):
            return target.id in loaded or target.id in self._declared
        if isinstance(target, ast.Attribute):
            return target.attr in self._attributes
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(self._target_read(element, loaded) for element in target.elts)
        if isinstance(target, ast.Starred):
            return self._target_read(target.value, loaded)
        return True  # a subscript store writes into an object an alias may share

    def statement_at(self, node: ast.AST) -> ast.stmt | None:
        """The innermost statement of the function that holds ``node``'s source."""
        span = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
        holding = [s for s in self.parent
                   if (s.lineno, s.col_offset) <= span[0] and span[1] <= (s.end_lineno, s.end_col_offset)]
        return max(holding, key=lambda s: (s.lineno, s.col_offset, -s.end_lineno, -s.end_col_offset), default=None)

    def stores_of(self, statement: ast.stmt) -> list[str]:
        """What the statement (or, compound, the statements inside it) stores into."""
        stores = []
        for node in ast.walk(statement):
            if isinstance(node, ast.Assign):
                stores += [ast.unparse(target) for target in node.targets]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                stores.append(ast.unparse(node.target))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                stores += [alias.asname or alias.name.partition(".")[0] for alias in node.names]
        return list(dict.fromkeys(stores))


def _is_compound(statement: ast.stmt) -> bool:
    return any(isinstance(getattr(statement, name, None), list) and getattr(statement, name)
               and isinstance(getattr(statement, name)[0], ast.stmt)
               for name in ("body", "orelse", "finalbody")) and not isinstance(statement, _ALWAYS_READ)


def _blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        yield getattr(statement, name, None) or []
    for handler in getattr(statement, "handlers", None) or []:
        yield handler.body
    for case in getattr(statement, "cases", None) or []:
        yield case.body


def _loads(statement: ast.stmt) -> set[str]:
    """The names a statement loads: for a compound one, those of its header only (the
    statements inside it are read or not on their own)."""
    if not _is_compound(statement):
        return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    header = [value for name, value in ast.iter_fields(statement)
              if name not in ("body", "orelse", "finalbody", "handlers", "cases")]
    header += [handler.type for handler in getattr(statement, "handlers", None) or [] if handler.type]
    header += [case.pattern for case in getattr(statement, "cases", None) or []]
    header += [case.guard for case in getattr(statement, "cases", None) or [] if case.guard]
    found = set()
    for value in header:
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, ast.AST):
                found |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    return found
