"""Kernels bound to a node's shapes and buffers (``Kernel.prepare`` / ``Kernel.bind``): each prepared call
gives what the kernel's plain call gives, into the runtime's buffers, and falls back to the plain call
for inputs of other shapes or dtypes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo, array_infos
from hetflow.ops.conv import DIRECT_FMA, ConvAttrs
from hetflow.ops.gemm import GemmAttrs
from hetflow.ops.pool import AveragePoolAttrs, MaxPoolAttrs
from hetflow.ops.softmax import SoftmaxAttrs
from tests.helpers import record_spin_jobs

TABLE = CPUDevice().kernels.kernels
DIRECT = next(k for k in TABLE["Conv"] if k.algorithm == DIRECT_FMA)
RELU = FusedActivation("Relu")
CLIP = FusedActivation("Clip", 0.0, 6.0)
SIGMOID = FusedActivation("Sigmoid")


def _kernel(op_type: str) -> Kernel:
    return TABLE[op_type][0]


def _buffers(kernel: Kernel, node: Node, arrays: list) -> tuple[list, np.ndarray | None]:
    """Dirty output buffers and workspace of the sizes the plain call implies (as an arena gives)."""
    outputs = kernel.fn(node, arrays)
    out = [None if y is None else np.full_like(y, np.nan) for y in outputs]
    nbytes = kernel.workspace(node, array_infos(arrays)) if kernel.workspace is not None else 0
    return out, (np.full(nbytes, 0xFF, np.uint8) if nbytes else None)


def _check_bound(kernel: Kernel, node: Node, arrays: list, rtol: float = 1e-6) -> None:
    """The bound call (prepared: not the plain function) matches the plain call, into ``out``."""
    expected = kernel.fn(node, arrays)
    out, workspace = _buffers(kernel, node, arrays)
    assert kernel.prepare is not None
    assert kernel.prepare(node, array_infos(arrays), out, workspace) is not None, "the kernel declined to bind"
    call = kernel.bind(node, array_infos(arrays), out, workspace)
    for _ in range(2):  # the second call reuses the buffers the first wrote
        results = call(arrays)
        for y, want, target in zip(results, expected, out):
            if want is None:
                assert y is None
                continue
            assert y is target, "the result is not the runtime's buffer"
            np.testing.assert_allclose(y, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


# -- Conv (direct_fma) ---------------------------------------------------------------------------------
CONV_CASES = [
    ((1, 1, 28, 28), (20, 1, 5, 5), ConvAttrs()),  # LeNet's conv1: flat positions
    ((1, 20, 12, 12), (50, 20, 5, 5), ConvAttrs()),  # LeNet's conv2: kernels as lanes
    ((2, 3, 9, 10), (4, 3, 2, 4), ConvAttrs(pads=(0, 3, 1, 0))),
    ((3, 4, 12, 12), (20, 4, 3, 3), ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2))),
]


@pytest.mark.parametrize("fused", [None, RELU, SIGMOID], ids=["plain", "relu", "sigmoid"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CONV_CASES)
def test_direct_conv_bound_matches_the_plain_call(x_shape, w_shape, attrs, bias, fused):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    node = Node("Conv", "conv", ["x", "w", "b" if bias else ""], ["y"], dataclasses.replace(attrs, fused=fused))
    _check_bound(DIRECT, node, [x, w, b], rtol=1e-5)


def test_direct_conv_bound_splits_a_large_call_over_threads(monkeypatch):
    """Past one thread's share the bound call runs the variant's split conv2d, with the same result."""
    from hetflow.devices.cpu.kernels import direct, jit_direct

    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_THREAD", 1)
    monkeypatch.setattr(direct, "intra_op_threads", lambda: 2)
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: 2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 13, 11)).astype(np.float32)
    w = rng.standard_normal((7, 5, 5, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    _check_bound(DIRECT, Node("Conv", "conv", ["x", "w", "b"], ["y"], ConvAttrs(pads=(2, 1, 2, 1))), [x, w, b], 1e-5)


def _spinning_direct_conv(monkeypatch, x_shape, w_shape, strides, python_pool=True):  # noqa: ANN001, ANN202
    """A direct Conv (Relu fused) on seeded X, W and B, split over two spinning threads from one computed
    product on: (the spin jobs recorded from here on, the node, the arrays)."""
    from hetflow.devices.cpu.kernels import direct

    monkeypatch.setattr(direct, "MIN_PRODUCTS_PER_SPIN_SHARE", 1)
    monkeypatch.setattr(direct, "available_cores", lambda: 2)
    jobs = record_spin_jobs(monkeypatch, min_outputs=None, python_pool=python_pool)
    rng = np.random.default_rng(14)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], ConvAttrs(pads=(1, 1, 1, 1), strides=strides, fused=RELU))
    return jobs, node, [x, w, b]


SPIN_CONV_CASES = [((20, 12, 12), (50, 20, 5, 5), (1, 1)), ((64, 6, 6), (40, 64, 3, 3), (1, 1)),
                   ((3, 17, 17), (16, 3, 3, 3), (2, 2))]  # fmt: skip


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize(("x_shape", "w_shape", "strides"), SPIN_CONV_CASES, ids=["flat", "lanes", "phases"])
def test_direct_conv_bound_splits_over_spinning_threads(monkeypatch, x_shape, w_shape, strides, batch):
    """On two spinning threads one image's kernel blocks, or a batch's runs of whole images (each chunk
    in its own part of the scratch), are two chunks of a spin-pool job, with the same result (every
    variant)."""
    from hetflow.devices.cpu import threads

    jobs, node, arrays = _spinning_direct_conv(monkeypatch, (batch, *x_shape), w_shape, strides)
    with threads.own_threads(2, spin=True):
        _check_bound(DIRECT, node, arrays, rtol=1e-5)
    assert [chunks for _, chunks in jobs] == [2, 2]


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize(("x_shape", "w_shape", "strides"), SPIN_CONV_CASES, ids=["flat", "lanes", "phases"])
def test_direct_conv_on_spinning_threads_writes_into_a_concat_slice(monkeypatch, x_shape, w_shape, strides, batch):
    """Y a Concat's channel slice (its images apart): the spin job writes each image's channels there and
    nothing else of the Concat's output, one image shared out by kernel blocks or a batch by images."""
    from hetflow.devices.cpu import threads

    jobs, node, arrays = _spinning_direct_conv(monkeypatch, (batch, *x_shape), w_shape, strides, python_pool=False)
    (expected,) = DIRECT.fn(node, arrays)
    kernels = w_shape[0]
    concat = np.full((batch, kernels + 7, *expected.shape[2:]), -5.0, np.float32)
    target = concat[:, 3 : 3 + kernels]
    _, workspace = _buffers(DIRECT, node, arrays)
    call = DIRECT.bind(node, array_infos(arrays), [target], workspace)
    with threads.own_threads(2, spin=True):
        (y,) = call(arrays)
    assert y is target and len(jobs) == 1
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
    assert (concat[:, :3] == -5.0).all() and (concat[:, 3 + kernels :] == -5.0).all()


def test_direct_conv_does_not_bind_float16():
    node = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs())
    infos = [TensorInfo((1, 2, 6, 6), np.dtype(np.float16)), TensorInfo((3, 2, 3, 3), np.dtype(np.float16))]
    assert DIRECT.prepare(node, infos, None, None) is None


# -- pools ---------------------------------------------------------------------------------------------
POOL_CASES = [
    ("MaxPool", MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)), (1, 20, 24, 24)),  # tiles X: its own loop
    ("MaxPool", MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), (2, 32, 15, 15)),
    ("MaxPool", MaxPoolAttrs(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), (1, 8, 7, 9)),
    ("AveragePool", AveragePoolAttrs(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), (1, 32, 16, 16)),
    ("AveragePool", AveragePoolAttrs(kernel_shape=(2, 2), pads=(1, 0, 1, 0), count_include_pad=1), (2, 3, 6, 5)),
]


@pytest.mark.parametrize(("op_type", "attrs", "x_shape"), POOL_CASES)
def test_pool_bound_matches_the_plain_call(op_type, attrs, x_shape):
    x = np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)
    _check_bound(_kernel(op_type), Node(op_type, "pool", ["x"], ["y"], attrs), [x])


@pytest.mark.parametrize(("op_type", "attrs", "x_shape"), [POOL_CASES[1], POOL_CASES[3]], ids=["max", "average"])
def test_small_pool_bound_splits_its_planes_over_spinning_threads(monkeypatch, op_type, attrs, x_shape):
    """On a spinning run a small pool's planes are two chunks a thread of a spin-pool job, with the same
    result."""
    from hetflow.devices.cpu import threads

    jobs = record_spin_jobs(monkeypatch, python_pool=True)
    x = np.random.default_rng(7).standard_normal(x_shape).astype(np.float32)
    with threads.own_threads(2, spin=True):
        _check_bound(_kernel(op_type), Node(op_type, "pool", ["x"], ["y"], attrs), [x])
    assert [chunks for _, chunks in jobs] == [4] * 4  # the plain call twice (the reference, the buffers' sizes), the bound one twice


def test_max_pool_bound_propagates_nan():
    x = np.random.default_rng(6).standard_normal((1, 2, 8, 8)).astype(np.float32)
    x[0, 1, 3, 2] = np.nan
    node = Node("MaxPool", "pool", ["x"], ["y"], MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)))
    (y, _) = _kernel("MaxPool").bind(node, array_infos([x]))([x])
    assert np.isnan(y[0, 1, 1, 1]) and np.isnan(y).sum() == 1


# -- Gemm ----------------------------------------------------------------------------------------------
GEMM_CASES = [
    (GemmAttrs(transB=1), (1, 800), (500, 800), (500,)),  # LeNet's fc1 at batch 1
    (GemmAttrs(transB=1, fused=RELU), (4, 30), (20, 30), (1, 20)),
    (GemmAttrs(transA=1, fused=CLIP), (30, 4), (30, 20), (20,)),
    (GemmAttrs(transB=1, fused=SIGMOID), (3, 8), (5, 8), (5,)),  # an activation numpy applies
    (GemmAttrs(beta=0.5), (3, 8), (8, 5), (3, 5)),  # a scaled, full C: numpy's add
    (GemmAttrs(fused=RELU), (3, 8), (8, 5), None),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "a_shape", "b_shape", "c_shape"), GEMM_CASES)
def test_gemm_bound_matches_the_plain_call(attrs, a_shape, b_shape, c_shape, dtype):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    c = None if c_shape is None else rng.standard_normal(c_shape).astype(dtype)
    node = Node("Gemm", "fc", ["a", "b", "c" if c is not None else ""], ["y"], attrs)
    _check_bound(_kernel("Gemm"), node, [a, b, c])


def test_gemm_does_not_bind_alpha_or_integers():
    infos = [TensorInfo((2, 3), np.dtype(np.float32)), TensorInfo((3, 4), np.dtype(np.float32))]
    assert _kernel("Gemm").prepare(Node("Gemm", "fc", ["a", "b"], ["y"], GemmAttrs(alpha=2.0)), infos, None, None) is None
    integers = [TensorInfo((2, 3), np.dtype(np.int32)), TensorInfo((3, 4), np.dtype(np.int32))]
    assert _kernel("Gemm").prepare(Node("Gemm", "fc", ["a", "b"], ["y"], GemmAttrs()), integers, None, None) is None


# -- Softmax -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attrs", "shape"),
    [(SoftmaxAttrs(), (1, 10)), (SoftmaxAttrs(axis=1, coerce_2d=1), (2, 3, 4)), (SoftmaxAttrs(axis=-1), (2, 3, 7))],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_bound_matches_the_plain_call(attrs, shape, dtype):
    x = (np.random.default_rng(9).standard_normal(shape) * 20).astype(dtype)
    _check_bound(_kernel("Softmax"), Node("Softmax", "prob", ["x"], ["y"], attrs), [x])


def test_softmax_bound_runs_in_place_and_makes_a_row_with_nan_nan():
    x = np.random.default_rng(10).standard_normal((3, 6)).astype(np.float32)
    x[1, 2] = np.nan
    expected = _kernel("Softmax").fn(Node("Softmax", "p", ["x"], ["y"], SoftmaxAttrs()), [x.copy()])[0]
    node = Node("Softmax", "p", ["x"], ["y"], SoftmaxAttrs())
    (y,) = _kernel("Softmax").bind(node, array_infos([x]), [x])([x])
    assert y is x
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
    np.testing.assert_allclose(y[[0, 2]], expected[[0, 2]], rtol=1e-6)


def test_softmax_over_a_middle_axis_is_not_bound():
    infos = [TensorInfo((2, 3, 4), np.dtype(np.float32))]
    assert _kernel("Softmax").prepare(Node("Softmax", "p", ["x"], ["y"], SoftmaxAttrs(axis=1)), infos, None, None) is None


# -- the guard -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "other",
    [np.zeros((2, 1, 12, 12), np.float32), np.zeros((1, 1, 12, 12), np.float64)],
    ids=["another-shape", "another-dtype"],
)
def test_a_bound_call_falls_back_to_the_plain_call_for_other_inputs(other):
    """Bound to one input shape and dtype, the call hands any other input to ``fn`` (the result is
    then the plain call's, allocated), and never runs the prepared code on it."""
    node = Node("MaxPool", "pool", ["x"], ["y"], MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)))
    x = np.random.default_rng(12).standard_normal((1, 1, 12, 12)).astype(np.float32)
    calls = []

    def prepare(node, infos, out, workspace):  # noqa: ANN001, ANN202
        return lambda inputs: calls.append("prepared") or [out[0], None]

    kernel = dataclasses.replace(_kernel("MaxPool"), prepare=prepare)
    out = [np.empty((1, 1, 6, 6), np.float32)]
    call = kernel.bind(node, array_infos([x]), out)
    assert call([x])[0] is out[0] and calls == ["prepared"]
    other[...] = np.arange(other.size).reshape(other.shape)
    (y, _) = call([other])
    assert calls == ["prepared"] and y.shape == (other.shape[0], 1, 6, 6)
    np.testing.assert_array_equal(y, other[:, :, 1::2, 1::2])


def test_symbolic_shapes_bind_the_plain_call():
    node = Node("MaxPool", "pool", ["x"], ["y"], MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)))
    kernel = dataclasses.replace(_kernel("MaxPool"), prepare=lambda *_: pytest.fail("prepared a symbolic shape"))
    call = kernel.bind(node, [TensorInfo(("N", 1, 4, 4), np.dtype(np.float32))])
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(call([x])[0], [[[[5, 7], [13, 15]]]])
