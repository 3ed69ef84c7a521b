"""The ``swafuzz`` command line (also ``python -m harness``).

Exit codes, for every subcommand:

- 0: no divergence
- 1: a divergence was found (or a replayed one is still there)
- 2: usage or input error: bad option, unknown subject, malformed replay file, no such device
- 130 / 143: interrupted by SIGINT / SIGTERM before any divergence was found
- 3: swafuzz itself failed (a bug in the harness, with its traceback)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from queue import Empty
from typing import Any, Callable

import torch

from reference import ScenarioError

from . import __version__
from . import fuzz as fuzz_engine
from .database import DatabaseError, open_database
from .executor import SubjectError
from .merge import ReportError, merge_reports
from .fuzz import PROFILES, SETTINGS_PROFILES, FuzzResult, Progress
from .progress import ProgressLine
from .devices import enable_stream_sanitizer
from .registry import SubjectInfo, all_subjects, resolve_subject
from .replay import Replay, ReplayError, emit_pytest, load_replay, run_replay, same_divergence, write_replay
from .reports import REPORT_FILES, Report, write_reports
from .shard import WHOLE, SeedLane, Shard, seed_lane

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

GATE_BUDGET_S = 120.0
WORKER_STOP_GRACE_S = 60.0


class UsageError(Exception):
    """Bad input from the person or script running swafuzz (exit code 2)."""


# ---- parsing -------------------------------------------------------------------------------


def _whole_number(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = _whole_number(1)
_seed = _whole_number(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_subject(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--subject", required=required, metavar="NAME|module:attr",
        help="a built-in subject (see 'swafuzz subjects'), sglang:<target>[@<version>] for real "
             "SGLang code, or module:attr naming a Subject class or SubjectInfo importable from here",
    )
    _add_sglang_options(parser)


def _add_sglang_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sglang-source", metavar="PATH",
                        help="an SGLang checkout whose code sglang:<target> subjects bind "
                             "(default: $SWAFUZZ_SGLANG_SOURCE, else the installed package)")
    parser.add_argument("--sglang-mode", choices=("auto", "import", "source"),
                        help="import the installed package, read the source, or auto (import where "
                             "it imports, else source; default: $SWAFUZZ_SGLANG_MODE, else auto)")


def _apply_sglang_options(args: argparse.Namespace) -> None:
    # through the environment, so that worker processes bind the same code
    from .sglang import MODE_ENV, SOURCE_ENV

    for value, name in ((getattr(args, "sglang_source", None), SOURCE_ENV),
                        (getattr(args, "sglang_mode", None), MODE_ENV)):
        if value:
            os.environ[name] = str(value)


def _add_device(parser: argparse.ArgumentParser, default: str | None = "cpu") -> None:
    parser.add_argument("--device", default=default, metavar="cpu|cuda",
                        help="where the subject's tensors live" + (f" (default: {default})" if default else ""))


def _add_stream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stream-delay", type=_positive_int, default=0, metavar="CYCLES",
                        help="GPU only: queue a sleep of CYCLES clock cycles on the engine's side stream "
                             "before each metadata init, so a missing stream wait shows as a divergence")
    parser.add_argument("--sanitize-streams", action="store_true",
                        help="GPU only: run under PyTorch's CUDA Stream Sanitizer; an unsynchronized "
                             "cross-stream access becomes a divergence of kind 'race'")


def _add_outputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report-dir", type=Path, default=Path("reports"), metavar="DIR",
        help="where reports (summary.md, report.json, junit.xml, report.html) and replay files "
             "(DIR/replays/) go (default: reports)",
    )
    parser.add_argument(
        "--database", metavar="DIR|redis://HOST:PORT/DB",
        help="Hypothesis example database: every failing example is saved there as it is found, "
             "so an interrupted run loses nothing; a Redis URL is shared by many machines and "
             "copied into .hypothesis-db inside --report-dir, which carries on alone if Redis "
             "goes away (default: .hypothesis-db inside --report-dir)",
    )
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout and no progress line")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=_seconds, metavar="SECONDS", help="stop after this many seconds")
    parser.add_argument("--max-examples", type=_positive_int, metavar="N", help="stop after N scenarios")
    parser.add_argument("--seed", type=_seed, metavar="N",
                        help="random seed: the run repeats exactly, so it never replays the example "
                             "database, though it saves its failures there (default: unseeded, saved "
                             "failures are replayed first)")
    parser.add_argument("--long-horizon", action="store_true",
                        help="scenarios with runs of hundreds of plain decode forwards between the "
                             "interesting ones, for state that goes stale only after many steps "
                             "(slower examples: use with a budget; --settings nightly-long implies it)")
    parser.add_argument(
        "--workers", type=_positive_int, default=1, metavar="N",
        help="fuzz in N processes (with seeds SEED..SEED+N-1 when seeded), each with the full "
             "time budget and 1/N of --max-examples; the first divergence stops the others",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swafuzz",
        description="Differential fuzzing of cached SWA write locations against a reference.",
        epilog="Exit codes: 0 no divergence, 1 divergence found, 2 usage or input error, "
               "130/143 interrupted (SIGINT/SIGTERM) with no divergence, 3 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"swafuzz {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fuzz = commands.add_parser("fuzz", help="fuzz a subject against the reference",
                               description="Fuzz a subject; each divergence is shrunk and written as a "
                                           "replay file, and reports are written at the end.")
    _add_subject(fuzz)
    fuzz.add_argument("--profile", choices=PROFILES, default="realistic",
                      help="scenario profile (default: realistic)")
    fuzz.add_argument("--settings", choices=sorted(SETTINGS_PROFILES),
                      help="search settings profile (default: $SWAFUZZ_SETTINGS, else dev); "
                           "ci is deterministic and keeps no example database")
    fuzz.add_argument("--shard", type=_shard, metavar="I/N",
                      help="this machine's part I of a campaign spread over N machines: their seeds "
                           "never overlap (seeded from --seed, default 0; every shard must use the "
                           "same --seed and --workers); see merge-reports")
    fuzz.add_argument("--threads", action="store_true",
                      help="stress mode: micro-batches call the subject from real threads; a "
                           "divergence is not shrunk, its interleaving is pinned into the replay file")
    _add_run_options(fuzz)
    _add_device(fuzz)
    _add_stream_options(fuzz)
    _add_outputs(fuzz)
    fuzz.set_defaults(handler=_cmd_fuzz)

    gate = commands.add_parser(
        "gate", help="merge-gate preset: fuzz with CI settings and write JUnit and Markdown",
        description=f"The merge gate: the realistic profile under the 'ci' settings for "
                    f"{GATE_BUDGET_S:g} s (or --budget), every report written, the Markdown summary "
                    "printed for a pull-request comment.")
    _add_subject(gate)
    _add_run_options(gate)
    _add_device(gate)
    _add_stream_options(gate)
    _add_outputs(gate)
    gate.set_defaults(handler=_cmd_gate, budget=None)

    replay = commands.add_parser("replay", help="re-run a replay file",
                                 description="Re-run a recorded divergence: exit 1 while it is there, 0 once fixed.")
    replay.add_argument("file", type=Path, metavar="FILE", help="a replay file written by fuzz, gate or exhaustive")
    _add_subject(replay, required=False)
    replay.set_defaults(subject=None)
    replay.add_argument("--emit-pytest", type=Path, metavar="PATH",
                        help="also write a standalone pytest regression test (no Hypothesis) to PATH")
    _add_device(replay, default=None)
    replay.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    replay.set_defaults(handler=_cmd_replay)

    subjects = commands.add_parser("subjects", help="list the subjects (built-in, and real SGLang targets when SGLang is found)")
    subjects.add_argument("--json", action="store_true", help="print a JSON list of subjects on stdout")
    _add_sglang_options(subjects)
    subjects.set_defaults(handler=_cmd_subjects)

    exhaustive = commands.add_parser(
        "exhaustive", help="run every small scenario within bounds",
        description="Enumerate every scenario within the bounds instead of sampling.")
    _add_subject(exhaustive)
    exhaustive.add_argument("--profile", choices=PROFILES, default="adversarial",
                            help="which scenarios count (default: adversarial, everything)")
    exhaustive.add_argument("--max-forwards", type=_positive_int, default=2, metavar="N", help="(default: 2)")
    exhaustive.add_argument("--max-layers", type=_positive_int, default=3, metavar="N", help="(default: 3)")
    exhaustive.add_argument("--max-micro-batches", type=_positive_int, default=2, metavar="N", help="(default: 2)")
    _add_device(exhaustive)
    _add_outputs(exhaustive)
    exhaustive.set_defaults(handler=_cmd_exhaustive)

    merge = commands.add_parser(
        "merge-reports", help="combine the reports of a sharded campaign into one",
        description="Combine the report.json of each DIR (the --report-dir of each shard or run) "
                    "into one summary.md, junit.xml, report.html and report.json. Exits 1 when any "
                    "run found a divergence.")
    merge.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a report directory, or a report.json")
    merge.add_argument("--report-dir", type=Path, default=Path("reports") / "merged", metavar="DIR",
                       help="where the merged reports go (default: reports/merged)")
    merge.set_defaults(handler=_cmd_merge_reports)

    commands.add_parser("bench", add_help=False, help="benchmarks (arguments go to the benchmark runner)")
    return parser


def entry() -> None:
    """The program's entry point (console script and ``python -m harness``).

    After a run stopped by a signal, CPython may still end the process by SIGINT at exit
    (an interrupt raised inside library code leaves it flagged as unhandled), which would
    replace the documented 130/143 or 1; so such a run leaves through ``os._exit`` once its
    output is flushed.
    """
    code = main()
    if InterruptWatch.caught_any:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, --version, or a usage error already printed
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_USAGE
    try:
        _apply_sglang_options(args)
        return args.handler(args)
    except (UsageError, SubjectError, ReplayError) as exc:
        print(f"swafuzz {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:  # noqa: BLE001 - a harness bug: say so, never pass it off as a divergence
        print(f"swafuzz {args.command}: internal error (a bug in swafuzz):\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_INTERNAL


# ---- shared checks -------------------------------------------------------------------------


def check_device(text: str) -> str:
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise UsageError(f"--device {text!r} is not a device name (use cpu or cuda): {exc}") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {text!r}: swafuzz runs on cpu or cuda, not {device.type}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: no CUDA or ROCm device is available here "
                             "(torch.cuda.is_available() is False); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {text}: this machine has {torch.cuda.device_count()} GPU(s)")
    return str(device)


def _prepare_report_dir(directory: Path) -> Path:
    try:
        (directory / "replays").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--report-dir {directory}: cannot create it: {exc}") from None
    if not os.access(directory, os.W_OK):
        raise UsageError(f"--report-dir {directory}: not writable")
    return directory


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2))


def _stdout_to_stderr(enabled: bool = True) -> contextlib.AbstractContextManager:
    """Keeps stdout for the one JSON object: whatever a subject or Hypothesis's verbose
    settings print while the run goes on lands on stderr."""
    return contextlib.redirect_stdout(sys.stderr) if enabled else contextlib.nullcontext()


# ---- interrupts ----------------------------------------------------------------------------


class InterruptWatch:
    """Catches SIGINT and SIGTERM for the length of a run and remembers the first one.

    With ``raise_first`` the first signal raises KeyboardInterrupt in the main thread (the
    fuzzer runs there and must stop); later signals, and every signal after :meth:`disarm`,
    are only noted, so the reports of a stopped run still get written in full.

    Python runs a signal handler wherever the main thread is, which can be a garbage
    collector callback or a finalizer that swallows the exception; :meth:`check`, called
    between examples, raises it again for a run that is still going.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    caught_any = False  # any watch of this process caught a signal

    def __init__(self, raise_first: bool = True):
        self.raise_first = raise_first
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "InterruptWatch":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def disarm(self) -> None:
        self.raise_first = False

    def check(self) -> None:
        if self.signum is not None and self.raise_first:
            raise KeyboardInterrupt

    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def _on_signal(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        InterruptWatch.caught_any = True
        if first:
            self.signum = signum
        if first and self.raise_first:
            raise KeyboardInterrupt


# ---- fuzzing campaigns ---------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzJob:
    """Everything one fuzzing process needs; plain data so that it crosses process bounds."""

    subject: str  # the spec as given
    profile: str
    settings: str
    seed: int | None  # None: unseeded, failures are remembered in the database instead
    run: str  # names the run's replay file
    device: str
    replay_dir: str
    database_dir: str  # a directory or a Redis URL
    budget_s: float | None = None
    max_examples: int | None = None
    threads: bool = False
    stream_delay_cycles: int = 0
    sanitize_streams: bool = False
    long_horizon: bool | None = None  # None: as the settings profile says
    seed_stride: int = 1  # chunk k draws from seed + k * seed_stride (see harness.shard)
    local_database_dir: str | None = None  # the local copy of a Redis database
    shard: str | None = None


class DivergenceLog:
    """Writes a replay file the moment the fuzzer reports a divergence.

    The fuzzer may report one divergence several times while it shrinks it; all reports of a
    run go to the same file, so the file always holds the smallest scenario found so far.
    """

    def __init__(self, job: FuzzJob):
        self.job = job
        self.latest: FuzzResult | None = None
        self.path: Path | None = None

    def record(self, result: FuzzResult) -> Path | None:
        if result.divergence is None or result.scenario is None:
            return None
        replay = Replay(
            subject=self.job.subject, profile=result.profile or self.job.profile, scenario=result.scenario,
            divergence=result.divergence, seed=result.seed,
            settings=result.settings or self.job.settings, device=self.job.device,
        )
        self.latest = result
        self.path = write_replay(replay, self.job.replay_dir, self.job.run)
        return self.path


def run_until_interrupted(start: Callable[[Callable[[Progress], None]], FuzzResult],
                          partial: Callable[[int, float], FuzzResult], on_progress: Callable[[Progress], None],
                          watch: InterruptWatch) -> FuzzResult:
    """``start(progress_callback)``; a KeyboardInterrupt ends it with ``partial(examples run,
    seconds elapsed)``. ``watch`` is disarmed as soon as the run stops, so that a second
    signal cannot cut short the writing of what it found."""
    last: list[Progress] = []
    started = time.monotonic()

    def progress(update: Progress) -> None:
        last[:] = [update]
        on_progress(update)
        watch.check()

    try:
        return start(progress)
    except KeyboardInterrupt:
        return partial(last[0].examples if last else 0, time.monotonic() - started)
    finally:
        watch.disarm()


def run_job(info: SubjectInfo, job: FuzzJob, watch: InterruptWatch, on_progress: Callable[[Progress], None],
            on_replay: Callable[[FuzzResult, Path], None]) -> tuple[FuzzResult, Path | None]:
    """Fuzz once in this process, writing each divergence's replay file as it is reported."""
    log = DivergenceLog(job)

    def divergence(result: FuzzResult) -> None:
        path = log.record(result)
        if path is not None:
            on_replay(result, path)

    def partial(examples: int, elapsed_s: float) -> FuzzResult:
        if log.latest is not None:
            return replace(log.latest, examples=max(examples, log.latest.examples), elapsed_s=elapsed_s,
                           interrupted=True)
        return FuzzResult(info.name, job.profile, job.settings, examples=examples, elapsed_s=elapsed_s,
                          seed=job.seed, interrupted=True)

    if job.sanitize_streams:
        enable_stream_sanitizer()
    result = run_until_interrupted(
        lambda progress: fuzz_engine.fuzz(
            info, profile=job.profile, settings=job.settings, max_examples=job.max_examples,
            budget_s=job.budget_s, seed=job.seed, seed_stride=job.seed_stride, device=job.device,
            database_dir=job.database_dir, local_database_dir=job.local_database_dir,
            threads=job.threads, stream_delay_cycles=job.stream_delay_cycles, long_horizon=job.long_horizon,
            on_progress=progress, on_divergence=divergence,
        ),
        partial, on_progress, watch,
    )
    log.record(result)
    return result, log.path


def merge_results(results: list[FuzzResult], winner: FuzzResult | None) -> FuzzResult:
    """One result for a run spread over processes: the winner's divergence, everyone's counts."""
    coverage: Counter[str] = Counter()
    for result in results:
        coverage.update(result.coverage)
    base = winner or results[0]
    return replace(
        base, examples=sum(r.examples for r in results), coverage=dict(coverage),
        elapsed_s=max(r.elapsed_s for r in results), interrupted=False,
    )


_worker_queue: Any = None


def _init_worker(queue: Any) -> None:
    global _worker_queue
    _worker_queue = queue
    # a Ctrl-C reaches every process of the terminal's group: a worker that dies between
    # jobs breaks the whole pool, so it only listens while it fuzzes (see _worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker(index: int, job: FuzzJob) -> tuple[FuzzResult, str | None]:
    with InterruptWatch() as watch, _stdout_to_stderr():
        _worker_queue.put(("started", index, os.getpid()))
        result, path = run_job(
            resolve_subject(job.subject), job, watch,
            on_progress=lambda update: _worker_queue.put(("progress", index, update)),
            on_replay=lambda found, path: _worker_queue.put(
                ("divergence", index, (found.divergence.sentence, str(path)))),
        )
    return result, str(path) if path else None


class WorkerPool:
    """Runs one job per process with the standard library's process pool.

    The first divergence reported wins: the other workers get SIGINT, stop fuzzing and
    return what they covered. A SIGINT or SIGTERM to this process is passed on the same way.
    A worker that dies without answering still left its replay file, which stands in for it.
    """

    def __init__(self, jobs: list[FuzzJob], line: ProgressLine, watch: InterruptWatch):
        self.jobs = jobs
        self.line = line
        self.watch = watch
        self.pids: dict[int, int] = {}
        self.progress: dict[int, Progress] = {}
        self.replay_files: dict[int, Path] = {}
        self.winner: int | None = None
        self.spared: int | None = None  # the worker left to finish shrinking its divergence
        self.stopping = False
        self.started = time.monotonic()

    def run(self) -> tuple[FuzzResult, Path | None]:
        context = multiprocessing.get_context("spawn")  # CUDA cannot be used after fork
        queue = context.Queue()
        outcomes: dict[int, FuzzResult] = {}
        with ProcessPoolExecutor(len(self.jobs), mp_context=context, initializer=_init_worker,
                                 initargs=(queue,)) as pool:
            futures = {pool.submit(_worker, i, job): i for i, job in enumerate(self.jobs)}
            pending = set(futures)
            stop_deadline = float("inf")
            while pending and time.monotonic() < stop_deadline:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                self._drain(queue)
                for future in done:
                    self._collect(futures[future], future, outcomes)
                if self.watch.interrupted and (not self.stopping or self.spared is not None):
                    self._stop_workers(spare=None)  # the person asked: the winner stops too
                    stop_deadline = time.monotonic() + WORKER_STOP_GRACE_S
                elif self.winner is not None and not self.stopping:
                    self._stop_workers(spare=self.winner)
                    stop_deadline = time.monotonic() + WORKER_STOP_GRACE_S
            self._drain(queue)
            for index in (futures[f] for f in pending):
                _send(self.pids.get(index, 0), signal.SIGKILL)
        return self._merge(outcomes)

    def _collect(self, index: int, future: Any, outcomes: dict[int, FuzzResult]) -> None:
        try:
            result, path = future.result()
        except (BrokenProcessPool, KeyboardInterrupt):
            return  # its replay file, if any, speaks for it
        outcomes[index] = result
        if path:
            self.replay_files[index] = Path(path)
        if result.divergence is not None and self.winner is None:
            self.winner = index

    def _merge(self, outcomes: dict[int, FuzzResult]) -> tuple[FuzzResult, Path | None]:
        winner = outcomes.get(self.winner) if self.winner is not None else None
        if self.winner is not None and (winner is None or winner.divergence is None):
            winner = self._from_replay_file(self.winner)
        results = list(outcomes.values()) or [self._from_progress()]
        merged = merge_results(results + ([winner] if winner and winner not in results else []), winner)
        merged.interrupted = self.watch.interrupted
        merged.elapsed_s = time.monotonic() - self.started  # the wall time, process start-ups included
        return merged, self.replay_files.get(self.winner) if winner else None

    def _from_replay_file(self, index: int) -> FuzzResult | None:
        path = self.replay_files.get(index)
        if path is None:
            return None
        recorded = load_replay(path)
        job = self.jobs[index]
        return FuzzResult(
            subject=job.subject, profile=recorded.profile, settings=job.settings, examples=0,
            elapsed_s=time.monotonic() - self.started, divergence=recorded.divergence,
            scenario=recorded.scenario, seed=recorded.seed,
        )

    def _from_progress(self) -> FuzzResult:
        job = self.jobs[0]
        return FuzzResult(
            subject=job.subject, profile=job.profile, settings=job.settings,
            examples=sum(p.examples for p in self.progress.values()),
            elapsed_s=time.monotonic() - self.started, seed=job.seed,
        )

    def _drain(self, queue: Any) -> None:
        while True:
            try:
                kind, index, payload = queue.get_nowait()
            except Empty:
                return
            if kind == "started":
                self.pids[index] = payload
                if self.stopping and index != self.spared:
                    _send(payload, signal.SIGINT)
            elif kind == "progress":
                self.progress[index] = payload
                self.line.update(self._combined_progress())
            elif kind == "divergence":
                sentence, path = payload
                self.replay_files[index] = Path(path)
                self.line.note(f"divergence (worker {index}): {sentence}\n  replay file: {path}")
                if self.winner is None:
                    self.winner = index

    def _combined_progress(self) -> Progress:
        updates = list(self.progress.values())
        return Progress(
            examples=sum(u.examples for u in updates), elapsed_s=time.monotonic() - self.started,
            budget_s=self.jobs[0].budget_s, features_covered=max(u.features_covered for u in updates),
            divergences=sum(u.divergences for u in updates),
        )

    def _stop_workers(self, spare: int | None) -> None:
        self.stopping = True
        self.spared = spare
        for index, pid in self.pids.items():
            if index != spare:
                _send(pid, signal.SIGINT)


def _send(pid: int, signum: int) -> None:
    if pid <= 0:
        return  # never started: there is nothing to signal (and 0 would mean our own group)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it already ended


@dataclass
class Campaign:
    """Options shared by fuzz, gate and exhaustive, checked."""

    command: str
    subject: str
    info: SubjectInfo
    device: str
    report_dir: Path
    database_dir: str  # a directory or a Redis URL
    as_json: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Campaign":
        info = resolve_subject(args.subject)
        device = check_device(args.device)
        for flag, used in (("--stream-delay", getattr(args, "stream_delay", 0)),
                           ("--sanitize-streams", getattr(args, "sanitize_streams", False))):
            if used and not device.startswith("cuda"):
                raise UsageError(f"{flag} works on GPU streams: it needs --device cuda")
        report_dir = _prepare_report_dir(args.report_dir)
        database = args.database or str(report_dir / ".hypothesis-db")
        try:
            open_database(database, report_dir / ".hypothesis-db")
        except DatabaseError as exc:
            raise UsageError(f"--database {exc}") from None
        return cls(args.command, args.subject, info, device, report_dir, database, args.json)

    def job(self, args: argparse.Namespace, settings: str | None, profile: str) -> FuzzJob:
        try:
            chosen = fuzz_engine.settings_profile(settings)
        except ValueError as exc:  # only $SWAFUZZ_SETTINGS can name an unknown one here
            raise UsageError(f"${fuzz_engine.SETTINGS_ENV}: {exc}") from None
        sharded = getattr(args, "shard", None) is not None
        seed = 0 if args.seed is None and (chosen.deterministic or sharded) else args.seed
        run = f"seed{seed}" if seed is not None else datetime.now().strftime("%Y%m%d-%H%M%S")
        return FuzzJob(
            subject=self.subject, profile=profile, settings=chosen.name, seed=seed, run=run,
            device=self.device, replay_dir=str(self.report_dir / "replays"),
            database_dir=str(self.database_dir), budget_s=args.budget, max_examples=args.max_examples,
            threads=getattr(args, "threads", False),
            stream_delay_cycles=getattr(args, "stream_delay", 0),
            sanitize_streams=getattr(args, "sanitize_streams", False),
            long_horizon=True if getattr(args, "long_horizon", False) else None,
            local_database_dir=str(self.report_dir / ".hypothesis-db"),
            shard=str(args.shard) if getattr(args, "shard", None) else None,
        )

    def progress_line(self) -> ProgressLine:
        return ProgressLine(sys.stderr, enabled=not self.as_json)

    def finish(self, result: FuzzResult, replay_path: Path | None, watch: InterruptWatch,
               budget_s: float | None = None, workers: int = 1, print_markdown: bool = False,
               shard: str | None = None) -> int:
        interrupted = result.interrupted  # a signal after the run ended cut nothing short
        report = Report(
            command=self.command, subject=self.subject, subject_info=self.info.to_dict(),
            profile=result.profile, settings=result.settings, seed=result.seed, device=self.device,
            examples=result.examples, elapsed_s=result.elapsed_s, budget_s=budget_s, workers=workers,
            coverage=dict(result.coverage), divergence=result.divergence, scenario=result.scenario,
            weakest_profile=result.weakest_profile,
            replay_file=str(replay_path) if replay_path and result.divergence else None,
            complete=not interrupted, interrupted_by=watch.signal_name if interrupted else None,
            replays=result.replays, shrink_complete=result.shrink_complete,
            scope=result.scope.to_dict() if result.scope is not None else None,
            shard=shard, examples_to_divergence=result.examples_to_divergence,
        )
        written = write_reports(report, self.report_dir)
        if self.as_json:
            _print_json({**report.to_dict(), "reports": {fmt: str(path) for fmt, path in written.items()}})
        elif print_markdown:
            print(written["markdown"].read_text(encoding="utf-8"))
        else:
            _print_summary(report, written)
        if report.divergence is not None:
            return EXIT_DIVERGENCE
        return watch.exit_code if interrupted else EXIT_OK


def _print_summary(report: Report, written: dict[str, Path]) -> None:
    head = f"swafuzz {report.command}: {report.verdict} in {report.subject}"
    run = f"{report.examples} examples in {report.elapsed_s:.1f} s"
    if report.seed is not None:
        run += f", seed {report.seed}"
    if not report.complete:
        run += f"; interrupted by {report.interrupted_by or 'a signal'}, the report is marked incomplete"
    print(f"{head} ({run})")
    if report.divergence is not None:
        print(f"  {report.divergence.sentence}")
        print(f"  replay file: {report.replay_file}")
        print(f"  reproduce:   {report.replay_command}")
        if not report.shrink_complete:
            print("  the budget ran out while shrinking: the scenario is the smallest found so far")
    print(f"  features covered: {len(report.features_covered)}")
    print(f"  reports: {', '.join(str(written[fmt]) for fmt in REPORT_FILES)}")


def _fuzz(args: argparse.Namespace, settings: str | None, profile: str, print_markdown: bool = False) -> int:
    campaign = Campaign.from_args(args)
    base = campaign.job(args, settings, profile)
    line = campaign.progress_line()
    workers = args.workers
    shard = getattr(args, "shard", None) or WHOLE
    with InterruptWatch(raise_first=workers == 1) as watch:
        try:
            with _stdout_to_stderr(campaign.as_json):
                if workers == 1:
                    result, path = run_job(
                        campaign.info, _in_lane(base, seed_lane(shard)), watch, on_progress=line.update,
                        on_replay=lambda found, p: line.note(
                            f"divergence: {found.divergence.sentence}\n  replay file: {p}"),
                    )
                else:
                    per_worker = -(-args.max_examples // workers) if args.max_examples else None
                    jobs = [_worker_job(base, i, per_worker, seed_lane(shard, i, workers)) for i in range(workers)]
                    result, path = WorkerPool(jobs, line, watch).run()
        finally:
            line.close()
        return campaign.finish(result, path, watch, budget_s=args.budget, workers=workers,
                               print_markdown=print_markdown, shard=base.shard)


def _worker_job(base: FuzzJob, index: int, max_examples: int | None, lane: SeedLane) -> FuzzJob:
    if base.seed is None:
        return replace(base, run=f"{base.run}-w{index}", max_examples=max_examples)
    return replace(_in_lane(base, lane), max_examples=max_examples)


def _in_lane(job: FuzzJob, lane: SeedLane) -> FuzzJob:
    if job.seed is None:
        return job
    seed = job.seed + lane.offset
    return replace(job, seed=seed, seed_stride=lane.stride, run=f"seed{seed}")


def _cmd_fuzz(args: argparse.Namespace) -> int:
    return _fuzz(args, settings=args.settings, profile=args.profile)


def _cmd_gate(args: argparse.Namespace) -> int:
    if args.budget is None:
        args.budget = GATE_BUDGET_S
    return _fuzz(args, settings="ci", profile="realistic", print_markdown=not args.json)


def _cmd_exhaustive(args: argparse.Namespace) -> int:
    campaign = Campaign.from_args(args)
    job = FuzzJob(subject=campaign.subject, profile=args.profile, settings="exhaustive", seed=None,
                  run="exhaustive", device=campaign.device, replay_dir=str(campaign.report_dir / "replays"),
                  database_dir=str(campaign.database_dir))
    line = campaign.progress_line()
    with InterruptWatch() as watch:
        try:
            with _stdout_to_stderr(campaign.as_json):
                result = run_until_interrupted(
                    lambda progress: fuzz_engine.exhaustive(
                        campaign.info, max_forwards=args.max_forwards, max_layers=args.max_layers,
                        max_micro_batches=args.max_micro_batches, profile=args.profile,
                        device=campaign.device, on_progress=progress,
                    ),
                    lambda examples, elapsed_s: FuzzResult(
                        campaign.info.name, job.profile, job.settings, examples=examples,
                        elapsed_s=elapsed_s, interrupted=True),
                    line.update, watch,
                )
        finally:
            line.close()
        log = DivergenceLog(job)
        log.record(result)
        code = campaign.finish(result, log.path, watch)
    if code == EXIT_OK and not campaign.as_json and result.scope is not None:
        for line in result.scope.lines():
            print(f"  {line}")
    return code


# ---- replay, subjects, bench ---------------------------------------------------------------


def _cmd_replay(args: argparse.Namespace) -> int:
    recorded = load_replay(args.file)
    subject = args.subject or recorded.subject
    info = resolve_subject(subject)
    device = check_device(args.device or recorded.device)
    started = time.monotonic()
    try:
        with _stdout_to_stderr(args.json):
            run = run_replay(recorded, subject=subject, device=device)
    except ScenarioError as exc:
        raise ReplayError(f"{args.file}: the recorded scenario cannot run: {exc}") from None
    elapsed = time.monotonic() - started
    if args.emit_pytest is not None:
        emit_pytest(replace(recorded, subject=subject, device=device), args.emit_pytest, source=str(args.file))
    found = run.divergence
    reproduced = found is not None and same_divergence(found, recorded.divergence)
    if args.json:
        report = Report(
            command="replay", subject=subject, subject_info=info.to_dict(), profile=recorded.profile,
            settings=recorded.settings, seed=recorded.seed, device=device, examples=1, elapsed_s=elapsed,
            divergence=found, scenario=recorded.scenario if found else None,
            replay_file=str(args.file) if found else None,
        )
        _print_json({**report.to_dict(), "reproduced": reproduced,
                     "recorded_diagnosis": recorded.divergence.to_dict(),
                     "emitted_pytest": str(args.emit_pytest) if args.emit_pytest else None})
    else:
        _print_replay(args, subject, recorded, found, reproduced, run.checks)
    return EXIT_DIVERGENCE if found is not None else EXIT_OK


def _print_replay(args: argparse.Namespace, subject: str, recorded: Replay, found: Any, reproduced: bool,
                  checks: int) -> None:
    if found is None:
        print(f"swafuzz replay: fixed: {subject} matches the reference on {args.file} ({checks} stores checked)")
        print(f"  recorded: {recorded.divergence.sentence}")
    elif reproduced:
        print(f"swafuzz replay: divergence still there in {subject}")
        print(f"  {found.sentence}")
    else:
        print(f"swafuzz replay: {subject} still diverges on {args.file}, but differently")
        print(f"  now:      {found.sentence}")
        print(f"  recorded: {recorded.divergence.sentence}")
    if args.emit_pytest is not None:
        print(f"  regression test written to {args.emit_pytest}")


def _cmd_subjects(args: argparse.Namespace) -> int:
    rows = [info.to_dict() for info in all_subjects()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    width = max(len(row["name"]) for row in rows)
    print(f"{'NAME':<{width}}  TRUTH  EXPECTED    DIVERGES ON")
    for row in rows:
        print(f"{row['name']:<{width}}  {row['truth']:<5}  {row['expected']:<10}  "
              f"{', '.join(row['diverges_on']) or '-'}")
    print("\nA user subject is given as module:attr (a Subject class or a SubjectInfo).")
    return EXIT_OK


def _cmd_merge_reports(args: argparse.Namespace) -> int:
    try:
        merged = merge_reports(args.dirs, args.report_dir)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    print(merged.headline())
    print(f"  reports: {', '.join(str(path) for path in merged.written.values())}")
    return EXIT_DIVERGENCE if merged.diverged else EXIT_OK


def _cmd_bench(argv: list[str]) -> int:
    try:
        from . import bench
    except ImportError as exc:
        print(f"swafuzz bench: error: the benchmark runner is not available: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return bench.main(argv)
