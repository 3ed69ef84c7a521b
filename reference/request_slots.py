"""The live requests: each one's request slot, length and the positions that left its
window, kept per request slot so that whole-array passes cover every request at once."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .paging import INT, NO_PAGES, PageAllocator
from .scenario import ScenarioError

_NO_BATCH: tuple[tuple[int, ...] | None, np.ndarray] = (None, NO_PAGES)


class Request(NamedTuple):
    """A live request; its length, window and pages are kept per request slot."""

    rid: int
    slot: int


class RequestSlots:
    """Request ids handed out in admission order; per request slot, the length (a free
    slot has length 0, so whole-array passes skip it) and the positions below which the
    request's tokens left the sliding window."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.slot_of: dict[int, int] = {}  # live request id -> its slot, in admission order
        self.last_batch = _NO_BATCH  # (request ids, their slots) of the latest forward
        self.free_slots = PageAllocator(num_slots, "request slots")
        self.length = np.zeros(num_slots, dtype=INT)
        self.evicted = np.zeros(num_slots, dtype=INT)  # positions below left the window
        self.slot_limit = 1  # no slot at or above it was ever used: passes over slots stop there
        self.longest = 0  # no request was ever longer: while it fits the window, none leaves it
        self.next_request_id = 0

    def live(self, rid: int) -> Request:
        if rid not in self.slot_of:
            raise self._not_live(rid)
        return Request(rid, self.slot_of[rid])

    def _not_live(self, rid: int) -> ScenarioError:
        return ScenarioError(f"request {rid} is not live (live requests: {sorted(self.slot_of)})")

    def slots(self, rids: tuple[int, ...]) -> np.ndarray:
        """The request slots of ``rids``; the first that is not live is the error. A
        request keeps its slot while it lives, so the slots of the last batch hold until a
        request finishes (forwards mostly run the batch before them again)."""
        last_rids, last_slots = self.last_batch
        if rids == last_rids:
            return last_slots
        try:
            slots = np.fromiter(map(self.slot_of.__getitem__, rids), dtype=INT, count=len(rids))
        except KeyError as missing:
            raise self._not_live(missing.args[0]) from None
        self.last_batch = (tuple(rids), slots)
        return slots

    def admit(self, count: int) -> None:
        if count > self.free_slots.available:
            raise ScenarioError(f"no free request slot ({self.num_slots - 1} in use)")
        slots = self.free_slots.take_lowest(count)
        rids = range(self.next_request_id, self.next_request_id + count)
        self.next_request_id += count
        self.slot_of.update(zip(rids, slots.tolist()))
        self.slot_limit = max(self.slot_limit, int(slots[-1]) + 1)

    def held_pages(self, slots: np.ndarray, page: int) -> tuple[np.ndarray, np.ndarray]:
        """First held page number and one past the last, per slot, for pages of ``page``
        tokens holding the window: from the one holding the window's first position up to
        the one holding the last token."""
        return self.evicted[slots] // page, -(-self.length[slots] // page)

    def forget(self, slots) -> None:
        """The slots are free again, with no length and nothing evicted."""
        self.last_batch = _NO_BATCH
        self.length[slots] = 0
        self.evicted[slots] = 0
        self.free_slots.give_back(np.asarray(slots, dtype=INT))
