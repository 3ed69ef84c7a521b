"""The committed fast verdicts are what the code says now, and the full report agrees with them.

``reports/sglang-verdicts.md`` holds the verdicts that take seconds a release: each target's
hand-written examples and each release's producers, runner steps, compressed-KV kernels and
index-table builders.
Each release the suite reads is made again here and compared row by row. The full report,
``reports/sglang-matrix.md``, adds the searches (minutes a release, rebuilt by ``tox -e
sglang-matrix``); its examples and producers columns must say what the fast table says.
"""

from __future__ import annotations

import re

import pytest
from conftest import SUITE_RELEASES, released_tree

from swafuzz.subjects.sglang import compressed, provenance
from swafuzz.tools.sglang_matrix import VERDICTS_COMMAND, run_matrix, stale_replays, verdict_row

REPORTS = provenance.REPO_ROOT / "reports"
VERDICTS = REPORTS / "sglang-verdicts.md"
REGENERATE = f"regenerate with `{VERDICTS_COMMAND}`"


def _rows(text: str, header_start: str) -> dict[str, list[str]]:
    """The cells of each release's row in the first table whose header starts so."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def _committed() -> dict[str, list[str]]:
    return _rows(VERDICTS.read_text(encoding="utf-8"), "| release |")


@pytest.mark.parametrize("version", SUITE_RELEASES)
def test_the_committed_verdicts_of_each_release_are_what_the_code_says(version):
    if isinstance(tree := released_tree(version), str):
        pytest.skip(tree)
    committed = _committed().get(version)
    assert committed is not None, f"{VERDICTS.name} has no row for {version}; {REGENERATE}"
    matrix = run_matrix([version], replay_dir=None, searches=False)
    made = [c.strip() for c in verdict_row(matrix, version).strip().strip("|").split(" | ")][1:]
    if not compressed.triton_available():
        # without the triton extra the kernels, the Triton table builders and the readers of the
        # compressed values are not run: compare the rest
        made, committed = made[:-3], committed[:-3]
    assert made == committed, f"sglang {version}'s verdicts changed; {REGENERATE}"


def test_the_full_report_says_what_the_fast_verdicts_say():
    fast = _committed()
    full = (REPORTS / "sglang-matrix.md").read_text(encoding="utf-8")
    examples = _rows(full.split("## Verdicts: examples", 1)[1], "| version |")
    producers = _rows(full.split("## Producers of the rows by release", 1)[1], "| release |")
    assert set(examples) == set(fast), "the two reports cover other releases; rebuild both"
    targets = len(examples[next(iter(examples))])
    for version, cells in fast.items():
        counts = [cell.split(":")[0] for cell in cells[:targets]]
        assert counts == examples[version], f"{version}: the full report's examples differ; tox -e sglang-matrix"
        summary = producers[version][0]
        wrong = re.findall(r"`([^`]+)`", summary) if summary.startswith("**wrong**") else []
        said = cells[targets]
        assert wrong == (said.removeprefix("wrong: ").split(", ") if said.startswith("wrong: ") else []), (
            f"{version}: the full report's producers differ; tox -e sglang-matrix")


def test_the_matrix_keeps_only_the_replay_files_its_report_names(tmp_path):
    (tmp_path / "named.json").write_text("{}")
    (tmp_path / "earlier.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    assert stale_replays(tmp_path, "| 0.5.23 | [replay](named.json) |") == [tmp_path / "earlier.json"]
    report = (REPORTS / "sglang-matrix.md").read_text(encoding="utf-8")
    assert stale_replays(REPORTS / "sglang-matrix", report) == [], "tox -e sglang-matrix removes them"
