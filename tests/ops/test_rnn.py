"""LSTM, GRU and RNN: shape inference, cost and the CPU kernel against ONNX Runtime.

ONNX Runtime is the oracle. Where it cannot serve (layout=1 and float64 are not implemented in its CPU
kernels), the test says which reference it uses instead.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hetflow.devices.cpu.kernels.jit_gate_panels import packed_gates
from hetflow.devices.cpu.table import CPU_KERNELS
from hetflow.errors import InvalidModelError
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.base import GemmDims, TensorInfo
from hetflow.ops.rnn import GRUAttrs, LSTMAttrs, RNNAttrs, resolve_activations
from hetflow.runtime.session import InferenceSession

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import onnxruntime as ort

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
ATTRS = {"LSTM": LSTMAttrs, "GRU": GRUAttrs, "RNN": RNNAttrs}
INPUT_NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
OUTPUT_NAMES = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
F32 = np.float32


# -- helpers ------------------------------------------------------------------------------------------
def make_inputs(
    op: str,
    *,
    seq: int = 4,
    batch: int = 3,
    input_size: int = 5,
    hidden: int = 7,
    directions: int = 1,
    bias: bool = True,
    lengths: list[int] | None = None,
    initial: bool = False,
    peepholes: bool = False,
    layout: int = 0,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random inputs for one node, keyed by their ONNX input names (only the present ones)."""
    rng = np.random.default_rng(seed)
    gates = GATES[op]

    def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(F32)

    x_shape = (seq, batch, input_size) if layout == 0 else (batch, seq, input_size)
    state_shape = (directions, batch, hidden) if layout == 0 else (batch, directions, hidden)
    feeds = {
        "X": rand(*x_shape),
        "W": rand(directions, gates * hidden, input_size, scale=0.4),
        "R": rand(directions, gates * hidden, hidden, scale=0.4),
    }
    if bias:
        feeds["B"] = rand(directions, 2 * gates * hidden, scale=0.3)
    if lengths is not None:
        feeds["sequence_lens"] = np.array(lengths, dtype=np.int32)
    if initial:
        feeds["initial_h"] = rand(*state_shape, scale=0.5)
        if op == "LSTM":
            feeds["initial_c"] = rand(*state_shape, scale=0.5)
    if peepholes:
        feeds["P"] = rand(directions, 3 * hidden, scale=0.3)
    return feeds


def make_model(
    op: str, feeds: dict[str, np.ndarray], outputs: list[str], opset: int = 22, **attrs: object
) -> onnx.ModelProto:
    """A one-node model; ``feeds`` become graph inputs, an output named "" is omitted by the node.

    ``hidden_size`` defaults to R's last dimension (ONNX Runtime insists on it although the spec leaves
    it optional); pass ``hidden_size=None`` to leave it out.
    """
    attrs.setdefault("hidden_size", feeds["R"].shape[-1])
    if attrs["hidden_size"] is None:
        del attrs["hidden_size"]
    last = max(INPUT_NAMES.index(name) for name in feeds)
    node_inputs = [name if name in feeds else "" for name in INPUT_NAMES[: last + 1]]
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
        for name, array in feeds.items()
    ]
    elem = helper.np_dtype_to_tensor_dtype(feeds["X"].dtype)
    graph_outputs = [helper.make_tensor_value_info(name, elem, None) for name in outputs if name]
    node = helper.make_node(op, node_inputs, outputs, **attrs)
    graph = helper.make_graph([node], f"{op.lower()}_test", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # the newest IR version the installed onnxruntime reads
    return model


def with_weights(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Make W, R and B of ``make_model``'s model initializers (in place, as a trained model holds them);
    returns the feeds left to give."""
    weights = {name: feeds[name] for name in ("W", "R", "B") if name in feeds}
    kept = [value for value in model.graph.input if value.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(array, name) for name, array in weights.items())
    return {name: array for name, array in feeds.items() if name not in weights}


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_hetflow(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return InferenceSession(model).run(None, feeds)


def assert_close(
    actual: list[np.ndarray], expected: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def check_against_ort(
    op: str, feeds: dict[str, np.ndarray], outputs: list[str] | None = None, **attrs: object
) -> list[np.ndarray]:
    outputs = outputs or OUTPUT_NAMES[op]
    actual = run_hetflow(make_model(op, feeds, outputs, **attrs), feeds)
    ort_attrs = {**attrs, "hidden_size": feeds["R"].shape[-1]}
    assert_close(actual, run_ort(make_model(op, feeds, outputs, **ort_attrs), feeds))
    return actual


# -- kernel vs ONNX Runtime ---------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions_with_initial_states(op: str, direction: str) -> None:
    directions = 2 if direction == "bidirectional" else 1
    feeds = make_inputs(op, directions=directions, initial=True)
    check_against_ort(op, feeds, direction=direction, hidden_size=7)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_defaults_without_bias_or_hidden_size(op: str) -> None:
    feeds = make_inputs(op, bias=False, batch=1, hidden=4, input_size=3)
    check_against_ort(op, feeds, hidden_size=None)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_unequal_sequence_lengths(op: str, direction: str) -> None:
    # Past its length an element writes zeros to Y and keeps its last valid state for Y_h / Y_c; the
    # reverse direction reads each element backward from its own last step.
    directions = 2 if direction == "bidirectional" else 1
    feeds = make_inputs(op, seq=5, batch=4, directions=directions, lengths=[5, 2, 3, 1], initial=True)
    y = check_against_ort(op, feeds, direction=direction)[0]
    assert not y[2:, :, 1].any() and not y[3:, :, 2].any()
    assert y[1, :, 1].all()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_zero_sequence_length_gives_zero_states(op: str) -> None:
    # NOTE: ONNX Runtime reports zeros (not initial_h) as the final state of a length-0 element.
    feeds = make_inputs(op, seq=3, batch=3, directions=2, lengths=[3, 0, 2], initial=True)
    outputs = check_against_ort(op, feeds, direction="bidirectional")
    for state in outputs[1:]:
        assert not state[:, 1].any()


def test_lstm_sequence_lengths_equal_to_seq_take_the_fast_path() -> None:
    feeds = make_inputs("LSTM", seq=4, batch=2, lengths=[4, 4], initial=True)
    without = {k: v for k, v in feeds.items() if k != "sequence_lens"}
    model = make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"])
    assert_close(
        run_hetflow(model, feeds), run_ort(make_model("LSTM", without, OUTPUT_NAMES["LSTM"]), without)
    )


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_matches_layout_0_transposed(op: str, direction: str) -> None:
    # ONNX Runtime's CPU kernels reject layout=1, so the oracle is ONNX Runtime on the layout-0 node
    # fed the transposed inputs, its outputs transposed back.
    directions = 2 if direction == "bidirectional" else 1
    batch_first = make_inputs(
        op, seq=4, batch=3, directions=directions, lengths=[4, 1, 3], initial=True, layout=1
    )
    seq_first = dict(batch_first)
    seq_first["X"] = batch_first["X"].transpose(1, 0, 2).copy()
    for name in ("initial_h", "initial_c"):
        if name in batch_first:
            seq_first[name] = batch_first[name].transpose(1, 0, 2).copy()
    outputs = OUTPUT_NAMES[op]
    expected = run_ort(make_model(op, seq_first, outputs, direction=direction), seq_first)
    expected = [expected[0].transpose(2, 0, 1, 3)] + [s.transpose(1, 0, 2) for s in expected[1:]]
    actual = run_hetflow(make_model(op, batch_first, outputs, direction=direction, layout=1), batch_first)
    assert_close(actual, expected)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_clip_bounds_gate_pre_activations(op: str) -> None:
    feeds = make_inputs(op, directions=2, initial=True)
    clipped = check_against_ort(op, feeds, direction="bidirectional", clip=0.25)
    unclipped = run_hetflow(make_model(op, feeds, OUTPUT_NAMES[op], direction="bidirectional"), feeds)
    assert not np.allclose(clipped[0], unclipped[0])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes_initial_cell_and_clip(direction: str) -> None:
    directions = 2 if direction == "bidirectional" else 1
    feeds = make_inputs("LSTM", directions=directions, initial=True, peepholes=True, lengths=[4, 2, 3])
    check_against_ort("LSTM", feeds, direction=direction, clip=0.6)


def test_lstm_input_forget_couples_gates() -> None:
    feeds = make_inputs("LSTM", initial=True, peepholes=True)
    coupled = check_against_ort("LSTM", feeds, input_forget=1)
    separate = run_hetflow(make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"]), feeds)
    assert not np.allclose(coupled[2], separate[2])


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru_linear_before_reset(linear_before_reset: int, direction: str) -> None:
    directions = 2 if direction == "bidirectional" else 1
    feeds = make_inputs("GRU", directions=directions, initial=True, lengths=[4, 3, 1])
    check_against_ort("GRU", feeds, direction=direction, linear_before_reset=linear_before_reset)


@pytest.mark.parametrize(
    ("op", "outputs"),
    [
        ("LSTM", ["", "", "Y_c"]),
        ("LSTM", ["Y", "", ""]),
        ("LSTM", ["", "Y_h"]),
        ("LSTM", ["Y"]),
        ("GRU", ["", "Y_h"]),
        ("GRU", ["Y", ""]),
        ("RNN", ["Y"]),
    ],
)
def test_omitted_outputs(op: str, outputs: list[str]) -> None:
    feeds = make_inputs(op, directions=2, initial=True, lengths=[4, 2, 3])
    check_against_ort(op, feeds, outputs, direction="bidirectional")


def test_kernel_returns_none_for_omitted_outputs() -> None:
    feeds = make_inputs("LSTM", batch=2)
    node = Node("LSTM", "lstm", ["X", "W", "R", "B"], ["", "", "Y_c"], LSTMAttrs(hidden_size=7))
    kernel = CPU_KERNELS.lookup(node)
    assert kernel is not None
    y, y_h, y_c = kernel.fn(node, [feeds["X"], feeds["W"], feeds["R"], feeds["B"]])
    assert y is None and y_h is None
    assert y_c is not None and y_c.shape == (1, 2, 7) and y_c.dtype == F32


@pytest.mark.parametrize(
    ("op", "activations", "alpha", "beta"),
    [
        ("LSTM", ["HardSigmoid", "Elu", "Softsign"], [], []),
        ("LSTM", ["hardsigmoid", "tanh", "LeakyRelu"], [0.3, 0.2], [0.4]),
        ("LSTM", ["Sigmoid", "ScaledTanh", "Softplus"], [0.8], [1.5]),
        ("GRU", ["Sigmoid", "Relu", "HardSigmoid", "Softsign"], [0.25], [0.45]),
        ("GRU", ["Sigmoid", "Affine", "Sigmoid", "ThresholdedRelu"], [0.5, 0.1], [0.2]),
        ("RNN", ["Relu"], [], []),
        ("RNN", ["Elu", "LeakyRelu"], [0.5, 0.1], []),
        ("RNN", ["ScaledTanh", "HardSigmoid"], [1.5, 0.3], [0.7, 0.4]),
    ],
)
def test_activations_with_alpha_and_beta(
    op: str, activations: list[str], alpha: list[float], beta: list[float]
) -> None:
    # Values go, in list order, to the functions that take them (ONNX Runtime's reading of the spec).
    directions = len(activations) // {"LSTM": 3, "GRU": 2, "RNN": 1}[op]
    direction = "bidirectional" if directions == 2 else "forward"
    feeds = make_inputs(op, directions=directions, initial=True)
    attrs: dict[str, object] = {"activations": activations, "direction": direction}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check_against_ort(op, feeds, **attrs)


def test_rnn_one_direction_uses_the_first_of_two_activations() -> None:
    feeds = make_inputs("RNN")
    check_against_ort("RNN", feeds, activations=["Relu", "Tanh"])


@pytest.mark.parametrize(
    ("name", "alpha", "beta"),
    [("ThresholdedRelu", [1.0], []), ("Affine", [1.0], [0.0]), ("ScaledTanh", [1.0], [1.0])],
)
def test_activation_defaults_follow_the_onnx_operators(
    name: str, alpha: list[float], beta: list[float]
) -> None:
    # NOTE: ONNX Runtime defaults these to 0 (it only knows LeakyRelu/HardSigmoid/Elu defaults); the
    # spec says "the same as of corresponding ONNX operators", so hetflow without values must equal
    # ONNX Runtime given those values explicitly.
    feeds = make_inputs("RNN", initial=True)
    ours = run_hetflow(make_model("RNN", feeds, ["Y", "Y_h"], activations=[name]), feeds)
    attrs: dict[str, object] = {"activations": [name], "activation_alpha": alpha}
    if beta:
        attrs["activation_beta"] = beta
    assert_close(ours, run_ort(make_model("RNN", feeds, ["Y", "Y_h"], **attrs), feeds))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float16_and_float64_keep_their_dtype(op: str) -> None:
    # ONNX Runtime has no float64 kernels for these ops: float64 is checked against its float32 run.
    feeds = make_inputs(op, directions=2, initial=True, lengths=[4, 1, 2])
    expected = run_ort(make_model(op, feeds, OUTPUT_NAMES[op], direction="bidirectional"), feeds)
    for dtype, tolerance in ((np.float64, 1e-5), (np.float16, 2e-2)):
        cast = {k: v.astype(dtype) if v.dtype == F32 else v for k, v in feeds.items()}
        actual = run_hetflow(make_model(op, cast, OUTPUT_NAMES[op], direction="bidirectional"), cast)
        for got, want in zip(actual, expected):
            assert got.dtype == dtype
            np.testing.assert_allclose(got.astype(F32), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_odd_sizes_and_larger_batch(op: str) -> None:
    feeds = make_inputs(
        op,
        seq=3,
        batch=9,
        input_size=1,
        hidden=11,
        directions=2,
        initial=True,
        lengths=[3, 1, 2, 3, 3, 2, 1, 1, 3],
    )
    check_against_ort(op, feeds, direction="bidirectional", hidden_size=11)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_opset_7_model(op: str) -> None:
    # layout (opset 14) is the only difference; older nodes run unchanged.
    feeds = make_inputs(op, initial=True)
    model = make_model(op, feeds, OUTPUT_NAMES[op], opset=7)
    assert_close(run_hetflow(model, feeds), run_ort(model, feeds))


# -- shape inference ----------------------------------------------------------------------------------
def infer(
    op: str, shapes: dict[str, tuple], outputs: list[str] | None = None, dtype: type = F32, **attrs: object
) -> list[TensorInfo]:
    """Run the op definition's shape inference on a node whose inputs have ``shapes``."""
    last = max(INPUT_NAMES.index(name) for name in shapes)
    names = [name if name in shapes else "" for name in INPUT_NAMES[: last + 1]]
    infos = [
        None
        if not name
        else TensorInfo(shapes[name], np.dtype(np.int32 if name == "sequence_lens" else dtype))
        for name in names
    ]
    node = Node(op, "n", names, outputs or OUTPUT_NAMES[op], ATTRS[op](**attrs))
    return registry.get(op).infer(node, infos, [None] * len(infos))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_infer_symbolic_batch(op: str) -> None:
    g = GATES[op]
    shapes = {
        "X": ("T", "N", 5),
        "W": (2, g * 7, 5),
        "R": (2, g * 7, 7),
        "sequence_lens": ("N",),
        "initial_h": (2, "N", 7),
    }
    outputs = infer(op, shapes, direction="bidirectional")
    assert [o.shape for o in outputs] == [("T", 2, "N", 7)] + [(2, "N", 7)] * (len(outputs) - 1)
    assert len(outputs) == len(OUTPUT_NAMES[op])
    assert all(o.dtype == np.float32 for o in outputs)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_infer_layout_1(op: str) -> None:
    g = GATES[op]
    shapes = {"X": ("N", 6, 5), "W": (1, g * 3, 5), "R": (1, g * 3, 3), "initial_h": ("N", 1, 3)}
    outputs = infer(op, shapes, ["", "Y_h"], dtype=np.float64, layout=1)
    assert outputs[0].shape == ("N", 6, 1, 3)
    assert outputs[1].shape == ("N", 1, 3)
    assert outputs[1].dtype == np.float64


def test_infer_through_the_importer_with_symbolic_batch() -> None:
    feeds = make_inputs("GRU", directions=2)
    model = make_model("GRU", feeds, ["Y", "Y_h"], direction="bidirectional")
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "N"
    session = InferenceSession(model)
    shapes = {o.name: o.shape for o in session.get_outputs()}
    assert shapes == {"Y": [4, 2, "N", 7], "Y_h": [2, "N", 7]}
    big = make_inputs("GRU", directions=2, batch=5)
    assert session.run(None, {**feeds, "X": big["X"]})[1].shape == (2, 5, 7)


@pytest.mark.parametrize(
    ("op", "shapes", "attrs", "message"),
    [
        ("LSTM", {"X": (4, 2, 5), "W": (1, 27, 5), "R": (1, 28, 7)}, {}, "W has shape"),
        ("LSTM", {"X": (4, 2, 5), "W": (1, 28, 5), "R": (1, 28, 6)}, {}, "R has shape"),
        ("GRU", {"X": (4, 2, 5), "W": (1, 21, 4), "R": (1, 21, 7)}, {}, "W has shape"),
        ("GRU", {"X": (4, 2, 5), "W": (1, 21, 5), "R": (1, 21, 7)}, {"hidden_size": 8}, "hidden_size is 8"),
        ("RNN", {"X": (4, 2, 5), "W": (1, 7, 5), "R": (2, 7, 7)}, {}, "R has shape"),
        (
            "RNN",
            {"X": (4, 2, 5), "W": (1, 7, 5), "R": (1, 7, 7)},
            {"direction": "bidirectional"},
            "R has shape",
        ),
        ("RNN", {"X": (4, 2, 5), "W": (1, 7, 5), "R": (1, 7, 7)}, {"direction": "backward"}, "direction"),
        ("RNN", {"X": (4, 2, 5), "W": (1, 7, 5), "R": (1, 7, 7), "B": (1, 7)}, {}, "B has shape"),
        (
            "GRU",
            {"X": (4, 2, 5), "W": (1, 21, 5), "R": (1, 21, 7), "initial_h": (1, 3, 7)},
            {},
            "initial_h has shape",
        ),
        ("LSTM", {"X": (4, 2, 5), "W": (1, 28, 5), "R": (1, 28, 7), "P": (1, 28)}, {}, "P has shape"),
        (
            "LSTM",
            {"X": (4, 2, 5), "W": (1, 28, 5), "R": (1, 28, 7), "sequence_lens": (3,)},
            {},
            "sequence_lens has shape",
        ),
        ("LSTM", {"X": (4, 5), "W": (1, 28, 5), "R": (1, 28, 7)}, {}, "X must be 3-D"),
        (
            "LSTM",
            {"X": (4, 2, 5), "W": (1, 28, 5), "R": (1, 28, 7)},
            {"activations": ("Sigmoid", "Tanh")},
            "activations lists 2",
        ),
        (
            "GRU",
            {"X": (4, 2, 5), "W": (1, 21, 5), "R": (1, 21, 7)},
            {"activations": ("Sigmoid", "Gelu")},
            "unknown activation",
        ),
        ("GRU", {"X": (4, 2, 5), "W": (1, 21, 5), "R": (1, 21, 7)}, {"layout": 2}, "layout"),
        (
            "GRU",
            {"X": (4, 2, 5), "W": (1, 21, 5), "R": (1, 21, 7)},
            {"linear_before_reset": 2},
            "linear_before_reset",
        ),
        ("LSTM", {"X": (4, 2, 5), "W": (1, 28, 5), "R": (1, 28, 7)}, {"input_forget": 3}, "input_forget"),
    ],
)
def test_infer_rejects_inconsistent_inputs(op: str, shapes: dict, attrs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        infer(op, shapes, **attrs)


def test_inconsistent_weights_are_rejected_at_import() -> None:
    feeds = make_inputs("LSTM")
    feeds["R"] = feeds["R"][:, :, :6].copy()
    with pytest.raises(InvalidModelError, match=r"LSTM.*R has shape \[1, 28, 6\]"):
        InferenceSession(make_model("LSTM", feeds, ["Y"]))


def test_sequence_lens_out_of_range_is_rejected() -> None:
    feeds = make_inputs("RNN", lengths=[4, 5, 1])
    with pytest.raises(Exception, match=r"sequence_lens \[4, 5, 1\] must lie in \[0, 4\]"):
        run_hetflow(make_model("RNN", feeds, ["Y"]), feeds)


def test_resolve_activations_hands_out_values_in_order() -> None:
    specs = resolve_activations(
        ["Relu", "LeakyRelu", "HardSigmoid", "Affine"],
        [0.1, 0.2],
        [0.3],
        per_direction=2,
        directions=2,
        defaults=(),
    )
    (relu, leaky), (hard, affine) = specs
    assert (relu.alpha, leaky.alpha, hard.alpha, hard.beta) == (0.0, 0.1, 0.2, 0.3)
    assert (affine.alpha, affine.beta) == (1.0, 0.0)  # lists used up: the ONNX operator's defaults


# -- cost ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "gates", "flops_per_unit"), [("LSTM", 4, 13), ("GRU", 3, 10), ("RNN", 1, 2)])
def test_cost_counts_input_and_recurrent_gemms(op: str, gates: int, flops_per_unit: int) -> None:
    seq, batch, input_size, hidden, dirs = 10, 3, 6, 5, 2
    shapes = {
        "X": (seq, batch, input_size),
        "W": (dirs, gates * hidden, input_size),
        "R": (dirs, gates * hidden, hidden),
        "B": (dirs, 2 * gates * hidden),
    }
    outputs = ["", "Y_h"]
    infos = infer(op, shapes, outputs, direction="bidirectional")
    inputs = [TensorInfo(shape, np.dtype(F32)) for shape in shapes.values()]
    node = Node(op, "n", list(shapes), outputs, ATTRS[op](direction="bidirectional"))
    cost = registry.get(op).cost(node, inputs, infos)

    # Independent count: one multiply-add per weight per (step, batch element, direction), W and R.
    weights_per_direction = gates * hidden * input_size + gates * hidden * hidden
    assert cost.macs == seq * batch * dirs * weights_per_direction
    assert cost.gemm == GemmDims(n=gates * hidden, m=batch, k=hidden, count=seq * dirs)
    assert cost.flops == seq * batch * dirs * hidden * flops_per_unit
    read = seq * batch * input_size + dirs * gates * hidden * (input_size + hidden + 2)
    assert cost.bytes_read == 4 * read
    assert cost.bytes_written == 4 * dirs * batch * hidden  # Y is omitted; only Y_h is written
    assert cost.workspace_bytes == 4 * seq * batch * dirs * gates * hidden


def test_cost_with_symbolic_batch_has_no_arithmetic() -> None:
    shapes = {"X": (10, "N", 6), "W": (1, 20, 6), "R": (1, 20, 5)}
    infos = infer("LSTM", shapes)
    inputs = [TensorInfo(shape, np.dtype(F32)) for shape in shapes.values()]
    node = Node("LSTM", "n", list(shapes), OUTPUT_NAMES["LSTM"], LSTMAttrs())
    cost = registry.get("LSTM").cost(node, inputs, infos)
    assert cost.macs == 0 and cost.gemm is None
    assert cost.bytes_read == 4 * (20 * 6 + 20 * 5)


# -- the compiled standard LSTM cell (jit_lstm) ------------------------------------------------------
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize(("batch", "dtype"), [(1, np.float32), (5, np.float32), (4, np.float64)])
@pytest.mark.parametrize("outputs", [["Y", "Y_h", "Y_c"], ["", "Y_h", ""]])
def test_standard_lstm_runs_compiled_and_matches_the_numpy_step(monkeypatch, direction, batch, dtype, outputs):
    from hetflow.devices.cpu.kernels import rnn as cpu_rnn

    directions = 2 if direction == "bidirectional" else 1
    feeds = make_inputs("LSTM", seq=6, batch=batch, input_size=3, hidden=13, directions=directions, initial=True)
    feeds = {name: array.astype(dtype) for name, array in feeds.items()}
    initial_c = feeds["initial_c"].copy()
    model = make_model("LSTM", feeds, outputs, direction=direction)
    calls = []
    compiled_lstm = cpu_rnn._compiled_lstm
    monkeypatch.setattr(cpu_rnn, "_compiled_lstm", lambda *a: calls.append(1) or compiled_lstm(*a))
    compiled = run_hetflow(model, feeds)
    assert calls, "the standard cell did not take the compiled path"
    np.testing.assert_array_equal(feeds["initial_c"], initial_c)  # C is updated in a copy
    monkeypatch.setattr(cpu_rnn, "COMPILED_DTYPES", ())  # every cell takes the numpy step
    calls.clear()
    stepped = run_hetflow(model, feeds)
    assert not calls
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    assert_close(compiled, stepped, rtol=tolerance, atol=tolerance)
    if dtype == np.float32:
        assert_close(compiled, run_ort(model, feeds))


def test_saturated_gates_stay_finite_in_the_compiled_cell():
    # exp overflows to inf for large negative pre-activations: sigmoid -> 0 and tanh -> -1, not NaN.
    feeds = make_inputs("LSTM", seq=3, batch=2, hidden=5, initial=True)
    feeds["W"] = feeds["W"] * 200
    outputs = check_against_ort("LSTM", feeds)
    assert all(np.isfinite(output).all() for output in outputs)


def _scan_driver(rng: np.random.Generator, batch: int, hidden: int, steps: int, reverse: bool, keep_y: bool):  # noqa: ANN202
    """``drive(scan)``: a ``jit_lstm`` driver run on one set of seeded operands (5 inputs), returning
    copies of the final H and C and Y (None unless ``keep_y``)."""
    inputs = 5
    r = (rng.standard_normal((4 * hidden, hidden)) * 0.3).astype(np.float32)
    w = rng.standard_normal((4 * hidden, inputs)).astype(np.float32)
    bias = rng.standard_normal(4 * hidden).astype(np.float32)
    x_t = rng.standard_normal((steps, inputs, batch)).astype(np.float32)
    h0 = rng.standard_normal((hidden, batch)).astype(np.float32)
    c0 = rng.standard_normal((hidden, batch)).astype(np.float32)

    def drive(scan, packed: bool = False):  # noqa: ANN001, ANN202
        """``packed``: give ``scan`` W and R as one column's spinning steps read them."""
        c = c0.copy()
        y = np.zeros((steps, hidden, batch), np.float32) if keep_y else None
        extra = {"panels": (packed_gates(r), packed_gates(w))} if packed else {}
        h = scan(r, w, bias, x_t, h0.copy(), c, reverse, y, **extra)[0]
        return h.copy(), c, y

    return drive


@pytest.mark.parametrize(("batch", "whole_projection"), [(1, True), (3, True), (3, False), (6, True), (16, False)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("keep_y", [False, True])
def test_the_compiled_sequence_matches_the_stepwise_lstm_driver(monkeypatch, batch, whole_projection, reverse, keep_y):
    from hetflow.devices.cpu.kernels import jit_lstm

    if not jit_lstm.runs_sequence(batch):
        pytest.fail("numpy's BLAS here cannot be called from compiled code: the compiled sequence never runs")
    if not whole_projection:
        monkeypatch.setattr(jit_lstm, "WHOLE_PROJECTION_BYTES", 0)
    drive = _scan_driver(np.random.default_rng(batch), batch, hidden=24, steps=7, reverse=reverse, keep_y=keep_y)
    compiled, stepwise = drive(jit_lstm.scan), drive(jit_lstm._scan_stepwise)
    for mine, theirs in zip(compiled, stepwise):
        if mine is not None:
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    if keep_y:
        # Y's last written step is the final H.
        np.testing.assert_array_equal(compiled[2][0 if reverse else -1], compiled[0])


# -- the LSTM on the spinning pool (jit_lstm._scan_spinning) ----------------------------------------
@pytest.mark.parametrize(("batch", "hidden"), [(1, 24), (1, 13), (1, 3), (16, 24), (17, 13), (40, 30)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("keep_y", [False, True])
def test_the_spinning_driver_matches_the_stepwise_lstm_driver(monkeypatch, batch, hidden, reverse, keep_y):
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.devices.cpu.threads import own_threads

    monkeypatch.setattr(jit_lstm, "VECTOR_MIN_BYTES", 0)  # one column spins however small R is

    drive = _scan_driver(np.random.default_rng(batch + hidden), batch, hidden, steps=9, reverse=reverse,
                         keep_y=keep_y)  # fmt: skip
    calls = []
    spinning_scan = jit_lstm._scan_spinning
    monkeypatch.setattr(jit_lstm, "_scan_spinning", lambda *a: calls.append(1) or spinning_scan(*a))
    with own_threads(2, spin=True, hold_blas=True):
        assert jit_lstm.runs_spinning(batch, hidden, np.float32)
        spinning = drive(jit_lstm.scan, packed=batch == 1)
    assert calls == [1]
    stepwise = drive(jit_lstm._scan_stepwise)
    for mine, theirs in zip(spinning, stepwise):
        if mine is not None:
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(("hidden", "spins"), [(32, False), (63, False), (64, True), (320, True), (512, True), (1024, True)])
def test_one_column_spins_from_a_hand_over_sized_r(hidden, spins):
    """Below ``VECTOR_MIN_BYTES`` of R (hidden 63: 63 504 bytes) a step is shorter than the pool's
    hand-over; above it one column spins however large R is (its panels stream from the last-level
    cache as fast as OpenBLAS's GEMV reads R)."""
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.devices.cpu.threads import own_threads

    assert jit_lstm.column_spins(hidden, 2) is spins
    with own_threads(2, spin=True, hold_blas=True):
        assert jit_lstm.runs_spinning(1, hidden, np.float32) is spins
    assert not jit_lstm.runs_spinning(1, hidden, np.float32)  # no spinning pool held


@pytest.mark.parametrize(("hidden", "spins"), [(24, False), (128, True), (405, True)])
def test_a_batch_one_lstm_session_spins_from_a_hand_over_sized_r_and_matches_ort(monkeypatch, hidden, spins):
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.runtime import executor

    feeds = make_inputs("LSTM", seq=6, batch=1, input_size=5, hidden=hidden, directions=1, initial=True)
    model = make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"])
    feeds = with_weights(model, feeds)
    calls = []  # the spinning steps, run (an uncaptured run) or made into jobs (a captured one)
    vector_scan, step_jobs = jit_lstm._scan_spinning, jit_lstm.step_jobs
    monkeypatch.setattr(jit_lstm, "_scan_spinning", lambda *a: calls.append(1) or vector_scan(*a))
    monkeypatch.setattr(jit_lstm, "step_jobs", lambda *a: calls.append(1) or step_jobs(*a))
    session = InferenceSession(model, threads=2)
    assert executor.plan_recurrent_batch(session.plan_for({})) == (1 if spins else 0)
    actual = session.run(None, feeds)
    assert len(calls) == (1 if spins else 0)
    assert_close(actual, run_ort(model, feeds))


def test_one_column_reads_w_and_r_packed_once_and_the_plan_counts_the_copies(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_lstm, rnn
    from hetflow.devices.cpu.kernels.jit_gate_panels import packed_bytes
    from hetflow.runtime.budget import transformed_weight_bytes

    hidden, inputs = 130, 5
    feeds = make_inputs("LSTM", seq=4, batch=1, input_size=inputs, hidden=hidden, directions=2, initial=True)
    model = make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"], direction="bidirectional")
    feeds = with_weights(model, feeds)
    packed = []
    original = rnn.GATE_PANELS.get
    monkeypatch.setattr(rnn.GATE_PANELS, "get", lambda m, d: packed.append((m.shape, d)) or original(m, d))
    steps = []
    spin = jit_lstm._scan_spinning
    monkeypatch.setattr(jit_lstm, "_scan_spinning", lambda *a: steps.append(a[-1]) or spin(*a))
    session = InferenceSession(model, threads=2)
    expected = 2 * (packed_bytes(hidden, hidden) + packed_bytes(hidden, inputs))
    assert transformed_weight_bytes(session.plan_for({})) == expected
    for _ in range(2):
        assert_close(session.run(None, feeds), run_ort(model, feeds))
    assert len(steps) == 4 and all(panels is not None for panels in steps)  # two directions, two runs
    assert sorted(packed) == sorted(2 * [((2, 4 * hidden, shape), d) for shape in (hidden, inputs) for d in (0, 1)])


@pytest.mark.parametrize(
    ("batch", "direction", "outputs", "layout", "initial"),
    [(1, "forward", ["", "Y_h"], 0, False), (1, "forward", ["Y", "Y_h", "Y_c"], 0, True),
     (1, "reverse", ["Y", "", "Y_c"], 0, False), (1, "forward", ["Y", "Y_h", "Y_c"], 1, True),
     (16, "forward", ["", "Y_h"], 0, False), (17, "reverse", ["Y", "Y_h", "Y_c"], 0, True)],
)  # fmt: skip
def test_a_spinning_sequence_is_replayed_as_jobs_on_every_new_feed(batch, direction, outputs, layout, initial):
    """An LSTM whose steps spin (one column, or a batch from 16), on weights a plan holds, is captured (X
    into the steps' columns, H0 and C set, every step a job, the outputs transposed out): later runs
    replay it from compiled code, X and the initial states read anew."""
    feeds = make_inputs("LSTM", seq=7, batch=batch, input_size=5, hidden=80, directions=1, initial=initial,
                        layout=layout)  # fmt: skip
    model = make_model("LSTM", feeds, outputs, direction=direction, layout=layout)
    feeds = with_weights(model, feeds)
    session = InferenceSession(model, threads=2)
    sequence = InferenceSession(model, threads=1)  # the compiled sequence, uncaptured (ORT lacks layout 1)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        fresh = {name: rng.standard_normal(a.shape).astype(np.float32) for name, a in feeds.items()}
        expected = run_ort(model, fresh) if layout == 0 else sequence.run(None, fresh)
        assert_close(session.run(None, fresh), expected, rtol=1e-4, atol=1e-5)
    report = session.replay_report()
    assert report["called"] == [] and "lstm" in report["replayed"][0].lower()


def test_a_column_without_a_spinning_run_or_with_fed_weights_is_not_captured():
    feeds = make_inputs("LSTM", seq=4, batch=1, input_size=3, hidden=80, directions=1)
    model = make_model("LSTM", feeds, ["", "Y_h"])
    fed = InferenceSession(model, threads=2)  # W, R and B are graph inputs: they may change between runs
    for _ in range(2):
        assert_close(fed.run(None, feeds), run_ort(model, feeds))
    assert fed.replay_report()["replayed"] == []
    feeds = with_weights(model, feeds)
    one_thread = InferenceSession(model, threads=1)
    for _ in range(2):
        assert_close(one_thread.run(None, feeds), run_ort(model, feeds))
    assert one_thread.replay_report()["replayed"] == []


def test_a_budget_without_room_for_the_packed_copies_runs_one_column_unpacked(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.runtime import executor
    from hetflow.runtime.budget import transformed_weight_bytes, without_winograd

    feeds = make_inputs("LSTM", seq=5, batch=1, input_size=4, hidden=400, directions=1, initial=True)
    model = make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"])
    raw = sum(int(feeds[name].nbytes) for name in ("W", "R", "B"))
    feeds = with_weights(model, feeds)
    plan = InferenceSession(model, threads=2).plan_for({})
    assert transformed_weight_bytes(plan) > 0 and executor.plan_recurrent_batch(plan) == 1
    fitted = without_winograd(plan)
    assert transformed_weight_bytes(fitted) == 0 and executor.plan_recurrent_batch(fitted) == 0
    monkeypatch.setattr(jit_lstm, "_scan_spinning", lambda *a: pytest.fail("one column spun"))
    session = InferenceSession(model, threads=2, memory_budget=raw + (1 << 20))  # the copies need 2.6 MB
    assert_close(session.run(None, feeds), run_ort(model, feeds))


@pytest.mark.parametrize(("batch", "spins"), [(1, True), (8, False), (16, True)])
def test_only_a_batch_that_spins_counts_the_spinning_drivers_scratch(batch, spins):
    """lstm-gesture's LSTM (hidden 512): inside a run that holds a spinning pool for something else, a
    batch the pool does not take keeps its own driver's scratch."""
    from hetflow.devices.cpu.kernels.rnn import compiled_lstm_scratch_bytes, spinning_lstm_batch
    from hetflow.passes.infer_shapes import bind_batch
    from hetflow.runtime.planner import input_infos

    session = InferenceSession("zoo:lstm-gesture")
    graph = bind_batch(session.graph, {"N": batch})
    node = next(n for n in graph.nodes if n.op_type == "LSTM")
    infos = input_infos(graph, node)
    assert spinning_lstm_batch(node, infos) == (batch if spins else 0)
    held, free = (compiled_lstm_scratch_bytes(node, infos, pool_held=held) for held in (True, False))
    assert (held != free) is spins


def test_a_large_batch_lstm_session_spins_and_matches_ort(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.runtime import executor

    feeds = make_inputs("LSTM", seq=5, batch=jit_lstm.SPIN_MIN_BATCH + 3, input_size=4, hidden=20, directions=2,
                        initial=True)  # fmt: skip
    model = make_model("LSTM", feeds, OUTPUT_NAMES["LSTM"], direction="bidirectional")
    spins = []
    spinning_scan = jit_lstm._scan_spinning
    monkeypatch.setattr(jit_lstm, "_scan_spinning", lambda *a: spins.append(1) or spinning_scan(*a))
    session = InferenceSession(model, threads=2)
    assert executor.plan_recurrent_batch(session.plan_for({})) == jit_lstm.SPIN_MIN_BATCH + 3
    actual = session.run(None, feeds)
    assert len(spins) == 2  # one scan per direction
    assert_close(actual, run_ort(model, feeds))


@pytest.mark.parametrize(("recurrent_batch", "threads", "kind"), [(64, 2, "spin"), (8, 2, "blas"), (64, 1, "blas")])
def test_the_thread_arrangement_spins_for_a_large_recurrent_batch(recurrent_batch, threads, kind):
    from hetflow.runtime.executor import thread_arrangement

    arrangement = thread_arrangement(0, True, threads, 0, recurrent_batch)
    assert arrangement.kind == kind
    assert arrangement.hold_blas is (kind == "spin")
