"""Specification of what the subject API hands a subject (``swafuzz.api``).

The spec and the batch carry what SGLang's pool and ``ForwardBatch`` carry, computed from the
live engine state: a subject that derives its answer from them alone must match the
reference wherever the engine can take it.
"""

from __future__ import annotations

import pytest
import torch

from swafuzz import SUBJECT_API_VERSION, SUPPORTED_API_VERSIONS, Subject, SubjectError, Truth, run_scenario
from swafuzz.subjects.builtin import PoolStartLayer, Uncached, UncachedRing
from swafuzz.run.executor import check_subject
from swafuzz.reference import Scenario

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick


def _scenario(config: dict, events: list[dict]) -> Scenario:
    return Scenario.from_dict({"config": config, "events": events})


class _RingFromLengths(Subject):
    """Ring rows from the request lengths alone, never reading ``positions``: token ``j``
    of a request sits at ``extend_prefix_lens + j``, and the request ends at ``seq_lens``
    (outside target-verify). Right only if those fields tell the truth."""

    truth = Truth.RING
    seen: list[tuple[str, list[int], list[int], list[int], int]] = []

    def swa_write_location(self, batch, layer_id):
        counts = batch.extend_seq_lens.to(torch.int64)
        prefix = batch.extend_prefix_lens
        if not batch.mode.value == "verify":
            assert torch.equal(batch.seq_lens, prefix + counts), "seq_lens is not prefix + new tokens"
        assert torch.equal(batch.seq_lens_cpu, batch.seq_lens.cpu())
        assert batch.seq_lens_sum == int(batch.seq_lens.sum())
        starts = torch.cumsum(counts, 0) - counts
        token_request = torch.repeat_interleave(torch.arange(batch.batch_size), counts)
        offset = torch.arange(int(counts.sum())) - starts[token_request]
        positions = prefix[token_request] + offset
        slots = batch.req_pool_indices[token_request]
        rows = (slots * self.spec.ring + positions % self.spec.ring).to(torch.int32)
        padding = torch.zeros(batch.num_tokens - rows.shape[0], dtype=torch.int32)
        type(self).seen.append((batch.mode.value, prefix.tolist(), counts.tolist(), batch.seq_lens.tolist(),
                                batch.batch_size))
        return torch.cat([rows, padding])


@pytest.fixture
def ring_from_lengths():
    _RingFromLengths.seen = []
    return _RingFromLengths


def test_extend_over_a_cached_prefix_hands_the_prefix_and_the_full_length(ring_from_lengths):
    scenario = _scenario({"start_layer": 0, "end_layer": 1, "sliding_window": 16}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [5, 2]},
        {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [3, 4]},
        {"op": "forward", "requests": [1, 0]},
    ])
    result = run_scenario(ring_from_lengths, scenario)
    assert result.passed, result.divergence and result.divergence.sentence
    assert ring_from_lengths.seen == [
        ("extend", [0, 0], [5, 2], [5, 2], 2),
        ("extend", [5, 2], [3, 4], [8, 6], 2),
        ("decode", [6, 8], [1, 1], [7, 9], 2),
    ]


def test_verify_seq_lens_leave_the_draft_tokens_out_as_sglang_does(ring_from_lengths):
    scenario = _scenario({"start_layer": 0, "end_layer": 1, "speculative": True, "num_draft_tokens": 3}, [
        {"op": "admit", "count": 1},
        {"op": "forward", "mode": "extend", "requests": [0], "tokens": [4]},
        {"op": "forward", "mode": "verify", "requests": [0]},
    ])
    result = run_scenario(ring_from_lengths, scenario)
    assert result.passed, result.divergence and result.divergence.sentence
    assert ring_from_lengths.seen[-1] == ("verify", [4], [3], [4], 1)


def test_multistep_draft_decode_advances_the_lengths_with_the_positions(ring_from_lengths):
    scenario = _scenario({"start_layer": 0, "end_layer": 1, "speculative": True, "num_draft_tokens": 2}, [
        {"op": "admit", "count": 1},
        {"op": "forward", "mode": "extend", "requests": [0], "tokens": [2]},
        {"op": "forward", "mode": "draft", "requests": [0], "steps": 3},
    ])
    result = run_scenario(ring_from_lengths, scenario)
    assert result.passed, result.divergence and result.divergence.sentence
    assert [seen[1:4] for seen in ring_from_lengths.seen[1:]] == [([2], [1], [3]), ([3], [1], [4]), ([4], [1], [5])]


def test_graph_replay_hands_the_live_lengths_and_pads_request_rows_with_one_token_on_no_prefix():
    seen = []

    class RecordsReplay(UncachedRing):
        def init_replay_metadata(self, batch):
            seen.append((batch.extend_prefix_lens.tolist(), batch.seq_lens.tolist(), batch.seq_lens_cpu.tolist(),
                         batch.batch_size))

    scenario = _scenario({"start_layer": 0, "end_layer": 1, "graph_batch_sizes": [4]}, [
        {"op": "admit", "count": 2},
        {"op": "forward", "mode": "extend", "requests": [0, 1], "tokens": [3, 1]},
        {"op": "forward", "requests": [0, 1], "graph": True},
        {"op": "forward", "requests": [1, 0], "graph": True},
    ])
    result = run_scenario(RecordsReplay, scenario)
    assert result.passed, result.divergence and result.divergence.sentence
    assert seen == [([3, 1, 0, 0], [4, 2, 1, 1], [4, 2, 1, 1], 4), ([2, 4, 0, 0], [3, 5, 1, 1], [3, 5, 1, 1], 4)]


class _PoolFirstSwaLayer(PoolStartLayer):
    """The pool cache refreshed where real code could find its stage's first SWA layer."""

    def refresh_layer(self) -> int:
        return self.spec.first_swa_layer


_FIRST_LAYER_NOT_SWA = _scenario({"start_layer": 2, "end_layer": 5, "non_swa_layers": [2]}, [
    {"op": "admit", "count": 1},
    {"op": "forward", "requests": [0]},
    {"op": "forward", "requests": [0]},
])


def test_the_spec_names_the_stages_swa_layers_and_the_first_of_them():
    seen = []

    class Records(Uncached):
        def __init__(self, spec):
            super().__init__(spec)
            seen.append((spec.start_layer, spec.swa_layers, spec.first_swa_layer, spec.is_swa_layer(2)))

    assert run_scenario(Records, _FIRST_LAYER_NOT_SWA).passed
    assert seen == [(2, (3, 4), 3, False)]


def test_a_pool_cache_refreshed_at_the_first_swa_layer_survives_a_stage_whose_first_layer_is_not_swa():
    assert not run_scenario(PoolStartLayer, _FIRST_LAYER_NOT_SWA).passed
    result = run_scenario(_PoolFirstSwaLayer, _FIRST_LAYER_NOT_SWA)
    assert result.passed, result.divergence and result.divergence.sentence


# ---- versions ------------------------------------------------------------------------------


def test_version_2_is_current_and_version_1_is_still_run():
    assert SUBJECT_API_VERSION == 2
    assert SUPPORTED_API_VERSIONS == (1, 2)


def test_a_version_1_subject_runs_unchanged_and_can_still_be_found_wrong():
    class Version1(Uncached):
        api_version = 1

    class Version1Stale(PoolStartLayer):
        api_version = 1

    assert check_subject(Version1) is Version1
    assert run_scenario(Version1, _FIRST_LAYER_NOT_SWA).passed
    divergence = run_scenario(Version1Stale, _FIRST_LAYER_NOT_SWA).divergence
    assert divergence is not None and divergence.source["kind"] == "earlier_forward"


@pytest.mark.parametrize("version, newer", [
    (3, True), (0, False), (-1, False), (None, False), ("1", False), (True, False), (2.0, False),
])
def test_an_unknown_api_version_is_refused_naming_the_versions_run(version, newer):
    class Unknown(Uncached):
        api_version = version

    with pytest.raises(SubjectError) as refused:
        check_subject(Unknown)
    message = str(refused.value)
    assert message.startswith(f"Unknown targets subject API version {version!r}; this harness runs versions 1, 2")
    assert ("a newer swafuzz is needed" in message) == newer
