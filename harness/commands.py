"""The commands of the ``swafuzz`` command line, once it has parsed their options
(:mod:`swafuzz.cli` parses them without importing anything heavy)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .reference import ScenarioError
from .strategies.features import ALL_FEATURES

from .run.boundary import describe_path, printable, writable_directory, writable_file
from .search.campaign import Campaign, Finished, earlier_replay_files, earlier_reports, stdout_to_stderr
from .errors import BindError, ImportModeUnavailable, UsageError
from .names import GATE_BUDGET_S
from .results import merge
from .results.merge import ReportError
from .names import EXIT_DIVERGENCE, EXIT_OK, EXIT_UNTESTABLE, SGLANG_SOURCE_ENV
from .subjects.registry import resolve_subject
from .results.replay import Replay, ReplayError, emit_pytest, load_replay, recorded_subject, run_replay, same_divergence
from .results.reports import REPORT_FILES, Report

def apply_sglang_options(args: argparse.Namespace) -> None:
    # through the environment, so that worker processes bind the same code
    from .subjects.sglang import ATTRS_ENV, MODE_ENV, SOURCE_ENV, SWITCHES_ENV, attribute_values, switch_overrides

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
    attributes = getattr(args, "sglang_attr", None)
    if attributes:
        attribute_values(attributes)  # a bad one is refused here, before any worker starts
        os.environ[ATTRS_ENV] = json.dumps(attributes)


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
    note = _earlier_runs_note(args.report_dir)
    if note is not None:
        print(f"swafuzz {args.command}: note: {note}", file=sys.stderr)
    return Campaign.open(args.command, args.subject, device, args.report_dir, args.database, args.json)


def _earlier_runs_note(report_dir: Path) -> str | None:
    """What a run into ``report_dir`` does with what earlier runs left there: it replaces
    their reports and keeps their replay files, numbering its own where a name is taken."""
    earlier, replay_files = earlier_reports(report_dir), earlier_replay_files(report_dir)
    replays = describe_path(report_dir / "replays")
    numbering = "numbering its own where one has its name (...-2.json)"
    if earlier is not None:
        kept = f" and keeps the replay files in {replays}, {numbering}" if replay_files else ""
        return (f"{describe_path(report_dir)} holds the reports of an earlier run ({earlier}); this run replaces "
                f"them{kept} (give another --report-dir to keep both runs' reports)")
    if replay_files:
        return f"{replays} holds replay files of earlier runs; this run keeps them, {numbering}"
    return None


def _print_finished(campaign: Campaign, finished: Finished, print_markdown: bool = False) -> int:
    report, written = finished.report, finished.written
    if campaign.as_json:
        _print_json({**report.to_dict(), "reports": {fmt: str(path) for fmt, path in written.items()},
                     "unwritten": finished.unwritten})
    elif print_markdown and "markdown" in written:
        print(written["markdown"].read_text(encoding="utf-8"))
        _print_written(written)
    else:
        _print_summary(report, written)
    for problem in finished.unwritten:
        print(f"swafuzz {report.command}: could not write {problem}", file=sys.stderr)
    if finished.unwritten and report.scenario is not None and not campaign.as_json:
        # the finding lives only here now: its scenario, to save by hand and replay
        print("  scenario (no replay file holds it):")
        print(json.dumps(report.scenario.to_dict()))
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
        print(f"  {printable(report.divergence.sentence)}")  # what a subject says: escapes shown, not obeyed
        if report.replay_file:
            print(f"  replay file: {report.replay_file}")
            print(f"  reproduce:   {report.replay_command}")
        if report.flaky:
            print(f"  flaky: the shrunk scenario diverged in {report.replays_diverged} of {report.replays_run} "
                  "replays; the replay file may pass while the bug is there")
        if not report.shrink_complete:
            print("  the budget ran out while shrinking: the scenario is the smallest found so far")
    print(f"  features covered: {len(report.features_covered)} of {len(ALL_FEATURES)}")
    for key in ("reached", "statements"):
        if key in report.subject_info:
            print(f"  {key}: {report.subject_info[key]['sentence']}")
    for branch in report.subject_info.get("not_checked", ()):
        print(f"  not checked: {branch}")
    _print_written(written)


def _print_written(written: dict[str, Path]) -> None:
    if written:
        print(f"  reports: {', '.join(str(written[fmt]) for fmt in REPORT_FILES if fmt in written)}")


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


def fuzz(args: argparse.Namespace) -> int:
    return _fuzz(args, settings=args.settings, profile=args.profile)


def gate(args: argparse.Namespace) -> int:
    if args.sglang_base:
        if args.subject or not args.sglang_source:
            raise UsageError("--sglang-base gates every SGLang target of the --sglang-source tree: give "
                             "--sglang-source HEAD and no --subject")
        from .tools.pr_gate import main

        return main(args.sglang_source, args.sglang_base, args.report_dir, args.budget, args.seed, args.max_examples)
    if not args.subject:
        raise UsageError("gate needs --subject, or --sglang-source HEAD --sglang-base BASE")
    if args.budget is None:
        args.budget = GATE_BUDGET_S
    return _fuzz(args, settings="ci", profile="realistic", print_markdown=not args.json)


def exhaustive(args: argparse.Namespace) -> int:
    campaign = _campaign(args)
    finished = campaign.exhaustive(args.profile, max_forwards=args.max_forwards, max_layers=args.max_layers,
                                   max_micro_batches=args.max_micro_batches)
    code = _print_finished(campaign, finished)
    if code == EXIT_OK and not campaign.as_json and finished.result.scope is not None:
        for line in finished.result.scope.lines():
            print(f"  {line}")
    return code


# ---- replay, subjects, bench ---------------------------------------------------------------


def replay(args: argparse.Namespace) -> int:
    recorded = load_replay(args.file)
    if args.emit_pytest is not None:
        writable_file(args.emit_pytest, "--emit-pytest", not_the_same_as=args.file)
    subject = args.subject or recorded.subject
    try:
        info = resolve_subject(args.subject) if args.subject else recorded_subject(recorded)
    except ReplayError as exc:
        raise ReplayError(f"{describe_path(args.file)}: {exc}") from None
    except BindError as exc:
        if isinstance(exc, ImportModeUnavailable) or not os.environ.get(SGLANG_SOURCE_ENV):
            raise  # this machine, or the tree the file recorded: the person supplies what is missing
        first, *_ = str(exc).splitlines() or [""]
        print(f"swafuzz replay: cannot test this tree: {first}", file=sys.stderr)
        return EXIT_UNTESTABLE
    if recorded.sglang_tree is not None and not args.subject:
        from .subjects.sglang import tree_changes

        changed = tree_changes(recorded.subject, recorded.sglang_tree)
        if changed:
            print(f"swafuzz replay: note: {changed}", file=sys.stderr)
    device = check_device(args.device or recorded.device)
    started = time.monotonic()
    try:
        with stdout_to_stderr(args.json):
            run = run_replay(recorded, subject=info, device=device)
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


def merge_reports(args: argparse.Namespace) -> int:
    try:
        merged = merge.merge_reports(args.dirs, args.report_dir)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    print(merged.headline())
    print(f"  reports: {', '.join(str(path) for path in merged.written.values())}")
    return EXIT_DIVERGENCE if merged.diverged else EXIT_OK


# ---- mutate --------------------------------------------------------------------------------


def mutate(args: argparse.Namespace) -> int:
    from .tools import mutate as mutation

    device = check_device(args.device)
    writable_directory(args.report_dir, "--report-dir")
    equivalents = mutation.load_equivalents(args.equivalent) if args.equivalent is not None else None

    def progress(number: int, total: int, outcome: mutation.Outcome) -> None:
        how = (f" ({outcome.profile or outcome.kind}, {outcome.time_to_kill_s:.2f} s)"
               if outcome.time_to_kill_s is not None else "")
        print(f"  [{number}/{total}] {outcome.status}: {outcome.mutant.id}{how}", file=sys.stderr)

    with stdout_to_stderr(args.json):
        report = mutation.mutate(args.subject, budget_s=args.budget, max_examples=args.max_examples,
                                 seed=args.seed, device=device,
                                 equivalents=equivalents, operators=tuple(args.operator or ()) or None,
                                 profiles=tuple(dict.fromkeys(args.profile or mutation.PROFILE_ORDER)),
                                 exclude=frozenset(args.exclude or ()),
                                 on_outcome=None if args.json else progress)
    written = report.write(args.report_dir)
    if args.json:
        _print_json({**report.to_dict(), "reports": [str(path) for path in written]})
    else:
        _print_mutation_summary(report, written)
    return EXIT_OK if report.passed else EXIT_DIVERGENCE


def _print_mutation_summary(report: Any, written: list[Path]) -> None:
    from .tools import mutate as mutation

    print(report.headline())
    if report.baseline.status != mutation.PASSES:
        print(f"  {printable(report.baseline.sentence or '')}")
    times = report.time_to_kill()
    if times["max_s"] is not None:
        print(f"  time to kill: median {times['median_s']:.2f} s, p90 {times['p90_s']:.2f} s, "
              f"max {times['max_s']:.2f} s")
    for outcome in report.survivors:
        print(f"  survived: {outcome.mutant.id}: {outcome.mutant.description}")
        if outcome.sentence:  # the unmutated subject fails the scenario that the mutant failed
            print(f"    the unmutated subject fails its scenario too: {printable(outcome.sentence)}")
        print("    " + outcome.mutant.diff.rstrip().replace("\n", "\n    "))
    for outcome in report.outcomes:
        if outcome.equivalent_reason:
            print(f"  equivalent: {outcome.mutant.id}: {outcome.equivalent_reason}")
    for outcome in report.outcomes:
        if outcome.status in (mutation.NEVER_READ, mutation.NOT_RUNNABLE):
            print(f"  {outcome.status}: {outcome.mutant.id}: {printable(outcome.sentence or '')}")
    for mutant_id in report.wrongly_listed:
        print(f"  listed as equivalent, yet killed: {mutant_id}")
    print(f"  reports: {', '.join(str(path) for path in written)}")
