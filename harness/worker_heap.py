"""Imported last by the fork server (:data:`swafuzz.workers.PRELOAD`): one collection over
what the server imported, whose survivors are then frozen out of every later collection,
so that each forked worker's first collection scans its own objects only (a collection
over torch's heap costs 0.2-0.3 s, spent from the worker's budget) and the collector never
writes to the pages the workers share with the server.
"""

import gc

gc.collect()
gc.freeze()
