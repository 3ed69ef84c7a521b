"""The committed SGLang version matrix covers every release and read the releases as they are.

``reports/sglang-matrix.md`` records a digest of swafuzz's deciding sources (for a reader:
its fast verdicts are held to the code by ``tests/test_sglang_verdicts.py``) and, per
release, of the SGLang files it read; when a release reads differently, regenerate with
``tox -e sglang-matrix``. Releases whose wheel is neither cached nor downloadable are
skipped with the reason.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import SUITE_RELEASES, released_tree

from swafuzz.subjects.sglang import locate, provenance

REPORT = provenance.REPO_ROOT / "reports" / "sglang-matrix.md"
REGENERATE = "regenerate reports/sglang-matrix.md with `tox -e sglang-matrix`"


def _recorded():
    return provenance.recorded(REPORT.read_text(encoding="utf-8"))


def test_the_committed_matrix_records_the_sources_that_decided_it():
    harness, _ = _recorded()
    assert harness is not None and re.fullmatch(r"[0-9a-f]{16}", harness), f"no harness digest; {REGENERATE}"


def test_the_committed_matrix_covers_every_release_with_post_releases():
    _, releases = _recorded()
    assert tuple(releases) == locate.RELEASES, REGENERATE


@pytest.mark.parametrize("version", SUITE_RELEASES)
def test_the_committed_matrix_read_the_sglang_sources_of_each_release(version):
    # the suite's releases; the matrix's tox environment reads every release it covers
    recorded = _recorded()[1].get(version)
    if recorded is None:
        pytest.fail(f"the matrix records no SGLang digest for {version}; {REGENERATE}")
    tree = released_tree(version)
    if isinstance(tree, str):
        pytest.skip(tree)
    assert provenance.sglang_digest(tree) == recorded, f"sglang {version} reads differently now; {REGENERATE}"


def test_any_change_to_a_deciding_source_changes_the_digest(tmp_path):
    for folder in (*provenance.DECIDING_PACKAGES, "harness"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for module in provenance.DECIDING_MODULES:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(provenance.REPO_ROOT / module, tmp_path / module)
    truth = tmp_path / "reference" / "truth.py"
    shutil.copy(provenance.REPO_ROOT / "reference" / "truth.py", truth)
    before = provenance.harness_digest(tmp_path)
    truth.write_text(truth.read_text() + "\nCHANGED = True\n")
    changed = provenance.harness_digest(tmp_path)
    assert changed != before
    (tmp_path / "harness" / "cli.py").write_text("# the command line decides no verdict\n")
    assert provenance.harness_digest(tmp_path) == changed


def test_a_comment_or_a_docstring_leaves_the_digest_alone(tmp_path):
    (tmp_path / "reference").mkdir()
    module = tmp_path / "reference" / "truth.py"
    module.write_text('"""The truth."""\n\n\ndef rows(x):\n    """Rows."""\n    return x + 1\n')
    before = provenance.harness_digest(tmp_path)
    module.write_text('"""The truth, said again."""\n\n\ndef rows(x):\n    # why, not what\n    return x + 1\n')
    assert provenance.harness_digest(tmp_path) == before
    module.write_text('"""The truth."""\n\n\ndef rows(x):\n    """Rows."""\n    return x + 2\n')
    assert provenance.harness_digest(tmp_path) != before


def test_the_sglang_digest_follows_the_files_read(tmp_path):
    root = tmp_path / "sglang-checkout"
    path = Path(provenance.sglang_paths()[0])
    (root / path.parent).mkdir(parents=True)
    tree = locate.SourceTree(root, "checkout")
    absent = provenance.sglang_digest(tree)
    (root / path).write_text("x = 1\n")
    present = provenance.sglang_digest(tree)
    (root / path).write_text("x = 2\n")
    assert len({absent, present, provenance.sglang_digest(tree)}) == 3
