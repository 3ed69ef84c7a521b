"""Which statements of a target's entry method the scenarios of a run ran.

A *clean* verdict speaks only of the branches some scenario took: a getter branch that the
run's switches or model never reach (the request window with its switch off, a branch a pull
request adds for a mode no scenario draws) passes unseen. So the entry method
(``get_swa_out_cache_loc``, the pool's store) is bound with a mark before each of its
statements, and the report names the statements of the tree's own code that no scenario
ran, by line and text.

Statements are the simple ones of the method's body: an ``if`` is covered by what it
guards, and a docstring and nested functions are left out. A mark is one store into a list,
given the statement's line, so tracebacks and the lines findings cite are the tree's own.
Only code the binder compiled from the tree's text can be marked (source mode); in import
mode the installed code runs as it is, and nothing is said.
"""

from __future__ import annotations

import ast
import copy
import itertools
import linecache
from dataclasses import dataclass
from typing import Any, Callable

MAX_TEXT_CHARS = 80  # of a statement's first line in a sentence

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
             *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_MARKS = itertools.count()


@dataclass(frozen=True)
class Statement:
    line: int
    text: str  # its first line, stripped and cut

    def describe(self) -> str:
        return f"line {self.line} `{self.text}`"


class StatementsRun:
    """The statements of one entry method, named ``name``, and which of them ran in this
    process (none are known of code that was not marked)."""

    def __init__(self, name: str, statements: tuple[Statement, ...] = ()):
        self.name = name
        self.statements = statements
        self.ran = [False] * len(statements)  # the marks write into this list

    @classmethod
    def marking(cls, function: Callable[..., Any], name: str) -> tuple["StatementsRun", Callable[..., Any]]:
        """The tally of ``function``'s statements, and ``function`` compiled again with a
        mark before each (``function`` itself where the binder kept no source of it)."""
        node = getattr(function, "swafuzz_source", None)
        if node is None:
            return cls(name), function
        code = function.__code__
        statements: list[Statement] = []
        marker = f"_swafuzz_statements_ran_{next(_MARKS)}"

        def marked(body: list[ast.stmt]) -> list[ast.stmt]:
            out = []
            for statement in body:
                if isinstance(statement, _COMPOUND):
                    for block in ("body", "orelse", "finalbody"):
                        if getattr(statement, block, None):
                            setattr(statement, block, marked(getattr(statement, block)))
                    for part in (*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())):
                        part.body = marked(part.body)
                elif not isinstance(statement, _NESTED):
                    mark = ast.Assign([ast.Subscript(ast.Name(marker, ast.Load()), ast.Constant(len(statements)),
                                                     ast.Store())], ast.Constant(True))
                    out.append(ast.copy_location(mark, statement))
                    statements.append(_statement(code.co_filename, statement))
                out.append(statement)
            return out

        tree = copy.deepcopy(node)
        docstring = tree.body[:1] if _is_docstring(tree.body[0]) else []
        tree.body = docstring + marked(tree.body[len(docstring):])
        tally = cls(name, tuple(statements))
        namespace = function.__globals__
        namespace[marker] = tally.ran
        defined: dict[str, Any] = {}
        exec(compile(ast.fix_missing_locations(ast.Module([tree], [])), code.co_filename, "exec"),
             namespace, defined)
        again = defined[tree.name]
        again.__qualname__ = function.__qualname__
        again.__code__ = again.__code__.replace(co_qualname=code.co_qualname)
        again.swafuzz_source = node
        return tally, again

    def lines_ran(self) -> list[int]:
        return [s.line for s, ran in zip(self.statements, self.ran) if ran]

    def never_ran(self) -> list[Statement]:
        return [s for s, ran in zip(self.statements, self.ran) if not ran]

    def sentence(self) -> str | None:
        """What the run's calls ran of the method; None where it was not called here (or
        not marked)."""
        if not any(self.ran):
            return None
        missing = self.never_ran()
        total = len(self.statements)
        if not missing:
            return f"every one of the {total} statements of {self.name} ran"
        return (f"{total - len(missing)} of the {total} statements of {self.name} ran; no scenario ran "
                + ", ".join(s.describe() for s in missing))

    def to_dict(self) -> dict[str, Any] | None:
        sentence = self.sentence()
        if sentence is None:
            return None
        return {"sentence": sentence, "name": self.name, "statements": len(self.statements), "ran": sum(self.ran),
                "never_ran": [{"line": s.line, "text": s.text} for s in self.never_ran()]}


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _statement(filename: str, node: ast.stmt) -> Statement:
    text = linecache.getline(filename, node.lineno).strip() or ast.unparse(node).splitlines()[0]
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS - 1] + "…"
    return Statement(node.lineno, text)
