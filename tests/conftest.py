"""Fixtures shared by the specifications."""


from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable

import pytest
import torch

# The suite downloads nothing: the real-SGLang tests read the releases named in
# sglang-releases.txt beside this file, which scripts/fetch-test-releases puts in the wheel
# cache (CI runs it first), and skip, saying so, where one is missing. Set in the environment,
# so that the commands the tests start read the same cache the same way.
os.environ.setdefault("SWAFUZZ_SGLANG_OFFLINE", "1")
SUITE_RELEASES = tuple(
    line.strip() for line in (Path(__file__).parent / "sglang-releases.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)

# A process started in the background by a shell without job control (`pytest &` in a script,
# nohup) inherits SIGINT ignored, and Python then leaves it so: the interrupt tests would find
# no interrupt to test. Each test process takes SIGINT as an interactive Python does.
signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest -n runs a process per core: torch's default of a thread per core in each would make
# the small tensor operations of the subjects wait on threads that are not running, as
# swafuzz's own campaigns avoid by running torch on one thread (campaign_torch_threads)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def signal_handlers_stay_in_their_test():
    """A test that leaves SIGINT ignored (or any handler changed) breaks the interrupt tests
    that a worker process happens to run after it: each test leaves them as it found them."""
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
    before = {signum: signal.getsignal(signum) for signum in watched}
    yield
    changed = {signal.Signals(signum).name: handler for signum in watched
               if (handler := signal.getsignal(signum)) is not before[signum]}
    for signum, handler in before.items():
        signal.signal(signum, handler)
    assert not changed, f"the test left signal handlers changed: {changed}"


@pytest.fixture(autouse=True)
def sglang_options_stay_in_their_test():
    """The --sglang-* options reach worker processes through the environment: a test that
    runs a command in-process with them must not hand them to the tests after it."""
    def options() -> dict[str, str]:
        return {name: value for name, value in os.environ.items() if name.startswith("SWAFUZZ_SGLANG_")}

    before = options()
    yield
    for name in options():
        os.environ.pop(name)
    os.environ.update(before)


def wait_until(condition: Callable[[], bool], what: str, process: subprocess.Popen | None = None,
               timeout_s: float = 180.0) -> None:
    """Waits until ``condition()`` holds. A test that acts on a running process acts once the
    process has done something, never after a fixed time, which a busy machine can outlast;
    the timeout is only a net for a process that never gets there."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"the process ended with {process.returncode} before {what}: "
                        f"{process.stderr.read() if process.stderr else ''}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.02)


# A correct subject (the built-in uncached design) that leaves a file named after its process,
# answered-PID, in the working directory once it has answered a store: a test that signals a
# running search waits for the file, so the search is under way however slowly it started.
ANSWERING_SUBJECT = textwrap.dedent('''
    import os
    from pathlib import Path

    from swafuzz.subjects.builtin import Uncached


    class Answering(Uncached):
        def swa_write_location(self, batch, layer_id):
            rows = super().swa_write_location(batch, layer_id)
            Path(f"answered-{os.getpid()}").touch()
            return rows
''')


def answering_subject(directory: Path) -> str:
    """Writes :data:`ANSWERING_SUBJECT` into ``directory`` and returns its name for --subject."""
    (directory / "answering.py").write_text(ANSWERING_SUBJECT)
    return "answering:Answering"


def processes_answered(directory: Path) -> int:
    """How many processes the answering subject has answered a store in."""
    return len(list(directory.glob("answered-*")))


PytestRun = Callable[..., "tuple[subprocess.CompletedProcess, dict[str, str]]"]


@pytest.fixture
def run_pytest_in_subprocess(tmp_path_factory: pytest.TempPathFactory) -> PytestRun:
    """Runs pytest on a path in a fresh interpreter and returns the process with each test's
    outcome ("passed", "failed", "skipped"), read from its JUnit XML: pytest's summary line
    is prose that changes between its releases, the XML is data."""

    def run(target: Path, extra_path: Path | None = None) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
        junit = tmp_path_factory.mktemp("junit") / "results.xml"
        paths = [str(extra_path) if extra_path else None, os.environ.get("PYTHONPATH")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
        directory = target if target.is_dir() else target.parent
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", str(target)],
            capture_output=True, text=True, cwd=directory, env=env, timeout=120,
        )
        return done, _outcomes(junit)

    return run


def _outcomes(junit: Path) -> dict[str, str]:
    if not junit.is_file():
        return {}
    outcomes = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes


@functools.lru_cache(maxsize=None)
def released_tree(version: str):
    """The installed SGLang package when it is ``version``, else the release's wheel, or why
    neither is there (a failed download is remembered: each try costs a round trip)."""
    from swafuzz.subjects.sglang import locate

    installed = locate.installed()
    if installed is not None and installed.version == version:
        return installed
    try:
        return locate.wheel(version)
    except locate.SglangUnavailable as exc:
        return f"no sglang {version} wheel: {exc}"


def release_or_skip(version: str):
    """The release's tree, or the test is skipped with why it cannot be had."""
    tree = released_tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    return tree


def edited_release(version: str, path: str, old: str, new: str, name: str):
    """``version``'s tree with ``old`` replaced by ``new`` in ``path`` (which must hold it),
    read in place: no file is written."""
    from swafuzz.subjects.sglang import locate

    tree = release_or_skip(version)
    text = tree.read(path)
    assert text is not None and old in text, f"sglang {version}'s {path} no longer holds the text this edit replaces"
    return locate.EditedTree(root=tree.root, origin=tree.origin, path=path, text=text.replace(old, new), name=name)
