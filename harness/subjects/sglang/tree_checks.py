"""The checks that run a tree's own code on generated inputs, outside the fuzzer.

These tables of SGLang code are checked this way, each against :mod:`swafuzz.reference`:

- the producers of the rows the stores write (:mod:`.producers`), run on
  :func:`producer_batches`: decode-like, target-verify-like, ragged extend, prefill, a
  graph-padded batch and an idle forward right after a live one;
- the graph runner's merge steps before replay (:mod:`.runner_steps`);
- the compressed-KV metadata kernels (:mod:`.compressed`), under Triton's interpreter where
  the ``triton`` extra is installed, and *not checked* where it is not;
- the builders of the per-step index tables (:mod:`.tables`: page table, SWA indices and
  lengths, the C4 top-k table, compress-state ring rows), one check per SGLang function,
  the Triton ones likewise only where triton is installed;
- the readers of the compressed-KV values (:mod:`.readers`: the compressor's
  ``_get_out_loc``, the rows ``forward_unified`` hands each compressor store, and each
  multi-step draft step's slots and compressed locations), on metadata the tree's own
  ``init_compression_metadata`` made, so likewise only with triton.

Each check of a tree ends as one :class:`TreeCheck`: *right*, *wrong* (the first wrong row
and the batch that showed it), *absent* (the tree lacks the code, with why) or *not checked*
(the tree has it, but it reads something swafuzz cannot run on CPU, with what). The matrix
shows them per release; the pull-request gate compares them between HEAD and BASE, in a
process of its own: ``python -m swafuzz.subjects.sglang.tree_checks --sglang-source PATH``
(or ``--release 0.5.23``) prints them as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
from dataclasses import asdict, dataclass

import torch

from ...errors import BindError, StandInGap, SglangUnavailable
from ...names import EXIT_OK, EXIT_USAGE
from . import compressed, locate, readers, runner_steps, tables
from .producers import Batch, bind_producers, check, idle

PRODUCER, RUNNER_STEP, KERNEL, READER = "producer", "runner step", "kernel", "reader"
COMPRESSED_VALUES = f"{compressed.KERNEL_ENTRY} (compressed-KV values)"
RIGHT, WRONG, ABSENT, GAP = "right", "wrong", "absent", "not checked"
PRODUCER_WINDOWS = (8, 128)
BATCH_KINDS = ("decode", "verify", "ragged extend", "prefill", "padded", "idle after a live forward")


@dataclass(frozen=True)
class TreeCheck:
    """One producer or runner step of one tree: ``detail`` is the first wrong row and its
    batch (wrong), why the tree lacks it (absent) or what swafuzz cannot run (not checked)."""

    kind: str  # PRODUCER, RUNNER_STEP, KERNEL or READER
    name: str  # the SGLang function, as the producers' and runner steps' tables name it
    outcome: str  # RIGHT, WRONG, ABSENT or GAP
    detail: str = ""
    owner: str = ""  # the class or module a producer belongs to
    batches: int = 0  # the batches a producer ran on before its outcome
    # the lines of its SGLang function's statements that a producer's batches ran, under the
    # function's name and place: {"name": ..., "lines": [...]}, where any ran
    statements: dict | None = None


def unrunnable(reason: str) -> bool:
    """Whether a reason the binding gave says swafuzz cannot run code the tree has (rather
    than that the tree lacks it)."""
    return any(word in reason for word in ("swafuzz", "--sglang-attr", "decorated"))


def _not_there(kind: str, name: str, reason: str) -> TreeCheck:
    return TreeCheck(kind, name, GAP if unrunnable(reason) else ABSENT, reason)


def producer_batches(seed: int = 0, per_kind: int = 12) -> list[tuple[str, Batch, int]]:
    """(kind, batch, window) for each of :data:`BATCH_KINDS`: one token per request
    (decode), equal counts above one (verify), ragged counts with prefixes (ragged extend),
    ragged counts without (prefill), graph padding rows after a live batch (padded), and an
    idle forward that keeps the metadata of the live one before it. Distinct request slots,
    prefixes past the smaller window; the same for the same seed."""
    rng = random.Random(seed)
    batches = []
    for kind in BATCH_KINDS:
        for index in range(per_kind):
            requests = rng.randint(1, 6)
            slots = rng.sample(range(32), requests)
            prefixes = [0 if kind == "prefill" else rng.randint(0, 40) for _ in range(requests)]
            if kind in ("decode", "idle after a live forward"):
                counts = [1] * requests
            elif kind == "verify":
                counts = [rng.randint(2, 4)] * requests
            else:
                counts = [rng.randint(1, 7) for _ in range(requests)]
                if requests > 1 and len(set(counts)) == 1:
                    counts[0] += 1  # ragged for sure
            batch = Batch(torch.tensor(slots), torch.tensor(prefixes), torch.tensor(counts),
                          padding=rng.randint(1, 4) if kind == "padded" else 0)
            if kind == "idle after a live forward":
                batch = idle(rng.randint(1, 6), previous=batch)
            batches.append((kind, batch, PRODUCER_WINDOWS[index % len(PRODUCER_WINDOWS)]))
    return batches


def check_producers(tree: locate.SourceTree, seed: int = 0) -> list[TreeCheck]:
    """Every producer the tree has, run on :func:`producer_batches` until its first wrong
    row, then every one it lacks or swafuzz cannot run, with the reason."""
    found, absent = bind_producers(tree, "source")
    checks = []
    batches = producer_batches(seed)
    for producer in found:
        ran, outcome, detail = 0, RIGHT, ""
        for kind, batch, window in batches:
            ran += 1
            try:
                problems = check(producer, batch, window)
            except StandInGap as exc:
                outcome, detail = GAP, f"{exc} ({kind} batch: {describe(batch)})"
                break
            except Exception as exc:  # noqa: BLE001 - the tree's code may raise anything: that is its answer
                problems = [f"raised {type(exc).__name__}: {exc}"]
            if problems:
                outcome, detail = WRONG, f"{first_wrong_row(problems[0])} ({kind} batch: {describe(batch)}, window {window})"
                break
        tally = producer.statements
        lines = tally.lines_ran() if tally is not None else []
        checks.append(TreeCheck(PRODUCER, producer.name, outcome, detail, producer.backend, ran,
                                {"name": tally.name, "lines": lines} if lines else None))
    checks += [_not_there(PRODUCER, name, reason) for name, reason in absent.items()]
    return checks


def check_runner_steps(tree: locate.SourceTree) -> list[TreeCheck]:
    """Every merge step of the graph runner (:func:`runner_steps.verdicts`) as a check."""
    return [_not_there(RUNNER_STEP, v.step, v.absent) if v.absent else
            TreeCheck(RUNNER_STEP, v.step, WRONG if v.findings else RIGHT, "; ".join(v.findings) or v.detail)
            for v in runner_steps.verdicts(tree)]


def check_compressed_values(tree: locate.SourceTree) -> list[TreeCheck]:
    """The compressed-KV metadata kernels (:func:`compressed.check_release`) as one check."""
    try:
        found = compressed.check_release(tree)
    except BindError as exc:
        return [_not_there(KERNEL, COMPRESSED_VALUES, str(exc))]
    if not found.checked:
        return [TreeCheck(KERNEL, COMPRESSED_VALUES, GAP, found.reason)]
    absent = f" (this tree has no {', '.join(found.absent)})" if found.absent else ""
    if found.wrong:
        return [TreeCheck(KERNEL, COMPRESSED_VALUES, WRONG, "; ".join(found.wrong) + absent)]
    return [TreeCheck(KERNEL, COMPRESSED_VALUES, RIGHT, "every value matches the truth" + absent)]


def check_tables(tree: locate.SourceTree) -> list[TreeCheck]:
    """Each builder of :data:`tables.BUILDERS` (:func:`tables.check_builder`) as a check."""
    checks = []
    for builder in tables.BUILDERS:
        try:
            found = tables.check_builder(builder, tree)
        except BindError as exc:
            checks.append(_not_there(KERNEL, builder.name, str(exc)))
            continue
        if not found.bound:
            checks.append(TreeCheck(KERNEL, builder.name, GAP, found.reason))
        elif found.wrong:
            checks.append(TreeCheck(KERNEL, builder.name, WRONG,
                                    f"{'; '.join(found.wrong)} (batch: {tables.describe(found.batch)})"))
        else:
            checks.append(TreeCheck(KERNEL, builder.name, RIGHT, "every value matches the truth"))
    return checks


def check_readers(tree: locate.SourceTree, names: tuple[str, ...] | None = None) -> list[TreeCheck]:
    """Each reader of the compressed-KV values (:data:`readers.READERS`; those ``names``
    where given) as a check."""
    checks = []
    for reader in (r for r in readers.READERS if names is None or r.name in names):
        try:
            found = readers.check_reader(reader, tree)
        except BindError as exc:
            checks.append(_not_there(READER, reader.name, str(exc)))
            continue
        if not found.ran:
            checks.append(TreeCheck(READER, reader.name, GAP, found.reason))
        elif found.wrong:
            unread = reader.unread(tree) if reader.unread and not found.raised else None
            checks.append(TreeCheck(READER, reader.name, WRONG, (f"never read: {unread}; " if unread else "")
                                    + f"{'; '.join(found.wrong)} ({found.batch})"))
        else:
            checks.append(TreeCheck(READER, reader.name, RIGHT, "every row matches the truth"))
    return checks


def check_tree(tree: locate.SourceTree, seed: int = 0) -> list[TreeCheck]:
    return (check_producers(tree, seed) + check_runner_steps(tree) + check_compressed_values(tree) + check_tables(tree)
            + check_readers(tree))


_ROWS = re.compile(r"^(?P<field>\w[\w ]*?): got (?P<got>\[[^\]]*\]), want (?P<want>\[[^\]]*\])$")


def first_wrong_row(problem: str) -> str:
    """``field: got [..], want [..]`` (as :func:`producers.check` says) reduced to the first
    row that differs; any other wording unchanged."""
    match = _ROWS.match(problem)
    if match is None:
        return problem
    got, want = (ast.literal_eval(match.group(name)) for name in ("got", "want"))
    row = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"{match.group('field')} row {row}: got {_at(got, row)}, want {_at(want, row)} "
            f"({len(got)} rows, {len(want)} wanted)")


def _at(rows: list, row: int) -> object:
    return rows[row] if row < len(rows) else "no row"


def describe(batch: Batch) -> str:
    if batch.is_idle:
        shown = f"{batch.padding} padding rows"
        return shown + (f", after a forward of {describe(batch.previous)}" if batch.previous is not None else "")
    return (f"request slots {batch.req_pool_indices.tolist()}, prefixes {batch.extend_prefix_lens.tolist()}, "
            f"tokens {batch.extend_seq_lens.tolist()}" + (f", {batch.padding} padding rows" if batch.padding else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swafuzz.subjects.sglang.tree_checks",
                                     description="Check a tree's producers of the rows and graph-runner steps; "
                                                 "print the checks as JSON.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sglang-source", metavar="PATH", help="an SGLang checkout or unpacked tree")
    where.add_argument("--release", metavar="VERSION", help="a released wheel, such as 0.5.23")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        tree = locate.wheel(args.release) if args.release else locate.checkout(args.sglang_source)
        checks = check_tree(tree, args.seed)
    except (SglangUnavailable, BindError) as exc:
        print(f"swafuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    json.dump([asdict(c) for c in checks], sys.stdout)
    print()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
