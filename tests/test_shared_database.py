"""A Redis example database shared by fuzzing processes on many machines (here: two
processes and a real redis-server on the loopback interface)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from swafuzz.search.database import SharedDatabase, open_database, redacted

REDIS_SERVER = shutil.which("redis-server")
redis = pytest.importorskip("redis", reason="the redis package is part of the test extra: pip install -e '.[test]'")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def redis_server(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (.ci/run installs it from the system's packages where apt-get is available)")
    port = _free_port()
    server = subprocess.Popen(
        [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    yield server, f"redis://127.0.0.1:{port}/0"
    server.kill()
    server.wait()


def _fuzz(cwd: Path, report_dir: str, database: str, *argv: str, env: dict | None = None,
          wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    command = [sys.executable, "-m", "swafuzz", "fuzz", "--settings", "dev", "--max-examples", "3000",
               "--database", database, "--report-dir", report_dir, "--json", *argv]
    environment = {**os.environ, "PYTHONPATH": str(cwd), **(env or {})}
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)


def test_a_failure_one_process_found_is_the_first_example_the_other_runs(tmp_path, redis_server):
    _, url = redis_server
    first = _fuzz(tmp_path, "machine-a", url, "--subject", "pool-start-layer")
    assert first.returncode == 1, first.stderr
    found = json.loads(first.stdout)
    second = _fuzz(tmp_path, "machine-b", url, "--subject", "pool-start-layer")
    assert second.returncode == 1, second.stderr
    replayed = json.loads(second.stdout)
    assert replayed["examples_to_divergence"] == 1
    assert replayed["scenario"] == found["scenario"]
    assert "going on with the local copy" not in first.stderr + second.stderr


WAITING_SUBJECT = """
    import os
    import time
    from pathlib import Path

    from swafuzz.subjects.builtin import PoolStartLayer


    class WaitsThenStale(PoolStartLayer):
        '''The pool-level cache, whose first store waits until it is told to go on.'''

        def swa_write_location(self, batch, layer_id):
            go = Path(os.environ["WAIT_FOR"])
            if not go.exists():
                Path(os.environ["STARTED"]).touch()
                while not go.exists():
                    time.sleep(0.02)
            return super().swa_write_location(batch, layer_id)
"""


def test_when_redis_goes_away_mid_run_the_run_goes_on_with_the_local_copy(tmp_path, redis_server):
    server, url = redis_server
    (tmp_path / "waiting_subject.py").write_text(textwrap.dedent(WAITING_SUBJECT))
    started, go = tmp_path / "started", tmp_path / "go"
    run = _fuzz(tmp_path, "machine-a", url, "--subject", "waiting_subject:WaitsThenStale",
                env={"STARTED": str(started), "WAIT_FOR": str(go)}, wait=False)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    server.kill()  # the run has read the shared database; it is gone before anything is saved
    server.wait()
    go.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 1, err
    report = json.loads(out)
    assert report["verdict"] == "divergence"
    assert err.count("going on with the local copy") == 1
    assert redacted(url) in err
    # nothing was lost: the local copy replays the failure first
    again = _fuzz(tmp_path, "machine-a-again", str(tmp_path / "machine-a" / ".hypothesis-db"),
                  "--subject", "waiting_subject:WaitsThenStale", env={"STARTED": str(started), "WAIT_FOR": str(go)})
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout)["examples_to_divergence"] == 1


def test_a_redis_url_opens_a_shared_database_with_a_local_copy(tmp_path):
    database = open_database("redis://127.0.0.1:1/0", tmp_path / "copy")
    assert isinstance(database, SharedDatabase)
    assert redacted("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"


def test_a_bad_redis_url_exits_2(capsys, tmp_path):
    from swafuzz.cli import main as swafuzz

    assert swafuzz(["fuzz", "--subject", "uncached", "--database", "redis://host:port/0",
                    "--report-dir", str(tmp_path)]) == 2
    assert "--database redis://host:port/0" in capsys.readouterr().err
