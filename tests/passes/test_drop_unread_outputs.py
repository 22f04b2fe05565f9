"""drop_unread_outputs: optional outputs nothing reads are omitted; read ones, graph outputs and
required outputs stay."""

from __future__ import annotations

import numpy as np

import hetflow
from hetflow.passes.drop_unread_outputs import drop_unread_outputs
from tests.passes.graphs import FLOAT, check_pass, model, node, weights

HIDDEN = 6


def _lstm_model(outputs: list[str], graph_outputs: list[str]):
    lstm = node("LSTM", ["x", "W", "R", "B"], outputs, hidden_size=HIDDEN)
    squeeze = node("Squeeze", ["y_h", "axis"], ["last"])
    initializers = {
        "W": weights(1, 4 * HIDDEN, 3),
        "R": weights(1, 4 * HIDDEN, HIDDEN),
        "B": weights(1, 8 * HIDDEN),
        "axis": np.array([0], np.int64),
    }
    return model([lstm, squeeze], [("x", FLOAT, [5, "N", 3])], [(name, FLOAT, None) for name in graph_outputs],
                 initializers)  # fmt: skip


def test_an_lstm_read_only_for_its_last_state_stops_writing_every_step():
    graph = check_pass(_lstm_model(["y", "y_h", "y_c"], ["last"]), drop_unread_outputs)
    assert graph.nodes[0].outputs == ["", "y_h", ""]
    assert "y" not in graph.values and "y_c" not in graph.values


def test_graph_outputs_stay():
    graph = check_pass(_lstm_model(["y", "y_h", "y_c"], ["last", "y"]), drop_unread_outputs)
    assert graph.nodes[0].outputs == ["y", "y_h", ""]


def test_unread_indices_of_a_max_pool_go_and_read_ones_stay():
    nodes = [
        node("MaxPool", ["x"], ["pooled", "unread"], kernel_shape=[2, 2]),
        node("MaxPool", ["x"], ["pooled2", "indices"], kernel_shape=[2, 2]),
        node("Cast", ["indices"], ["as_float"], to=FLOAT),
        node("Add", ["pooled", "pooled2"], ["sum"]),
        node("Add", ["sum", "as_float"], ["y"]),
    ]
    graph = check_pass(model(nodes, [("x", FLOAT, ["N", 2, 4, 4])], [("y", FLOAT, None)]), drop_unread_outputs)
    assert graph.nodes[0].outputs == ["pooled", ""]
    assert graph.nodes[1].outputs == ["pooled2", "indices"]


def test_required_outputs_stay_even_unread():
    nodes = [node("Split", ["x"], ["left", "unread_right"], axis=1), node("Relu", ["left"], ["y"])]
    graph = check_pass(model(nodes, [("x", FLOAT, ["N", 4])], [("y", FLOAT, None)]), drop_unread_outputs)
    assert graph.nodes[0].outputs == ["left", "unread_right"]


def test_sessions_drop_unread_outputs_by_default():
    session = hetflow.InferenceSession(_lstm_model(["y", "y_h", "y_c"], ["last"]))
    assert session.run(None, {"x": np.ones((5, 2, 3), np.float32)})[0].shape == (2, HIDDEN)
    assert [n.outputs for n in session.graph.nodes if n.op_type == "LSTM"] == [["", "y_h", ""]]
