"""The edge where input from outside enters: files read, JSON parsed, paths to write.

A replay file may come from a pull request or a CI artifact, so reading one is bounded
before any work is done on it: only a regular file is read, at most :data:`MAX_FILE_BYTES`
bytes of it; JSON nesting deeper than :data:`MAX_JSON_DEPTH` and integers longer than
:data:`MAX_INT_DIGITS` digits are refused before the parser builds them. The sizes inside a
scenario are bounded by :data:`swafuzz.reference.scenario.LIMITS`. Every refusal is an
:class:`InputError` whose message is one line naming the file, the field and the limit.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..reference.scenario import abbreviate
from ..errors import InputError

MAX_FILE_BYTES = 4 * 1024 * 1024  # a real replay file is a few kilobytes
MAX_JSON_DEPTH = 32  # a replay file nests six deep
MAX_INT_DIGITS = 20  # every integer swafuzz reads fits in 64 bits

show = abbreviate  # a value for a one-line message


def printable(text: str) -> str:
    """Text read from a file as it may be shown on a terminal: control characters (escape
    sequences that could rewrite the screen) are shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe_path(path: str | os.PathLike) -> str:
    """A path for a one-line message (a file name may hold a newline)."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


def read_regular_file(path: str | os.PathLike, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes`` bytes.

    Opened without blocking, so a FIFO or a device is refused instead of read forever.
    """
    name = describe_path(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{name}: no such {what}") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot open it: {exc.strerror or exc}") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise InputError(f"{name}: {kind}; a {what} is read only from a regular file")
    with os.fdopen(descriptor, "rb") as stream:
        try:
            data = stream.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{name}: larger than the limit MAX_FILE_BYTES = {max_bytes} bytes for a {what}")
    return data


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub('""', text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class _LongInt:
    """Stands in for an integer too long to build, until its place in the document is known."""

    def __init__(self, digits: int):
        self.digits = digits


class _Digits:
    """The parser's integer hook for one document: notes whether any integer was too long."""

    def __init__(self) -> None:
        self.too_long = False

    def __call__(self, text: str) -> int | _LongInt:
        digits = len(text.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            self.too_long = True
            return _LongInt(digits)
        return int(text)


def _path_to_long_int(value: Any) -> list[str | int] | None:
    """The keys and indices leading to the first too-long integer (nesting is bounded)."""
    if isinstance(value, _LongInt):
        return []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(item, (dict, list, _LongInt)):
            below = _path_to_long_int(item)
            if below is not None:
                return [key, *below]
    return None


def _no_constant(name: str) -> None:
    raise InputError(f"{name} is not JSON (numbers are finite)")


def parse_json(data: bytes, name: str) -> Any:
    """Parse ``data`` as UTF-8 JSON within the depth and digit limits."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    depth = _nesting_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"{name}: JSON nested {depth} deep exceeds the limit MAX_JSON_DEPTH = {MAX_JSON_DEPTH}")
    integers = _Digits()
    try:
        data = json.loads(text, parse_int=integers, parse_constant=_no_constant)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if integers.too_long:
        keys = _path_to_long_int(data)
        found: Any = data
        for key in keys:
            found = found[key]
        where = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in keys).lstrip(".")
        raise InputError(f"{name}: {printable(where[:120]) or 'the document'}: an integer of {found.digits} "
                         f"digits exceeds the limit MAX_INT_DIGITS = {MAX_INT_DIGITS}")
    return data


def writable_file(path: Path, option: str, *, not_the_same_as: Path | None = None) -> Path:
    """``path`` as a file swafuzz may create or replace, checked before any run starts."""
    name = describe_path(path)
    if path.is_dir():
        raise InputError(f"{option} {name}: is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {name}: not a regular file; swafuzz writes only regular files")
    if not_the_same_as is not None and path.exists() and path.samefile(not_the_same_as):
        raise InputError(f"{option} {name}: is the input file, which swafuzz never overwrites")
    writable_directory(path.parent if str(path.parent) else Path("."), option, create=True, shown=name)
    return path


def writable_directory(path: Path, option: str, *, create: bool = True, shown: str | None = None) -> Path:
    """``path`` as a directory swafuzz can write into, made if ``create``."""
    name = shown or describe_path(path)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{option} {name}: cannot create it: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise InputError(f"{option} {name}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{option} {name}: not writable ({os.strerror(errno.EACCES)})")
    return path
