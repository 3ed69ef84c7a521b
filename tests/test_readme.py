"""The README's promises hold: every output block, of the README and of the reference pages
under docs/ it links, is what its command prints; its adapter example runs and diverges as
described, typed as written into the installed command; it links every reference page and
stays short enough to read through."""

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

from swafuzz.search.fuzz import fuzz
from swafuzz.subjects.registry import SubjectInfo, subject_names

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# the reference pages the README links, each with output blocks of its own
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *DOCS]}
OUTPUT_OF = re.compile(r"<!-- output of: (.+) -->")
# what varies from machine to machine in what a command prints: its time (and, with it, nothing
# else: the commands shown run derandomized settings)
MACHINE_DEPENDENT = re.compile(r"\b\d+(?:\.\d+)? s\b")


def code_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """Each fenced block of ``text``: its language, the command an ``<!-- output of: ... -->``
    line right above it names, and its text."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        if lines[index].startswith("```"):
            language = lines[index][3:].strip()
            above = OUTPUT_OF.fullmatch(lines[index - 1]) if index else None
            end = lines.index("```", index + 1)
            blocks.append((language, above.group(1) if above else None, "\n".join(lines[index + 1:end])))
            index = end
        index += 1
    return blocks


# each output block of each page, with an id naming its page and its place among the page's blocks
OUTPUT_BLOCKS = [pytest.param(command, text, id=f"{page}-block{index}")
                 for page, text_of_page in PAGES.items()
                 for index, (command, text) in enumerate(
                     (command, text) for language, command, text in code_blocks(text_of_page) if not language)]
_printed: dict[str, str] = {}


def printed_by(command: str, directory: Path) -> str:
    """What ``command`` (a ``swafuzz`` or ``pytest`` command line of the README) prints, run
    once per test session in a directory of its own, as a new user runs it in a fresh checkout."""
    if command not in _printed:
        program, *arguments = shlex.split(command)
        runner = {"swafuzz": [sys.executable, "-m", "swafuzz"],
                  "pytest": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]}[program]
        env = {key: value for key, value in os.environ.items() if not key.startswith(("SWAFUZZ_", "PYTEST_"))}
        done = subprocess.run([*runner, *arguments], cwd=directory, env=env, capture_output=True, text=True,
                              timeout=600)
        _printed[command] = done.stdout + done.stderr
    return _printed[command]


def test_every_output_block_of_the_readme_names_the_command_that_prints_it():
    assert OUTPUT_BLOCKS and all(block.values[0] for block in OUTPUT_BLOCKS), [
        f"{block.id}: {block.values[1].splitlines()[0]}" for block in OUTPUT_BLOCKS if not block.values[0]]


@pytest.mark.parametrize("command, shown", OUTPUT_BLOCKS)
def test_each_output_block_of_the_readme_is_what_its_command_prints(command, shown, tmp_path_factory):
    printed = printed_by(command, tmp_path_factory.mktemp("readme")).splitlines()
    # each shown line is in a line printed, in the order shown (pytest indents and interleaves)
    at = 0
    for line in shown.splitlines():
        wanted = MACHINE_DEPENDENT.sub("T s", line.strip())
        found = next((i for i in range(at, len(printed)) if wanted in MACHINE_DEPENDENT.sub("T s", printed[i])),
                     None)
        assert found is not None, f"README shows {line!r}; {command!r} printed:\n" + "\n".join(printed[at:])
        at = found + 1


def test_readme_adapter_example_is_found_to_diverge():
    block = next(text for language, _, text in code_blocks(README) if language == "python")
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
    block = next(text for language, _, text in code_blocks(README) if language == "python")
    file_name, command = re.search(r"Save it as `([^`]+)` and run `(swafuzz fuzz [^`]+)`", README).groups()
    (tmp_path / file_name).write_text(block)
    argv = shlex.split(command)
    # the working directory, where the example was saved, is deliberately not on the path
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    outcome = subprocess.run([script, *argv[1:], "--settings", "ci", "--json", "--report-dir", "reports"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert outcome.returncode == 1, outcome.stderr
    printed = json.loads(outcome.stdout)
    assert printed["verdict"] == "divergence"
    assert printed["diagnosis"]["source"]["kind"] in ("graph_capture", "earlier_step", "earlier_forward")


def test_readme_states_the_gates_budget():
    from swafuzz.cli import GATE_BUDGET_S

    assert f"under the `ci` settings for {GATE_BUDGET_S:g} s" in README


LINK = re.compile(r"\]\(([^)#\s]+)?(?:#([^)\s]+))?\)")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    anchors = set()
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_readme_links_every_reference_page_and_every_link_leads_somewhere():
    linked = {target.split("#")[0] for target, _ in LINK.findall(README) if target.startswith("docs/")}
    assert linked == {path.relative_to(ROOT).as_posix() for path in DOCS}, (
        "docs pages not linked from the README, or links to pages that do not exist")
    broken = []
    for page, text in PAGES.items():
        for target, anchor in LINK.findall(text):
            if target and re.match(r"[a-z]+:", target):
                continue  # a URL, not a file of this repository
            path = ((ROOT / page).parent / target).resolve() if target else ROOT / page
            if not path.exists():
                broken.append(f"{page}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path.read_text()):
                broken.append(f"{page}: {target}#{anchor}")
    assert not broken, broken


def test_the_readme_stays_a_guide_short_enough_to_read_through():
    # reference material belongs in docs/, which the README links
    assert len(README.encode()) < 20_000, f"README.md is {len(README.encode())} bytes"


def test_readme_names_the_releases_the_suite_reads_and_what_they_weigh():
    from conftest import SUITE_RELEASES

    from swafuzz.subjects.sglang import locate

    stated = re.search(r"\(`tests/sglang-releases.txt`: ([^)]*?), (\w+)\s+wheels of about (\d+) MB together\)",
                       " ".join(README.split()))
    assert stated is not None, "the README no longer says which releases the suite reads"
    names, count, megabytes = stated.groups()
    assert re.findall(r"\d+\.\d+\.\d+(?:\.post\d+)?", names) == list(SUITE_RELEASES)
    assert count == {5: "five", 6: "six", 7: "seven", 8: "eight"}.get(len(SUITE_RELEASES))
    wheels = [locate.cached_wheel(version) for version in SUITE_RELEASES]
    if None in wheels:
        pytest.skip("the suite's releases are not all in the wheel cache (scripts/fetch-test-releases)")
    assert round(sum(w.stat().st_size for w in wheels) / 1e6, -1) == int(megabytes)
