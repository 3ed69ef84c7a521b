"""The ``swafuzz`` command line (also ``python -m swafuzz``).

Exit codes, for every subcommand:

- 0: no divergence
- 1: a divergence was found (or a replayed one is still there); for ``mutate``, also a
  mutant that survived its search and is not listed as equivalent
- 2: usage or input error: bad option, unknown subject, malformed replay file, no such device
- 130 / 143: interrupted by SIGINT / SIGTERM before any divergence was found
- 3: swafuzz itself failed (a bug in the harness, with its traceback)
- 125: for ``replay``, the SGLang tree given with ``--sglang-source`` does not bind the
  recorded target: ``git bisect run swafuzz replay FILE --sglang-source .`` skips that commit

Once a divergence is recorded the code is 1, whatever signal follows; a closed stdout ends
the command quietly with its own code (see :mod:`swafuzz.entry`).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Callable

# Nothing heavy here: --help, a usage error and 'subjects' answer without torch or Hypothesis;
# a command's own module (swafuzz.commands) is imported once the command line is understood.
from . import __version__
from .names import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, GATE_BUDGET_S, MUTANT_BUDGET_S, SETTINGS_NAMES
from .search.shard import Shard
from .strategies.features import ALL_FEATURES
from .strategies.profiles import PROFILES
from .errors import UsageError, exit_code_of

# the operators of swafuzz.tools.mutate, named here so that --help answers without torch
MUTATION_OPERATORS = ("negate-guard", "drop-guard", "layer-bound", "drop-key-element", "drop-reset",
                      "ring-window", "off-by-one", "copy-prefix", "assign-instead-of-copy", "swap-arguments")


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
                             "SGLANG_PREP_IN_CUDA_GRAPH=0 (repeatable; docs/sglang.md lists the switches; "
                             "default: $SWAFUZZ_SGLANG_SWITCHES, else each release's defaults)")
    parser.add_argument("--sglang-attr", action="append", default=[], metavar="NAME=VALUE",
                        help="a value (a Python literal) for a name the bound SGLang code reads that "
                             "swafuzz cannot derive from the tree or the engine model: self.NAME of a "
                             "stand-in, or a global (repeatable; a binding that lacks one names it and why)")


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
    fuzz.add_argument("--settings", choices=sorted(SETTINGS_NAMES),
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
    fuzz.set_defaults(handler='fuzz')

    gate = commands.add_parser(
        "gate", help="merge-gate preset: fuzz with CI settings and write JUnit and Markdown",
        description=f"The merge gate: the realistic profile under the 'ci' settings for "
                    f"{GATE_BUDGET_S:g} s (or --budget), every report written, the Markdown summary "
                    "printed for a pull-request comment. With --sglang-source HEAD --sglang-base BASE, "
                    "the pull-request gate: every SGLang target HEAD has, on HEAD and on BASE, one "
                    "verdict per target.")
    _add_subject(gate, required=False)
    gate.add_argument("--sglang-base", metavar="VERSION|PATH",
                      help="gate a pull request: the release (e.g. 0.5.23) or checkout that the "
                           "--sglang-source tree is based on; every target runs --budget seconds "
                           "(default 20) on each tree, and only a divergence HEAD brings fails")
    _add_run_options(gate)
    _add_device(gate)
    _add_stream_options(gate)
    _add_outputs(gate)
    gate.set_defaults(handler='gate', budget=None)

    replay = commands.add_parser("replay", help="re-run a replay file",
                                 description="Re-run a recorded divergence: exit 1 while it is there, 0 once fixed.")
    replay.add_argument("file", type=Path, metavar="FILE", help="a replay file written by fuzz, gate or exhaustive")
    _add_subject(replay, required=False)
    replay.set_defaults(subject=None)
    replay.add_argument("--emit-pytest", type=Path, metavar="PATH",
                        help="also write a standalone pytest regression test (no Hypothesis) to PATH")
    _add_device(replay, default=None)
    replay.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    replay.set_defaults(handler='replay')

    subjects = commands.add_parser("subjects", help="list the subjects (built-in, and real SGLang targets when SGLang is found)")
    subjects.add_argument("--json", action="store_true", help="print a JSON list of subjects on stdout")
    _add_sglang_options(subjects)
    subjects.set_defaults(handler='subjects')

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
    exhaustive.set_defaults(handler='exhaustive')

    merge = commands.add_parser(
        "merge-reports", help="combine the reports of a sharded campaign into one",
        description="Combine the report.json of each DIR (the --report-dir of each shard or run) "
                    "into one summary.md, junit.xml, report.html and report.json. Exits 1 when any "
                    "run found a divergence.")
    merge.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a report directory, or a report.json")
    merge.add_argument("--report-dir", type=Path, default=Path("reports") / "merged", metavar="DIR",
                       help="where the merged reports go (default: reports/merged)")
    merge.set_defaults(handler='merge_reports')

    mutate = commands.add_parser(
        "mutate", help="measure the search: fuzz mutants of a correct subject",
        description="Derive mutants from the subject's Python source (one operator applied at one "
                    "place each; for sglang:<target>, the SGLang functions it binds, each mutant the tree "
                    "with one edit), fuzz the unmutated subject and then each mutant, and report how "
                    "many the search killed and how fast. Exits 0 when the unmutated subject passes and "
                    "every mutant is killed, listed as equivalent, or never read (its edit changes only "
                    "values nothing reads), 1 otherwise.")
    _add_subject(mutate)
    mutate.add_argument("--budget", type=_seconds, default=MUTANT_BUDGET_S, metavar="SECONDS",
                        help=f"search time per mutant, shared evenly by the profiles in their order "
                             f"(default: {MUTANT_BUDGET_S:g})")
    mutate.add_argument("--max-examples", type=_positive_int, metavar="N",
                        help="at most N scenarios per mutant, shared by the profiles as the budget is; each "
                             "search stops at whichever bound comes first, so a seed gives the same figures "
                             "on any machine where the budget does not bind (default: the budget alone)")
    mutate.add_argument("--profile", action="append", choices=PROFILES, metavar="NAME",
                        help="a profile each search runs (repeatable, in order; default: realistic, then "
                             "adversarial)")
    mutate.add_argument("--exclude", action="append", choices=ALL_FEATURES, metavar="FEATURE",
                        help="a lifecycle feature no search draws, where the subject is not meant to be "
                             f"right (repeatable; one of {', '.join(ALL_FEATURES)})")
    mutate.add_argument("--seed", type=_seed, default=0, metavar="N", help="random seed (default: 0)")
    mutate.add_argument("--equivalent", type=Path, metavar="FILE",
                        help="a reviewed JSON object of mutant id to the reason it is equivalent: those "
                             "survivors are left out of the kill rate (default: the reviewed list of the built-in "
                             "subjects and SGLang targets)")
    mutate.add_argument("--operator", action="append", choices=MUTATION_OPERATORS, metavar="NAME",
                        help=f"only this operator (repeatable; default: all of {', '.join(MUTATION_OPERATORS)})")
    _add_device(mutate)
    mutate.add_argument("--report-dir", type=Path, default=Path("reports") / "mutants", metavar="DIR",
                        help="where mutants.md and mutants.json go (default: reports/mutants)")
    mutate.add_argument("--json", action="store_true", help="print one JSON object on stdout and no progress")
    mutate.set_defaults(handler='mutate')

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
        if args.handler == "subjects":
            return _cmd_subjects(args)
        if getattr(args, "subject", None):
            from .subjects.registry import unknown_subject

            unknown = unknown_subject(args.subject)
            if unknown is not None:
                raise UsageError(unknown)
        from . import commands

        commands.apply_sglang_options(args)
        return getattr(commands, args.handler)(args)
    except Exception as exc:  # noqa: BLE001 - a harness bug: say so, never pass it off as a divergence
        if exit_code_of(exc) == EXIT_USAGE:
            # a message that lists several pieces (a binding's gaps) keeps one line each
            first, *more = str(exc).splitlines() or [""]
            print(f"swafuzz {args.command}: error: {first}", file=sys.stderr)
            for line in more:
                print(f"  {line.strip()}", file=sys.stderr)
            return EXIT_USAGE
        print(f"swafuzz {args.command}: internal error (a bug in swafuzz):\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_INTERNAL


# what ``swafuzz subjects`` prints of each of its --json rows (swafuzz.subjects.registry.listing): the
# short fields as columns, then each long one on a line of its own below the row
SUBJECT_COLUMNS = (("NAME", "name"), ("KIND", "kind"), ("TRUTH", "truth"), ("EXPECTED", "expected"),
                   ("REQUIRES", "requires"), ("DIVERGES ON", "diverges_on"))
SUBJECT_LINES = (("design", "summary"), ("reached", "reached"), ("not checked", "not_checked"))


def _cmd_subjects(args: argparse.Namespace) -> int:
    if args.sglang_source or args.sglang_mode or args.sglang_switch or args.sglang_attr:
        from . import commands  # SGLang is asked for: binding it takes the heavy modules anyway

        commands.apply_sglang_options(args)
    from .subjects.registry import subject_listing

    rows = subject_listing()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return EXIT_OK
    cells = [[", ".join(value) if isinstance(value, list) else str(value) for value in
              (row[key] for _, key in SUBJECT_COLUMNS)] for row in rows]
    cells = [[text or "-" for text in line] for line in cells]
    widths = [max(len(heading), *(len(line[i]) for line in cells))
              for i, (heading, _) in enumerate(SUBJECT_COLUMNS)]

    def aligned(texts: list[str]) -> str:
        return "  ".join(text.ljust(width) for text, width in zip(texts, widths)).rstrip()

    print(aligned([heading for heading, _ in SUBJECT_COLUMNS]))
    for row, line in zip(rows, cells):
        print(aligned(line))
        for label, key in SUBJECT_LINES:
            value = row.get(key)  # "reached": an SGLang target's call sites, said in a sentence
            for said in value if isinstance(value, list) else [value] if value else []:
                print(f"  {label}: {said['sentence'] if isinstance(said, dict) else said}")
    print("\nA user subject is given as module:attr (a Subject class or a SubjectInfo).")
    return EXIT_OK


def _cmd_bench(argv: list[str]) -> int:
    try:
        from .tools import bench
    except ImportError as exc:
        print(f"swafuzz bench: error: the benchmark runner is not available: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return bench.main(argv)
