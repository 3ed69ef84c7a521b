"""The README's promises hold: its adapter example runs and diverges as described, typed as
written into the installed command, and its command table matches the CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fuzz import fuzz
from harness.registry import SubjectInfo, subject_names

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_adapter_example_is_found_to_diverge():
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    info = SubjectInfo("readme-example", namespace["MetadataCachedTranslation"], expected="diverges")
    result = fuzz(info, settings="ci", max_examples=1000)
    found = result.divergence
    assert found is not None
    # the three ways the README names: graph replay, multi-step draft, an idle forward without init
    stale = (found.source or {}).get("kind") in ("graph_capture", "earlier_step", "earlier_forward")
    assert stale or (found.kind == "raised" and found.mode == "idle"), found.sentence


def test_readme_lists_every_builtin_subject():
    for name in subject_names():
        assert f"`{name}`" in README, name


def console_script() -> str | None:
    """The installed ``swafuzz`` command, preferring the one of this interpreter's environment."""
    beside = Path(sys.executable).parent / "swafuzz"
    return str(beside) if beside.is_file() else shutil.which("swafuzz")


def test_readme_adapter_example_diverges_through_the_installed_command(tmp_path):
    script = console_script()
    if script is None:
        pytest.skip("the swafuzz command is not installed (scripts/install puts it on PATH)")
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    file_name, command = re.search(r"Save it as `([^`]+)` and run `(swafuzz fuzz [^`]+)`", README).groups()
    (tmp_path / file_name).write_text(block)
    argv = shlex.split(command)
    # this checkout's code, whichever one the command was installed from; the working
    # directory, where the example was saved, is deliberately not on the path
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outcome = subprocess.run([script, *argv[1:], "--settings", "ci", "--json", "--report-dir", "reports"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert outcome.returncode == 1, outcome.stderr
    printed = json.loads(outcome.stdout)
    assert printed["verdict"] == "divergence"
    assert printed["diagnosis"]["source"]["kind"] in ("graph_capture", "earlier_step", "earlier_forward")
