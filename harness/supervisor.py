"""A supervisor the subject cannot stop: the commands that run a subject run it in a child.

The code under test is arbitrary Python. It can end its process (``os._exit``), block or
ignore the signals the harness uses (SIGALRM for a call's timeout, SIGINT and SIGTERM for an
interrupt), hold the interpreter in a loop that never returns, or leave a thread behind that
keeps the process alive. Inside one process none of that can be caught, so ``swafuzz fuzz``,
``gate``, ``exhaustive`` and ``replay`` (the console script and ``python -m swafuzz``) run
the command in a child process, and this module, in the parent, owns the outcome:

- the child tells the parent, over a pipe, each scenario before it runs it, each divergence
  as soon as its replay file is written, a heartbeat with the subject call in flight, and
  the exit code it ends with;
- the parent never imports the subject and does no per-call work. It ends the child when the
  child stops answering (no heartbeat, or one call in flight, for :data:`HANG_S`), when it
  runs past its ``--budget`` by :data:`BUDGET_GRACE_S`, when it does not stop within
  :data:`STOP_GRACE_S` of an interrupt passed on to it, or when it has said its exit code
  and does not end within :data:`HANG_S` (a thread left behind, which it names: the parent
  waits for the child to end, never a fixed time, so a slow exit under load is no fault);
- a child that ends without saying its exit code has lost its run: the scenario it was
  running is reported as a divergence of kind ``exited``, ``killed`` or ``hung``, with a
  replay file and the reports, exit code 1. A divergence the child had recorded keeps exit
  code 1 whatever follows.

``SWAFUZZ_SUPERVISOR=0`` runs the command in one process (for a debugger).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .names import EXIT_DIVERGENCE, SUPERVISOR_SWITCH_ENV
from .process.channel import CHANNEL_ENV, HEARTBEAT_S

if TYPE_CHECKING:
    from .run.diagnosis import Divergence

SUPERVISED_COMMANDS = ("fuzz", "gate", "exhaustive", "replay")

# a call is ended by its own timeout (10 s by default) in the child; past this, the alarm
# did not end it
HANG_S = float(os.environ.get("SWAFUZZ_SUPERVISOR_HANG_S", 40.0))
BUDGET_GRACE_S = 60.0  # the child stops at its budget, then shrinks what it found and writes
STOP_GRACE_S = float(os.environ.get("SWAFUZZ_SUPERVISOR_STOP_GRACE_S", 20.0))


# ---- the parent's side -------------------------------------------------------------------


def wanted(argv: list[str]) -> bool:
    command = next((word for word in argv if not word.startswith("-")), None)
    # the pull-request gate (gate --sglang-base) only starts gates, each supervised on its own
    pr_gate = any(word == "--sglang-base" or word.startswith("--sglang-base=") for word in argv)
    # a command line that does not parse runs in this process, which says what is wrong once
    return (command in SUPERVISED_COMMANDS and os.environ.get(SUPERVISOR_SWITCH_ENV, "1") != "0"
            and not {"-h", "--help"} & set(argv) and not pr_gate and _arguments(argv) is not None)


def _arguments(argv: list[str]) -> Any:
    """The parsed command line, or None where it does not parse; argparse's own message is
    held back here, so that the command that runs says it once."""
    from .cli import build_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv)
    except SystemExit:
        return None


@dataclass
class _Heard:
    """What the child has said so far."""

    scenario: str | None = None  # the latest, pickled (see _Channel.announce_scenario)
    scenarios: int = 0
    divergence_file: str | None = None
    exit_code: int | None = None
    exit_at: float = 0.0
    threads: list = field(default_factory=list)  # those its exit waits for, by name
    joined: bool = False  # its exit has joined them
    started: float = field(default_factory=time.monotonic)
    last_alive: float = field(default_factory=time.monotonic)
    call: int | None = None  # the serial of the call in flight at the last heartbeat
    call_since: float = 0.0

    def hear(self, kind: str, payload: Any) -> None:
        now = time.monotonic()
        if kind == "scenario":
            self.scenario = payload
            self.scenarios += 1
        elif kind == "divergence":
            self.divergence_file = payload
        elif kind == "exit":
            self.exit_code, self.exit_at = payload, now
        elif kind == "threads":
            self.threads = payload
        elif kind == "joined":
            self.joined = True
        elif kind == "alive":
            self.last_alive = now
            if payload != self.call:
                self.call, self.call_since = payload, now

    def not_ended(self) -> str:
        """Why a child that said its exit code has not ended."""
        if not self.joined and self.threads:
            return (f"its subject left a thread running after the run ended "
                    f"({', '.join(map(str, self.threads[:3]))}), which it waited for {HANG_S:g} s")
        return f"it did not end within {HANG_S:g} s of saying its exit code"

    def stuck_s(self, now: float) -> float:
        silent = now - self.last_alive
        in_call = now - self.call_since if self.call is not None else 0.0
        return max(silent, in_call)


def supervise(argv: list[str]) -> int:
    """Run ``swafuzz ARGV`` in a child process and return the exit code the run earns."""
    args = _arguments(argv)
    budget = _budget_of(args)
    heard, reason = _Heard(), None
    interrupted: list[int] = []  # passed on to the child once it runs
    previous = {signum: signal.signal(signum, lambda signum, frame: interrupted.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    read, write = os.pipe()
    env = {**os.environ, CHANNEL_ENV: str(write)}
    # a group of its own: a Ctrl-C reaches the supervisor alone, which passes it on once
    child = subprocess.Popen([sys.executable, "-m", "swafuzz", *argv], env=env, pass_fds=(write,),
                             process_group=0)
    os.close(write)
    started, buffer, stop_sent = time.monotonic(), b"", None
    try:
        while True:
            ready, _, _ = select.select([read], [], [], HEARTBEAT_S)
            if ready:
                chunk = os.read(read, 1 << 16)
                if chunk:
                    buffer = _hear_lines(buffer + chunk, heard)
            now = time.monotonic()
            if child.poll() is not None:
                break
            if interrupted and stop_sent is None:
                stop_sent = now
                _signal(child, interrupted[0])
            if heard.exit_code is not None:
                if now - heard.exit_at > HANG_S:
                    reason = heard.not_ended()
                    break
            elif stop_sent is not None and now - stop_sent > STOP_GRACE_S:
                reason = f"it did not stop within {STOP_GRACE_S:g} s of {signal.Signals(interrupted[0]).name}"
                break
            elif heard.stuck_s(now) > HANG_S:
                reason = f"it stopped answering for {HANG_S:g} s (a subject call that the alarm did not end)"
                break
            elif budget is not None and now - started > budget + BUDGET_GRACE_S:
                reason = f"it ran past its budget of {budget:g} s by {BUDGET_GRACE_S:g} s"
                break
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        _hear_lines(buffer + _read_all(read), heard)
        os.close(read)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if heard.exit_code is not None:
        if reason is not None:
            print(f"swafuzz: the run's process was ended: {reason}", file=sys.stderr)
        return EXIT_DIVERGENCE if heard.divergence_file else heard.exit_code
    return _lost_run(args, child.returncode, reason, heard)


def _hear_lines(data: bytes, heard: _Heard) -> bytes:
    *lines, rest = data.split(b"\n")
    for line in lines:
        try:
            kind, payload = json.loads(line)
        except (ValueError, TypeError):
            continue  # not the child's harness speaking
        heard.hear(kind, payload)
    return rest


def _read_all(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _signal(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


def _budget_of(args: Any) -> float | None:
    from .names import GATE_BUDGET_S

    budget = getattr(args, "budget", None)
    return GATE_BUDGET_S if args.command == "gate" and budget is None else budget


# ---- a run the child lost ----------------------------------------------------------------


def _lost_run(args: Any, returncode: int, reason: str | None, heard: _Heard) -> int:
    """The child ended without its exit code: report what it was running as a divergence."""
    from .run.diagnosis import EXITED, HUNG, KILLED

    if reason is not None:
        kind, how = HUNG, f"was ended: {reason}"
    elif returncode < 0:
        kind, how = KILLED, f"was killed by {signal.Signals(-returncode).name}"
    else:
        kind, how = EXITED, f"exited with status {returncode}"
    try:
        if heard.divergence_file is not None:
            print(f"swafuzz {args.command}: the run's process {how} after recording a divergence: "
                  f"{heard.divergence_file}", file=sys.stderr)
            return _report_recorded(args, Path(heard.divergence_file), heard)
        return _report_lost_run(args, kind, how, heard)
    except Exception as exc:  # noqa: BLE001 - the finding is said even if its files cannot be
        print(f"swafuzz {args.command}: the run's process {how}; the report of it failed: {exc}",
              file=sys.stderr)
        return EXIT_DIVERGENCE


def _report_lost_run(args: Any, kind: str, how: str, heard: _Heard) -> int:
    scenario = pickle.loads(base64.b64decode(heard.scenario)) if heard.scenario is not None else None
    from .run.diagnosis import lost_run_divergence

    divergence = lost_run_divergence(kind, f"The subject's process {how}", scenario is not None)
    if args.command == "replay":
        return _replayed(args, divergence)
    return _write_lost_run(args, divergence, scenario, heard)


def _replayed(args: Any, divergence: Divergence) -> int:
    from .results.replay import load_replay

    recorded = load_replay(args.file)
    if recorded.divergence.kind == divergence.kind:
        print(f"swafuzz replay: divergence still there in {args.subject or recorded.subject}")
    else:
        print(f"swafuzz replay: {args.subject or recorded.subject} still diverges on {args.file}, but differently")
    print(f"  {divergence.sentence}")
    return EXIT_DIVERGENCE


def _report_recorded(args: Any, replay_file: Path, heard: _Heard) -> int:
    """The reports of a run whose child recorded a divergence and then ended: its replay file's."""
    from .results.replay import load_replay

    recorded = load_replay(replay_file)
    return _report(args, recorded.divergence, recorded.scenario, replay_file, heard)


def _write_lost_run(args: Any, divergence: Divergence, scenario: Any, heard: _Heard) -> int:
    from .search.campaign import DivergenceLog, stdout_to_stderr

    replay_file = None
    if scenario is not None:
        log = DivergenceLog(args.subject, _profile(args), _settings(args), args.device,
                            Path(args.report_dir) / "replays", divergence.kind)
        with stdout_to_stderr():
            replay_file = log.write(scenario, divergence, seed=getattr(args, "seed", None))
    return _report(args, divergence, scenario, replay_file, heard)


def _profile(args: Any) -> str:
    return getattr(args, "profile", None) or "realistic"


def _settings(args: Any) -> str:
    return "ci" if args.command == "gate" else (getattr(args, "settings", None) or "dev")


def _report(args: Any, divergence: Divergence, scenario: Any, replay_file: Path | None, heard: _Heard) -> int:
    """Write the reports the child could not, and print them as the command does. They are
    written under the report directory's lock, as the child would have written them, which
    also takes away the lock file the child left behind."""
    from .run.boundary import printable
    from .search.campaign import writing_reports_in
    from .subjects.registry import BUILTIN_TABLE
    from .results.reports import REPORT_FILES, Report, write_reports

    row = next((row for row in BUILTIN_TABLE if row.name == args.subject), None)
    info = row.to_dict() if row is not None else {"name": args.subject, "kind": "user"}  # never imported here
    profile, settings = _profile(args), _settings(args)
    report = Report(command=args.command, subject=args.subject, subject_info=info, profile=profile,
                    settings=settings, seed=getattr(args, "seed", None), device=args.device,
                    examples=heard.scenarios, elapsed_s=time.monotonic() - heard.started, divergence=divergence, scenario=scenario,
                    replay_file=str(replay_file) if replay_file else None, replays=False)
    directory = Path(args.report_dir)
    directory.mkdir(parents=True, exist_ok=True)  # a child lost at start-up had not made it
    with writing_reports_in(directory):
        written = write_reports(report, directory)
    if args.json:
        print(json.dumps({**report.to_dict(), "reports": {fmt: str(path) for fmt, path in written.items()}},
                         indent=2))
        return EXIT_DIVERGENCE
    print(f"swafuzz {args.command}: divergence in {printable(args.subject)} (the run's process was lost)")
    print(f"  {printable(divergence.sentence)}")
    if replay_file is not None:
        print(f"  replay file: {replay_file}")
        print(f"  reproduce:   {report.replay_command}")
    print(f"  reports: {', '.join(str(written[fmt]) for fmt in REPORT_FILES)}")
    return EXIT_DIVERGENCE
