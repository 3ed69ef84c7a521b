"""``python -m swafuzz.subjects.sglang.fetch VERSION...``: download SGLang releases into the wheel cache
before they are needed, saying what each costs (the test suite's are fetched so, by
``scripts/fetch-test-releases``, and read offline)."""

from __future__ import annotations

import sys

from .locate import CACHE_ENV, DEFAULT_CACHE_DIR, SglangUnavailable, cache_dir, cached_wheel, fetch_wheel


def main(argv: list[str] | None = None) -> int:
    """Fetches releases into the wheel cache."""
    # releases as words or comma-separated, as $SWAFUZZ_SGLANG_TEST_VERSIONS lists them
    versions = [v for word in (sys.argv[1:] if argv is None else argv) for v in word.split(",") if v]
    if not versions or any(v.startswith("-") for v in versions):
        print("usage: python -m swafuzz.subjects.sglang.fetch VERSION... (fetches each release's wheel into "
              f"${CACHE_ENV}, default {DEFAULT_CACHE_DIR})", file=sys.stderr)
        return 2
    total = 0
    for version in versions:
        cached = cached_wheel(version) is not None
        try:
            path = fetch_wheel(version, download=True)
        except SglangUnavailable as exc:
            print(f"sglang {version}: {exc}", file=sys.stderr)
            return 1
        size = path.stat().st_size
        total += size
        print(f"sglang {version}: {'already cached' if cached else 'downloaded'}, {size / 1e6:.1f} MB, {path}")
    print(f"{len(versions)} releases in {cache_dir()}, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
