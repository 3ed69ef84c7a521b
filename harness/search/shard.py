"""Sharded campaigns: N machines of a CI matrix search disjoint parts of one seed space.

A seeded fuzzing process draws its k-th chunk of examples from seed ``seed + k * stride``
(see :func:`swafuzz.search.fuzz.fuzz`). Shard ``I/N`` running ``W`` worker processes gives its
worker ``w`` the lane ``offset = (I - 1) * W + w`` of ``N * W`` lanes, so the chunk seeds of
all shards and workers are disjoint and together cover every seed from the base seed on.
Every shard must run the same number of workers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import count, islice

_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    total: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``"I/N"`` with ``1 <= I <= N``; anything else is a ValueError saying why."""
        match = _SHARD.fullmatch(text)
        if match is None:
            raise ValueError(f"expected I/N (this machine's shard I of N), got {text!r}")
        index, total = int(match[1]), int(match[2])
        if not 1 <= index <= total:
            raise ValueError(f"shard {index}/{total}: I must be between 1 and N")
        return cls(index, total)

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"


WHOLE = Shard(1, 1)


@dataclass(frozen=True)
class SeedLane:
    """Chunk ``k`` of the lane draws from seed ``base + offset + k * stride``."""

    offset: int
    stride: int

    def seeds(self, base: int, chunks: int) -> list[int]:
        return list(islice((base + self.offset + k * self.stride for k in count()), chunks))


def seed_lane(shard: Shard, worker: int = 0, workers: int = 1) -> SeedLane:
    """The lane of worker ``worker`` (0-based) of ``workers`` on ``shard``."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}")
    return SeedLane(offset=(shard.index - 1) * workers + worker, stride=shard.total * workers)
