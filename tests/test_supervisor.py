"""The supervisor: a subject that ends its process, hangs past its alarm, ignores interrupts or
leaves a thread behind ends in a reported divergence (or its own verdict), never in a pass or a
lost finding. Each hostile subject runs through the installed command, as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import answering_subject, processes_answered, wait_until

from swafuzz.search.campaign import REPORT_DIR_LOCK
from swafuzz.results.replay import load_replay
from swafuzz.strategies.examples import EXAMPLES

HOSTILE = textwrap.dedent('''
    import os, signal, threading, time

    from swafuzz.subjects.builtin import Uncached


    class ExitsInACall(Uncached):
        def swa_write_location(self, batch, layer_id):
            os._exit(0)


    class KilledInACall(Uncached):
        def swa_write_location(self, batch, layer_id):
            os.kill(os.getpid(), signal.SIGKILL)


    class IgnoresTheAlarm(Uncached):
        def swa_write_location(self, batch, layer_id):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            while True:
                time.sleep(0.01)


    class IgnoresInterrupts(Uncached):
        def __init__(self, spec):
            super().__init__(spec)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        def swa_write_location(self, batch, layer_id):
            # in a scenario, past the run's own handlers: the test interrupts once this exists
            open("ignoring", "w").close()
            return super().swa_write_location(batch, layer_id)


    class LeavesAThread(Uncached):
        def __init__(self, spec):
            super().__init__(spec)
            threading.Thread(target=time.sleep, args=(3600,)).start()


    class ThreadEndsLater(Uncached):
        """Leaves one thread that ends 10 s after the subject is built (the run is shorter)."""

        def __init__(self, spec):
            super().__init__(spec)
            if not any(t.name == "ends-later" for t in threading.enumerate()):
                threading.Thread(target=time.sleep, args=(10,), name="ends-later").start()


    class WrongThenExitsWhenReplayed(Uncached):
        """One row off in every answer; its process ends in the replays before the report."""

        runs = 0

        def __init__(self, spec):
            super().__init__(spec)
            type(self).runs += 1

        def swa_write_location(self, batch, layer_id):
            if type(self).runs > 4:
                os._exit(0)
            return super().swa_write_location(batch, layer_id) + 1
''')

# the supervisor's limits, short for these tests (the defaults give a slow machine room)
FAST_LIMITS = {"SWAFUZZ_SUPERVISOR_HANG_S": "4", "SWAFUZZ_SUPERVISOR_STOP_GRACE_S": "3"}


def swafuzz(tmp_path: Path, *argv: str, env: dict | None = None, limits: dict = FAST_LIMITS,
            **options) -> subprocess.Popen:
    (tmp_path / "hostile.py").write_text(HOSTILE)
    environment = {**os.environ, **limits, **(env or {}),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "swafuzz", *argv], cwd=tmp_path, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)


def fuzzed(tmp_path: Path, subject: str, *extra: str) -> tuple[int, dict, str]:
    process = swafuzz(tmp_path, "fuzz", "--subject", subject, "--settings", "ci", "--max-examples", "30",
                      "--report-dir", "reports", "--json", *extra)
    out, err = process.communicate(timeout=300)
    return process.returncode, json.loads(out), err


@pytest.mark.parametrize("subject, kind, how", [
    ("hostile:ExitsInACall", "exited", "exited with status 0 while running this scenario"),
    ("hostile:KilledInACall", "killed", "was killed by SIGKILL while running this scenario"),
    ("hostile:IgnoresTheAlarm", "hung", "stopped answering for 4 s"),
])
def test_a_subject_that_ends_or_stalls_its_process_is_a_replayable_divergence(tmp_path, subject, kind, how):
    code, report, _ = fuzzed(tmp_path, subject)
    assert code == 1
    assert report["diagnosis"]["kind"] == kind and how in report["diagnosis"]["sentence"]
    replay_file = tmp_path / report["replay_file"]
    assert load_replay(replay_file).scenario.to_dict() == report["scenario"]
    replayed = swafuzz(tmp_path, "replay", str(replay_file), "--subject", subject)
    out, _ = replayed.communicate(timeout=300)
    assert replayed.returncode == 1 and "divergence still there" in out


@pytest.mark.parametrize("extra", [(), ("--workers", "2")], ids=["one-process", "workers"])
def test_a_run_whose_process_was_lost_leaves_no_lock_file_in_its_report_folder(tmp_path, extra):
    code, report, _ = fuzzed(tmp_path, "hostile:KilledInACall", *extra)
    assert code == 1 and report["diagnosis"]["kind"] == "killed"
    assert (tmp_path / "reports" / "report.json").exists()
    assert not (tmp_path / "reports" / REPORT_DIR_LOCK).exists()


def test_a_subject_that_ends_a_worker_process_is_a_replayable_divergence(tmp_path):
    code, report, _ = fuzzed(tmp_path, "hostile:ExitsInACall", "--workers", "2")
    assert code == 1 and report["diagnosis"]["kind"] == "exited"
    assert load_replay(tmp_path / report["replay_file"]).scenario.to_dict() == report["scenario"]


def test_a_subject_that_ends_the_process_as_its_module_is_imported_is_a_divergence(tmp_path):
    (tmp_path / "exits_on_import.py").write_text("raise SystemExit(0)\n")
    code, report, _ = fuzzed(tmp_path, "exits_on_import:Subject")
    assert code == 1
    assert report["diagnosis"]["kind"] == "exited" and "before it ran any scenario" in report["diagnosis"]["sentence"]


def test_a_divergence_recorded_before_the_process_ends_keeps_exit_code_1(tmp_path):
    code, _, err = fuzzed(tmp_path, "hostile:WrongThenExitsWhenReplayed")
    assert code == 1
    recorded = err.split("after recording a divergence: ", 1)[1].strip()
    assert load_replay(tmp_path / recorded).divergence.kind == "wrong_rows"


def test_a_subject_that_leaves_a_thread_behind_is_ended_with_its_verdict(tmp_path):
    code, report, err = fuzzed(tmp_path, "hostile:LeavesAThread")
    assert code == 0 and report["verdict"] == "no divergence"
    assert "left a thread running after the run ended (Thread-" in err and "which it waited for 4 s" in err


def test_a_subject_thread_that_ends_after_the_run_is_waited_for_without_blame(tmp_path):
    # longer than the fast limits' 4 s: the supervisor waits for the process to end
    process = swafuzz(tmp_path, "fuzz", "--subject", "hostile:ThreadEndsLater", "--settings", "ci",
                      "--max-examples", "5", "--report-dir", "reports", "--json",
                      limits={**FAST_LIMITS, "SWAFUZZ_SUPERVISOR_HANG_S": "60"})
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0 and json.loads(out)["verdict"] == "no divergence"
    assert "was ended" not in err


def test_a_subject_that_ignores_interrupts_is_ended_and_reported(tmp_path):
    process = swafuzz(tmp_path, "fuzz", "--subject", "hostile:IgnoresInterrupts", "--settings", "nightly",
                      "--budget", "600", "--report-dir", "reports", "--json")
    wait_until((tmp_path / "ignoring").exists, "the subject set its signals to be ignored", process)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    diagnosis = json.loads(out)["diagnosis"]
    assert diagnosis["kind"] == "hung" and "did not stop within 3 s of SIGINT" in diagnosis["sentence"]


def test_an_interrupt_reaches_a_well_behaved_run_through_the_supervisor(tmp_path):
    # the supervisor's own limits: the short ones are for subjects meant to break them, and
    # a loaded machine can stall a well-behaved run past them
    process = swafuzz(tmp_path, "fuzz", "--subject", answering_subject(tmp_path), "--settings", "nightly",
                      "--budget", "600", "--report-dir", "reports", "--json", limits={})
    wait_until(lambda: processes_answered(tmp_path) == 1, "the search answered a store", process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, f"stdout: {out[-4000:]}\nstderr: {err[-4000:]}"
    report = json.loads(out)
    assert report["verdict"] == "no divergence" and report["interrupted_by"] == "SIGTERM"


def test_the_exit_code_is_heard_after_a_message_an_interrupt_cut_short():
    from swafuzz import supervisor
    from swafuzz.process.channel import _Channel

    read, write = os.pipe()
    child_end = _Channel(write)
    child_end.announce_scenario(EXAMPLES["first-swa-layer-not-start"])
    whole = os.read(read, 1 << 16)
    os.write(write, whole[:len(whole) // 2])  # the writes of a message an interrupt ended part way
    child_end.send("exit", 130)
    os.close(write)
    heard = supervisor._Heard()
    supervisor._hear_lines(supervisor._read_all(read), heard)
    os.close(read)
    assert (heard.exit_code, heard.scenarios) == (130, 0)


def test_the_heartbeat_answers_without_waiting_for_the_harness_imports():
    # the child's main thread spends seconds importing torch on a loaded machine; a heartbeat
    # that imported the guard would wait for it and be taken for a hung subject
    probe = ("import os, sys\n"
             "read, write = os.pipe()\n"
             "os.environ['SWAFUZZ_SUPERVISOR_FD'] = str(write)\n"
             "from swafuzz.process import channel\n"
             "channel.claim_channel()\n"
             "first = next(line for line in os.read(read, 1 << 16).split(b'\\n') if line)\n"
             "print(first.decode(), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).stdout
    assert out.split() == ['["alive",', "null]", "False"]
