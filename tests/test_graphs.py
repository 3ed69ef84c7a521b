"""Specification of the CPU graph model (``swafuzz.run.graphs.RecordedGraph``).

Like a CUDA graph: capture records tensor operations on the tensor objects they touched;
replay re-runs them on those same objects (by address) and writes into the outputs made
at capture. Python code, attribute lookups included, runs at capture only.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from swafuzz.run.graphs import GraphCaptureError, RecordedGraph, make_graph

pytestmark = pytest.mark.quick  # the contributors' subset: python3 -m pytest -m quick


def _t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_make_graph_on_the_cpu_is_the_recorded_model():
    assert isinstance(make_graph(torch.device("cpu")), RecordedGraph)


def test_capture_runs_the_work_once_like_eager_code():
    x, y = _t(1, 2, 3), _t(10, 20, 30)
    graph = RecordedGraph()
    with graph.capture():
        out = x * 2 + y
    assert out.tolist() == [12, 24, 36]


def test_replay_reads_new_values_copied_into_captured_inputs_and_updates_the_captured_output():
    x, y = _t(1, 2, 3), _t(10, 20, 30)
    graph = RecordedGraph()
    with graph.capture():
        out = x * 2 + y
    captured = out
    x.copy_(_t(5, 5, 5))
    y[0] = 0
    graph.replay()
    assert out is captured
    assert out.tolist() == [10, 30, 40]
    x.fill_(0)
    graph.replay()
    assert out.tolist() == [0, 20, 30]


def test_replay_without_input_changes_reproduces_the_capture():
    x = _t(4, 5)
    graph = RecordedGraph()
    with graph.capture():
        out = (x + 1) * (x - 1)
    out.fill_(-7)  # a write outside the graph is not part of it
    graph.replay()
    assert out.tolist() == [15, 24]


def test_replay_of_an_index_lookup_follows_in_place_changes_of_table_and_indices():
    mapping = _t(0, 7, 8, 9)
    loc = _t(1, 3)
    graph = RecordedGraph()
    with graph.capture():
        rows = mapping[loc].to(torch.int32)
    mapping[3] = 42
    loc.copy_(_t(3, 2))
    graph.replay()
    assert rows.dtype == torch.int32
    assert rows.tolist() == [42, 8]


def test_replay_reruns_in_place_writes_into_a_captured_sink():
    x = _t(1, 2)
    sink = torch.empty(2, dtype=torch.int64)
    graph = RecordedGraph()
    with graph.capture():
        sink.copy_(x * 3)
    x.copy_(_t(4, 5))
    graph.replay()
    assert sink.tolist() == [12, 15]


def test_a_view_taken_at_capture_keeps_following_its_base():
    x = _t(1, 2, 3, 4)
    graph = RecordedGraph()
    with graph.capture():
        out = x[1:] * 10
    x.copy_(_t(0, 6, 7, 8))
    graph.replay()
    assert out.tolist() == [60, 70, 80]


def test_re_pointing_an_attribute_after_capture_does_not_change_what_replay_reads():
    capture_time, later = _t(1, 2), _t(100, 200)
    metadata = SimpleNamespace(rows=capture_time)
    graph = RecordedGraph()
    with graph.capture():
        out = metadata.rows + 1
    metadata.rows = later  # an "assign" merge: the field now names another tensor
    graph.replay()
    assert out.tolist() == [2, 3]
    capture_time.copy_(_t(5, 6))  # a "copy" merge: written into the captured tensor
    graph.replay()
    assert out.tolist() == [6, 7]


def test_python_branches_are_decided_at_capture_only():
    flag = {"refresh": True}
    fresh, cached = _t(1), _t(9)
    graph = RecordedGraph()
    with graph.capture():
        out = (fresh if flag["refresh"] else cached) * 2
    flag["refresh"] = False
    fresh.fill_(3)
    graph.replay()
    assert out.tolist() == [6]


@pytest.mark.parametrize(
    "sync",
    [
        lambda t: t.sum().item(),
        lambda t: int(t[0]),
        lambda t: bool((t > 0).any()),
        lambda t: torch.equal(t, t),
        lambda t: t.nonzero(),
    ],
    ids=["item", "int", "bool", "equal", "nonzero"],
)
def test_reading_a_device_value_on_the_host_inside_capture_raises(sync):
    x = _t(1, 2, 3)
    graph = RecordedGraph()
    with pytest.raises(GraphCaptureError, match="during graph capture"):
        with graph.capture():
            sync(x)


def test_item_outside_capture_is_allowed():
    x = _t(1, 2, 3)
    graph = RecordedGraph()
    with graph.capture():
        out = x + 1
    assert out.sum().item() == 9


def test_a_shape_that_changes_at_replay_raises():
    keep, values = torch.tensor([True, False, True]), _t(5, 6, 7)
    graph = RecordedGraph()
    with graph.capture():
        out = values.masked_select(keep)
    assert out.tolist() == [5, 7]
    keep.copy_(torch.tensor([True, True, True]))
    with pytest.raises(GraphCaptureError, match="shape"):
        graph.replay()


@pytest.mark.parametrize(
    "expand",
    [lambda values, counts: values.repeat_interleave(counts), lambda values, counts: values[counts > 1]],
    ids=["repeat_interleave without output_size", "boolean mask"],
)
def test_ops_whose_output_size_depends_on_values_are_refused_at_capture(expand):
    counts, values = _t(1, 2), _t(5, 6)
    graph = RecordedGraph()
    with pytest.raises(GraphCaptureError, match="during graph capture"):
        with graph.capture():
            expand(values, counts)


def test_a_fixed_output_size_keeps_a_ragged_expansion_replayable():
    counts, values = _t(1, 2), _t(5, 6)
    graph = RecordedGraph()
    with graph.capture():
        out = values.repeat_interleave(counts, output_size=3)
    counts.copy_(_t(2, 1))
    graph.replay()
    assert out.tolist() == [5, 5, 6]


def test_two_graphs_replay_independently():
    x = _t(1)
    first, second = RecordedGraph(), RecordedGraph()
    with first.capture():
        a = x + 1
    with second.capture():
        b = x + 2
    x.fill_(10)
    first.replay()
    assert (a.tolist(), b.tolist()) == ([11], [3])
    second.replay()
    assert b.tolist() == [12]


def test_replay_writes_back_every_output_of_an_op_with_several():
    x = _t(3, 9, 4)
    graph = RecordedGraph()
    with graph.capture():
        low, high = torch.aminmax(x)
        values, indices = x.sort()
    x.copy_(_t(8, 1, 5))
    graph.replay()
    assert (low.item(), high.item()) == (1, 8)
    assert (values.tolist(), indices.tolist()) == ([1, 5, 8], [1, 2, 0])
