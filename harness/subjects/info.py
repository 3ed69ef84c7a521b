"""What describes a subject: its name, its class, what is expected of it, and how it is listed.
It imports no torch, so that listing subjects and reading reports stay light."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..api import Subject

DIVERGES = "diverges"
EQUIVALENT = "equivalent"
POOL, RING = "pool", "ring"  # the values of swafuzz.api.Truth


def listing(name: str, kind: str, truth: str, expected: str, diverges_on: tuple[str, ...],
            requires: tuple[str, ...], summary: str) -> dict:
    """A subject as ``swafuzz subjects --json`` lists it and a report records it."""
    return {"name": name, "kind": kind, "truth": truth, "expected": expected, "diverges_on": list(diverges_on),
            "requires": sorted(requires), "summary": summary}


def first_paragraph(text: str | None) -> str:
    """A docstring's summary: its first paragraph on one line, however many lines it takes."""
    paragraph = (text or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


@dataclass(frozen=True)
class SubjectInfo:
    name: str
    subject: type[Subject]
    expected: str
    diverges_on: tuple[str, ...] = ()
    kind: str = "builtin"
    summary: str = field(default="")

    @property
    def truth(self) -> str:
        return self.subject.truth.value

    def to_dict(self) -> dict:
        listed = listing(self.name, self.kind, self.truth, self.expected, self.diverges_on,
                         tuple(getattr(self.subject, "requires", ())),
                         self.summary or first_paragraph(self.subject.__doc__))
        # an SGLang target: where its tree calls it, which the verdict is about
        call_sites = getattr(self.subject, "call_sites", None)
        if call_sites is not None:
            listed["reached"] = {"sentence": call_sites.describe(), **call_sites.to_dict()}
        statements = getattr(self.subject, "statements_run", None)
        ran = statements.to_dict() if statements is not None else None
        if ran is not None:
            listed["statements"] = ran
        not_checked = getattr(self.subject, "not_checked", None)
        if not_checked is not None and not_checked():
            listed["not_checked"] = list(not_checked())
        return listed
