"""Kernels that write into provided memory: same results into a dirty workspace, a strided out view
(a Concat slice) and, where declared, in place over their input."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.kernels import buffers
from hetflow.devices.cpu.kernels.jit_depthwise import depthwise_2d
from hetflow.devices.cpu.kernels.jit_pool import pool_2d
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import ConvAttrs
from hetflow.ops.registry import get
from hetflow.ops.spatial import WindowSpec, geometry

CPU = CPUDevice()
RNG = np.random.default_rng(7)


def _node(op_type: str, inputs: int, **attrs: object) -> Node:
    op = get(op_type)
    return Node(op_type, op_type.lower(), [f"i{k}" for k in range(inputs)], ["y"], op.Attrs(**attrs))


@pytest.fixture(autouse=True)
def _workspaces_suffice():
    """Every kernel fits in the workspace it declared (no silent allocation)."""
    before = buffers.OVERFLOWS[0]
    yield
    assert buffers.OVERFLOWS[0] == before


def _dirty(nbytes: int) -> np.ndarray:
    """A workspace full of NaN bytes, as another step may have left it."""
    return np.full(nbytes, 0xFF, dtype=np.uint8)


CONV_CASES = [
    ("pad1", (2, 6, 9, 7), (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1))),
    ("stride2", (2, 3, 11, 10), (5, 3, 5, 5), ConvAttrs(pads=(2, 1, 2, 1), strides=(2, 2))),
    ("groups", (2, 8, 7, 7), (6, 4, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2)),
    ("depthwise", (2, 6, 8, 9), (12, 1, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=6)),
    ("depthwise_s2", (2, 6, 9, 9), (6, 1, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2), group=6)),
    ("pointwise", (2, 6, 5, 4), (7, 6, 1, 1), ConvAttrs()),
    ("fused", (2, 6, 9, 7), (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), fused=FusedActivation("Relu"))),
]


@pytest.mark.parametrize(("label", "x_shape", "w_shape", "attrs"), CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_every_conv_algorithm_writes_into_a_concat_slice_with_a_dirty_workspace(label, x_shape, w_shape, attrs):
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    infos = [TensorInfo(x_shape, x.dtype), TensorInfo(w_shape, w.dtype), TensorInfo(b.shape, b.dtype)]
    kernels = CPU.kernels.candidates(node, infos)
    assert len(kernels) >= 2
    for kernel in kernels:
        (expected,) = kernel.fn(node, [x, w, b])
        concat = np.full((x_shape[0], w_shape[0] + 3, *expected.shape[2:]), np.nan, np.float32)
        target = concat[:, 2 : 2 + w_shape[0]]
        workspace = _dirty(kernel.workspace(node, infos)) if kernel.workspace else None
        (got,) = kernel.fn(node, [x, w, b], [target], workspace)
        assert got is target, kernel.algorithm
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=kernel.algorithm)
        assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 2 + w_shape[0] :]).all()


POOL_CASES = [
    ("MaxPool", {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1), "strides": (2, 2)}),
    ("AveragePool", {"kernel_shape": (3, 3), "pads": (1, 0, 1, 0), "count_include_pad": 0}),
    ("AveragePool", {"kernel_shape": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 1}),
]


@pytest.mark.parametrize(("op_type", "attrs"), POOL_CASES)
def test_pools_pad_into_a_dirty_workspace(op_type, attrs):
    node = _node(op_type, 1, **attrs)
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    infos = [TensorInfo(x.shape, x.dtype)]
    kernel = CPU.kernels.lookup(node, infos)
    (expected,) = kernel.fn(node, [x])[:1]
    out = [np.empty_like(expected)]
    (got,) = kernel.fn(node, [x], out, _dirty(kernel.workspace(node, infos)))[:1]
    assert got is out[0]
    np.testing.assert_array_equal(got, expected)


IN_PLACE = [("Relu", 1, {}), ("Add", 2, {}), ("Sum", 3, {}), ("Clip", 1, {}), ("Tanh", 1, {}), ("Softmax", 1, {})]


@pytest.mark.parametrize(("op_type", "inputs", "attrs"), IN_PLACE)
@pytest.mark.parametrize("over", [0, -1])
def test_in_place_kernels_may_write_over_any_input(op_type, inputs, attrs, over):
    node = _node(op_type, inputs, **attrs)
    arrays = [RNG.standard_normal((2, 5, 3)).astype(np.float32) for _ in range(inputs)]
    kernel = CPU.kernels.lookup(node, [TensorInfo(a.shape, a.dtype) for a in arrays])
    assert kernel.writes_out and kernel.inplace
    originals = [a.copy() for a in arrays]
    (expected,) = kernel.fn(node, [a.copy() for a in arrays])
    target = arrays[over]
    (got,) = kernel.fn(node, arrays, [target], None)
    assert got is target
    if op_type == "Sum" and inputs > 2:
        # Written over input k, the sum starts from a_k (it must be read first): the same terms added in
        # another order, equal up to one float32 rounding per partial sum. Where the terms cancel, that
        # is no small relative error (the order-dependent failure this replaced: 7e-6 at -0.0043).
        bound = (inputs - 1) * np.finfo(np.float32).eps * np.sum(np.abs(originals), axis=0)
        assert (np.abs(got - expected) <= bound).all()
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_lrn_and_sigmoid_write_into_out_with_their_workspace():
    x = RNG.standard_normal((2, 9, 5, 5)).astype(np.float32)
    infos = [TensorInfo(x.shape, x.dtype)]
    for node in (_node("LRN", 1, size=5), _node("Sigmoid", 1)):
        kernel = CPU.kernels.lookup(node, infos)
        (expected,) = kernel.fn(node, [x])
        out = [np.empty_like(x)]
        nbytes = kernel.workspace(node, infos) if kernel.workspace is not None else 0  # LRN takes none
        (got,) = kernel.fn(node, [x], out, _dirty(nbytes))
        assert got is out[0]
        np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize(("label", "x_shape", "w_shape", "attrs"), CONV_CASES[:3], ids=[c[0] for c in CONV_CASES[:3]])
def test_a_steady_call_writes_the_fresh_result_into_buffers_it_keeps(label, x_shape, w_shape, attrs):
    """What tuning, calibration and validation time: the kernel's own result, into the same output
    buffers every call (no allocation, as in a run's arena)."""
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    infos = [TensorInfo(x_shape, x.dtype), TensorInfo(w_shape, w.dtype), TensorInfo(b.shape, b.dtype)]
    for kernel in CPU.kernels.candidates(node, infos):
        (expected,) = kernel.fn(node, [x, w, b])
        call = CPU.timed_call(kernel, node, [x, w, b])
        (first,) = call()
        (second,) = call()
        np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5, err_msg=kernel.algorithm)
        assert kernel.writes_out and first is second, kernel.algorithm


def test_a_steady_call_of_a_kernel_without_out_buffers_is_the_plain_call():
    calls = []

    def double(node: Node, inputs: list) -> list:
        calls.append(len(inputs))
        return [inputs[0] * 2]

    kernel = Kernel("Double", double)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    call = kernel.steady_call(_node("Relu", 1), [x])
    assert calls == []  # nothing runs until the call (no buffers to size)
    (result,) = call()
    np.testing.assert_array_equal(result, 2 * x)
    assert calls == [1]


def test_flat_images_spans_image_strided_outputs_and_refuses_the_rest():
    whole = np.zeros((3, 10, 4, 5), np.float32)
    flat, stride = buffers.flat_images(whole)
    assert flat.size == whole.size and stride == 200 and np.shares_memory(flat, whole)

    concat_slice = whole[:, 2:7]  # each image's [5, 4, 5] block contiguous, the images 200 apart
    flat, stride = buffers.flat_images(concat_slice)
    assert stride == 200 and flat.size == 2 * 200 + 100
    flat[stride + 3] = 1.0  # image 1, channel 0, row 0, column 3
    assert concat_slice[1, 0, 0, 3] == 1.0 and whole.sum() == 1.0

    assert buffers.flat_images(whole[:, :, :, ::2]) is None  # rows strided
    assert buffers.flat_images(whole.transpose(0, 1, 3, 2)) is None
    assert buffers.flat_images(whole[::-1]) is None  # images in reverse order


@pytest.mark.parametrize("kernel", ["depthwise", "max", "average"])
def test_compiled_window_loops_write_a_target_they_cannot_store_to_flat(kernel):
    """A target whose images are not contiguous takes the result through a contiguous copy."""
    x = RNG.standard_normal((2, 6, 9, 9)).astype(np.float32)
    wide = np.full((2, 6, 5, 10), np.nan, np.float32)
    target = wide[..., ::2]  # every other column: no flat view
    expected = np.empty(target.shape, np.float32)
    if kernel == "depthwise":
        w = RNG.standard_normal((6, 1, 3, 3)).astype(np.float32)
        b = RNG.standard_normal(6).astype(np.float32)
        for y in (expected, target):
            depthwise_2d(x, w, b, y, (2, 2), (1, 1), (1, 1), FusedActivation("Relu"))
    else:
        spec = WindowSpec(kernel=(3, 3), strides=(2, 2), dilations=(1, 1), pads=(1, 1, 1, 1), auto_pad="NOTSET", ceil_mode=0)
        geo = geometry(spec, x.shape[2:])
        scale = None if kernel == "max" else RNG.random(geo.out).astype(np.float32)
        for y in (expected, target):
            pool_2d(x, y, geo, scale)
    np.testing.assert_array_equal(target, expected)
    assert np.isnan(wide[..., 1::2]).all()
