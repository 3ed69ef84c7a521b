"""Where SGLang releases come from: the wheel cache, filled ahead by ``swafuzz.subjects.sglang.fetch``;
a machine (or the test suite) that sets ``SWAFUZZ_SGLANG_OFFLINE=1`` never downloads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from swafuzz.subjects.sglang import fetch, locate


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(locate.CACHE_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def no_downloads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a download was started: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)


@pytest.mark.usefixtures("no_downloads")
def test_offline_a_release_missing_from_the_cache_is_unavailable_and_the_message_says_how_to_fetch_it(
        cache, monkeypatch):
    monkeypatch.setenv(locate.OFFLINE_ENV, "1")
    with pytest.raises(locate.SglangUnavailable, match=r"python -m swafuzz\.subjects\.sglang\.fetch 0\.5\.13 fetches it"):
        locate.wheel("0.5.13")


@pytest.mark.usefixtures("no_downloads")
def test_offline_a_cached_release_is_read_from_the_cache(cache, monkeypatch):
    monkeypatch.setenv(locate.OFFLINE_ENV, "1")
    wheel = cache / "sglang-0.5.13-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert locate.wheel("0.5.13").root == wheel


@pytest.mark.usefixtures("no_downloads")
def test_fetch_reports_each_release_and_the_total_size(cache, capsys):
    (cache / "sglang-0.5.13-py3-none-any.whl").write_bytes(b"x" * 2_000_000)
    (cache / "sglang-0.5.14-py3-none-any.whl").write_bytes(b"x" * 500_000)
    assert fetch.main(["0.5.13", "0.5.14"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sglang 0.5.13: already cached, 2.0 MB, ")
    assert lines[1].startswith("sglang 0.5.14: already cached, 0.5 MB, ")
    assert lines[2] == f"2 releases in {cache}, 2.5 MB"


def test_fetch_downloads_even_where_downloads_are_otherwise_off(cache, monkeypatch, capsys):
    monkeypatch.setenv(locate.OFFLINE_ENV, "1")

    def pip_download(command, **kwargs):
        directory = command[command.index("-d") + 1]
        (Path(directory) / "sglang-0.5.13-py3-none-any.whl").write_bytes(b"x")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", pip_download)
    assert fetch.main(["0.5.13"]) == 0
    assert capsys.readouterr().out.startswith("sglang 0.5.13: downloaded, 0.0 MB")


def test_fetch_without_a_release_prints_its_usage_and_exits_2(capsys):
    assert fetch.main([]) == 2
    assert "usage: python -m swafuzz.subjects.sglang.fetch VERSION..." in capsys.readouterr().err


@pytest.mark.usefixtures("no_downloads")
def test_fetch_takes_releases_comma_separated_as_the_test_versions_list_them(cache, capsys):
    (cache / "sglang-0.5.13-py3-none-any.whl").write_bytes(b"x")
    (cache / "sglang-0.5.14-py3-none-any.whl").write_bytes(b"x")
    assert fetch.main(["0.5.13,0.5.14"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 releases in ")
