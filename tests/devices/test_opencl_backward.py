"""The OpenCL training kernels against their numpy references, in float32 on odd shapes: every backward
rule against the op's numpy rule (``OpDef.backward``), the softmax cross-entropy against
``hetflow.ops.loss``, and the optimizer updates against ``hetflow.train.optim``."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.ops import registry
from hetflow.ops.base import TensorInfo, shape_only
from hetflow.ops.loss import softmax_cross_entropy
from hetflow.train import SGD, Adam, AdamW
from hetflow.train.device import TrainingKernels, training_kernels
from tests.train.gradcheck import Case, forward, make_node

#: Largest difference allowed, relative to the largest magnitude of the reference.
TOLERANCE = 1e-4

F32 = np.float32

CASES: list[Case] = [
    # -- Conv: odd sizes, padding, strides, groups, dilation, 1-D, batch > 1 --------------------------
    Case("Conv", [(2, 3, 7, 9), (5, 3, 3, 3), (5,)], {"pads": (1, 1, 1, 1)}, label="3x3-pad"),
    Case(
        "Conv",
        [(3, 4, 11, 8), (6, 2, 3, 2), (6,)],
        {"group": 2, "strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (2, 1)},
        label="group-stride-asymmetric-pad-dilation",
    ),
    Case("Conv", [(2, 4, 6, 5), (8, 1, 3, 3), (8,)], {"group": 4, "pads": (1, 1, 1, 1)}, label="depthwise-x2"),
    Case("Conv", [(2, 3, 13), (4, 3, 5), (4,)], {"strides": (2,), "pads": (2, 1), "dilations": (2,)}, label="1d"),
    Case("Conv", [(3, 5, 7, 7), (4, 5, 1, 1)], {"strides": (2, 2)}, label="1x1-stride2-nobias"),
    Case("Conv", [(2, 2, 5, 5), (3, 2, 2, 2), (3,)], {"pads": (2, 2, 2, 2)}, label="pad-past-kernel"),
    # 8 images of 32x32 positions: the weight gradient's reduction is split into image chunks.
    Case("Conv", [(8, 3, 32, 32), (4, 3, 3, 3), (4,)], {"pads": (1, 1, 1, 1)}, label="split-reduction"),
    # -- matrix products --------------------------------------------------------------------------------
    Case("Gemm", [(5, 7), (7, 3), (3,)], label="bias-row"),
    Case("Gemm", [(7, 5), (3, 7), (1, 3)], {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3}, label="trans"),
    Case("Gemm", [(5, 7), (3, 7), (5, 1)], {"transB": 1, "beta": 0.5}, label="column-bias"),
    Case("MatMul", [(9, 6), (6, 5)], label="2d"),
    Case("MatMul", [(2, 3, 5), (5, 4)], label="batched-by-matrix"),
    Case("MatMul", [(2, 1, 3, 4), (3, 4, 2)], label="broadcast-batch"),
    # -- pooling ----------------------------------------------------------------------------------------
    Case("MaxPool", [(2, 3, 7, 6)], {"kernel_shape": (2, 2), "strides": (2, 2)}, label="2x2"),
    Case(
        "MaxPool",
        [(2, 2, 9, 7)],
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": 1},
        label="3x3-overlap-pad-ceil",
    ),
    Case("MaxPool", [(1, 2, 9, 9)], {"kernel_shape": (2, 3), "dilations": (2, 2)}, label="dilated"),
    Case("MaxPool", [(2, 3, 10)], {"kernel_shape": (3,), "strides": (2,), "pads": (1, 0)}, label="1d"),
    Case("AveragePool", [(2, 3, 7, 6)], {"kernel_shape": (3, 2), "strides": (2, 2)}, label="3x2"),
    Case(
        "AveragePool",
        [(2, 2, 8, 9)],
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 1},
        label="include-pad",
    ),
    Case(
        "AveragePool",
        [(1, 3, 9, 8)],
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 0, 1), "ceil_mode": 1},
        label="exclude-pad-ceil",
    ),
    Case("GlobalAveragePool", [(3, 5, 7, 3)], label="4d"),
    # -- activations ------------------------------------------------------------------------------------
    Case("Relu", [(3, 4, 5)]),
    Case("LeakyRelu", [(3, 4, 5)], {"alpha": 0.2}),
    Case("Sigmoid", [(3, 4, 5)]),
    Case("Tanh", [(3, 4, 5)]),
    Case("Clip", [(4, 6), np.array(-0.5, F32), np.array(0.7, F32)], label="both-bounds"),
    Case("Clip", [(4, 6), np.array(-0.2, F32)], label="min-only"),
]


def _inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray | None]:
    arrays: list[np.ndarray | None] = []
    for spec in case.inputs:
        if spec is None or isinstance(spec, np.ndarray):
            arrays.append(spec)
        else:
            arrays.append(rng.standard_normal(spec).astype(F32))
    return arrays


def _as_given(node, inputs, outputs):  # noqa: ANN001, ANN202
    """Inputs and outputs as the tape hands them to a rule: what it does not read as stand-ins."""
    read_inputs, read_outputs = registry.get(node.op_type).backward_reads(node)
    given_in = [
        x if x is None or read_inputs is None or i in read_inputs else shape_only(x.shape, x.dtype)
        for i, x in enumerate(inputs)
    ]
    given_out = [
        y if y is None or read_outputs is None or i in read_outputs else shape_only(y.shape, y.dtype)
        for i, y in enumerate(outputs)
    ]
    return given_in, given_out


def _relative(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-12)
    return float(np.max(np.abs(actual.astype(np.float64) - expected), initial=0.0)) / scale


def _compare(opencl, case: Case, inputs, wanted=None) -> None:  # noqa: ANN001
    node = make_node(case)
    infos = [TensorInfo(x.shape, x.dtype) if x is not None else None for x in inputs]
    rule = training_kernels(opencl).backward.lookup(node, infos)
    assert rule is not None, f"no OpenCL backward rule for {case.id}"
    outputs = forward(node, inputs)
    rng = np.random.default_rng(1)
    grad_outputs = [rng.standard_normal(y.shape).astype(F32) if y is not None else None for y in outputs]
    given_in, given_out = _as_given(node, inputs, outputs)
    expected = registry.get(node.op_type).backward(node, given_in, given_out, grad_outputs, wanted)
    actual = rule.fn(node, given_in, given_out, grad_outputs, wanted)
    assert len(actual) == len(expected)
    for index, (ours, reference) in enumerate(zip(actual, expected)):
        if reference is None:
            assert ours is None, f"input {index}: a gradient nobody asked for"
            continue
        assert ours is not None, f"input {index}: no gradient"
        assert ours.shape == reference.shape and ours.dtype == F32, (index, ours.shape, ours.dtype)
        assert _relative(ours, reference) <= TOLERANCE, (index, _relative(ours, reference))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backward_rule_matches_the_numpy_rule(opencl, case: Case):
    _compare(opencl, case, _inputs(case, np.random.default_rng(0)))


def test_conv_rule_skips_the_gradients_nobody_wants(opencl):
    case = CASES[1]
    _compare(opencl, case, _inputs(case, np.random.default_rng(2)), wanted=[False, True, False])


def test_maxpool_ties_go_to_the_first_maximum_as_on_the_cpu(opencl):
    # Small integers make most windows tie: the gradient must go where the numpy rule sends it.
    case = Case("MaxPool", [(2, 3, 9, 8)], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)})
    x = np.random.default_rng(3).integers(0, 3, (2, 3, 9, 8)).astype(F32)
    _compare(opencl, case, [x])


def test_ops_without_an_opencl_rule_have_no_entry(opencl):
    # They keep their numpy rules (the trainer falls back per node).
    table = training_kernels(opencl).backward
    assert not {"LRN", "BatchNormalization", "Add", "Reshape"} & set(table.op_types())


# -- loss ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 5), (4, 10, 1, 1)])
def test_softmax_cross_entropy_matches_numpy(opencl, shape):
    rng = np.random.default_rng(4)
    logits = (3 * rng.standard_normal(shape)).astype(F32)
    labels = rng.integers(0, shape[1], shape[0])
    ours = training_kernels(opencl).losses["cross_entropy"](logits, labels)
    reference = softmax_cross_entropy(logits, labels)
    assert ours.value == pytest.approx(reference.value, rel=TOLERANCE)
    assert ours.grad.shape == reference.grad.shape
    assert _relative(ours.grad, reference.grad) <= TOLERANCE


def test_softmax_cross_entropy_checks_labels_and_takes_probabilities(opencl):
    loss = training_kernels(opencl).losses["cross_entropy"]
    logits = np.zeros((3, 4), F32)
    with pytest.raises(ValueError, match="class labels"):
        loss(logits, np.array([0, 4, 1]))
    targets = np.full((3, 4), 0.25, F32)
    assert loss(logits, targets).value == pytest.approx(softmax_cross_entropy(logits, targets).value)


# -- optimizers ------------------------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd": lambda: SGD(0.1),
    "sgd-momentum-wd": lambda: SGD(0.05, momentum=0.9, weight_decay=1e-2),
    "sgd-nesterov": lambda: SGD(0.05, momentum=0.8, nesterov=True),
    "adam": lambda: Adam(1e-2),
    "adam-l2": lambda: Adam(1e-2, weight_decay=1e-2, betas=(0.8, 0.99)),
    "adamw": lambda: AdamW(1e-2, weight_decay=0.1),
}


def _params(kernels: TrainingKernels | None, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"w": (7, 5, 3), "b": (7,), "odd": (1,)}
    arrays = {name: rng.standard_normal(shape).astype(F32) for name, shape in shapes.items()}
    if kernels is None:
        return arrays
    # One parameter in memory the device wraps, one it must copy back into.
    return {name: kernels.host_copy(a) if name != "b" else a for name, a in arrays.items()}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_kernels_match_numpy(opencl, name):
    kernels = training_kernels(opencl)
    ours, reference = OPTIMIZERS[name](), OPTIMIZERS[name]()
    params = _params(kernels, np.random.default_rng(5))
    expected = _params(None, np.random.default_rng(5))
    rng = np.random.default_rng(6)
    for _ in range(4):
        grads = {key: rng.standard_normal(p.shape).astype(F32) for key, p in expected.items()}
        reference.step(expected, {k: g.copy() for k, g in grads.items()})
        ours.step(params, grads, kernels)
    for key in expected:
        assert _relative(params[key], expected[key]) <= TOLERANCE, key
    for key, value in reference.state_arrays().items():
        assert _relative(ours.state_arrays()[key], value) <= TOLERANCE, key


# -- the copy path (what a discrete GPU does) ------------------------------------------------------------
@pytest.fixture(scope="module")
def copying(opencl):
    """A second device object on the same OpenCL device that copies instead of mapping host memory."""
    from hetflow.devices.opencl import OpenCLDevice

    return OpenCLDevice(opencl.index, unified=False)


COPY_CASES = [c for c in CASES if c.label in ("group-stride-asymmetric-pad-dilation", "1d", "trans", "3x3-overlap-pad-ceil")]


@pytest.mark.parametrize("case", COPY_CASES, ids=[c.id for c in COPY_CASES])
def test_backward_rules_on_the_copy_path(copying, case: Case):
    assert not copying.unified_memory
    _compare(copying, case, _inputs(case, np.random.default_rng(7)))


@pytest.mark.parametrize("name", ["sgd-nesterov", "adamw"])
def test_optimizer_kernels_write_back_on_the_copy_path(copying, name):
    kernels = training_kernels(copying)
    ours, reference = OPTIMIZERS[name](), OPTIMIZERS[name]()
    params = _params(kernels, np.random.default_rng(8))
    expected = _params(None, np.random.default_rng(8))
    grads = {key: np.full(p.shape, 0.5, F32) for key, p in expected.items()}
    reference.step(expected, {k: g.copy() for k, g in grads.items()})
    ours.step(params, grads, kernels)
    for key in expected:
        assert _relative(params[key], expected[key]) <= TOLERANCE, key
