"""Every error of swafuzz's own that a user can meet, under one base, with the exit code it
ends a command with.

A subclass keeps the built-in exception it has always been as a second base (a
:class:`SubjectError` is a ``TypeError``, an :class:`InputError` a ``ValueError``), so code
that caught those still does. Errors that are the harness's own gap rather than the user's
input end a command with :data:`~swafuzz.names.EXIT_INTERNAL`, where the command says it is
a bug in swafuzz. Standard library only: any module may import this one.
"""

from __future__ import annotations

from typing import Any

from .names import EXIT_DIVERGENCE, EXIT_INTERNAL, EXIT_USAGE


class SwafuzzError(Exception):
    """The base of swafuzz's errors."""

    exit_code = EXIT_INTERNAL


# ---- bad input: the command exits 2 with one line saying what is wrong ---------------------


class UsageError(SwafuzzError):
    """Bad input from the person or script running swafuzz."""

    exit_code = EXIT_USAGE


class InputError(SwafuzzError, ValueError):
    """Input from outside that swafuzz refuses: beyond a limit, malformed."""

    exit_code = EXIT_USAGE


class ReplayError(InputError):
    """A replay file that cannot be read: missing, not JSON, another format or version,
    beyond a limit, or naming code to import."""


class ReportError(SwafuzzError, ValueError):
    """A report that cannot be merged: missing, not JSON, or not a swafuzz report."""

    exit_code = EXIT_USAGE


class DatabaseError(SwafuzzError, ValueError):
    """A database specification that cannot be used (bad URL, the redis package missing)."""

    exit_code = EXIT_USAGE


class SubjectError(SwafuzzError, TypeError):
    """The subject cannot be run at all (not a subject class, wrong API version)."""

    exit_code = EXIT_USAGE


class UnmodelledPath(SubjectError):
    """A run reached a path swafuzz does not model: it ends as a usage error that names what
    to supply, never as a divergence (a false alarm on a merge gate)."""


class NotCheckable(SubjectError):
    """The subject's behaviour cannot be observed on this device: it is not checked, and
    so it is never reported as passing."""


class BindError(SubjectError):
    """A target cannot be bound from this SGLang source."""


class ImportModeUnavailable(BindError):
    """The installed package cannot be imported (its GPU-only dependencies are missing)."""


class SglangUnavailable(SwafuzzError, RuntimeError):
    """No SGLang source can be found or downloaded."""

    exit_code = EXIT_USAGE


# ---- a finding ----------------------------------------------------------------------------


class Diverged(SwafuzzError, AssertionError):
    """The subject diverged from the reference on ``scenario``; the message is the diagnosis
    sentence (an AssertionError, so that pytest reports it as a failed test)."""

    exit_code = EXIT_DIVERGENCE

    def __init__(self, scenario: Any, divergence: Any):
        super().__init__(divergence.sentence)
        self.scenario = scenario
        self.divergence = divergence


class CodeFault(SwafuzzError):
    """The code under test raised, or handed on a value no caller can take (a store given
    the location None): a finding, told at the function of that code which did it.
    ``function``: its qualified name; ``place``: ``file:line`` in the tree; ``what``: a verb
    phrase ("handed set_key_buffer_fused the location None")."""

    exit_code = EXIT_DIVERGENCE

    def __init__(self, function: str, place: str, what: str):
        super().__init__(f"{function} ({place}) {what}")
        self.function, self.place, self.what = function, place, what


# ---- swafuzz's own gaps: the command says it is a bug in swafuzz --------------------------


class ModelGap(SwafuzzError):
    """Raised by code that runs the subject on swafuzz's models (the SGLang stand-ins) where
    the code took a path those models lack. It says nothing about the code under test."""


class StandInGap(ModelGap, AttributeError):
    """Bound SGLang code read something that swafuzz's stand-ins do not model. An
    AttributeError, so that SGLang's own ``getattr(obj, name, default)`` reads behave as on
    an object without the attribute; a :class:`ModelGap`, so that a run that meets it ends
    as a gap of swafuzz, never as a divergence of the code."""


class GraphCaptureError(SwafuzzError, RuntimeError):
    """The captured work cannot be replayed (host sync, data-dependent shape)."""


class Unreadable(SwafuzzError):
    """An SGLang tree cannot be read the way swafuzz reads it; the message says where."""


def exit_code_of(exc: BaseException) -> int:
    """The exit code a command ends with when ``exc`` reaches it."""
    return exc.exit_code if isinstance(exc, SwafuzzError) else EXIT_INTERNAL
