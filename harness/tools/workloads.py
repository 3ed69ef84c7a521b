"""The fixed workloads the benchmarks time: steady decode of a given size, and the subject
driven through it alone, with no harness around its calls (the floor any checker of the
subject stands on)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from ..api import ForwardBatch, ForwardMode, ModelSpec
from ..reference import EngineState, Scenario, replay_events


def decode_scenario(layers: int = 43, batch: int = 64, forwards: int = 20, graph: bool = False) -> Scenario:
    forward = {"op": "forward", "requests": list(range(batch)), **({"graph": True} if graph else {})}
    return Scenario.from_dict({
        "config": {
            "start_layer": 0, "end_layer": layers, "sliding_window": 128,
            "num_req_slots": batch + 1, "full_pool_size": batch * (forwards + 1) + 1,
            "swa_pool_size": batch * (forwards + 1) + 1, "graph_batch_sizes": [batch],
        },
        "events": [{"op": "admit", "count": batch}] + [forward] * forwards,
    })


def subject_alone(subject_cls, scenario: Scenario, device: str = "cpu", compare: bool = False) -> Callable[[], int]:
    """The same lifecycle as the executor drives, with inputs prepared beforehand: a
    function that runs it and returns the calls made. With ``compare``, each answer is
    compared to the reference's rows (prepared beforehand too) with one ``torch.equal``,
    the least any checker does per answer; a mismatch raises."""
    config = scenario.config
    where = torch.device(device)
    state = EngineState(config)
    inputs, expected = [], []
    for plan in replay_events(state, scenario.events):
        inputs.append(plan.steps[0][0])
        expected.append(state.expected("target", inputs[-1], subject_cls.truth.value).to(where))
    mapping = state.mappings["target"].to(where)
    spec = ModelSpec.of(config, "target", where)
    layers = config.swa_layers
    tensors = [
        [t.to(where) for t in (i.req_slots, i.token_counts, i.positions, i.out_cache_loc, i.seq_lens, i.prefix_lens)]
        for i in inputs
    ]
    finish = torch.cuda.synchronize if where.type == "cuda" else (lambda: None)

    def run() -> int:
        subject = subject_cls(spec)
        subject.register_mapping(mapping)
        backend = SimpleNamespace()
        calls = 0
        for forward_id, (live, rows, (slots, counts, positions, locs, lens, prefixes)) in enumerate(
                zip(inputs, expected, tensors)):
            batch = ForwardBatch(forward_id, ForwardMode.DECODE, 0, backend, slots, counts, positions,
                                 locs, live.num_live, seq_lens=lens, seq_lens_cpu=live.seq_lens,
                                 extend_prefix_lens=prefixes)
            subject.init_forward_metadata(batch)
            for layer_id in layers:
                out = subject.swa_write_location(batch, layer_id)
                if compare and not torch.equal(out, rows):
                    raise AssertionError(f"{subject_cls.__name__}: forward {forward_id}, layer {layer_id} diverges")
                calls += 1
        finish()
        return calls

    return run
