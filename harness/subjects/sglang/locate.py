"""Where SGLang's source comes from: an installed package, a checkout, or a released wheel.

Every origin is read the same way, as a tree of files addressed by their path inside the
package (``sglang/srt/...``). Wheels are fetched with ``pip download --no-deps`` into a
cache outside the repository and read as zip files: old releases are never installed,
so any number of them sit side by side.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from ...errors import SglangUnavailable

CACHE_ENV = "SWAFUZZ_SGLANG_CACHE"
# =1: a release that is not in the cache is unavailable rather than downloaded (the test
# suite runs so, on the releases fetched before it; so can a machine with no registry)
OFFLINE_ENV = "SWAFUZZ_SGLANG_OFFLINE"
DEFAULT_CACHE_DIR = Path("~/.cache/swafuzz/sglang")
# Every release from 0.5.12 to 0.5.23 on PyPI, post releases included (``pip index versions
# sglang`` on 2026-11-30): a post release can change a verdict (0.5.12.post1 clears the pool
# cache in register_mapping).
RELEASES = (
    "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
    "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)
# the build writes _version.py; older trees keep the number in version.py
VERSION_FILES = ("sglang/_version.py", "sglang/version.py")


def release_key(version: str) -> tuple[int, ...]:
    """Orders releases as PyPI does for these numbers: ``0.5.12 < 0.5.12.post1 < 0.5.13``."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version)
    if match is None:
        raise ValueError(f"{version!r} is not a release number of the form X.Y.Z[.postN]")
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post) if post is not None else -1


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


@dataclass(frozen=True)
class SourceTree:
    """SGLang's Python files from one origin.

    ``root`` is a directory that holds the ``sglang`` package, or a wheel (a zip whose
    top level is the package).
    """

    root: Path
    origin: str  # "installed", "checkout" or "wheel"

    def read(self, path: str) -> str | None:
        """The text of ``path`` (``sglang/...``), or None when this tree lacks it."""
        if self.root.suffix == ".whl":
            try:
                return _open_wheel(self.root).read(path).decode("utf-8")
            except KeyError:
                return None
        file = self.root / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    def location(self, path: str) -> str:
        """A name for ``path`` in tracebacks and messages."""
        return f"{self.root}/{path}" if self.root.suffix != ".whl" else f"{self.root.name}!/{path}"

    @functools.cached_property
    def version(self) -> str | None:
        for path in VERSION_FILES:
            text = self.read(path)
            for node in ast.parse(text).body if text else ():
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                    and isinstance(node.value, ast.Constant)
                ):
                    return str(node.value.value)
        return None

    @property
    def label(self) -> str:
        version = self.version or "unknown version"
        return {
            "installed": f"installed sglang {version}",
            "checkout": f"sglang checkout {self.root} ({version})",
            "wheel": f"sglang {version} wheel",
        }[self.origin]


@dataclass(frozen=True)
class EditedTree(SourceTree):
    """A tree with the text of one file replaced (a mutant of it), read in place of a copy:
    every other file is the tree's own, so what a binding reads beside the bound code (the
    call sites, the switches, the engine's own files) reads as it does for the tree."""

    path: str = ""
    text: str = ""
    name: str = ""  # the edit's, shown beside the edited file's location

    def read(self, path: str) -> str | None:
        return self.text if path == self.path else super().read(path)

    def location(self, path: str) -> str:
        # a location of its own, so that tracebacks show the edited lines, not the tree's
        shown = super().location(path)
        return f"{shown} ({self.name})" if path == self.path else shown

    @property
    def label(self) -> str:
        return f"{super().label} with {self.name}"


@functools.lru_cache(maxsize=32)
def _open_wheel(path: Path) -> zipfile.ZipFile:
    # a wheel's directory of several thousand entries is read once, not on every file read
    return zipfile.ZipFile(path)


def checkout(path: str | os.PathLike) -> SourceTree:
    """A source checkout (the repository root, its ``python/`` folder, or a folder
    that holds the ``sglang`` package directly)."""
    base = Path(path).expanduser().resolve()
    for root in (base / "python", base, base.parent):
        if (root / "sglang" / "__init__.py").is_file():
            return SourceTree(root, "checkout")
    raise SglangUnavailable(f"{base} holds no sglang package (looked for python/sglang/ and sglang/)")


def holds_sglang(path: str | os.PathLike) -> bool:
    """Whether :func:`checkout` finds an ``sglang`` package at ``path``."""
    try:
        checkout(path)
    except SglangUnavailable:
        return False
    return True


def installed() -> SourceTree | None:
    """The installed ``sglang`` package's files, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    return SourceTree(package_dir.parent, "installed")


def wheel(version: str, cache: str | os.PathLike | None = None) -> SourceTree:
    """The released wheel of ``version``, downloaded into the cache on first use."""
    return SourceTree(fetch_wheel(version, cache), "wheel")


def fetch_wheel(version: str, cache: str | os.PathLike | None = None, *, download: bool | None = None) -> Path:
    """The cached wheel of ``version``, downloaded first where it is missing and ``download``
    allows (by default, unless ``$SWAFUZZ_SGLANG_OFFLINE`` is 1)."""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version):
        raise SglangUnavailable(f"{version!r} is not a version number")
    directory = cache_dir(cache)
    found = _cached_wheel(directory, version)
    if found is not None:
        return found
    if not (download if download is not None else os.environ.get(OFFLINE_ENV, "0") != "1"):
        raise SglangUnavailable(
            f"the sglang {version} wheel is not in the cache {directory}, and {OFFLINE_ENV}=1 keeps it from being "
            f"downloaded (python -m swafuzz.subjects.sglang.fetch {version} fetches it)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    # download privately, then rename into the cache: processes fetching the same release at
    # once (parallel test workers) never see a half-written wheel
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as private:
        # wheels only: preparing a source distribution would run its build code, and the
        # version may come from a replay file
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
            "--disable-pip-version-check", f"sglang=={version}", "-d", private,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SglangUnavailable(f"pip download of sglang=={version} failed: {exc}") from None
        fetched = _cached_wheel(Path(private), version)
        if fetched is not None:
            os.replace(fetched, directory / fetched.name)
    found = _cached_wheel(directory, version)
    if done.returncode != 0 or found is None:
        said = done.stderr or done.stdout
        if "No matching distribution" in said or "Could not find a version" in said:
            raise SglangUnavailable(f"sglang {version} is no release on the package index (pip found no wheel of it)")
        tail = said.strip().splitlines()[-3:]
        raise SglangUnavailable(
            f"pip download of sglang=={version} failed (exit {done.returncode}): " + " | ".join(tail)
        )
    return found


def cached_wheel(version: str, cache: str | os.PathLike | None = None) -> Path | None:
    """The wheel of ``version`` in the cache, or None (nothing is downloaded)."""
    return _cached_wheel(cache_dir(cache), version)


def cached_releases(cache: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The releases of :data:`RELEASES` whose wheel is already in the cache."""
    directory = cache_dir(cache)
    return tuple(v for v in RELEASES if _cached_wheel(directory, v) is not None)


def _cached_wheel(directory: Path, version: str) -> Path | None:
    matches = sorted(directory.glob(f"sglang-{version}-*.whl"))
    return matches[0] if matches else None

