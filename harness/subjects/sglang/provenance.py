"""What a version matrix was generated from: digests of the sources that decide its verdicts.

The matrix report records the digest of swafuzz's deciding sources (the truth, the input
makers, the executor and diagnosis, the SGLang binding and its call-path table) and, per
release, the digest of the SGLang files it binds and cites. ``tests/test_sglang_matrix_report.py``
recomputes them and fails when the committed report is older than either.
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
from pathlib import Path

from .locate import SourceTree
from .reachability import ALL_QUESTIONS
from .targets import TARGETS

REPO_ROOT = Path(__file__).resolve().parents[3]
# the packages whose every module decides verdicts, and the harness modules that do
DECIDING_PACKAGES = ("reference", "strategies", "harness/subjects/sglang", "harness/run")
DECIDING_MODULES = tuple(
    f"harness/{name}.py" for name in ("api", "search/fuzz", "subjects/registry", "results/replay", "tools/sglang_matrix")
)

HARNESS_LINE = re.compile(r"harness sources: `([0-9a-f]+)`")
RELEASE_ROW = re.compile(r"^\| ([0-9][0-9A-Za-z.]*) \| `([0-9a-f]+)` \|", re.MULTILINE)


def deciding_files(root: Path = REPO_ROOT) -> list[Path]:
    files = [p for package in DECIDING_PACKAGES for p in (root / package).rglob("*.py")]
    files += [root / module for module in DECIDING_MODULES if (root / module).is_file()]
    return sorted(files)


def harness_digest(root: Path = REPO_ROOT) -> str:
    """A digest of what the deciding sources do: their code, read as Python, so that a
    comment or a docstring (a sentence about the code, which decides no verdict) leaves the
    committed matrix current, while any change to what runs asks for it to be made again."""
    digest = hashlib.sha256()
    for path in deciding_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + _code_of(path).encode() + b"\0")
    return digest.hexdigest()[:16]


def _code_of(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def revision(root: Path = REPO_ROOT) -> str:
    """``git describe`` of the checkout, for readers; the digest is what is checked."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def sglang_paths() -> tuple[str, ...]:
    """The SGLang files (``sglang/...``) the targets bind and the call-path tables cite."""
    paths = {code.path for target in TARGETS for code in target.code}
    paths |= {hop.file for item in ALL_QUESTIONS for route in item.routes for hop in route.hops}
    return tuple(sorted(paths))


def sglang_digest(tree: SourceTree) -> str:
    digest = hashlib.sha256()
    for path in sglang_paths():
        text = tree.read(path)
        digest.update(path.encode() + b"\0" + (text.encode() if text is not None else b"<absent>") + b"\0")
    return digest.hexdigest()[:16]


def recorded(report: str) -> tuple[str | None, dict[str, str]]:
    """The harness digest and the per-release SGLang digests a report records."""
    harness = HARNESS_LINE.search(report)
    return (harness.group(1) if harness else None), dict(RELEASE_ROW.findall(report))
