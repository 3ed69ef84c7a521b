"""On a GPU, graphs and streams are real: the CPU model must agree with them, and stream
ordering bugs must show. Skipped where torch sees no GPU (``scripts/gpu-check`` runs them)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from swafuzz import run_scenario
from swafuzz.search.fuzz import fuzz
from swafuzz.subjects.registry import BUILTIN_SUBJECTS, resolve_subject
from swafuzz.strategies.examples import EXAMPLES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (scripts/gpu-check)"),
]

HOST_CHECKABLE = [info for info in BUILTIN_SUBJECTS if not info.subject.requires]
DELAY_CYCLES = 50_000_000  # tens of milliseconds on current GPUs: far longer than a layer


def _outcome(result):
    d = result.divergence
    return None if d is None else (d.kind, (d.source or {}).get("kind"), d.forward, d.layer_id)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
@pytest.mark.parametrize("info", HOST_CHECKABLE, ids=lambda i: i.name)
def test_gpu_run_agrees_with_the_cpu_model(info, example):
    cpu = run_scenario(info.subject, EXAMPLES[example], device="cpu")
    gpu = run_scenario(info.subject, EXAMPLES[example], device="cuda")
    assert _outcome(gpu) == _outcome(cpu)


def test_real_graph_replay_finds_assign_listed_rows_and_not_copy_listed_rows():
    scenario = EXAMPLES["graph-replay"]
    assert run_scenario(resolve_subject("unified-graph-assign").subject, scenario, device="cuda").divergence
    assert run_scenario(resolve_subject("unified-graph-copy").subject, scenario, device="cuda").passed


def test_unsynced_side_stream_read_diverges_once_the_producer_is_delayed():
    subject = resolve_subject("stream-unsynced").subject
    scenario = EXAMPLES["first-swa-layer-not-start"]
    result = run_scenario(subject, scenario, device="cuda", stream_delay_cycles=DELAY_CYCLES)
    assert result.divergence is not None and result.divergence.kind == "wrong_rows"


def test_stream_sanitizer_reports_the_unsynced_read_as_a_race():
    program = (
        "from swafuzz.run.devices import enable_stream_sanitizer; enable_stream_sanitizer();"
        "from harness import run_scenario; from swafuzz.subjects.registry import resolve_subject;"
        "from swafuzz.strategies.examples import EXAMPLES;"
        "r = run_scenario(resolve_subject('stream-unsynced').subject, EXAMPLES['pipeline-stage'], device='cuda');"
        "print(r.divergence.kind if r.divergence else 'passed')"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "race", out.stdout + out.stderr


def test_step_keyed_survives_fuzzing_on_the_gpu():
    result = fuzz(resolve_subject("step-keyed-capture"), settings="ci", device="cuda", max_examples=100)
    assert result.divergence is None and result.examples == 100
