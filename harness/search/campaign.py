"""A fuzzing campaign: fuzz, gate and exhaustive runs, their worker processes, their
interrupts, the replay files of what they find and the reports they end with.

The command line (:mod:`swafuzz.cli`) parses options into plain values and prints what a
campaign returns; the pytest plugin records divergences with the same :class:`DivergenceLog`.

    campaign = Campaign.open("fuzz", "uncached", device="cpu", report_dir=Path("reports"))
    finished = campaign.fuzz(campaign.job(profile="realistic", settings="ci", budget_s=60))
    finished.report, finished.written, finished.exit_code

Signals: while a run goes, an :class:`InterruptWatch` stops it on the first SIGINT or SIGTERM
and the reports are still written, marked incomplete; :mod:`swafuzz.entry` handles a signal
before a run starts and after it ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ..reference import Scenario

from . import fuzz as fuzz_engine
from ..run.boundary import InputError, describe_path, parse_json, printable, read_regular_file, writable_directory
from .database import DatabaseError, is_redis_url, open_database
from ..run.devices import enable_stream_sanitizer
from ..run.executor import run_scenario
from ..process.signals import note_signal, run_starting, signal_before_run
from .fuzz import FuzzResult, Progress
from ..names import EXIT_DIVERGENCE, EXIT_INTERNAL, EXIT_OK
from .progress import ProgressLine
from ..subjects.registry import SubjectInfo, resolve_subject
from ..results.replay import Replay, claim_replay_path, load_replay, replay_file_name, write_replay
from ..results.reports import REPORT_FILES, Report, write_reports
from .shard import WHOLE, SeedLane, Shard, seed_lane
from ..process.channel import announce_divergence, keep_scenarios_in, last_scenario
from ..run.diagnosis import EXITED, lost_run_divergence
from .workers import context as worker_context, environment_for_workers, take_environment

if TYPE_CHECKING:
    from ..run.diagnosis import Divergence


WORKER_STOP_GRACE_S = 60.0

# A campaign process runs torch on one intra-op thread; the machine's other cores are
# for --workers. The subjects' tensors hold a few hundred elements, which threads do not
# speed up, and some of their operations (repeat_interleave, the ring subjects' per-layer
# expansion) open an OpenMP region on every call however small: each waits for all of
# the process's threads, so once the processes' threads outnumber the cores (two workers
# with torch's default of one thread per core, or one process beside other load), most
# of the time goes to waiting for a thread that is not running.
CAMPAIGN_TORCH_THREADS = 1


@contextlib.contextmanager
def campaign_torch_threads() -> Iterator[None]:
    """Torch on :data:`CAMPAIGN_TORCH_THREADS` threads for the length of a run in this process."""
    previous = torch.get_num_threads()
    torch.set_num_threads(CAMPAIGN_TORCH_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def stdout_to_stderr(enabled: bool = True) -> contextlib.AbstractContextManager:
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

    def __init__(self, raise_first: bool = True):
        self.raise_first = raise_first
        self.signum: int | None = signal_before_run()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "InterruptWatch":
        run_starting()
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        self._previous_unraisable_hook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = self._previous_unraisable_hook

    def _on_unraisable(self, unraisable: Any) -> None:
        # this watch's interrupt, landed in a finalizer that could not raise it: it is
        # raised again between examples (check), so its traceback is noise
        if not (issubclass(unraisable.exc_type, KeyboardInterrupt) and self.interrupted):
            self._previous_unraisable_hook(unraisable)

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
        note_signal(signum)
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
    # when the budget started, a time.monotonic() reading (None: when the fuzzing starts)
    started_at: float | None = None
    max_examples: int | None = None
    threads: bool = False
    stream_delay_cycles: int = 0
    sanitize_streams: bool = False
    long_horizon: bool | None = None  # None: as the settings profile says
    seed_stride: int = 1  # chunk k draws from seed + k * seed_stride (see swafuzz.search.shard)
    local_database_dir: str | None = None  # the local copy of a Redis database
    shard: str | None = None


class DivergenceLog:
    """Writes a replay file the moment a divergence is reported: the one way swafuzz records
    what it found, for the command line's runs and the pytest plugin's tests alike.

    The fuzzer may report one divergence several times while it shrinks it; all reports of a
    run go to the same file (named by subject, profile and ``run``, numbered where another
    run's file has that name), so the file always holds the smallest scenario found so far and
    no run replaces another's.
    """

    def __init__(self, subject: str, profile: str, settings: str, device: str,
                 replay_dir: str | os.PathLike, run: str):
        self.subject = subject
        self.profile = profile
        self.settings = settings
        self.device = device
        self.replay_dir = replay_dir
        self.run = run
        self.latest: FuzzResult | None = None
        self.path: Path | None = None
        self.unwritten: str | None = None  # why the replay file could not be written (a full disk)

    @classmethod
    def of(cls, job: FuzzJob) -> "DivergenceLog":
        return cls(job.subject, job.profile, job.settings, job.device, job.replay_dir, job.run)

    def write(self, scenario: Scenario, divergence: Divergence, *, seed: int | None = None,
              profile: str | None = None, settings: str | None = None) -> Path:
        """Record one divergence; ``profile`` and ``settings`` default to the log's own."""
        replay = Replay(
            subject=self.subject, profile=profile or self.profile, scenario=scenario,
            divergence=divergence, seed=seed, settings=settings or self.settings, device=self.device,
            engine_switches=_engine_switches(self.subject), sglang_tree=_sglang_tree(self.subject),
        )
        try:
            if self.path is None:  # this run's own file, beside any other run's
                self.path = claim_replay_path(self.replay_dir, replay_file_name(replay, self.run))
            write_replay(replay, self.replay_dir, path=self.path)
            self.unwritten = None
            announce_divergence(self.path)
        except OSError as exc:  # the run goes on: what it finds is still printed at the end
            self.unwritten = f"{describe_path(self.path or self.replay_dir)}: {exc.strerror or exc}"
        return self.path

    def record(self, result: FuzzResult) -> Path | None:
        """Record the divergence of a fuzzer's result, if it has one."""
        if result.divergence is None or result.scenario is None:
            return None
        self.latest = result
        return self.write(result.scenario, result.divergence, seed=result.seed, profile=result.profile,
                          settings=result.settings)


def _engine_switches(subject: str) -> dict[str, bool] | None:
    """The SGLang switches a run of ``subject`` set against their defaults, which its replay
    file must record to replay it."""
    if not subject.startswith("sglang:"):
        return None
    from ..subjects.sglang import switch_overrides

    return switch_overrides() or None


def _sglang_tree(subject: str) -> dict | None:
    """The SGLang tree a run of ``subject`` binds, which its replay file must record to be
    replayed as printed (a release's wheel is named by the subject itself)."""
    if not subject.startswith("sglang:"):
        return None
    from ..subjects.sglang import tree_record

    return tree_record(subject)


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
    except Exception:
        # an interrupt landing inside library code can surface as another exception (a
        # Hypothesis strategy interrupted mid-draw reports itself as flaky): the run was
        # stopped, it did not fail
        if watch.interrupted:
            return partial(last[0].examples if last else 0, time.monotonic() - started)
        raise
    finally:
        watch.disarm()


def run_job(info: SubjectInfo, job: FuzzJob, watch: InterruptWatch, on_progress: Callable[[Progress], None],
            on_replay: Callable[[FuzzResult, Path], None]) -> tuple[FuzzResult, Path | None]:
    """Fuzz once in this process, writing each divergence's replay file as it is reported."""
    log = DivergenceLog.of(job)

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
            budget_s=job.budget_s, started_at=job.started_at, seed=job.seed, seed_stride=job.seed_stride,
            device=job.device, database_dir=job.database_dir, local_database_dir=job.local_database_dir,
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
        base, examples=sum(r.examples for r in results), checks=sum(r.checks for r in results),
        coverage=dict(coverage),
        elapsed_s=max(r.elapsed_s for r in results), interrupted=False,
    )


_worker_queue: Any = None
PARENT_WATCH_S = 0.5
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _init_worker(queue: Any, parent: int, environment: dict[str, str]) -> None:
    global _worker_queue
    _worker_queue = queue
    take_environment(environment)
    # a Ctrl-C reaches every process of the terminal's group: a worker that dies between
    # jobs breaks the whole pool, so it only listens while it fuzzes (see _worker); one
    # that came while it started (blocked since, see WorkerPool.run) is dropped here
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with(parent)
    torch.set_num_threads(CAMPAIGN_TORCH_THREADS)  # the process is the worker's alone


def _die_with(campaign: int) -> None:
    """End this worker when ``campaign`` ends, however it ends (SIGKILL included).

    The worker's parent is the fork server (:mod:`swafuzz.search.workers`), which ends with the
    campaign, or the campaign itself. Linux delivers SIGKILL on the parent's death once asked
    with prctl; elsewhere, and should the parent have died before the request, a thread
    polls for both.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl here: the thread below suffices
    parent = os.getppid()

    def alive() -> bool:
        if os.getppid() != parent:
            return False
        try:
            os.kill(campaign, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch() -> None:
        while alive():
            time.sleep(PARENT_WATCH_S)
        os._exit(EXIT_INTERNAL)

    if not alive():
        os._exit(EXIT_INTERNAL)
    threading.Thread(target=watch, name="swafuzz-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _signals_held(*signums: int) -> Iterator[None]:
    """Hold ``signums`` back in this thread for the block; one sent meanwhile lands after it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(signums))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _worker(index: int, job: FuzzJob, scenario_file: Path) -> tuple[FuzzResult, str | None]:
    # the scenario it runs, for its campaign to replay should the subject end this process
    keep_scenarios_in(scenario_file)
    with InterruptWatch() as watch, stdout_to_stderr():
        # The first put starts the queue's feeder thread and registers its exit hooks, the
        # join and then the close; an interrupt raised between the two would leave this
        # process's exit joining a thread that is never told to stop. The campaign learns
        # this pid from the message, so a SIGINT held back here still lands right after.
        with _signals_held(signal.SIGINT, signal.SIGTERM):
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

    The budget counts from the pool's start, for every worker: their start-ups are spent
    from it, so the campaign ends within a subject call of its budget, plus the workers'
    shutdown. Workers are forked from a server that has imported swafuzz
    (:mod:`swafuzz.search.workers`), so a start-up is the subject's own, not an interpreter's.
    """

    def __init__(self, info: SubjectInfo, jobs: list[FuzzJob], line: ProgressLine, watch: InterruptWatch):
        self.info = info  # resolved once, by the campaign; each worker resolves its own
        self.started = time.monotonic()
        self.jobs = [replace(job, started_at=self.started) for job in jobs]
        self.line = line
        self.watch = watch
        self.pids: dict[int, int] = {}
        self.progress: dict[int, Progress] = {}
        self.replay_files: dict[int, Path] = {}
        self.winner: int | None = None
        self.spared: int | None = None  # the worker left to finish shrinking its divergence
        self.stopping = False
        self.examples_per_worker: list[int] = []
        self.scenario_files: list[Path] = []  # where each worker keeps what it runs
        self.lost = False  # a worker ended without its result, and nobody had stopped it

    def run(self) -> tuple[FuzzResult, Path | None]:
        context = worker_context()
        queue = context.Queue()
        outcomes: dict[int, FuzzResult] = {}
        with tempfile.TemporaryDirectory(prefix="swafuzz-workers-") as scenarios:
            self.scenario_files = [Path(scenarios) / f"worker-{i}.scenario" for i in range(len(self.jobs))]
            with ProcessPoolExecutor(len(self.jobs), mp_context=context, initializer=_init_worker,
                                     initargs=(queue, os.getpid(), environment_for_workers())) as pool:
                # workers inherit a blocked SIGINT, so that a Ctrl-C to the whole process group
                # while they import cannot end one with a traceback (_init_worker unblocks it)
                with _signals_held(signal.SIGINT):
                    futures = {pool.submit(_worker, i, job, self.scenario_files[i]): i
                               for i, job in enumerate(self.jobs)}
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
            # its replay file, if any, speaks for it; a pool broken while nobody stopped it
            # lost a worker to its subject
            self.lost = self.lost or not (self.stopping or self.watch.interrupted)
            return
        outcomes[index] = result
        if path:
            self.replay_files[index] = Path(path)
        if result.divergence is not None and self.winner is None:
            self.winner = index

    def _merge(self, outcomes: dict[int, FuzzResult]) -> tuple[FuzzResult, Path | None]:
        winner = outcomes.get(self.winner) if self.winner is not None else None
        if self.winner is not None and (winner is None or winner.divergence is None):
            winner = self._from_replay_file(self.winner)
        if winner is None and self.lost:
            winner = self._lost_worker()
        results = list(outcomes.values()) or [self._from_progress()]
        merged = merge_results(results + ([winner] if winner and winner not in results else []), winner)
        self.examples_per_worker = [self._examples_run(index, outcomes) for index in range(len(self.jobs))]
        merged.examples = sum(self.examples_per_worker)
        merged.interrupted = self.watch.interrupted
        merged.elapsed_s = time.monotonic() - self.started  # the wall time, process start-ups included
        return merged, self.replay_files.get(self.winner) if winner else None

    def _lost_worker(self) -> FuzzResult:
        """A worker ended without its result while nobody stopped it: its subject ended it.

        Each worker's last scenario runs again here, in the campaign's own process, which the
        supervisor watches as it watches a run without workers: a scenario that ends this
        process too is reported by it, one that diverges otherwise is that divergence, and
        if none does the lost worker is the divergence, with the first worker's scenario."""
        job = self.jobs[0]
        subject = self.info.subject
        ran = {index: scenario for index, path in enumerate(self.scenario_files)
               if (scenario := last_scenario(path)) is not None}
        found = None
        for index, scenario in ran.items():
            outcome = run_scenario(subject, scenario, device=job.device)
            if outcome.divergence is not None:
                found = index, scenario, outcome.divergence
                break
        if found is None:
            index, scenario = next(iter(ran.items()), (0, None))
            found = index, scenario, lost_run_divergence(
                EXITED, "A worker process running the subject ended without its result", scenario is not None)
        index, scenario, divergence = found
        result = FuzzResult(subject=job.subject, profile=job.profile, settings=job.settings, examples=0,
                            elapsed_s=time.monotonic() - self.started, divergence=divergence, scenario=scenario,
                            seed=job.seed, replays=False)
        if scenario is not None:
            path = DivergenceLog.of(replace(job, run=f"{job.run}-lost")).record(result)
            if path is not None:
                self.replay_files[index] = path
        self.winner = index
        return result

    def _examples_run(self, index: int, outcomes: dict[int, FuzzResult]) -> int:
        """What worker ``index`` ran: its result's count, else (it died) its last progress's."""
        if index in outcomes:
            return outcomes[index].examples
        return self.progress[index].examples if index in self.progress else 0

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


# ---- the campaign --------------------------------------------------------------------------


@dataclass
class Finished:
    """A campaign's end: its result, the report written from it, and the exit code it earns."""

    result: FuzzResult
    report: Report
    written: dict[str, Path]  # the report files, by format
    exit_code: int
    unwritten: list[str] = field(default_factory=list)  # files that could not be written, and why


@dataclass
class Campaign:
    """One fuzz, gate or exhaustive run of one subject, its outputs in ``report_dir``."""

    command: str
    subject: str
    info: SubjectInfo
    device: str
    report_dir: Path
    database_dir: str  # a directory or a Redis URL
    as_json: bool = False

    @classmethod
    def open(cls, command: str, subject: str, device: str, report_dir: Path, database: str | None = None,
             as_json: bool = False) -> "Campaign":
        """Resolve the subject, make the report directory and open the example database
        (``database``, else ``$SWAFUZZ_DATABASE``, else ``.hypothesis-db`` inside
        ``report_dir``); bad input raises InputError naming where the database came from."""
        info = resolve_subject(subject)
        report_dir = _prepare_report_dir(report_dir)
        origin = "--database" if database else f"${fuzz_engine.DATABASE_ENV}"
        database = database or os.environ.get(fuzz_engine.DATABASE_ENV) or None
        if database is not None and not is_redis_url(database):
            writable_directory(Path(database), origin)
        database = database or str(report_dir / ".hypothesis-db")
        try:
            open_database(database, report_dir / ".hypothesis-db")
        except DatabaseError as exc:
            raise InputError(f"{origin} {exc}") from None
        return cls(command, subject, info, device, report_dir, database, as_json)

    def job(self, profile: str, settings: str | None = None, seed: int | None = None,
            budget_s: float | None = None, max_examples: int | None = None, threads: bool = False,
            stream_delay_cycles: int = 0, sanitize_streams: bool = False, long_horizon: bool = False,
            shard: Shard | None = None) -> FuzzJob:
        """The job of a fuzz run; a deterministic settings profile or a shard seeds it with 0
        unless ``seed`` says otherwise."""
        try:
            chosen = fuzz_engine.settings_profile(settings)
        except ValueError as exc:  # only $SWAFUZZ_SETTINGS can name an unknown one here
            raise InputError(f"${fuzz_engine.SETTINGS_ENV}: {exc}") from None
        seed = 0 if seed is None and (chosen.deterministic or shard is not None) else seed
        run = f"seed{seed}" if seed is not None else datetime.now().strftime("%Y%m%d-%H%M%S")
        return FuzzJob(
            subject=self.subject, profile=profile, settings=chosen.name, seed=seed, run=run,
            device=self.device, replay_dir=str(self.report_dir / "replays"),
            database_dir=str(self.database_dir), budget_s=budget_s, max_examples=max_examples,
            threads=threads, stream_delay_cycles=stream_delay_cycles, sanitize_streams=sanitize_streams,
            long_horizon=True if long_horizon else None,
            local_database_dir=str(self.report_dir / ".hypothesis-db"),
            shard=str(shard) if shard else None,
        )

    def progress_line(self) -> ProgressLine:
        return ProgressLine(sys.stderr, enabled=not self.as_json)

    def fuzz(self, base: FuzzJob, workers: int = 1, shard: Shard | None = None) -> Finished:
        """Fuzz ``base`` in this process, or in ``workers`` processes that split its
        examples and draw from ``shard``'s seeds (default: all of them), then write the reports."""
        line = self.progress_line()
        lanes = shard or WHOLE
        examples_per_worker = None
        with writing_reports_in(self.report_dir), InterruptWatch(raise_first=workers == 1) as watch:
            try:
                with stdout_to_stderr(self.as_json), campaign_torch_threads():
                    if workers == 1:
                        result, path = run_job(
                            self.info, _in_lane(base, seed_lane(lanes)), watch, on_progress=line.update,
                            on_replay=lambda found, p: line.note(
                                f"divergence: {found.divergence.sentence}\n  replay file: {p}"),
                        )
                    else:
                        per_worker = -(-base.max_examples // workers) if base.max_examples else None
                        jobs = [_worker_job(base, i, per_worker, seed_lane(lanes, i, workers))
                                for i in range(workers)]
                        pool = WorkerPool(self.info, jobs, line, watch)
                        result, path = pool.run()
                        examples_per_worker = pool.examples_per_worker
            finally:
                line.close()
            return self.finish(result, path, watch, budget_s=base.budget_s, workers=workers, shard=base.shard,
                               examples_per_worker=examples_per_worker)

    def exhaustive(self, profile: str, max_forwards: int, max_layers: int, max_micro_batches: int) -> Finished:
        """Run every scenario of ``profile`` within the bounds, then write the reports."""
        job = FuzzJob(subject=self.subject, profile=profile, settings="exhaustive", seed=None,
                      run="exhaustive", device=self.device, replay_dir=str(self.report_dir / "replays"),
                      database_dir=str(self.database_dir))
        line = self.progress_line()
        with writing_reports_in(self.report_dir), InterruptWatch() as watch:
            try:
                with stdout_to_stderr(self.as_json), campaign_torch_threads():
                    result = run_until_interrupted(
                        lambda progress: fuzz_engine.exhaustive(
                            self.info, max_forwards=max_forwards, max_layers=max_layers,
                            max_micro_batches=max_micro_batches, profile=profile, device=self.device,
                            on_progress=progress,
                        ),
                        lambda examples, elapsed_s: FuzzResult(
                            self.info.name, job.profile, job.settings, examples=examples,
                            elapsed_s=elapsed_s, interrupted=True),
                        line.update, watch,
                    )
            finally:
                line.close()
            log = DivergenceLog.of(job)
            log.record(result)
            return self.finish(result, log.path, watch)

    def finish(self, result: FuzzResult, replay_path: Path | None, watch: InterruptWatch,
               budget_s: float | None = None, workers: int = 1, shard: str | None = None,
               examples_per_worker: list[int] | None = None) -> Finished:
        """Write the reports of ``result``: 1 when it diverged, else the watch's code when a
        signal cut the run short, else 0. A file that cannot be written (a full disk) is named
        in ``unwritten``; the finding is still returned whole, to be printed."""
        interrupted = result.interrupted  # a signal after the run ended cut nothing short
        unwritten = []
        if result.divergence is not None and not _holds_a_replay(replay_path):
            unwritten.append(f"{describe_path(replay_path or self.report_dir / 'replays')}: the replay file "
                             "could not be written")
            replay_path = None
        report = Report(
            command=self.command, subject=self.subject, subject_info=self.info.to_dict(),
            profile=result.profile, settings=result.settings, seed=result.seed, device=self.device,
            examples=result.examples, elapsed_s=result.elapsed_s, budget_s=budget_s, workers=workers,
            examples_per_worker=examples_per_worker,
            coverage=dict(result.coverage), divergence=result.divergence, scenario=result.scenario,
            weakest_profile=result.weakest_profile,
            replay_file=str(replay_path) if replay_path and result.divergence else None,
            complete=not interrupted, interrupted_by=watch.signal_name if interrupted else None,
            replays=result.replays, replays_run=result.replays_run, replays_diverged=result.replays_diverged,
            shrink_complete=result.shrink_complete,
            scope=result.scope.to_dict() if result.scope is not None else None,
            shard=shard, examples_to_divergence=result.examples_to_divergence,
            first_divergence_s=result.first_divergence_s,
        )
        try:
            written = write_reports(report, self.report_dir)
        except OSError as exc:
            written = {}
            unwritten.append(f"{describe_path(self.report_dir)}: the reports could not be written: "
                             f"{exc.strerror or exc}")
        if report.divergence is not None:
            code = EXIT_DIVERGENCE
        else:
            code = watch.exit_code if interrupted else EXIT_OK
        return Finished(result, report, written, code, unwritten)


def _holds_a_replay(path: Path | None) -> bool:
    try:
        return path is not None and path.stat().st_size > 0
    except OSError:
        return False


REPORT_DIR_LOCK = ".swafuzz-run"


@contextlib.contextmanager
def writing_reports_in(directory: Path) -> Iterator[None]:
    """This run alone writes reports in ``directory`` while it lasts: a second run started
    into it meanwhile is refused (InputError) rather than mixing its reports with this one's.

    The lock is the file :data:`REPORT_DIR_LOCK`, which goes when the run ends, however it
    ends; one left by a process that was killed holds no lock and is taken over (the
    supervisor removes it once it has reported the lost run)."""
    path = directory / REPORT_DIR_LOCK
    handle = _lock_report_dir(path)
    try:
        os.ftruncate(handle, 0)
        os.pwrite(handle, str(os.getpid()).encode(), 0)
        yield
    finally:
        # removed while still locked, and only while the path is still this lock's file: a
        # run that opened it meanwhile finds it gone once it has the lock, and takes the
        # file at the path instead (see _lock_report_dir)
        with contextlib.suppress(OSError):
            if _is_the_file_at(path, handle):
                os.unlink(path)
        os.close(handle)  # and with it the lock


def _lock_report_dir(path: Path) -> int:
    """A descriptor of the lock file at ``path``, locked by this process."""
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(handle, 32).decode(errors="replace").strip() or "?"
            os.close(handle)
            raise InputError(f"--report-dir {describe_path(path.parent)}: another swafuzz run (process {holder}) "
                             "is writing its reports there; give this one another --report-dir") from None
        except BaseException:
            os.close(handle)
            raise
        if _is_the_file_at(path, handle):
            return handle
        os.close(handle)  # its run ended and removed it between the open and the lock


def _is_the_file_at(path: Path, handle: int) -> bool:
    try:
        there, held = os.stat(path), os.fstat(handle)
    except FileNotFoundError:
        return False
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def earlier_reports(directory: Path) -> str | None:
    """What the reports already in ``directory`` are of, when there are any: a run writing
    there replaces them, and says so before it starts."""
    found = directory / REPORT_FILES["json"]
    if not found.is_file():
        return None
    try:
        earlier = parse_json(read_regular_file(found, "report"), str(found))
        return (f"{printable(str(earlier['command']))} of {printable(str(earlier['subject']))}, "
                f"finished {printable(str(earlier['finished_at']))}")
    except (InputError, KeyError, TypeError):
        return "a run whose report.json cannot be read"


def earlier_replay_files(directory: Path) -> int:
    """How many replay files earlier runs left in ``directory``'s replays folder. A run writing
    there keeps them all, whatever it replaces: each is a finding, which only a person may
    delete; where one has the name of this run's own, this run's is numbered (``-2.json``)."""
    try:
        return sum(1 for path in (directory / "replays").glob("*.json") if path.is_file())
    except OSError:
        return 0


def _prepare_report_dir(directory: Path) -> Path:
    try:
        (directory / "replays").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--report-dir {directory}: cannot create it: {exc}") from None
    if not os.access(directory, os.W_OK):
        raise InputError(f"--report-dir {directory}: not writable")
    return directory


def _worker_job(base: FuzzJob, index: int, max_examples: int | None, lane: SeedLane) -> FuzzJob:
    if base.seed is None:
        return replace(base, run=f"{base.run}-w{index}", max_examples=max_examples)
    return replace(_in_lane(base, lane), max_examples=max_examples)


def _in_lane(job: FuzzJob, lane: SeedLane) -> FuzzJob:
    if job.seed is None:
        return job
    seed = job.seed + lane.offset
    return replace(job, seed=seed, seed_stride=lane.stride, run=f"seed{seed}")


