"""What the subject was handed, and whether it left it alone.

A subject must not write into the tensors of its batch, re-point a batch field or write
into a registered mapping: the engine reads them after it. The guard keeps what each held
and finds the first such change, dated by the call that made it where that is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..api import CodeNames, ForwardBatch
from ..reference import PACKED_INPUTS, ForwardPlan

from . import diagnosis as dx
from .guard import type_name
from .mappings import MappingSync
from .progress import Progress, Stop, Where

# the batch field of each of PACKED_INPUTS, in its order; every draft step's locations,
# positions and lengths are new, the requests' slots and token counts (the first two) are not
BATCH_INPUTS = tuple({
    "req_slots": "req_pool_indices", "token_counts": "extend_seq_lens", "positions": "positions",
    "out_cache_loc": "out_cache_loc", "seq_lens": "seq_lens", "prefix_lens": "extend_prefix_lens",
    "host_seq_lens": "seq_lens_cpu",
}[name] for name in PACKED_INPUTS)

# the StepInputs field each batch field is handed from
PACKED_FIELD = dict(zip(BATCH_INPUTS, PACKED_INPUTS))


@dataclass(eq=False)
class Handed:
    """The inputs of one forward (or graph capture) as handed to the subject: per draft
    step and micro-batch, each batch field's tensor; the batch objects; and what the
    tensors must hold, read from the plan or (graphs) given as ``values``. ``block``
    (eager forwards): the tensors of every step, one after another (the host lengths only
    on the host), and ``block_held`` what it was copied from."""

    plan: ForwardPlan
    batches: list[ForwardBatch]
    fields: list[list[dict[str, torch.Tensor]]]
    values: dict[str, torch.Tensor] | None = None
    block: torch.Tensor | None = None
    block_held: Sequence[torch.Tensor] = ()
    block_version: int = 0
    step: int = 0  # the draft step whose tensors the batch fields name now
    phase: str = "the end of"  # how a write found after the calls is dated

    def named(self, mb: int) -> dict[str, torch.Tensor]:
        """What micro-batch ``mb``'s batch fields name now: the current step's tensors, and
        the first step's for the fields a later step does not replace."""
        first = self.fields[0][mb]
        return first if self.step == 0 else {**first, **self.fields[self.step][mb]}

    def held(self, step: int, mb: int, name: str) -> torch.Tensor:
        if self.values is not None:
            return self.values[name]
        return getattr(self.plan.steps[step][mb], PACKED_FIELD[name])


class InputGuard:
    """Finds the subject's writes into what it was handed: :attr:`handed`, the current
    forward's inputs (set by whoever hands them), and the registered mappings."""

    def __init__(self, progress: Progress, mappings: MappingSync, on_host: bool, names: CodeNames):
        self.progress = progress
        self.mappings = mappings
        self.history = mappings.history
        self.on_host = on_host
        self.names = names
        # a subject that names its code has each write told at the call that made it
        self.after_each_call = bool(names.calls)
        self._handed: Handed | None = None
        self._versions_seen: tuple[int, ...] = ()
        self.mappings_checked_at = -1  # the call count when the mappings were last checked
        # the subject methods called since the inputs were last found intact, and the latest
        self._ran: dict[str, None] = {}
        self._latest = ""

    @property
    def handed(self) -> Handed | None:
        """The current forward's inputs (set by whoever hands them)."""
        return self._handed

    @handed.setter
    def handed(self, handed: Handed) -> None:
        self._handed = handed
        self._versions_seen = self._versions()

    def _versions(self) -> tuple[int, ...]:
        """The versions of the tensors handed for the current forward (an eager forward's
        device inputs share their block's)."""
        handed = self._handed
        if handed is None:
            return ()
        if handed.block is not None:
            return (handed.block._version,)
        return tuple(tensor._version for tensor in handed.fields[0][0].values())

    def moved(self) -> bool:
        """Whether a handed tensor's version moved since the inputs were last found intact."""
        return self._versions() != self._versions_seen

    def stop_if_written_by(self, where: Where) -> None:
        """After the call at ``where``: stop at a write it made into what it was handed,
        where it moved a handed tensor's version and changed what that holds (a write of
        the values already there is none). Made after each call where
        :attr:`after_each_call`, for the price of reading a version or a few."""
        versions = self._versions()
        if versions != self._versions_seen:
            self._versions_seen = versions
            written = self.input_written(where)
            if written is not None:
                raise Stop(written)

    def ran(self, method: str) -> None:
        """Note a call of the subject's ``method``: a write found later may be its."""
        self._ran[method] = None
        self._latest = method

    def check_inputs(self, plan: ForwardPlan) -> None:
        """At the end of a forward (graph replay, capture): every tensor handed to the subject
        still holds what it was handed, and every batch field still names it. One
        comparison covers an eager forward's device inputs; what it finds is explained only
        when something changed."""
        handed, holds = self.handed, self._holds
        if handed.block is not None:
            held = handed.block_held
            # a view resized or re-pointed in place moves the version its block shares
            intact = handed.block._version == handed.block_version and holds(
                handed.block, held[0] if len(held) == 1 else torch.cat(held)
            )
            if not self.on_host:  # the host lengths are not in the block
                for step_fields, step_inputs in zip(handed.fields, plan.steps):
                    for fields, inputs in zip(step_fields, step_inputs):
                        intact = intact and _equal(fields["seq_lens_cpu"], inputs.host_seq_lens)
        else:
            intact = all(holds(tensor, handed.values[name]) for name, tensor in handed.fields[0][0].items())
        if not intact or not self.fields_named():
            written = self.input_written()
            if written is not None:
                raise Stop(written)
        self._ran.clear()

    def _holds(self, tensor: torch.Tensor, held: torch.Tensor) -> bool:
        return _equal(tensor, held) if self.on_host else _equal(tensor.cpu(), held)

    def fields_named(self) -> bool:
        """Whether the batches' fields still name the tensors handed for the current step."""
        handed = self.handed
        for mb, batch in enumerate(handed.batches):
            found = vars(batch)
            for name, tensor in handed.named(mb).items():
                if found.get(name) is not tensor:
                    return False
        return True

    def input_written(self, where: Where | None = None) -> dx.Divergence | None:
        """The first change the subject made to what it was handed (``where``: the call by
        which it was made, if known): a batch field re-pointed, a tensor written or
        resized, a mapping written."""
        handed = self.handed
        if handed is not None:
            for mb, batch in enumerate(handed.batches):
                for name, tensor in handed.named(mb).items():
                    found = vars(batch).get(name, _MISSING)
                    if found is not tensor:
                        what = ("another tensor" if type(found) is torch.Tensor else "nothing" if found is _MISSING
                                else "None" if found is None else f"a {type_name(found)}")
                        shown = self.names.inputs.get(name, f"the batch's {name}")
                        return self._wrote(where, Where(handed.plan, handed.step, mb), name,
                                           f"replaced {shown} with {what}")
            for step, step_fields in enumerate(handed.fields):
                for mb, fields in enumerate(step_fields):
                    for name, tensor in fields.items():
                        change = dx.input_change(self.names.inputs.get(name, name), tensor,
                                                 handed.held(step, mb, name))
                        if change is not None:
                            return self._wrote(where, Where(handed.plan, step, mb), name, change)
        return self._mapping_written(None, where)

    def _wrote(self, by: Where | None, found: Where, name: str, change: str) -> dx.Divergence:
        """The divergence of a write found by the call ``by`` (None: after the forward's
        calls, in the batch of ``found``)."""
        at = by or found
        sentence = dx.wrote_input_sentence(self._when(at, by is not None), name, change, self._writer(by),
                                           read_only=name in self.names.inputs)
        return self.progress.site(at).divergence(dx.WROTE_INPUT, sentence)

    def _writer(self, by: Where | None) -> str:
        """Who made a write found by the call ``by`` (None: since the inputs were last found
        intact): the code the subject names for that call, or for each call since."""
        calls = self.names.calls
        if by is not None:
            method = "swa_write_location" if by.layer_id is not None else self._latest
            return calls.get(method, "the subject")
        named = [calls[method] for method in self._ran if method in calls]
        return " or ".join(named) if named else "the subject"

    def _when(self, where: Where, by_call: bool) -> str:
        described = self.progress.site(where).describe()
        if by_call:
            return described
        return f"{self.handed.phase if self.handed is not None else 'the end of'} {described}"

    def check_mappings(self, what: str) -> None:
        """Before the harness writes into the registered mappings (``what`` names the sync;
        a sync checks only after subject calls), the subject has left them as the last sync
        did. On the host a small mapping is compared whole (an in-place write through
        numpy leaves the version alone); a large one, or one on a device, when its version
        moved."""
        self.mappings_checked_at = self.progress.call
        written = self._mapping_written(what)
        if written is not None:
            raise Stop(written)

    def _mapping_written(self, when: str | None, by: Where | None = None) -> dx.Divergence | None:
        """A write into a registered mapping, found at the sync ``when`` names, by the call
        ``by``, or (neither) after a forward's calls."""
        synced, registered = self.history.mappings, self.mappings
        held = [(model, "mapping", mapping, synced[model], registered.mapping_versions[model])
                for model, mapping in registered.mappings.items()]
        held += [(model, "earlier mapping", mapping, values, version)
                 for model, earlier in registered.earlier_mappings.items() for mapping, values, version in earlier]
        for model, which, mapping, values, version in held:
            # on the host compared whole: a write through numpy or .data leaves the version alone
            if (_equal(mapping, values) if self.on_host else mapping._version == version):
                continue
            shown = self.names.inputs.get("mapping", "")
            change = dx.input_change(f"the {model} model's {which}" + (f" ({shown})" if shown else ""), mapping, values)
            if change is not None:
                plan = self.progress.plan
                at = by or (Where(plan) if plan is not None and plan.model == model else Where(model=model))
                sentence = dx.wrote_input_sentence(when or self._when(at, by is not None), "mapping", change,
                                                   self._writer(by))
                return self.progress.site(at).divergence(dx.WROTE_INPUT, sentence)
        return None


_MISSING = object()  # a batch field the subject deleted

_equal = torch.Tensor.equal  # torch.equal less its module-function argument parsing
