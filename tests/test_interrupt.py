"""Interrupt safety: a `swafuzz fuzz` process stopped by SIGINT or SIGTERM leaves every
divergence found so far on disk and writes its report, marked incomplete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import answering_subject, processes_answered, wait_until

from swafuzz.search.campaign import REPORT_DIR_LOCK
from swafuzz.results.replay import load_replay

# subprocesses import this checkout, whichever one is installed

# Diverges in nearly every scenario with two forwards, and is slow only when it diverges: the
# search finds it at once, shrinking takes seconds, and a signal sent as soon as the first
# replay file appears lands in the middle of the run.
SLOW_STALE_SUBJECT = '''
    import time

    import torch

    from swafuzz.api import Subject, Truth


    class SlowStale(Subject):
        """Translates once and returns those rows forever; takes its time when they are stale."""

        truth = Truth.POOL

        def swa_write_location(self, batch, layer_id):
            fresh = self.mapping[batch.out_cache_loc].to(torch.int32)
            cached = self.__dict__.setdefault("rows", fresh)
            if cached.shape != fresh.shape or not torch.equal(cached, fresh):
                time.sleep(0.3)
            return cached
'''


def environment(tmp_path: Path) -> dict[str, str]:
    paths = [str(tmp_path), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def start_fuzz(tmp_path: Path, *options: str, command: str = "fuzz") -> subprocess.Popen:
    env = environment(tmp_path)
    return subprocess.Popen(
        [sys.executable, "-m", "swafuzz", command, "--report-dir", str(tmp_path / "reports"), "--json", *options],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def stop(process: subprocess.Popen, signum: int) -> tuple[int, dict]:
    process.send_signal(signum)
    return finished(process)


def finished(process: subprocess.Popen) -> tuple[int, dict]:
    out, err = process.communicate(timeout=60)
    return process.returncode, json.loads(out) if out.strip() else {"stderr": err}


def reports(tmp_path: Path) -> dict:
    directory = tmp_path / "reports"
    junit = ET.parse(directory / "junit.xml").getroot()
    return {
        "json": json.loads((directory / "report.json").read_text()),
        "markdown": (directory / "summary.md").read_text(),
        "html": (directory / "report.html").read_text(),
        "junit_case": junit.find("testsuite/testcase"),
    }


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_clean_run_stopped_by_a_signal_writes_an_incomplete_report(tmp_path, signum, exit_code):
    # nightly settings: no cap on examples, so only the signal ends the run
    process = start_fuzz(tmp_path, "--subject", answering_subject(tmp_path), "--settings", "nightly",
                         "--budget", "600")
    wait_until(lambda: processes_answered(tmp_path) == 1, "the search answered a store", process)
    code, printed = stop(process, signum)
    assert code == exit_code, printed
    name = signal.Signals(signum).name
    assert printed["verdict"] == "no divergence" and printed["complete"] is False
    assert printed["interrupted_by"] == name
    written = reports(tmp_path)
    assert written["json"]["complete"] is False and written["json"]["interrupted_by"] == name
    assert f"Incomplete: the run was interrupted by {name}" in written["markdown"]
    assert "Incomplete" in written["html"]
    assert written["junit_case"].find("skipped") is not None
    assert not list((tmp_path / "reports" / "replays").iterdir())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_divergence_found_before_the_signal_is_on_disk(tmp_path, signum):
    (tmp_path / "slow_subject.py").write_text(textwrap.dedent(SLOW_STALE_SUBJECT))
    process = start_fuzz(tmp_path, "--subject", "slow_subject:SlowStale", "--budget", "600")
    replays = tmp_path / "reports" / "replays"
    database = tmp_path / "reports" / ".hypothesis-db"
    # the replay file is written the moment the divergence is seen, the database entry just
    # after it: once both exist, shrinking has seconds to go
    wait_until(lambda: any(replays.glob("*.json")) and any(p.is_file() for p in database.rglob("*")),
               "the divergence was recorded", process)
    code, printed = stop(process, signum)

    assert code == 1, printed  # a divergence was found: that outranks the interruption
    assert printed["verdict"] == "divergence" and printed["complete"] is False, printed
    (replay_file,) = replays.glob("*.json")
    assert Path(printed["replay_file"]).name == replay_file.name
    recorded = load_replay(replay_file)
    assert recorded.subject == "slow_subject:SlowStale"
    written = reports(tmp_path)
    assert written["json"]["verdict"] == "divergence" and written["json"]["complete"] is False
    assert written["junit_case"].find("failure") is not None
    assert any(path.is_file() for path in database.rglob("*"))  # an unseeded run keeps its database

    # and the replay file replays, still diverging
    replayed = subprocess.run([sys.executable, "-m", "swafuzz", "replay", str(replay_file),
                               "--subject", "slow_subject:SlowStale"], cwd=tmp_path,
                              env=environment(tmp_path), capture_output=True, text=True,
                              timeout=120)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_by_a_signal_leaves_no_lock_file_in_its_report_folder(tmp_path, signum):
    (tmp_path / "slow_subject.py").write_text(textwrap.dedent(SLOW_STALE_SUBJECT))
    process = start_fuzz(tmp_path, "--subject", "slow_subject:SlowStale", "--budget", "600")
    lock = tmp_path / "reports" / REPORT_DIR_LOCK
    replays = tmp_path / "reports" / "replays"
    # a replay file written while the lock is held: the run is in the middle of its search
    wait_until(lambda: lock.exists() and any(replays.glob("*.json")), "the search recorded a divergence", process)
    code, printed = stop(process, signum)
    assert code == 1, printed
    assert (tmp_path / "reports" / "report.json").exists()
    assert not lock.exists()


def test_a_run_over_workers_stops_them_all_and_reports(tmp_path):
    process = start_fuzz(tmp_path, "--subject", answering_subject(tmp_path), "--settings", "nightly",
                         "--budget", "600", "--workers", "2")
    wait_until(lambda: processes_answered(tmp_path) == 2, "both workers answered a store", process)
    code, printed = stop(process, signal.SIGTERM)
    assert code == 143, printed
    assert printed["complete"] is False and printed["workers"] == 2
    assert reports(tmp_path)["json"]["interrupted_by"] == "SIGTERM"


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False  # it ended
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads handlers from /proc (Linux)")
@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up_exits_with_its_code_and_one_line(tmp_path, signum, exit_code):
    process = start_fuzz(tmp_path, "--subject", "uncached", "--settings", "nightly", "--budget", "600")
    # the entry catches SIGTERM first thing, before it imports torch and the rest (seconds)
    wait_until(lambda: catches(process.pid, signal.SIGTERM), "the entry took SIGTERM over", process)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == exit_code, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"interrupted by {signal.Signals(signum).name}" in err and out == ""
    assert not (tmp_path / "reports").exists()


LINGERING_SUBJECT = '''
    import atexit
    import time
    from pathlib import Path

    from swafuzz.subjects.builtin import PoolStartLayer as Stale


    def linger():
        """The process lingers after its result is known, until the test has sent its signal."""
        Path("lingering").touch()
        end = time.monotonic() + 60
        while not Path("signalled").exists() and time.monotonic() < end:
            time.sleep(0.02)


    atexit.register(linger)
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_after_the_divergence_was_reported_keeps_exit_code_1(tmp_path, signum):
    (tmp_path / "lingering_subject.py").write_text(textwrap.dedent(LINGERING_SUBJECT))
    # the first divergence of a small enumeration: found at once, nothing to shrink
    process = start_fuzz(tmp_path, "--subject", "lingering_subject:Stale", "--max-forwards", "2",
                         "--max-layers", "2", "--max-micro-batches", "1", command="exhaustive")
    wait_until((tmp_path / "lingering").exists, "the run has its result", process)
    process.send_signal(signum)
    (tmp_path / "signalled").touch()
    code, printed = finished(process)
    assert code == 1, printed
    assert printed["verdict"] == "divergence" and printed["complete"] is True


def descendants_of(pid: int) -> list[int]:
    """The processes below ``pid``: the supervised run, its workers and their helpers."""
    children = children_of(pid)
    return children + [grandchild for child in children for grandchild in descendants_of(child)]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_workers_and_their_helpers_die_with_a_killed_parent(tmp_path):
    process = start_fuzz(tmp_path, "--subject", "uncached", "--settings", "nightly", "--budget", "600",
                         "--workers", "2")
    # the supervised run, the fork server, its two workers and the resource tracker; a worker
    # catches SIGINT once it fuzzes
    def started() -> bool:
        below = descendants_of(process.pid)
        return len(below) >= 5 and sum(catches(pid, signal.SIGINT) for pid in below) >= 3

    wait_until(started, "the workers catch SIGINT", process)
    helpers = descendants_of(process.pid)
    process.kill()
    process.wait(timeout=30)  # its pipes stay open as long as a worker holds them
    process.stdout.close()
    process.stderr.close()
    deadline = time.monotonic() + 20
    while any(running(pid) for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in helpers if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(helpers)} processes outlived their parent"
