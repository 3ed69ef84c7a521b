"""Running a tree's Triton kernels on CPU: each ``@triton.jit`` function compiled from the
tree's own text while Triton's interpreter (``TRITON_INTERPRET=1``) is on, so that launching
it runs on CPU torch tensors. Shared by every check that runs SGLang's metadata kernels.

triton comes with the ``triton`` extra (``pip install 'swafuzz[triton]'``); without it a
kernel is not checked, and the check says so in :data:`TRITON_MISSING`.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import importlib.util
import linecache
import os
from typing import Any, Iterator

from .locate import SourceTree

TRITON_MISSING = "not checked on CPU: install swafuzz[triton]"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """``@triton.jit`` decorates as Triton's CPU interpreter while this is open; the
    process's own setting is back afterwards."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


_LIBRARY_TWINS: dict[Any, Any] = {}


@contextlib.contextmanager
def _library_interpreted() -> Iterator[None]:
    """Triton's own ``@jit`` library functions (``tl.zeros``, ...) as interpreted twins
    while a kernel runs: triton was imported with the interpreter off, so its library was
    compiled for the GPU, and a kernel calling it would raise under the interpreter."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    compiled = {name: value for name, value in vars(tl).items() if isinstance(value, JITFunction)}
    for name, value in compiled.items():
        setattr(tl, name, _LIBRARY_TWINS.setdefault(value, InterpretedFunction(value.fn)))
    try:
        yield
    finally:
        for name, value in compiled.items():
            setattr(tl, name, value)


class _Launcher:
    """An interpreted kernel as a wrapper launches it, ``kernel[grid](...)``, with Triton's
    library interpreted for the launch."""

    def __init__(self, kernel: Any):
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            with _library_interpreted():
                return launch(*args, **kwargs)
        return run


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) == "triton.jit"


def jitted_kernels(tree: SourceTree, path: str) -> dict[str, Any]:
    """Each ``@triton.jit`` function of ``path``, compiled from the tree's own text as an
    interpreted kernel that its Python wrappers launch (Triton reads a kernel's source
    through linecache, so the tree's text is registered under its location)."""
    import triton
    import triton.language as tl

    text = tree.read(path)
    filename = tree.location(path)
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict[str, Any] = {"triton": triton, "tl": tl, "__name__": "swafuzz_sglang_kernels"}
    kernels = [node for node in ast.parse(text, filename=filename).body
               if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list)]
    with interpreted():
        for node in kernels:
            exec(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"), namespace)
    return {node.name: _Launcher(namespace[node.name]) for node in kernels}


def triton_stand_ins(tree: SourceTree, path: str) -> dict[str, Any]:
    """The globals a kernel file's Python wrappers read for Triton: the ``triton`` and
    ``tl`` modules and the file's interpreted kernels."""
    import triton
    import triton.language as tl

    return {"triton": triton, "tl": tl, **jitted_kernels(tree, path)}


def defines(tree: SourceTree, path: str, name: str) -> bool:
    """Whether ``path`` in ``tree`` defines a top-level function or class ``name``."""
    text = tree.read(path)
    return text is not None and any(
        isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name for node in ast.parse(text).body)


def record_fields(tree: SourceTree, path: str, name: str) -> tuple[str, ...] | None:
    """The annotated fields of ``path``'s record class ``name`` in order (a NamedTuple or a
    msgspec Struct), or None where the file has no such class."""
    module = ast.parse(tree.read(path))
    record = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if record is None:
        return None
    return tuple(n.target.id for n in record.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))


def record(tree: SourceTree, path: str, name: str) -> type | None:
    """``path``'s record class ``name`` as a named tuple of its fields (they are built by
    keyword and read by attribute alike), or None where the file has none."""
    fields = record_fields(tree, path, name)
    return None if fields is None else collections.namedtuple(name, fields)
