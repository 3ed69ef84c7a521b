"""Where fuzzing runs remember their failing examples: a directory, or a Redis server that
many machines share.

A shared database is Hypothesis's own :class:`~hypothesis.extra.redis.RedisExampleDatabase`
with a local directory copy of everything the run reads or writes. When Redis stops
answering in the middle of a run, the run goes on with the local copy alone and says so
once on stderr: a failure found after that is still saved, and still reported.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, TextIO

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from ..errors import DatabaseError

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# a dead server must not stall the run: fail fast and fall back to the local copy
REDIS_TIMEOUT_S = 5.0


def is_redis_url(spec: str | os.PathLike) -> bool:
    return str(spec).startswith(REDIS_SCHEMES)


def open_database(spec: str | os.PathLike, local_copy: str | os.PathLike | None = None) -> ExampleDatabase:
    """The example database named by ``spec``: a directory, or a Redis URL
    (``redis://host:port/db``) whose examples are also kept in the ``local_copy`` directory
    (default: ``.hypothesis/swafuzz-local``)."""
    if not is_redis_url(spec):
        return DirectoryBasedExampleDatabase(str(spec))
    local = DirectoryBasedExampleDatabase(str(local_copy or Path(".hypothesis") / "swafuzz-local"))
    return SharedDatabase(_redis_database(str(spec)), local, where=redacted(str(spec)))


def _redis_database(url: str) -> ExampleDatabase:
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise DatabaseError(
            f"{redacted(url)}: a Redis database needs the redis package (pip install 'swafuzz[redis]')"
        ) from None
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
    except ValueError as exc:
        raise DatabaseError(f"{redacted(url)} is not a Redis URL: {exc}") from None
    return RedisExampleDatabase(client)


def redacted(url: str) -> str:
    """The URL without its password, fit for a log line."""
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import RedisError
    except ImportError:
        return (OSError,)
    return (RedisError, OSError)


class SharedDatabase(ExampleDatabase):
    """Writes go to the shared database and to a local directory; reads see both.

    Once the shared database fails, it is dropped for the rest of the run: one line on
    ``stream`` says so, and the local copy carries on alone, so nothing found is lost.
    """

    def __init__(self, shared: ExampleDatabase, local: ExampleDatabase, *, where: str,
                 stream: Callable[[], TextIO] = lambda: sys.stderr):
        super().__init__()
        self.shared: ExampleDatabase | None = shared
        self.local = local
        self.where = where
        self._stream = stream
        self._errors = _unreachable_errors()

    def __repr__(self) -> str:
        return f"SharedDatabase({self.shared!r}, local={self.local!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SharedDatabase) and (self.shared, self.local) == (other.shared, other.local)

    @property
    def degraded(self) -> bool:
        return self.shared is None

    def fetch(self, key: bytes) -> Iterable[bytes]:
        seen: set[bytes] = set()
        for value in self._shared_values(key):
            seen.add(value)
            yield value
        for value in self.local.fetch(key):
            if value not in seen:
                yield value

    def _shared_values(self, key: bytes) -> Iterator[bytes]:
        if self.shared is None:
            return
        try:
            values = list(self.shared.fetch(key))
        except self._errors as exc:
            self._lose_shared(exc)
            return
        yield from values

    def save(self, key: bytes, value: bytes) -> None:
        self.local.save(key, value)
        self._on_shared(lambda db: db.save(key, value))

    def delete(self, key: bytes, value: bytes) -> None:
        self.local.delete(key, value)
        self._on_shared(lambda db: db.delete(key, value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.local.move(src, dest, value)
        self._on_shared(lambda db: db.move(src, dest, value))

    def _on_shared(self, operation: Callable[[ExampleDatabase], Any]) -> None:
        if self.shared is None:
            return
        try:
            operation(self.shared)
        except self._errors as exc:
            self._lose_shared(exc)

    def _lose_shared(self, exc: BaseException) -> None:
        self.shared = None
        print(f"swafuzz: the shared example database {self.where} stopped answering ({exc}); "
              f"going on with the local copy in {getattr(self.local, 'path', self.local)}",
              file=self._stream(), flush=True)
