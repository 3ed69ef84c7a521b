"""Paging: the pools' pages and, per request slot, the pages each request holds.

Free pages are masks and page tables arrays indexed by request slot, so that a batch's
pages are taken, given back, read and written with a fixed number of array operations.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .scenario import EngineConfig, ScenarioError

INT = np.int64
NO_PAGES = np.zeros(0, dtype=INT)
MIN_SEGMENT = 32  # pages of a request slot's home segment: most requests never outgrow it


def ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i] .. starts[i] + counts[i] - 1`` for every ``i``, concatenated."""
    ends = counts.cumsum()
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=INT) + (starts - (ends - counts)).repeat(counts)


class PageAllocator:
    """Pages ``1..num_pages-1``; page 0 is the reserved dummy. Lowest free pages first.

    A free mask, taken from and given back to a batch of pages at a time. No page below
    ``_low`` is free, so the lowest free pages are found by scanning up from there.
    """

    def __init__(self, num_pages: int, what: str):
        self.num_pages = num_pages
        self.what = what
        self.free = np.empty(num_pages, dtype=bool)
        self.reset()

    def reset(self) -> None:
        self.free.fill(True)
        self.free[0] = False
        self.available = self.num_pages - 1
        self._low = 1

    def full(self) -> ScenarioError:
        return ScenarioError(f"the {self.what} is full ({self.num_pages - 1} pages in use)")

    def take_lowest(self, count: int) -> np.ndarray:
        """The ``count`` lowest free pages, ascending (the caller checked ``available``)."""
        if not count:
            return NO_PAGES
        span = max(64, 2 * count)
        while True:
            found = self.free[self._low:self._low + span].nonzero()[0]
            if len(found) >= count or self._low + span >= self.num_pages:
                break
            span *= 4
        pages = found[:count] + self._low
        self.free[pages] = False
        self.available -= count
        self._low = int(pages[-1]) + 1
        return pages

    def take_highest(self, count: int) -> np.ndarray:
        """The ``count`` highest free pages, highest first."""
        if count > self.available:
            raise self.full()
        pages = np.flatnonzero(self.free)[::-1][:count]
        self.free[pages] = False
        self.available -= count
        return pages

    def take_pages(self, pages: np.ndarray) -> None:
        self.free[pages] = False
        self.available -= len(pages)

    def give_back(self, pages: np.ndarray) -> None:
        if len(pages):
            self.free[pages] = True
            self.available += len(pages)
            self._low = min(self._low, int(pages.min()))


class PageTables:
    """Per request slot, its pages by page number, so a batch's pages are read or written
    with one indexed operation. Each slot owns a home segment of ``MIN_SEGMENT`` pages at
    the start of one array; a request that outgrows it moves to a segment twice as large
    after them (the array is compacted when it runs out), and a finished request's slot
    goes back home."""

    def __init__(self, num_slots: int):
        self.home = np.arange(num_slots, dtype=INT) * MIN_SEGMENT
        self.start = self.home.copy()
        self.capacity = np.full(num_slots, MIN_SEGMENT, dtype=INT)
        self.homes_end = num_slots * MIN_SEGMENT
        # never zeroed: a page number is read only where one was written
        self.pages = np.empty(2 * self.homes_end, dtype=INT)
        self.top = self.homes_end

    def get(self, slots, page_nos: np.ndarray) -> np.ndarray:
        return self.pages[self.start[slots] + page_nos]

    def put(self, slots: np.ndarray, page_nos: np.ndarray, pages: np.ndarray, fits: bool = False) -> None:
        """``fits``: every page number is known to be below ``MIN_SEGMENT``."""
        self.pages[self.entries(slots, page_nos, fits)] = pages

    def entries(self, slots: np.ndarray, page_nos: np.ndarray, fits: bool = False) -> np.ndarray:
        """Where in :attr:`pages` the slots' page numbers are kept, each slot's segment grown
        first to hold them. They stay there until a later call grows a segment."""
        if not fits:
            short = page_nos >= self.capacity[slots]
            if short.any():
                self._grow(slots[short], page_nos[short] + 1)
        return self.start[slots] + page_nos

    def release(self, slots) -> None:
        """The slots' pages are forgotten (grown segments are reclaimed at compaction)."""
        self.start[slots] = self.home[slots]
        self.capacity[slots] = MIN_SEGMENT

    def _grow(self, slots: np.ndarray, needed: np.ndarray) -> None:
        need = np.zeros(len(self.capacity), dtype=INT)
        np.maximum.at(need, slots, needed)
        grown = need.nonzero()[0]
        old = self.capacity[grown]
        new = np.maximum(need[grown], 2 * old)
        if self.top + int(new.sum()) > len(self.pages):
            self._compact(int(new.sum()))
        starts = self.top + new.cumsum() - new
        self.pages[ragged_arange(starts, old)] = self.pages[ragged_arange(self.start[grown], old)]
        self.start[grown] = starts
        self.capacity[grown] = new
        self.top += int(new.sum())

    def _compact(self, extra: int) -> None:
        away = (self.capacity > MIN_SEGMENT).nonzero()[0]  # the slots that left home
        sizes = self.capacity[away]
        used = int(sizes.sum())
        pages = np.empty(self.homes_end + 2 * (used + extra), dtype=INT)
        pages[:self.homes_end] = self.pages[:self.homes_end]
        starts = self.homes_end + sizes.cumsum() - sizes
        pages[ragged_arange(starts, sizes)] = self.pages[ragged_arange(self.start[away], sizes)]
        self.pages = pages
        self.start[away] = starts
        self.top = self.homes_end + used


class Paging:
    """Where a forward's tokens (positions, in allocation order) fall in a pool's pages."""

    def __init__(self, positions: np.ndarray, page_size: int, last_position: int):
        self.page_size = page_size
        self.fits = last_position // page_size < MIN_SEGMENT  # every page table has room
        if page_size == 1:  # every token starts a page: its slot is the page
            self.page_nos, self.offsets, self.starts = positions, None, None
            self.new_pages = len(positions)
        else:
            self.page_nos, self.offsets = np.divmod(positions, page_size)
            self.starts = (self.offsets == 0).nonzero()[0]  # the tokens that start a page
            self.new_pages = len(self.starts)

    def asking(self, pages_given: int) -> int:
        """The token that asks for a page after ``pages_given`` were given."""
        return pages_given if self.starts is None else int(self.starts[pages_given])

    def place(self, owners: np.ndarray, allocator: PageAllocator, table: PageTables,
              returns: Sequence[tuple[int, np.ndarray, np.ndarray]] = ()) -> np.ndarray:
        """Take the tokens' new pages and record them; the tokens' slots in the pool.

        ``returns``: ``(token, owners, page_nos)`` in token order: the pages those hold in
        ``table`` go back to ``allocator`` before token ``token`` asks (they were read
        from the table then, as it holds the pages taken before)."""
        asking = slice(None) if self.starts is None else self.starts
        # where the asking tokens' pages and the returned ones are kept, found once: every
        # segment is grown first, so none moves while pages are taken and given back
        entries = table.entries(owners[asking], self.page_nos[asking], self.fits)
        held = table.entries(np.concatenate([held_owners for _, held_owners, _ in returns]),
                             np.concatenate([held_page_nos for _, _, held_page_nos in returns])) if returns else NO_PAGES
        held_ends = np.cumsum([len(held_owners) for _, held_owners, _ in returns]).tolist()
        taken: list[np.ndarray] = []
        asked = 0  # tokens that asked for a page so far (only those that start one ask)
        for (token, _, _), held_start, held_end in zip(returns, [0] + held_ends, held_ends):
            asked = self._take(allocator, table, entries, asked, token if self.starts is None else
                               int(self.starts.searchsorted(token)), taken)
            allocator.give_back(table.pages[held[held_start:held_end]])
        self._take(allocator, table, entries, asked, self.new_pages, taken)
        if self.starts is None:  # every token took a page: its slot is the page
            return taken[0] if len(taken) == 1 else np.concatenate(taken or [NO_PAGES])
        return table.get(owners, self.page_nos) * self.page_size + self.offsets

    @staticmethod
    def _take(allocator: PageAllocator, table: PageTables, entries: np.ndarray, first: int, stop: int,
              taken: list[np.ndarray]) -> int:
        """Pages for the asking tokens ``first .. stop - 1``, kept at their ``entries``; ``stop``."""
        if stop > first:
            pages = allocator.take_lowest(stop - first)
            table.pages[entries[first:stop]] = pages
            taken.append(pages)
        return stop


def slots_in(table: PageTables, page_size: int, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The pool slots of tokens (request slot, position) as ``table`` pages them."""
    if page_size == 1:
        return table.get(owners, positions)
    page_nos, offsets = np.divmod(positions, page_size)
    return table.get(owners, page_nos) * page_size + offsets


class Pools:
    """The paged pools of one engine: the full pool every model shares and one SWA pool per
    model, each with its page table per request slot."""

    def __init__(self, config: EngineConfig):
        c = config
        self.models = c.models
        self.swa_page_size = c.swa_page_size
        self.full_page_size = c.full_page_size
        self.full_pages = PageAllocator(c.full_pool_size // c.full_page_size, "full KV pool")
        self.swa_pages = {
            m: PageAllocator(c.swa_pool_size // c.swa_page_size, f"{m} SWA pool") for m in c.models
        }
        self.full_table = PageTables(c.num_req_slots)
        self.swa_tables = {m: PageTables(c.num_req_slots) for m in c.models}

    def full_slots(self, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return slots_in(self.full_table, self.full_page_size, owners, positions)

    def swa_slots(self, model: str, owners: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return slots_in(self.swa_tables[model], self.swa_page_size, owners, positions)

    def give_back_swa(self, slots: np.ndarray, first: np.ndarray, stop: np.ndarray) -> None:
        counts = stop - first
        if counts.any():
            owners, page_nos = np.repeat(slots, counts), ragged_arange(first, counts)
            for model in self.models:
                self.swa_pages[model].give_back(self.swa_tables[model].get(owners, page_nos))

    def page_ends(self, positions: np.ndarray) -> np.ndarray | None:
        """Which of the positions leaving the window end their SWA page (None: all, pages of
        one slot): a page goes back once its last position has left."""
        page = self.swa_page_size
        return None if page == 1 else (positions % page == page - 1).nonzero()[0]

    def release(self, slots) -> None:
        """The slots' page tables forget their pages."""
        self.full_table.release(slots)
        for table in self.swa_tables.values():
            table.release(slots)

    def reset(self) -> None:
        """Every page is free again."""
        self.full_pages.reset()
        for model in self.models:
            self.swa_pages[model].reset()
