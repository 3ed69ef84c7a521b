"""Imported last by the fork server (:data:`swafuzz.search.workers.PRELOAD`): the heap frozen there
once, as every search freezes its own (:func:`swafuzz.search.fuzz.freeze_the_heap_so_far`), so
that each forked worker's first collection scans its own objects only (a collection over
torch's heap costs 0.2-0.3 s, spent from the worker's budget) and the collector never
writes to the pages the workers share with the server.
"""

from .fuzz import freeze_the_heap_so_far

freeze_the_heap_so_far()
