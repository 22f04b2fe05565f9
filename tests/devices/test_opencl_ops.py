"""OpenCL pooling, LRN, BatchNormalization, Concat, Transpose, views, Sum and LSTM against the CPU
device on odd shapes, padding, ceil_mode, count_include_pad and batch > 1."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from hetflow.devices.opencl.kernels import lstm
from hetflow.devices.opencl.kernels.lstm import FUSED_MAX_BATCH, GPU_STEP_SPLIT, StepSplit
from hetflow.ops.activation import FusedActivation
from tests.devices.opencl_helpers import assert_close, infos, make_node, random, run_both

RNG = np.random.default_rng(2)

POOLS = [
    ((2, 3, 11, 13), {"kernel_shape": (3, 3), "strides": (2, 2)}),
    ((2, 3, 11, 13), {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 1, 1), "ceil_mode": 1}),
    ((1, 4, 9, 10), {"kernel_shape": (3, 2), "strides": (2, 3), "pads": (1, 1, 1, 1), "ceil_mode": 1}),
    ((3, 2, 8, 8), {"kernel_shape": (2, 2), "dilations": (2, 2), "pads": (1, 1, 0, 0)}),
    ((1, 2, 7, 5), {"kernel_shape": (3, 3), "auto_pad": "SAME_UPPER", "strides": (2, 2)}),
    ((2, 3, 12), {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1)}),
]


@pytest.mark.parametrize("x_shape, attrs", POOLS)
def test_max_pool(opencl, x_shape, attrs):
    inputs = [random(RNG, *x_shape)]
    got, expected = run_both(opencl, make_node("MaxPool", inputs, **attrs), inputs)
    assert_close(got[0], expected[0], rtol=0)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("x_shape, attrs", POOLS)
def test_average_pool(opencl, x_shape, attrs, count_include_pad):
    inputs = [random(RNG, *x_shape)]
    node = make_node("AveragePool", inputs, count_include_pad=count_include_pad, **attrs)
    got, expected = run_both(opencl, node, inputs)
    assert_close(got[0], expected[0])


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("x_shape", [(2, 3, 7, 5), (1, 5, 1, 1), (2, 4, 9)])
def test_global_pools(opencl, op_type, x_shape):
    inputs = [random(RNG, *x_shape)]
    got, expected = run_both(opencl, make_node(op_type, inputs), inputs)
    assert_close(got[0], expected[0])


def test_max_pool_indices_stay_on_the_cpu(opencl):
    inputs = [random(RNG, 1, 1, 4, 4)]
    node = make_node("MaxPool", inputs, outputs=2, kernel_shape=(2, 2))
    assert "Indices" in opencl.kernels.reason_unsupported(node, infos(inputs))


@pytest.mark.parametrize(
    "x_shape, attrs",
    [((2, 7, 5, 3), {"size": 5, "alpha": 1e-3, "beta": 0.75, "bias": 2.0}),
     ((1, 16, 6, 6), {"size": 3, "alpha": 0.1, "beta": 0.5, "bias": 1.0}),
     ((2, 4, 3), {"size": 4, "alpha": 1e-2, "beta": 1.3, "bias": 1.5})],
)  # fmt: skip
def test_lrn(opencl, x_shape, attrs):
    inputs = [random(RNG, *x_shape) * 3]
    got, expected = run_both(opencl, make_node("LRN", inputs, **attrs), inputs)
    assert_close(got[0], expected[0])


@pytest.mark.parametrize("x_shape", [(2, 5, 3, 4), (3, 7), (1, 3, 2, 2, 3)])
def test_batchnorm_inference(opencl, x_shape):
    channels = x_shape[1]
    params = [random(RNG, channels), random(RNG, channels), random(RNG, channels)]
    inputs = [random(RNG, *x_shape), *params, np.abs(random(RNG, channels)) + 0.1]
    got, expected = run_both(opencl, make_node("BatchNormalization", inputs, epsilon=1e-3), inputs)
    assert_close(got[0], expected[0])


@pytest.mark.parametrize(
    "fused",
    [FusedActivation("Relu"), FusedActivation("Clip", 0.0, 6.0), FusedActivation("LeakyRelu", 0.1),
     FusedActivation("Sigmoid")],
    ids=lambda f: f.op_type,
)  # fmt: skip
def test_batchnorm_with_a_fused_activation(opencl, fused):
    params = [random(RNG, 5), random(RNG, 5), random(RNG, 5)]
    inputs = [random(RNG, 2, 5, 4, 3) * 3, *params, np.abs(random(RNG, 5)) + 0.1]
    got, expected = run_both(opencl, make_node("BatchNormalization", inputs, fused=fused), inputs)
    assert_close(got[0], expected[0])


@pytest.mark.parametrize("op_type, count", [("Add", 2), ("Sum", 2), ("Sum", 3)])
@pytest.mark.parametrize(
    "fused", [FusedActivation("Relu"), FusedActivation("Clip", -0.5, 0.5), FusedActivation("LeakyRelu", 0.1)],
    ids=lambda f: f.op_type,
)
def test_residual_sum_with_a_fused_activation(opencl, op_type, count, fused):
    inputs = [random(RNG, 2, 3, 4, 5) for _ in range(count)]
    got, expected = run_both(opencl, make_node(op_type, inputs, fused=fused), inputs)
    assert_close(got[0], expected[0])


def test_batchnorm_training_stays_on_the_cpu(opencl):
    inputs = [random(RNG, 2, 3, 4)] + [random(RNG, 3) for _ in range(4)]
    node = make_node("BatchNormalization", inputs, outputs=3, training_mode=1)
    assert "inference" in opencl.kernels.reason_unsupported(node, infos(inputs))


@pytest.mark.parametrize(
    "shapes, axis",
    [([(2, 3, 4), (2, 5, 4), (2, 1, 4)], 1), ([(3, 2), (4, 2)], 0), ([(2, 3, 5), (2, 3, 1)], -1),
     ([(1, 64, 7, 7), (1, 32, 7, 7), (1, 16, 7, 7)], 1)],
)  # fmt: skip
def test_concat_writes_slices(opencl, shapes, axis):
    inputs = [random(RNG, *shape) for shape in shapes]
    got, expected = run_both(opencl, make_node("Concat", inputs, axis=axis), inputs)
    assert_close(got[0], expected[0], rtol=0)


@pytest.mark.parametrize(
    "shape, perm", [((2, 3, 4, 5), (0, 2, 3, 1)), ((3, 4), None), ((2, 1, 3, 2, 4), (0, 2, 1, 3, 4))]
)
def test_transpose(opencl, shape, perm):
    inputs = [random(RNG, *shape)]
    got, expected = run_both(opencl, make_node("Transpose", inputs, perm=perm), inputs)
    assert_close(got[0], expected[0], rtol=0)


def test_views(opencl):
    x = random(RNG, 2, 3, 4, 1)
    cases = [
        ("Reshape", [x, np.array([0, -1], np.int64)], {}),
        ("Flatten", [x], {"axis": 2}),
        ("Squeeze", [x, np.array([3], np.int64)], {}),
        ("Unsqueeze", [x, np.array([0, -1], np.int64)], {}),
        ("Identity", [x], {}),
    ]
    for op_type, inputs, attrs in cases:
        got, expected = run_both(opencl, make_node(op_type, inputs, **attrs), inputs)
        assert_close(got[0], expected[0], rtol=0)


def test_sum_of_three_with_broadcasting(opencl):
    inputs = [random(RNG, 2, 3, 4), random(RNG, 3, 4), random(RNG, 4)]
    got, expected = run_both(opencl, make_node("Sum", inputs), inputs)
    assert_close(got[0], expected[0])


def test_gemm_fc_with_fused_bias_and_activation(opencl):
    inputs = [random(RNG, 3, 37), random(RNG, 11, 37), random(RNG, 11)]
    node = make_node("Gemm", inputs, transB=1, fused=FusedActivation("Relu"))
    got, expected = run_both(opencl, node, inputs)
    assert_close(got[0], expected[0])


HIDDEN, WIDTH, STEPS, BATCH = 7, 5, 6, 3
#: Batches of the fused step (1, 3, its limit) and one past the limit (the gates GEMM and the cell).
LSTM_BATCHES = (1, 3, FUSED_MAX_BATCH, FUSED_MAX_BATCH + 1)
#: Fused step splits to run on this device besides its own: the GPU's (lanes > 1: the local-memory
#: reduction) and one whose units, lanes and vectors divide none of the hidden sizes tested.
LSTM_SPLITS = (GPU_STEP_SPLIT, StepSplit(units=3, lanes=4, vector=4))


def _lstm_inputs(directions: int, batch_first: bool = False, bias: bool = True, states: bool = False,
                 peepholes: bool = False, lengths: bool = False, batch: int = BATCH,
                 hidden: int = HIDDEN) -> list[np.ndarray | None]:
    x = random(RNG, batch, STEPS, WIDTH) if batch_first else random(RNG, STEPS, batch, WIDTH)
    state_shape = (batch, directions, hidden) if batch_first else (directions, batch, hidden)
    return [
        x,
        random(RNG, directions, 4 * hidden, WIDTH),
        random(RNG, directions, 4 * hidden, hidden) / np.float32(np.sqrt(hidden)),  # gates not saturated
        random(RNG, directions, 8 * hidden) if bias else None,
        np.array([(STEPS, 0, 2, 4)[i % 4] for i in range(batch)], np.int32) if lengths else None,
        random(RNG, *state_shape) if states else None,
        random(RNG, *state_shape) if states else None,
        random(RNG, directions, 3 * hidden) if peepholes else None,
    ]


LSTM_CASES = [
    ("forward", {}, {}),
    ("reverse", {"bias": False}, {"input_forget": 1}),
    ("bidirectional", {"states": True, "peepholes": True}, {"clip": 1.5}),
    ("forward", {"batch_first": True, "states": True}, {"layout": 1}),
    ("forward", {"lengths": True, "states": True}, {}),
    ("bidirectional", {"lengths": True, "peepholes": True}, {}),
    ("reverse", {"lengths": True, "batch_first": True, "states": True}, {"layout": 1}),
]


def _check_lstm(opencl, direction: str, options: dict, attrs: dict, batch: int, hidden: int) -> None:
    directions = 2 if direction == "bidirectional" else 1
    inputs = _lstm_inputs(directions, batch=batch, hidden=hidden, **options)
    while inputs and inputs[-1] is None:
        inputs.pop()
    node = make_node("LSTM", inputs, outputs=3, hidden_size=hidden, direction=direction, **attrs)
    got, expected = run_both(opencl, node, inputs)
    for g, e in zip(got, expected):
        assert_close(g, e, rtol=1e-4)


@pytest.mark.parametrize("hidden", [5, 37])
@pytest.mark.parametrize("batch", LSTM_BATCHES)
@pytest.mark.parametrize("direction, options, attrs", LSTM_CASES)
def test_lstm(opencl, direction, options, attrs, batch, hidden):
    _check_lstm(opencl, direction, options, attrs, batch, hidden)


@pytest.mark.parametrize("split", LSTM_SPLITS, ids=str)
@pytest.mark.parametrize("direction, options, attrs", LSTM_CASES)
def test_lstm_fused_step_splits(opencl, monkeypatch, direction, options, attrs, split):
    monkeypatch.setattr(lstm, "CPU_STEP_SPLIT" if opencl.is_cpu else "GPU_STEP_SPLIT", split)
    for batch in (1, FUSED_MAX_BATCH):
        _check_lstm(opencl, direction, options, attrs, batch, 37)


def _launches(opencl, monkeypatch, node, inputs) -> collections.Counter:
    """How many times each kernel was enqueued while ``node`` ran on ``opencl``."""
    counts: collections.Counter = collections.Counter()
    enqueue = opencl.enqueue

    def counting(kernel, global_size, local_size, args):
        counts[kernel.function_name] += 1
        enqueue(kernel, global_size, local_size, args)

    monkeypatch.setattr(opencl, "enqueue", counting)
    run_both(opencl, node, inputs)
    return counts


@pytest.mark.parametrize("batch", [1, FUSED_MAX_BATCH, FUSED_MAX_BATCH + 1])
def test_lstm_small_batches_run_one_launch_per_step(opencl, monkeypatch, batch):
    inputs = _lstm_inputs(2, batch=batch)
    node = make_node("LSTM", inputs[:4], outputs=3, hidden_size=HIDDEN, direction="bidirectional")
    counts = _launches(opencl, monkeypatch, node, inputs[:4])
    if batch <= FUSED_MAX_BATCH:
        # Per direction: the input projection, then one fused step per time step.
        assert counts["gemm"] == 2 and counts["lstm_step"] == 2 * STEPS and counts["lstm_cell"] == 0
    else:
        assert counts["gemm"] == 2 * (1 + STEPS) and counts["lstm_cell"] == 2 * STEPS and counts["lstm_step"] == 0


def test_lstm_with_other_activations_stays_on_the_cpu(opencl):
    inputs = _lstm_inputs(1)[:3]
    node = make_node("LSTM", inputs, hidden_size=HIDDEN, activations=("Relu", "Tanh", "Tanh"))
    assert "default activations" in opencl.kernels.reason_unsupported(node, infos(inputs))


@pytest.mark.parametrize("op_type", ["Gemm", "MatMul"])
def test_read_only_weights_are_packed_once_and_stay_right(opencl, op_type):
    a, b, c = random(RNG, 5, 19), random(RNG, 19, 13), random(RNG, 13)
    for array in (b, c):
        array.flags.writeable = False  # as a graph's initializers are
    inputs = [a, b, c] if op_type == "Gemm" else [a, b]
    node = make_node(op_type, inputs)
    got, expected = run_both(opencl, node, inputs)
    count = len(opencl.resident)
    inputs[0] = random(RNG, 5, 19)  # a new activation, the same weights
    again, expected_again = run_both(opencl, node, inputs)
    assert len(opencl.resident) == count
    assert_close(got[0], expected[0])
    assert_close(again[0], expected_again[0])
