"""What every built-in subject does on every hand-written example, stated once as a table.

Like an OpInfo table: the rows are ``swafuzz.subjects.registry.BUILTIN_SUBJECTS``, the columns are
``swafuzz.strategies.examples.EXAMPLES``, and each cell is the verdict the design must get when the
scenario is *run*. A cell left out means the subject passes that example. Every cell follows
from the domain brief's description of the design (section 2) and the bug class the example
triggers (section 4).
"""

from __future__ import annotations

import re
from functools import lru_cache

import pytest

from swafuzz.run import mappings

from swafuzz import run_scenario
from swafuzz.run.diagnosis import STALE_SOURCES
from swafuzz.run.executor import NotCheckable
from swafuzz.subjects.registry import BUILTIN_SUBJECTS, DIVERGES, EQUIVALENT
from swafuzz.strategies.examples import EXAMPLES
from swafuzz.strategies.features import features_of

PASS = None
# A subject whose bug lives in GPU stream ordering: refused, never passed, on the CPU.
NOT_CHECKABLE_ON_CPU = "not checkable on the cpu"


def stale(source: str) -> tuple[str, str]:
    """Wrong live rows that reproduce an earlier answer of the given source kind."""
    return ("wrong_rows", source)


# a size error on a ragged batch, hinted as the uniform repeat_interleave fallback
RAISED_ON_RAGGED = ("raised", "uniform_repeat")
UNIFORM_REPEAT = ("wrong_rows", "uniform_repeat")

# The pool-level cache (seed 000): one cached translation per pool, refreshed at one layer.
_POOL_CACHE = {
    "first-swa-layer-not-start": stale("earlier_forward"),  # bug class 1
    "two-batch-overlap": stale("other_micro_batch"),  # bug class 3
    "in-place-change-mid-forward": stale("old_mapping"),  # bug class 4
}
# The ring-row metadata cache (seed 002): rows built with decode metadata, trusted by length.
_UNIFIED = {
    "multi-step-draft": stale("earlier_step"),  # bug class 5
    "ragged-extend": UNIFORM_REPEAT,  # bug class 6, counts divide
    "ragged-extend-indivisible": RAISED_ON_RAGGED,  # bug class 6, counts do not divide
    "skipped-metadata-init": stale("earlier_forward"),  # bug class 7
    "idle-replay-skips-init": stale("graph_capture"),  # bug class 8 (no copy into the capture)
    "graph-replay": stale("graph_capture"),  # bug class 8
    # the same bug classes on a model with compressed layers: the SWA rows go stale alike
    "compressed-multi-step-draft": stale("earlier_step"),
    "compressed-graph-replay": stale("graph_capture"),
}
_UNIFIED_MTP_BYPASS = {k: v for k, v in _UNIFIED.items() if k not in ("multi-step-draft", "compressed-multi-step-draft")}
# The compressed write locations: each design's one bug, on the example that triggers it; the
# SWA write location, translated per layer, is right everywhere.
_COMPRESSED = {
    "compressed-idle-stale": {"compressed-idle-skips-init": ("padding", "earlier_forward")},
    "compressed-unsliced": {"compressed-multi-step-draft": stale("earlier_step")},
    "compressed-first-layer": {"compressed-pipeline-stage": stale("earlier_forward")},
    "compressed-graph-assign": {"compressed-graph-replay": stale("graph_capture")},
    # the fourth draft token's successors are left out of the plan: their entries go to the dummy
    "compressed-draft-pad4": {"compressed-verify-eight-drafts": ("wrong_rows", "dummy")},
    "page-table": {},
    # built at capture and never repopulated: replays read the capture's (the dummy request's) pages
    "page-table-captured": {"compressed-graph-replay": stale("graph_capture")},
}

VERDICTS: dict[str, dict[str, tuple[str, str | None] | None] | str] = {
    "uncached": {},
    "uncached-ring": {},
    # keyed on the forward: graph capture warms up on the same batch, so the captured layers
    # hit the warm-up's rows and the graph never recomputes them
    "step-keyed": {"graph-replay": stale("graph_capture"), "idle-replay-skips-init": stale("graph_capture"),
                   "compressed-graph-replay": stale("graph_capture")},
    "step-keyed-ring": {"graph-replay": stale("graph_capture"), "idle-replay-skips-init": stale("graph_capture"),
                        "compressed-graph-replay": stale("graph_capture")},
    # the key also says whether the call is being captured: the capture recomputes
    "step-keyed-capture": {},
    "step-keyed-capture-ring": {},
    "pool-start-layer": dict(_POOL_CACHE),
    # refreshes at layer 0, so a stage starting at layer 1 never refreshes (bug class 2)
    "pool-layer0": {**_POOL_CACHE, "pipeline-stage": stale("earlier_forward"),
                    "compressed-pipeline-stage": stale("earlier_forward")},
    # release 0.5.12: register_mapping keeps the stale translation
    "pool-no-invalidate": {**_POOL_CACHE, "register-then-skip-start": stale("earlier_forward")},
    "unified-metadata": dict(_UNIFIED),
    "unified-metadata-mtp-bypass": dict(_UNIFIED_MTP_BYPASS),
    # the translated-loc metadata cache: per micro-batch, captured as an operation under graphs
    "swa-out-shape-guard": {
        "in-place-change-mid-forward": stale("old_mapping"),
        "multi-step-draft": stale("earlier_step"),
        "skipped-metadata-init": stale("earlier_forward"),
        "compressed-multi-step-draft": stale("earlier_step"),
    },
    # ring rows in the merge's assign list: replay re-points the field, captured layers
    # keep reading the capture-time tensor
    "unified-graph-assign": dict(_UNIFIED_MTP_BYPASS),
    # ring rows in the copy list: replay is right, but a skipped replay init leaves the
    # previous forward's live rows where padding must write to the dummy slot
    "unified-graph-copy": {
        "ragged-extend": UNIFORM_REPEAT,
        "ragged-extend-indivisible": RAISED_ON_RAGGED,
        "skipped-metadata-init": stale("earlier_forward"),
        # padding rows hold the previous forward's live rows
        "idle-replay-skips-init": ("padding", "earlier_forward"),
    },
    # translates on a side stream without making the layers' stream wait: a race that only a
    # device with real streams can show, so the CPU refuses it instead of passing it
    "stream-unsynced": NOT_CHECKABLE_ON_CPU,
    "compressed-metadata": {},
    **_COMPRESSED,
}

_SUBJECTS = {info.name: info for info in BUILTIN_SUBJECTS}
_CELLS = [(subject, example) for subject in _SUBJECTS for example in EXAMPLES]


@lru_cache(maxsize=None)
def _run(subject: str, example: str):
    """Each (subject, example) runs once per test process; the result is immutable."""
    return run_scenario(_SUBJECTS[subject].subject, EXAMPLES[example], device="cpu", timeout_s=10)


def _checkable(subject: str) -> bool:
    return VERDICTS[subject] != NOT_CHECKABLE_ON_CPU


def _expected(subject: str, example: str):
    row = VERDICTS[subject]
    return row if isinstance(row, str) else row.get(example, PASS)


def test_the_table_has_a_row_for_every_builtin_subject_and_only_those():
    assert sorted(VERDICTS) == sorted(_SUBJECTS)


def test_every_cell_of_the_table_names_a_hand_written_example():
    for subject, row in VERDICTS.items():
        if isinstance(row, dict):
            assert set(row) <= set(EXAMPLES), f"{subject}: {sorted(set(row) - set(EXAMPLES))}"


def test_exactly_the_subjects_that_need_gpu_streams_are_not_checkable_on_the_cpu():
    needs_streams = {i.name for i in BUILTIN_SUBJECTS if "gpu_streams" in getattr(i.subject, "requires", ())}
    assert needs_streams == {name for name in VERDICTS if not _checkable(name)}


@pytest.mark.parametrize("subject, example", _CELLS, ids=[f"{s}-{e}" for s, e in _CELLS])
def test_subject_verdict_on_example(subject, example):
    want = _expected(subject, example)
    if want == NOT_CHECKABLE_ON_CPU:
        with pytest.raises(NotCheckable, match="not checkable"):
            run_scenario(_SUBJECTS[subject].subject, EXAMPLES[example], device="cpu")
        return
    result = _run(subject, example)
    if want is PASS:
        assert result.passed, result.divergence.sentence
        assert result.checks > 0
        return
    kind, source = want
    d = result.divergence
    assert d is not None, f"{subject} passed {example}, expected {kind}/{source}"
    assert (d.kind, (d.source or {}).get("kind")) == (kind, source), d.sentence


@pytest.mark.parametrize("info", [i for i in BUILTIN_SUBJECTS if i.expected == EQUIVALENT], ids=lambda i: i.name)
def test_every_equivalent_subject_passes_every_example(info):
    failing = {name: _run(info.name, name).divergence for name in EXAMPLES}
    assert {k: v.sentence for k, v in failing.items() if v is not None} == {}


_CHECKABLE_DIVERGING = [i for i in BUILTIN_SUBJECTS if i.expected == DIVERGES and _checkable(i.name)]


@pytest.mark.parametrize("info", _CHECKABLE_DIVERGING, ids=lambda i: i.name)
def test_every_diverging_subject_diverges_on_some_example(info):
    assert any(not _run(info.name, name).passed for name in EXAMPLES)


@pytest.mark.parametrize("info", _CHECKABLE_DIVERGING, ids=lambda i: i.name)
def test_a_subject_diverges_only_on_examples_with_a_feature_it_declares(info):
    for name, scenario in EXAMPLES.items():
        if not _run(info.name, name).passed:
            assert features_of(scenario) & set(info.diverges_on), (
                f"{info.name} diverges on {name}, whose features {sorted(features_of(scenario))} "
                f"include none of {list(info.diverges_on)}"
            )


# ---- the sentences -------------------------------------------------------------------------


_STALE_CELLS = [
    (subject, example) for subject, example in _CELLS
    if isinstance(want := _expected(subject, example), tuple) and want[1] in STALE_SOURCES
]


@pytest.mark.parametrize("subject, example", _STALE_CELLS, ids=[f"{s}-{e}" for s, e in _STALE_CELLS])
def test_a_stale_cache_sentence_is_one_plain_sentence_naming_forward_and_layer(subject, example):
    d = _run(subject, example).divergence
    assert d.stale
    sentence = d.sentence
    assert "\n" not in sentence and sentence == sentence.strip()
    assert sentence.startswith("Stale cache: at ")
    assert sentence.endswith(".") and not sentence.endswith("..")
    # one sentence: no full stop before the end
    assert not re.search(r"\.\s", sentence[:-1])
    assert f"forward {d.forward} (" in sentence
    assert re.search(rf"\blayer {d.layer_id}\b", sentence)


@pytest.mark.parametrize(
    "subject, example, sentence",
    [
        (
            "pool-start-layer", "first-swa-layer-not-start",
            "Stale cache: at forward 2 (decode), layer 1, all live rows hold the rows of forward 1 "
            "(decode): a cached value was not refreshed for this forward.",
        ),
        (
            "pool-layer0", "pipeline-stage",
            "Stale cache: at forward 2 (decode), layer 1, all live rows hold the rows of forward 1 "
            "(decode): a cached value was not refreshed for this forward.",
        ),
        (
            "pool-start-layer", "two-batch-overlap",
            "Stale cache: at forward 1 (decode), micro-batch 0, layer 1, all live rows hold "
            "micro-batch 1's rows: one cache is shared by micro-batches whose layers interleave.",
        ),
        (
            "pool-start-layer", "in-place-change-mid-forward",
            "Stale cache: at forward 1 (decode), layer 1, 1 of 2 live rows hold the translation "
            "under the mapping before the relocate inside forward 1: the cache was not invalidated "
            "when the mapping changed.",
        ),
        (
            "unified-metadata", "multi-step-draft",
            "Stale cache: at forward 1 (draft), draft step 1, layer 0, all live rows hold the rows "
            "of draft step 0: the cache was not refreshed between draft steps.",
        ),
        (
            "unified-graph-assign", "graph-replay",
            "Stale cache: at forward 1 (decode), layer 0, all live rows hold the rows recorded at "
            "graph capture (forward 1): the captured layers read a tensor that the replay no "
            "longer updates.",
        ),
        (
            "unified-metadata", "ragged-extend",
            "Wrong rows: at forward 1 (extend), layer 0, 1 of 4 live rows hold the uniform "
            "repeat_interleave fallback: it gives every request 2 tokens, but their counts are "
            "[1, 3].",
        ),
    ],
)
def test_exact_diagnosis_sentences(subject, example, sentence):
    assert _run(subject, example).divergence.sentence == sentence


def test_the_indivisible_ragged_extend_reports_the_shape_error_where_it_happened_and_hints_the_fallback():
    d = _run("unified-metadata", "ragged-extend-indivisible").divergence
    assert d.kind == "raised"
    assert d.sentence.startswith("At forward 1 (extend), layer 0, swa_write_location raised RuntimeError: ")
    assert d.sentence.endswith(
        "; likely a uniform expansion such as repeat_interleave(n_tokens // n_reqs) met this ragged batch: "
        "it gives every request 1 token (2 in all), but the batch's token counts are [1, 2] (3 in all)."
    )


def test_a_skipped_idle_replay_init_reports_the_padding_row_on_a_live_ring_and_whose_rows_it_holds():
    d = _run("unified-graph-copy", "idle-replay-skips-init").divergence
    assert (d.forward, d.mode, d.layer_id) == (2, "idle", 0)
    assert d.sentence.startswith("Stale cache: at forward 2 (idle), layer 0, padding row 0 writes to ")
    assert d.sentence.endswith(
        ", which a live request owns, instead of the dummy slot: the padding holds the rows of forward 1 "
        "(decode): a cached value was not refreshed for this forward."
    )


# ---- the same verdicts whichever way the mapping reaches the subject -------------------------


_MAPPING_CHANGING = [name for name, scenario in EXAMPLES.items()
                     if any(e.op in ("register_mapping", "relocate") or e.mutation is not None for e in scenario.events)]
_MAPPING_CELLS = [(subject, example) for subject in _SUBJECTS if _checkable(subject) for example in _MAPPING_CHANGING]


@pytest.mark.parametrize("subject, example", _MAPPING_CELLS, ids=[f"{s}-{e}" for s, e in _MAPPING_CELLS])
def test_the_verdict_holds_when_mapping_rows_reach_the_subject_one_by_one(subject, example, monkeypatch):
    # every example's pool is small enough to be synced whole; here only the changed rows are
    monkeypatch.setattr(mappings, "ROWS_COPIED_WHOLE_BELOW", 0)
    result = run_scenario(_SUBJECTS[subject].subject, EXAMPLES[example], device="cpu", timeout_s=10)
    whole = _run(subject, example)
    assert result.checks == whole.checks
    assert (result.divergence and result.divergence.sentence) == (whole.divergence and whole.divergence.sentence)
