"""A Concat whose inputs the memory plan places in its output copies nothing in a run: the estimate
prices only what it still copies, and validation times it as a run calls it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from hetflow.estimate.predict import concat_copy_cost, estimate, open_session
from hetflow.estimate.validate import _placed_concat_call, layer_seconds, random_feeds
from hetflow.ops.cost import node_costs
from hetflow.runtime.executor import memory_plan
from tests.helpers import make_model

CHANNELS, SIZE = 16, 24


def _branches_model(concat_inputs: list[str]):
    """Two 1x1 Convs of x (8 and 16 kernels), a Concat ``c`` of ``concat_inputs`` along the channels and
    its Relu (the arena holds ``c``; the model's outputs are copied out of it)."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((8, CHANNELS, 1, 1)).astype(np.float32),
        "w2": rng.standard_normal((16, CHANNELS, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv_a"),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="conv_b"),
        helper.make_node("Concat", concat_inputs, ["c"], name="concat", axis=1),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    channels = {"a": 8, "b": 16, "x": CHANNELS}
    out = sum(channels[name] for name in concat_inputs)
    outputs = [("y", TensorProto.FLOAT, [1, out, SIZE, SIZE])]
    outputs += [(name, TensorProto.FLOAT, None) for name in ("a", "b") if name not in concat_inputs]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])], outputs, weights)


@pytest.fixture(scope="module")
def placed_session(zoo_home):
    return open_session(_branches_model(["a", "b"]), "cpu")


def _concat_cost(session, planned):
    plan = session.plan_for({})
    node, cost = next((n, c) for n, c in node_costs(plan.graph) if n.op_type == "Concat")
    return concat_copy_cost(node, cost, planned, plan.graph), cost


def test_placed_inputs_cost_no_copy(placed_session):
    planned = memory_plan(placed_session.plan_for({}), ["y"])
    assert planned is not None and planned.concat_parts.get("a") == "c" and planned.concat_parts.get("b") == "c"
    work, cost = _concat_cost(placed_session, planned)
    assert cost.bytes_read > 0
    assert work.bytes_read == 0 and work.bytes_written == 0 and work.loops == 0


def test_inputs_left_in_place_keep_their_copy(zoo_home):
    # The graph's input cannot be written by a producer into the Concat's output: it is copied.
    session = open_session(_branches_model(["x", "a"]), "cpu")
    planned = memory_plan(session.plan_for({}), ["y", "b"])
    placed = planned.concat_parts
    work, _ = _concat_cost(session, planned)
    x_bytes = CHANNELS * SIZE * SIZE * 4
    assert placed == {"a": "c"}  # the Conv's result lies in place; the graph's input cannot
    assert work.bytes_read == work.bytes_written == x_bytes
    assert work.loops == 1


def test_estimate_prices_a_placed_concat_below_its_copy(placed_session, quick_profile):
    placed = estimate(placed_session, quick_profile)
    copied = estimate(open_session(_branches_model(["x", "a"]), "cpu"), quick_profile)
    in_place = next(layer for layer in placed.layers if layer.op == "Concat")
    copying = next(layer for layer in copied.layers if layer.op == "Concat")
    assert in_place.predicted_ms < copying.predicted_ms


class _Recording:
    """A stand-in kernel that records the arrays and ``out`` it is called with, then concatenates."""

    def __init__(self):
        self.calls = []

    def fn(self, node, inputs, out=None):
        self.calls.append((list(inputs), list(out)))
        from hetflow.devices.cpu.kernels.tensor import concat

        return concat(node, inputs, out)


def test_placed_concat_call_hands_the_slices_over(placed_session):
    plan = placed_session.plan_for({})
    node = next(n for n in plan.graph.nodes if n.op_type == "Concat")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 8, SIZE, SIZE)).astype(np.float32)
    b = rng.standard_normal((1, 16, SIZE, SIZE)).astype(np.float32)
    kernel = _Recording()
    call = _placed_concat_call(kernel, node, [a, b], np.concatenate([a, b], axis=1), [True, False])
    (result,) = call()
    np.testing.assert_array_equal(result, np.concatenate([a, b], axis=1))
    inputs, out = kernel.calls[-1]
    assert inputs[0] is out[1] and out[2] is None and inputs[1] is b  # a lies in place, b is copied


def test_layer_seconds_times_the_placed_concat(placed_session):
    seconds = layer_seconds(placed_session, random_feeds(placed_session, 1), min_time=0.001, rounds=1)
    assert set(seconds) == {step.node.name for step in placed_session.plan_for({}).steps}
    assert all(s > 0 for s in seconds.values())
