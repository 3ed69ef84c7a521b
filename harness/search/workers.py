"""Where a campaign's worker processes come from: a fork server that has imported swafuzz.

A worker started with ``spawn`` is a new interpreter that imports torch, Hypothesis and the
harness before its first example: seconds, spent from the campaign's budget (the workers'
budgets count from the campaign's start), so that on a short budget two workers ran well
under twice the examples of one. Workers are forked instead from a server process that
imported those once (:data:`PRELOAD`) and does nothing else: no thread, no CUDA context,
no torch operation has run in it, so a worker forked from it is as clean as a spawned one
and starts in milliseconds. :func:`start_early` starts the server as soon as the command
line asks for workers, so that its imports overlap the command's own.

The server keeps the environment it started with; what a campaign sets in its own
environment after that (the ``--sglang-*`` options) reaches its workers through
:func:`environment_for_workers`, applied as each worker starts.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
from typing import Any

# torch._dynamo too: every run loads the graph recorder, which imports it (1.4-1.6 s), and
# a worker would pay that from its budget; importing it starts no thread and no device
PRELOAD = ["swafuzz.search.campaign", "torch._dynamo", "swafuzz.search.worker_heap"]
ENVIRONMENT_PREFIX = "SWAFUZZ_"


def context() -> Any:
    """The multiprocessing context workers start in: the fork server where the platform has
    one, else ``spawn`` (CUDA cannot be used in a process forked after it was)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    return forkserver


def start_early(argv: list[str]) -> None:
    """Start the fork server now when ``argv`` asks for more than one worker."""
    if _workers(argv) > 1:
        start_server()


def start_server() -> None:
    """Start the fork server (where the platform has one) unless it runs already."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context()
        multiprocessing.forkserver.ensure_running()


def _workers(argv: list[str]) -> int:
    for index, word in enumerate(argv):
        value = word.partition("=")[2] if word.startswith("--workers=") else (
            argv[index + 1] if word == "--workers" and index + 1 < len(argv) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 1  # the command line's own check says what is wrong with it
    return 1


def environment_for_workers() -> dict[str, str]:
    """swafuzz's variables as this process has them now, for :func:`take_environment`."""
    return {name: value for name, value in os.environ.items() if name.startswith(ENVIRONMENT_PREFIX)}


def take_environment(environment: dict[str, str]) -> None:
    """In a worker: swafuzz's variables as the campaign had them when it started the pool."""
    for name in [name for name in os.environ if name.startswith(ENVIRONMENT_PREFIX)]:
        del os.environ[name]
    os.environ.update(environment)
