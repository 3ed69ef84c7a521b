"""Each answer of the subject judged against the truth the engine state gives at that moment.

The truth is the reference's rows for the answer's micro-batch (values, int32, length,
device, padding on the dummy slot); a wrong answer is explained from the run's history.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..quantities import Quantity
from ..reference import EngineState, ForwardPlan

from . import diagnosis as dx
from .guard import type_name
from .inputs import InputGuard
from .progress import Progress, Stop, Where

# the most values of a wrong-dtype answer scanned for NaN (an expanded one may claim 2**40)
_MAX_SCANNED = 1 << 20


@dataclass(frozen=True)
class StoreOutcome:
    """One checked store: where it ran and its divergence (None: it matched the reference)."""

    forward: int
    draft_step: int
    micro_batch: int
    layer_id: int | None
    divergence: dx.Divergence | None


class Judge:
    """Compares answers with the reference's rows under ``truth`` ("pool" or "ring").

    ``on_store`` sees every checked store. ``keep_going``: a wrong answer does not end the
    run; :attr:`first_divergence` holds the first. ``answered_by``: the code that answers
    and how ("X (file:line) returned"), where the subject names it, for the sentences."""

    def __init__(self, state: EngineState, history: dx.History, progress: Progress, inputs: InputGuard,
                 truth: str, device: torch.device, on_store: Callable[[StoreOutcome], None] | None,
                 keep_going: bool, answered_by: str | None = None):
        self.answered_by = answered_by
        self.state = state
        self.history = history
        self.progress = progress
        self.inputs = inputs
        self.truth_kind = truth
        self.config = state.config
        self.device = device
        self.on_host = device.type == "cpu"
        if self.on_host:
            self.on_device = operator.attrgetter("is_cpu")
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.on_device = lambda t: t.device.type == device.type and t.get_device() == index
        self.on_store = on_store
        self.keep_going = keep_going
        self.first_divergence: dx.Divergence | None = None
        self.value_histories: dict[str, dx.History] = {}
        self.value_plan: ForwardPlan | None = None
        self.value_truths: dict[tuple[int, int, str], torch.Tensor] = {}
        # where a stale eager answer sat in the subject's state, told as "FIELD, as forward 1
        # (decode) set it" (None: not known); set by whoever can ask the subject
        self.held_in: Callable[[ForwardPlan, int, int, Any], str | None] = lambda plan, step, mb, out: None

    def check_answers(self, plan: ForwardPlan, step: int, answers: Iterable[tuple[int, int, Any, int]]) -> None:
        """Check each (micro-batch, layer, answer, call index) of one draft step against the
        reference's rows for its micro-batch, computed at its first answer: the engine state
        stands still while ``answers`` are made."""
        truths: list[torch.Tensor | None] = [None] * plan.num_micro_batches
        on_device, every_store, progress = self.on_device, self.on_store is not None, self.progress
        for mb, layer_id, out, call in answers:
            expected = truths[mb]
            if expected is None:
                expected = truths[mb] = self.truth(plan, step, mb)
            progress.checks += 1
            matched = matches(out, expected, on_device)
            if not matched or every_store:
                self.verdict(plan, step, mb, layer_id, out, expected, matched, call)
            progress.stop_if_past_deadline()

    def truth(self, plan: ForwardPlan, step: int, mb: int) -> torch.Tensor:
        inputs = plan.steps[step][mb]
        expected = self.state.expected(plan.model, inputs, self.truth_kind)
        n = inputs.num_live
        self.history.record_answer(self.progress.forward, plan.event.mode, plan.model, step, mb,
                                   expected if n == expected.shape[0] else expected[:n])
        return expected if self.on_host else expected.to(self.device)

    def verdict(self, plan: ForwardPlan, step: int, mb: int, layer_id: int, out: Any,
                expected: torch.Tensor, matched: bool, call: int) -> None:
        """What a store the fast comparison did not settle comes to: its divergence, shown to
        ``on_store``. A wrong answer given after the subject wrote into its inputs is put
        down to the write."""
        divergence = None
        if not matched:
            where = Where(plan, step, mb, layer_id)
            divergence = self.inputs.input_written(where) or self._diagnose(
                self.progress.site(where, call), plan, step, mb, out, expected.cpu()
            )
        if self.on_store is not None:
            self.on_store(StoreOutcome(self.progress.forward, step, mb, layer_id, divergence))
        if divergence is not None:
            if not self.keep_going:
                raise Stop(divergence)
            self.first_divergence = self.first_divergence or divergence

    def shape_problem(self, site: dx.Site, out: Any, rows: int, quantity: Quantity | None = None,
                      columns: tuple[int, int | None] | None = None) -> dx.Divergence | None:
        """What makes ``out`` no answer of ``rows`` rows: of the SWA write location, or
        (``quantity``) of that per-step value; a table's ``columns`` are (least, most)."""
        if quantity is not None:
            return self._shape_problem(site, out, rows, quantity.dtype, f"At {site.describe()}, "
                                       f"{_value_answered_by(quantity)}", quantity.name, columns)
        return self._shape_problem(site, out, rows, torch.int32,
                                   f"At {site.describe()}, {self.answered_by or 'swa_write_location returned'}")

    def _shape_problem(self, site: dx.Site, out: Any, rows: int, dtype: torch.dtype, said: str,
                       quantity: str | None = None, columns: tuple[int, int | None] | None = None) -> dx.Divergence | None:
        problem = self._shape_of(site, out, rows, dtype, said, columns)
        return problem if problem is None or quantity is None else dataclasses.replace(problem, quantity=quantity)

    def _shape_of(self, site: dx.Site, out: Any, rows: int, dtype: torch.dtype, said: str,
                  columns: tuple[int, int | None] | None = None) -> dx.Divergence | None:
        # an answer is read only as a plain tensor: a subclass's methods are the subject's code
        if type(out) is not torch.Tensor:
            if isinstance(out, torch.Tensor):
                return site.divergence(
                    dx.NON_TENSOR, f"{said} a {type_name(out)} (a tensor subclass), not a torch.Tensor."
                )
            return site.divergence(dx.NON_TENSOR, f"{said} {type_name(out)}, not a tensor.")
        if out.is_nested or out.layout is not torch.strided:
            layout = "nested" if out.is_nested else str(out.layout).removeprefix("torch.")
            return site.divergence(dx.NON_TENSOR, f"{said} a {layout} tensor, not a dense one.")
        if not self.on_device(out):
            return site.divergence(
                dx.WRONG_DEVICE, f"{said} a tensor on {out.device}, not on {self.device}."
            )
        if out.dtype != dtype:
            nan = " containing NaN" if (
                out.is_floating_point() and not self.progress.capturing and out.numel() <= _MAX_SCANNED
                and bool(torch.isnan(out).any())
            ) else ""
            return site.divergence(dx.WRONG_DTYPE, f"{said} {out.dtype}{nan}, not {dtype}.")
        if columns is None:
            if out.dim() != 1 or out.shape[0] != rows:
                return site.divergence(
                    dx.WRONG_LENGTH, f"{said} shape {tuple(out.shape)} for {rows} rows.",
                    actual=dx.stored_values(out),
                )
            return None
        least, most = columns
        if out.dim() != 2 or out.shape[0] != rows or out.shape[1] < least or (most is not None and out.shape[1] > most):
            wanted = f"{least}" if most == least else f"at least {least}" if most is None else f"{least} to {most}"
            return site.divergence(
                dx.WRONG_LENGTH, f"{said} shape {tuple(out.shape)} for {rows} rows of {wanted} columns.",
                actual=dx.stored_values(out),
            )
        return None

    def _diagnose(self, site: dx.Site, plan: ForwardPlan, step: int, mb: int, out: Any,
                  expected: torch.Tensor, quantity: Quantity | None = None) -> dx.Divergence | None:
        """The divergence of an answer the fast comparison did not settle, of the SWA write
        location or (``quantity``) of a per-step value, traced through that value's history."""
        model, inputs = plan.model, plan.steps[step][mb]
        if quantity is None:
            history, truth_kind, answered_by, extra = self.history, self.truth_kind, self.answered_by, {}
        else:
            history, truth_kind = self.value_history(quantity), quantity.name
            answered_by, extra = _value_answered_by(quantity), {"quantity": quantity.name}
        table = quantity is not None and quantity.is_table
        columns = (expected.shape[1], None) if table else None
        problem = self.shape_problem(site, out, expected.shape[0], quantity, columns)
        if problem is not None:
            if problem.kind == dx.WRONG_LENGTH and out.dim() == 1:
                return self._explain_length(site, inputs, out, expected, problem, history, truth_kind, answered_by)
            return problem
        actual = out.to("cpu")
        fit = None
        if table:
            actual = quantity.compared(actual, expected)
            fit = _fitted_to(quantity, expected[:inputs.num_live])
        n = inputs.num_live
        live, want = actual[:n], expected[:n]
        if not torch.equal(live, want):
            source = dx.explain(history, site, truth_kind, inputs, self.config, live, want, fit)
            n_wrong = int(dx.wrong_rows(live != want).sum())
            held_in = (self.held_in(plan, step, mb, out)
                       if quantity is None and source.kind in dx.STALE_SOURCES else None)
            return site.divergence(
                dx.WRONG_ROWS, dx.wrong_rows_sentence(site, source, n_wrong, n, answered_by, held_in),
                expected=dx.stored_values(want), actual=dx.stored_values(live), source=dx.source_dict(source),
                **extra,
            )
        padding = actual[n:]
        wrong_entries = padding != expected[n:]
        wrong = dx.wrong_rows(wrong_entries).nonzero().flatten().tolist()
        if not wrong:
            return None
        # a per-step value's rows are no request's own: only the SWA rows can alias one
        owned = self.state.live_targets(model, truth_kind) if quantity is None else set()
        aliased = [i for i in wrong if int(padding[i]) in owned] if owned else []
        row = (aliased or wrong)[0]
        # of a table row, its first wrong entry
        value = int(padding[row] if padding.dim() == 1 else padding[row][wrong_entries[row]][0])
        explained = dx.explain_padding(history, site, n, actual, expected)
        sentence = dx.padding_sentence(site, n + row, value, bool(aliased), explained, answered_by)
        source = explained or (
            dx.Source(dx.ALIASES_LIVE, f"row {value}, which a live request owns",
                      "the padding write would corrupt that request's keys")
            if aliased else dx.Source(dx.UNKNOWN, f"row {value}", "padding must write to the dummy slot")
        )
        return site.divergence(
            dx.PADDING, sentence, expected=dx.stored_values(expected), actual=dx.stored_values(actual),
            source=dx.source_dict(source), **extra,
        )

    def _explain_length(self, site, inputs, out, expected, problem, history, truth_kind, answered_by) -> dx.Divergence:
        """A 1-D answer of the wrong length, read only when a candidate has its length (it
        may claim 2**40 rows through a stride of 0)."""
        stored = {"expected": dx.stored_values(expected), "actual": problem.actual, "quantity": problem.quantity}
        for source, rows in history.candidates(site, truth_kind, inputs, self.config):
            if source.kind != dx.DUMMY and rows.shape == out.shape and bool((rows == out.cpu()).all()):
                came = (f"{answered_by} {out.shape[0]} rows for" if answered_by
                        else f"{out.shape[0]} rows came back for")
                sentence = (f"Stale cache: at {site.describe()}, {came} {expected.shape[0]}: they are "
                            f"{source.phrase}: {source.consequence}.")
                return site.divergence(dx.WRONG_LENGTH, sentence, source=dx.source_dict(source), **stored)
        return site.divergence(problem.kind, problem.sentence, **stored)

    # ---- per-step values (swafuzz.quantities) ------------------------------------------

    def value_history(self, quantity: Quantity) -> dx.History:
        """The run's history of ``quantity``'s truth: where a wrong value of it came from."""
        history = self.value_histories.get(quantity.name)
        if history is None:
            history = self.value_histories[quantity.name] = dx.History()
        return history

    def value_truth(self, plan: ForwardPlan, step: int, mb: int, quantity: Quantity) -> torch.Tensor:
        """``quantity``'s rows for a micro-batch of a draft step, from its live inputs (read
        once per plan, step and micro-batch) and recorded in the value's history."""
        if self.value_plan is not plan:
            self.value_plan, self.value_truths = plan, {}
        key = (step, mb, quantity.name)
        expected = self.value_truths.get(key)
        if expected is None:
            inputs = plan.steps[step][mb]
            expected = quantity.truth(inputs, self.state)
            self.value_history(quantity).record_answer(self.progress.forward, plan.event.mode, plan.model, step, mb,
                                                       expected[: inputs.num_live])
            self.value_truths[key] = expected
        return expected

    def check_value(self, plan: ForwardPlan, step: int, mb: int, layer_id: int, quantity: Quantity, out: Any,
                    call: int) -> None:
        """Check a per-step value a layer read against its truth, as :meth:`verdict` checks
        an SWA answer: a wrong one ends the run unless ``keep_going``."""
        expected = self.value_truth(plan, step, mb, quantity)
        self.progress.checks += 1
        if (type(out) is torch.Tensor and out.dtype is quantity.dtype and self.on_device(out)
                and quantity.matches(out if self.on_host else out.cpu(), expected)):
            return
        where = Where(plan, step, mb, layer_id)
        divergence = self.inputs.input_written(where) or self._diagnose(
            self.progress.site(where, call), plan, step, mb, out, expected, quantity)
        if divergence is None:
            return
        if not self.keep_going:
            raise Stop(divergence)
        self.first_divergence = self.first_divergence or divergence


def _fitted_to(quantity: Quantity, truth: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor | None]:
    """How a candidate table is held against ``truth`` as the answer was: its first
    columns, with the truth's unread entries; None for one of another shape or too few
    columns."""
    def fit(rows: torch.Tensor) -> torch.Tensor | None:
        if rows.dim() != 2 or rows.shape[0] != truth.shape[0] or rows.shape[1] < truth.shape[1]:
            return None
        return quantity.compared(rows, truth)
    return fit


def _value_answered_by(quantity: Quantity) -> str:
    """How a finding's sentence names the per-step value a subject answered."""
    return f"per_step_value({quantity.name!r}) returned"


_equal = torch.Tensor.equal  # torch.equal less its module-function argument parsing


def matches(out: Any, expected: torch.Tensor, on_device: Callable[[torch.Tensor], bool],
            _tensor=torch.Tensor, _int32=torch.int32) -> bool:
    """The fast comparison: a plain int32 tensor on the device with the reference's rows;
    anything else goes to the verdict, which says what is wrong or finds it right after all
    (a tensor subclass). (It runs once per answer: torch's names are bound once.)"""
    try:
        return (
            type(out) is _tensor
            and out.dtype is _int32
            and on_device(out)
            and _equal(out, expected)  # equal sizes included
        )
    except RuntimeError:  # a layout torch.equal cannot compare (sparse, nested): the verdict names it
        return False
