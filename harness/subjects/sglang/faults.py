"""Findings told in SGLang's terms: the SGLang function that did it, its file and line in the
tree, and what it handed on, returned or raised.

Bound SGLang code keeps the file it came from (``tree.location``) and its qualified name
(:mod:`.binding`), in source and import mode alike, and all of it lies under ``sglang/srt/``
in every tree; a frame there is SGLang's, any other is swafuzz's (a driver, a stand-in) or
a library's.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable

from ...errors import CodeFault, SwafuzzError
from ...run.guard import SubjectTimeout, describe_exception

TREE_PACKAGE = "sglang/srt/"


def place(code: types.CodeType, line: int) -> str:
    """``sglang/srt/...py:LINE``: where ``code`` is, from the package down."""
    filename = code.co_filename
    at = filename.rfind(TREE_PACKAGE)
    return f"{filename[at:] if at >= 0 else filename}:{line}"


def _in_tree(code: types.CodeType) -> bool:
    return TREE_PACKAGE in code.co_filename


def defined_at(function: Callable[..., Any]) -> tuple[str, str]:
    """A bound function's qualified name and the place of its ``def`` line."""
    code = getattr(function, "__func__", function).__code__
    return code.co_qualname, place(code, code.co_firstlineno)


def _innermost_in_tree(exc: BaseException) -> tuple[str, str] | None:
    """The qualified name and place of the innermost SGLang frame ``exc`` passed through."""
    innermost = None
    traceback = exc.__traceback__
    while traceback is not None:
        if _in_tree(traceback.tb_frame.f_code):
            innermost = traceback
        traceback = traceback.tb_next
    if innermost is None:
        return None
    code = innermost.tb_frame.f_code
    return code.co_qualname, place(code, innermost.tb_lineno)


def raised_in_sglang(exc: Exception) -> CodeFault | None:
    """The fault of the innermost SGLang function that ``exc`` passed through, saying what
    it raised; None where no SGLang frame raised it, or it is swafuzz's own error (a gap
    of the stand-ins, a fault already told)."""
    if isinstance(exc, SwafuzzError):
        return None
    found = _innermost_in_tree(exc)
    return None if found is None else CodeFault(*found, f"raised {describe_exception(exc)}")


def told_in_sglang_terms(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a driver, raising what SGLang code raised in it as the fault of the
    SGLang function that raised it, and naming the SGLang function a timeout interrupted."""

    @functools.wraps(method)
    def run(self, *args: Any) -> Any:
        try:
            return method(self, *args)
        except SubjectTimeout as timeout:
            # the guard's alarm: the SGLang function it interrupted (its line at the time)
            # is the one that did not return
            found = _innermost_in_tree(timeout)
            if found is not None:
                timeout.running_in = "{} ({})".format(*found)
            raise
        except Exception as exc:
            fault = raised_in_sglang(exc)
            if fault is None:
                raise
            raise fault from exc

    return run


def location_fault(callee: str, location: Any) -> CodeFault:
    """The fault of the SGLang function that handed ``callee``, a store stand-in (the
    caller of this), a location that is no tensor of rows."""
    caller = frame = sys._getframe(2)
    while frame is not None and not _in_tree(frame.f_code):  # a stand-in between them
        frame = frame.f_back
    frame = frame or caller
    shown = "None" if location is None else f"a {type(location).__name__}"
    return CodeFault(frame.f_code.co_qualname, place(frame.f_code, frame.f_lineno),
                     f"handed {callee} the location {shown}, not a tensor of rows: the layer's keys have "
                     "nowhere to go")
