"""Fixtures shared by the specifications."""


from __future__ import annotations

import functools
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable

import pytest
import torch

# pytest -n runs a process per core: torch's default of a thread per core in each would make
# the small tensor operations of the subjects wait on threads that are not running, as
# swafuzz's own campaigns avoid by running torch on one thread (campaign_torch_threads)
torch.set_num_threads(1)


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
    from swafuzz.sglang import locate

    installed = locate.installed()
    if installed is not None and installed.version == version:
        return installed
    try:
        return locate.wheel(version)
    except locate.SglangUnavailable as exc:
        return f"no sglang {version} wheel: {exc}"
