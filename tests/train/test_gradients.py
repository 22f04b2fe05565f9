"""Every backward rule against central finite differences in float64 (relative error <= 1e-5).

The cases are data (``CASES``); ``test_every_rule_has_a_case`` makes a newly added backward rule fail
until it gets cases here, so no rule goes unchecked.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.ops import registry
from hetflow.ops.activation import FusedActivation
from hetflow.ops.loss import LOSSES
from tests.train.gradcheck import STEP, TOLERANCE, Case, check_gradients, relative_error

I64 = np.int64


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=I64)


CASES: list[Case] = [
    # -- convolution ------------------------------------------------------------------------------
    Case("Conv", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)], label="3x3"),
    Case(
        "Conv",
        [(1, 4, 9, 8), (6, 2, 3, 2), (6,)],
        {"group": 2, "strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2)},
        label="group-stride-pad-dilation",
    ),
    Case("Conv", [(2, 3, 5, 5), (3, 1, 3, 3)], {"group": 3, "pads": (1, 1, 1, 1)}, label="depthwise-nobias"),
    Case("Conv", [(2, 4, 5, 3), (5, 4, 1, 1), (5,)], label="pointwise"),
    Case("Conv", [(2, 2, 9), (3, 2, 4)], {"strides": (3,), "auto_pad": "SAME_UPPER"}, label="1d-same"),
    # Stride 1 with no more kernels than channels takes dX as a correlation of dY with the flipped
    # weights: asymmetric pads, groups with several kernels per group, 1-D, 3-D, and padding past
    # kernel - 1 (which falls back to col2im).
    Case(
        "Conv",
        [(2, 6, 6, 5), (4, 3, 3, 2), (4,)],
        {"group": 2, "pads": (0, 1, 2, 0)},
        label="stride1-group-asymmetric-pads",
    ),
    Case("Conv", [(2, 3, 8), (2, 3, 3)], {"pads": (2, 0)}, label="stride1-1d"),
    Case("Conv", [(1, 3, 4, 3, 5), (2, 3, 2, 2, 3), (2,)], {"pads": (1, 0, 1, 0, 1, 1)}, label="stride1-3d"),
    Case("Conv", [(2, 2, 5, 5), (3, 2, 2, 2)], {"pads": (2, 2, 2, 2)}, label="pad-past-kernel"),
    # The training graph's Conv + Relu (``fuse_conv_relu``): dY masked by the fused output first.
    Case(
        "Conv",
        [(2, 3, 6, 5), (4, 3, 3, 3), (4,)],
        {"pads": (1, 1, 1, 1), "fused": FusedActivation("Relu")},
        label="fused-relu",
    ),
    Case(
        "Conv",
        [(1, 4, 7, 6), (6, 2, 3, 2)],
        {"group": 2, "strides": (2, 1), "pads": (1, 0, 2, 1), "fused": FusedActivation("Relu")},
        label="fused-relu-group-stride",
    ),
    # -- matrix products --------------------------------------------------------------------------
    Case("Gemm", [(3, 5), (5, 4), (4,)], label="bias-row"),
    Case(
        "Gemm", [(5, 3), (4, 5), (3, 1)], {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3}, label="trans"
    ),
    Case("MatMul", [(2, 3, 5), (5, 4)], label="batched-by-matrix"),
    Case("MatMul", [(2, 1, 3, 4), (3, 4, 2)], label="broadcast-batch"),
    Case("MatMul", [(5,), (2, 5, 3)], label="vector-left"),
    Case("MatMul", [(3, 5), (5,)], label="vector-right"),
    # -- pooling ----------------------------------------------------------------------------------
    Case("MaxPool", [(2, 3, 7, 6)], {"kernel_shape": (2, 2), "strides": (2, 2)}, label="2x2"),
    Case(
        "MaxPool",
        [(1, 2, 7, 7)],
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": 1},
        label="3x3-pad-ceil",
    ),
    Case("MaxPool", [(1, 2, 9)], {"kernel_shape": (2,), "dilations": (2,)}, label="1d-dilated"),
    Case("AveragePool", [(2, 3, 7, 6)], {"kernel_shape": (3, 2), "strides": (2, 2)}, label="3x2"),
    Case(
        "AveragePool",
        [(1, 2, 7, 7)],
        {
            "kernel_shape": (3, 3),
            "strides": (2, 2),
            "pads": (1, 1, 1, 1),
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
        label="pad-ceil-include",
    ),
    Case("AveragePool", [(1, 2, 5, 5)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}, label="pad-exclude"),
    Case("GlobalAveragePool", [(2, 3, 5, 3)]),
    Case("GlobalMaxPool", [(2, 3, 5, 3)]),
    # -- activations ------------------------------------------------------------------------------
    Case("Relu", [(3, 7)], away_from=[0.0]),
    Case("LeakyRelu", [(3, 7)], {"alpha": 0.2}, away_from=[0.0]),
    Case("PRelu", [(2, 3, 4), (3, 1)], away_from=[0.0]),
    Case("Sigmoid", [(3, 7)]),
    Case("Tanh", [(3, 7)]),
    Case("Clip", [(4, 5), np.array(-0.5), np.array(0.7)], away_from=[-0.5, 0.7], label="both"),
    Case("Clip", [(4, 5), None, np.array(0.3)], away_from=[0.3], label="max-only"),
    Case("Softmax", [(3, 7)], {"axis": -1}, label="last"),
    Case("Softmax", [(2, 3, 4)], {"axis": 1, "coerce_2d": 1}, label="coerce-2d"),
    Case("LogSoftmax", [(3, 5, 2)], {"axis": 1}),
    # -- normalisation ----------------------------------------------------------------------------
    Case(
        "BatchNormalization",
        [(4, 3, 3, 2), (3,), (3,), (3,), (3,)],
        {"training_mode": 1},
        outputs=3,
        check=[0, 1, 2],
        loss_outputs=[0],
        prepare=lambda a: [*a[:4], np.abs(a[4]) + 0.5],
        label="training",
    ),
    Case(
        "BatchNormalization",
        [(4, 3, 5), (3,), (3,), (3,), (3,)],
        check=[0, 1, 2],
        prepare=lambda a: [*a[:4], np.abs(a[4]) + 0.5],
        label="inference",
    ),
    Case(
        "BatchNormalization",
        [(5, 3, 2), (3, 2), (3, 2), (3, 2), (3, 2)],
        {"training_mode": 1, "spatial": 0},
        outputs=3,
        check=[0, 1, 2],
        loss_outputs=[0],
        prepare=lambda a: [*a[:4], np.abs(a[4]) + 0.5],
        label="per-element",
    ),
    Case("LRN", [(2, 7, 3, 2)], {"size": 3, "alpha": 0.5, "beta": 0.75, "bias": 1.5}, label="odd"),
    Case("LRN", [(1, 6, 4)], {"size": 4, "alpha": 0.3, "beta": 0.6, "bias": 2.0}, label="even"),
    # -- data movement ----------------------------------------------------------------------------
    Case("Dropout", [(4, 6), np.array(0.3), np.array(True)], {"seed": 3}, outputs=2, label="training"),
    Case("Dropout", [(4, 6)], label="inference"),
    Case("Concat", [(2, 3, 2), (2, 1, 2), (2, 4, 2)], {"axis": 1}),
    Case("Split", [(2, 7)], {"axis": 1, "num_outputs": 3}, outputs=3, label="uneven"),
    Case("Split", [(5, 2), ints(2, 3)], {"axis": 0}, outputs=2, label="sizes"),
    Case("Slice", [(5, 6), ints(1, -1), ints(4, 0), ints(0, 1), ints(2, -2)], label="steps"),
    Case("Reshape", [(2, 3, 4), ints(0, -1)]),
    Case("Flatten", [(2, 3, 2, 2)], {"axis": 2}),
    Case("Squeeze", [(2, 1, 3), ints(1)]),
    Case("Unsqueeze", [(2, 3), ints(0, 3)]),
    Case("Transpose", [(2, 3, 4)], {"perm": (2, 0, 1)}),
    Case("Pad", [(2, 3, 4), ints(1, 0, -1, 2, 1, 1)], label="grow-and-crop"),
    Case("Pad", [(3, 5), ints(2, -1), None, ints(1)], label="axes"),
    Case("Gather", [(5, 3), np.array([[0, 4], [-1, 0]], dtype=I64)], {"axis": 0}, label="repeated"),
    Case("Gather", [(2, 4, 3), ints(3, 1)], {"axis": 1}),
    Case("Identity", [(3, 2)]),
    # -- recurrent layers (through time) ----------------------------------------------------------
    Case(
        "LSTM",
        [(4, 2, 3), (1, 12, 3), (1, 12, 3), (1, 24), None, (1, 2, 3), (1, 2, 3)],
        {"hidden_size": 3},
        outputs=3,
        label="forward-states",
    ),
    Case(
        "LSTM",
        [(3, 2, 2), (2, 8, 2), (2, 8, 2), (2, 16), None, None, None, (2, 6)],
        {"hidden_size": 2, "direction": "bidirectional"},
        outputs=3,
        label="bidirectional-peepholes",
    ),
    Case(
        "LSTM",
        [(2, 5, 3), (1, 8, 3), (1, 8, 2)],
        {"hidden_size": 2, "direction": "reverse", "layout": 1},
        outputs=2,
        label="reverse-layout1",
    ),
    Case(
        "GRU",
        [(4, 2, 3), (1, 9, 3), (1, 9, 3), (1, 18), None, (1, 2, 3)],
        {"hidden_size": 3},
        outputs=2,
        label="forward",
    ),
    Case(
        "GRU",
        [(3, 2, 2), (2, 6, 2), (2, 6, 2), (2, 12), None, (2, 2, 2)],
        {"hidden_size": 2, "direction": "bidirectional", "linear_before_reset": 1},
        outputs=2,
        label="bidirectional-linear-before-reset",
    ),
    Case(
        "GRU", [(2, 3, 2), (1, 6, 2), (1, 6, 2)], {"hidden_size": 2, "layout": 1}, outputs=2, label="layout1"
    ),
    Case(
        "RNN",
        [(4, 2, 3), (1, 3, 3), (1, 3, 3), (1, 6), None, (1, 2, 3)],
        {"hidden_size": 3},
        outputs=2,
        label="forward",
    ),
    Case(
        "RNN",
        [(2, 3, 2), (2, 2, 2), (2, 2, 2), (2, 4)],
        {"hidden_size": 2, "direction": "bidirectional", "layout": 1},
        outputs=2,
        label="bidirectional-layout1",
    ),
    Case("ReduceMean", [(2, 3, 4), ints(1, -1)], {"keepdims": 0}, label="axes"),
    Case("ReduceMean", [(3, 5)], label="all-keepdims"),
    # -- arithmetic with broadcasting -------------------------------------------------------------
    Case("Add", [(2, 3, 4), (3, 1)]),
    Case("Sub", [(3, 1), (2, 3, 4)]),
    Case("Mul", [(2, 1, 4), (3, 1)]),
    Case("Div", [(2, 3), (3,)], prepare=lambda a: [a[0], np.abs(a[1]) + 0.5]),
    Case("Sum", [(2, 3), (3,), (1, 1)]),
    Case("Max", [(2, 3), (3,), (2, 1)]),
    Case("Min", [(3, 4), (4,)]),
]


def _ids(cases: list[Case]) -> list[str]:
    return [case.id for case in cases]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_backward_matches_finite_differences(case: Case) -> None:
    errors = check_gradients(case)
    assert errors
    worst = max(errors.values())
    assert worst <= TOLERANCE, f"{case.id}: relative errors per input {errors}"


def test_every_rule_has_a_case() -> None:
    with_rules = {op for op in registry.registered_ops() if registry.get(op).has_backward}
    covered = {case.op_type for case in CASES}
    assert with_rules - covered == set(), "backward rules without a finite-difference case"


LOSS_INPUTS = {
    "cross_entropy": [
        ("labels", lambda rng: (rng.standard_normal((5, 7)) * 3, rng.integers(0, 7, 5))),
        ("probabilities", lambda rng: (rng.standard_normal((4, 3)), rng.dirichlet(np.ones(3), 4))),
        ("large-logits", lambda rng: (rng.standard_normal((3, 4)) * 1e3, rng.integers(0, 4, 3))),
    ],
    "cross_entropy-4d": [
        ("squeezenet-head", lambda rng: (rng.standard_normal((3, 5, 1, 1)), rng.integers(0, 5, 3))),
    ],
    "mse": [("odd", lambda rng: (rng.standard_normal((3, 5)), rng.standard_normal((3, 5))))],
}
LOSS_CASES = [(name, label, make) for name, cases in LOSS_INPUTS.items() for label, make in cases]


@pytest.mark.parametrize(
    ("name", "label", "make"), LOSS_CASES, ids=[f"{n}-{lab}" for n, lab, _ in LOSS_CASES]
)
def test_loss_gradient_matches_finite_differences(name: str, label: str, make) -> None:
    loss = LOSSES[name.split("-")[0]]
    scores, targets = make(np.random.default_rng(1))
    result = loss(scores, targets)
    assert np.isfinite(result.value)
    numeric = np.zeros_like(scores)
    for flat in range(scores.size):
        position = np.unravel_index(flat, scores.shape)
        original = scores[position]
        scores[position] = original + STEP
        plus = loss(scores, targets).value
        scores[position] = original - STEP
        minus = loss(scores, targets).value
        scores[position] = original
        numeric[position] = (plus - minus) / (2 * STEP)
    if label == "large-logits":
        # NOTE: at |logits| ~ 1e3 the difference step is below float64's resolution of the loss, so
        # the check here is that the fused form stays finite and exact: softmax is one-hot.
        expected = -np.eye(4)[targets] / 3
        expected[np.arange(3), scores.argmax(axis=1)] += 1 / 3
        np.testing.assert_allclose(result.grad, expected, atol=1e-12)
        return
    assert relative_error(result.grad, numeric) <= TOLERANCE


def test_every_loss_has_a_case() -> None:
    assert set(LOSSES) == {name.split("-")[0] for name in LOSS_INPUTS}
