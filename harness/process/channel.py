"""The supervised child's end of the pipe to its supervisor (:mod:`swafuzz.supervisor`), and
a worker process's record of the scenario in flight.

The child tells the parent each scenario before it runs it, each divergence as soon as its
replay file is written, a heartbeat with the subject call in flight, the exit code it ends
with and the threads its exit waits for, and once they are joined, that they are. The
executor, the campaign and the entry announce through here; this module imports only the
standard library, so any of them may.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..names import EXIT_INTERNAL

CHANNEL_ENV = "SWAFUZZ_SUPERVISOR_FD"
HEARTBEAT_S = 0.5


def _pickled(scenario: Any) -> bytes:
    """The scenario in flight as both announcers keep it. A pickle writes a run's repeated
    event once, where JSON writes out every forward of the run: over drawn scenarios a
    fortieth of the cost and of the bytes."""
    return pickle.dumps(scenario, protocol=pickle.HIGHEST_PROTOCOL)


class _Channel:
    """The child's end of the pipe: messages of one line each, from any thread.

    A message can be cut short: an interrupt raised in the main thread while it writes (a
    long scenario takes several writes) leaves part of a line in the pipe. Each message
    therefore starts a line of its own, so that what follows a torn one (the exit code,
    above all) is still read whole; the torn line is no JSON and is passed over."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def announce_scenario(self, scenario: Any) -> None:
        # the parent decodes only the one a lost run was in
        self.send("scenario", base64.b64encode(_pickled(scenario)).decode("ascii"))

    def send(self, kind: str, payload: Any = None) -> bool:
        """False once the parent is gone."""
        data = ("\n" + json.dumps([kind, payload]) + "\n").encode()
        with self.lock:
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                return False
        return True


class _ScenarioFile:
    """A worker process's announcements. The process that started it needs only the scenario
    in flight, should the worker die in it, so that is kept in a file rather than sent:
    sending each one over a queue cost a campaign worker a quarter of its examples (the
    queue's feeder thread contends with every subject call for the interpreter lock), where
    a pickle that replaces the file costs about 0.1 ms. The rename keeps the file whole
    whenever the worker dies."""

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")

    def announce_scenario(self, scenario: Any) -> None:
        self.partial.write_bytes(_pickled(scenario))
        os.replace(self.partial, self.path)

    def send(self, kind: str, payload: Any = None) -> bool:
        return True  # a worker's divergences and exit reach its starter with its answer


_channel: _Channel | _ScenarioFile | None = None


def keep_scenarios_in(path: Path) -> None:
    """In a worker process (of a campaign or of ``mutate``): keep the scenario in flight in
    ``path`` for :func:`last_scenario`."""
    global _channel
    _channel = _ScenarioFile(path)


def last_scenario(path: Path) -> Any:
    """The scenario a worker kept in ``path`` last, or None where it kept none."""
    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def claim_channel() -> None:
    """In a supervised child: take the pipe the parent gave, and keep it from this process's
    own children (worker processes), then start the heartbeat."""
    global _channel
    fd = os.environ.pop(CHANNEL_ENV, None)
    if fd is None:
        return
    _channel = _Channel(int(fd))
    atexit.register(_joined)
    threading.Thread(target=_heartbeat, name="swafuzz-heartbeat", daemon=True).start()


def announce_scenario(scenario: Any) -> None:
    """The scenario about to run (a child that dies in it is reported with it)."""
    if _channel is not None:
        _channel.announce_scenario(scenario)


def announce_divergence(replay_file: Path) -> None:
    if _channel is not None:
        _channel.send("divergence", str(replay_file))


def announce_exit(code: int) -> None:
    """The exit code, and the threads the interpreter will wait for before it exits (those
    neither daemons nor the main thread), by name."""
    if _channel is not None:
        _channel.send("exit", code)
        main = threading.main_thread()
        _channel.send("threads", [t.name for t in threading.enumerate() if t is not main and not t.daemon])


def _joined() -> None:
    # atexit runs once the interpreter has joined every thread it waits for
    _channel.send("joined")


def _heartbeat() -> None:
    while _channel.send("alive", _call_in_flight()):
        time.sleep(HEARTBEAT_S)
    os._exit(EXIT_INTERNAL)  # the parent has gone, however it ended: nobody would get the result


def _call_in_flight() -> int | None:
    # Never imported from here: the guard's imports reach torch, and an import the main
    # thread is in the middle of would hold this thread, silent, until it is done. Before
    # the guard is loaded no subject call can be in flight.
    guard = sys.modules.get("swafuzz.run.guard")
    call_in_flight = getattr(guard, "call_in_flight", None)
    return call_in_flight() if call_in_flight is not None else None
