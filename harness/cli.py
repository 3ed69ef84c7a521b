"""The ``swafuzz`` command line (also ``python -m harness``).

Exit codes, for every subcommand:

- 0: no divergence
- 1: a divergence was found (or a replayed one is still there)
- 2: usage or input error: bad option, unknown subject, malformed replay file, no such device
- 130 / 143: interrupted by SIGINT / SIGTERM before any divergence was found
- 3: swafuzz itself failed (a bug in the harness, with its traceback)

Once a divergence is recorded the code is 1, whatever signal follows; a closed stdout ends
the command quietly with its own code (see :mod:`harness.entry`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from reference import ScenarioError

from . import __version__
from .boundary import InputError, describe_path, printable, writable_file
from .campaign import EXIT_DIVERGENCE, EXIT_INTERNAL, EXIT_OK, Campaign, Finished, stdout_to_stderr
from .entry import entry  # noqa: F401 - the console script of installs made before harness.entry
from .executor import SubjectError
from .merge import ReportError, merge_reports
from .fuzz import PROFILES, SETTINGS_PROFILES
from .registry import all_subjects, resolve_subject
from .replay import Replay, ReplayError, emit_pytest, load_replay, recorded_subject, run_replay, same_divergence
from .reports import REPORT_FILES, Report
from .shard import Shard

EXIT_USAGE = 2  # the other exit codes are a campaign's (harness.campaign)

GATE_BUDGET_S = 120.0


class UsageError(Exception):
    """Bad input from the person or script running swafuzz (exit code 2)."""


# ---- parsing -------------------------------------------------------------------------------


MAX_OPTION_DIGITS = 19
MAX_SEED = 2**63 - 1  # a replay file records it, and files hold 64-bit integers
MAX_WORKERS = 256  # each is a process of a few hundred megabytes
MAX_STREAM_DELAY = 10**10  # clock cycles: seconds of GPU sleep per metadata init


def _whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if len(text.strip().lstrip("+-")) > MAX_OPTION_DIGITS:
            raise argparse.ArgumentTypeError(f"more than {MAX_OPTION_DIGITS} digits")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


_positive_int = _whole_number(1)
_seed = _whole_number(0, MAX_SEED)


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
    parser.add_argument("--sglang-switch", action="append", default=[], metavar="NAME=0|1",
                        help="set an SGLang engine switch against the release's default, e.g. "
                             "SGLANG_PREP_IN_CUDA_GRAPH=0 (repeatable; the README lists the switches; "
                             "default: $SWAFUZZ_SGLANG_SWITCHES, else each release's defaults)")


def _apply_sglang_options(args: argparse.Namespace) -> None:
    # through the environment, so that worker processes bind the same code
    from .sglang import MODE_ENV, SOURCE_ENV, SWITCHES_ENV, switch_overrides

    for value, name in ((getattr(args, "sglang_source", None), SOURCE_ENV),
                        (getattr(args, "sglang_mode", None), MODE_ENV)):
        if value:
            os.environ[name] = str(value)
    switches = getattr(args, "sglang_switch", None)
    if switches:
        subject = getattr(args, "subject", None)
        if subject and not subject.startswith("sglang:"):
            raise UsageError(f"--sglang-switch sets SGLang's engine switches; {subject!r} is not an "
                             "sglang:<target> subject")
        joined = ",".join(switches)
        switch_overrides(joined)  # read as the workers will read it; a bad one is refused here
        os.environ[SWITCHES_ENV] = joined


def _add_device(parser: argparse.ArgumentParser, default: str | None = "cpu") -> None:
    parser.add_argument("--device", default=default, metavar="cpu|cuda",
                        help="where the subject's tensors live" + (f" (default: {default})" if default else ""))


def _add_stream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stream-delay", type=_whole_number(1, MAX_STREAM_DELAY), default=0, metavar="CYCLES",
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
        "--workers", type=_whole_number(1, MAX_WORKERS), default=1, metavar="N",
        help="fuzz in N processes (one torch thread each), each with 1/N of --max-examples; "
             "the budget counts from the campaign's start for all of them, their start-up "
             "(seconds) included; seeded, each draws its own seed stream from SEED, so none "
             "repeats another's examples; the first divergence stops the others",
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
    except (UsageError, SubjectError, InputError) as exc:
        message = " ".join(str(exc).splitlines())
        print(f"swafuzz {args.command}: error: {message}", file=sys.stderr)
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


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2))


# ---- fuzz, gate, exhaustive ----------------------------------------------------------------


def _campaign(args: argparse.Namespace) -> Campaign:
    device = check_device(args.device)
    for flag, used in (("--stream-delay", getattr(args, "stream_delay", 0)),
                       ("--sanitize-streams", getattr(args, "sanitize_streams", False))):
        if used and not device.startswith("cuda"):
            raise UsageError(f"{flag} works on GPU streams: it needs --device cuda")
    return Campaign.open(args.command, args.subject, device, args.report_dir, args.database, args.json)


def _print_finished(campaign: Campaign, finished: Finished, print_markdown: bool = False) -> int:
    report, written = finished.report, finished.written
    if campaign.as_json:
        _print_json({**report.to_dict(), "reports": {fmt: str(path) for fmt, path in written.items()}})
    elif print_markdown:
        print(written["markdown"].read_text(encoding="utf-8"))
    else:
        _print_summary(report, written)
    return finished.exit_code


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
    campaign = _campaign(args)
    job = campaign.job(
        profile, settings, seed=args.seed, budget_s=args.budget, max_examples=args.max_examples,
        threads=getattr(args, "threads", False), stream_delay_cycles=getattr(args, "stream_delay", 0),
        sanitize_streams=getattr(args, "sanitize_streams", False),
        long_horizon=getattr(args, "long_horizon", False), shard=getattr(args, "shard", None),
    )
    finished = campaign.fuzz(job, workers=args.workers, shard=getattr(args, "shard", None))
    return _print_finished(campaign, finished, print_markdown)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    return _fuzz(args, settings=args.settings, profile=args.profile)


def _cmd_gate(args: argparse.Namespace) -> int:
    if args.budget is None:
        args.budget = GATE_BUDGET_S
    return _fuzz(args, settings="ci", profile="realistic", print_markdown=not args.json)


def _cmd_exhaustive(args: argparse.Namespace) -> int:
    campaign = _campaign(args)
    finished = campaign.exhaustive(args.profile, max_forwards=args.max_forwards, max_layers=args.max_layers,
                                   max_micro_batches=args.max_micro_batches)
    code = _print_finished(campaign, finished)
    if code == EXIT_OK and not campaign.as_json and finished.result.scope is not None:
        for line in finished.result.scope.lines():
            print(f"  {line}")
    return code


# ---- replay, subjects, bench ---------------------------------------------------------------


def _cmd_replay(args: argparse.Namespace) -> int:
    recorded = load_replay(args.file)
    if args.emit_pytest is not None:
        writable_file(args.emit_pytest, "--emit-pytest", not_the_same_as=args.file)
    subject = args.subject or recorded.subject
    try:
        info = resolve_subject(args.subject) if args.subject else recorded_subject(recorded)
    except ReplayError as exc:
        raise ReplayError(f"{describe_path(args.file)}: {exc}") from None
    device = check_device(args.device or recorded.device)
    started = time.monotonic()
    try:
        with stdout_to_stderr(args.json):
            run = run_replay(recorded, subject=args.subject, device=device)
    except ScenarioError as exc:
        raise ReplayError(f"{describe_path(args.file)}: the recorded scenario cannot run: {exc}") from None
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
        print(f"  recorded: {printable(recorded.divergence.sentence)}")
    elif reproduced:
        print(f"swafuzz replay: divergence still there in {subject}")
        print(f"  {found.sentence}")
    else:
        print(f"swafuzz replay: {subject} still diverges on {args.file}, but differently")
        print(f"  now:      {found.sentence}")
        print(f"  recorded: {printable(recorded.divergence.sentence)}")
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
