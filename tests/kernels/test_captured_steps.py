"""The small steps a captured run replays as jobs instead of calling them from Python: the final global
pools, a Relu no kernel before it took, LRN. Each bound call's capture, replayed, writes the plain
kernel's result into the Y the plan placed; where the arrays do not fit, nothing is bound or captured."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice, spin_pool, threads
from hetflow.graph import Node
from hetflow.ops.base import array_infos
from hetflow.ops.norm import LRNAttrs
from hetflow.ops.pool import AveragePoolAttrs

KERNELS = {(k.op_type, k.algorithm): k for kernels in CPUDevice().kernels.kernels.values() for k in kernels}
RNG = np.random.default_rng(41)


def _replayed(node: Node, arrays: list[np.ndarray], y_shape: tuple[int, ...], spin: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(the plain kernel's Y, the Y a replay of the bound call's capture wrote into a dirty planned buffer)."""
    kernel = KERNELS[(node.op_type, "default")]
    expected = kernel.fn(node, arrays)[0]
    target = np.full(y_shape, np.nan, np.float32)
    call = kernel.bind(node, array_infos(arrays), [target], None)
    context = threads.own_threads(2, spin=True) if spin else threads.own_threads(1)
    with context:
        outputs, jobs = call.capture(arrays)
        assert outputs[0] is target and len(jobs) == 1
        spin_pool.replay_on(spin_pool.JobScript(jobs), threads.spinning())
    return expected, target


@pytest.mark.parametrize(("op_type", "attrs"), [
    ("GlobalAveragePool", None),
    ("AveragePool", AveragePoolAttrs(kernel_shape=(7, 7))),
])  # fmt: skip
@pytest.mark.parametrize("x_shape", [(1, 1024, 7, 7), (3, 5, 7, 7)])
def test_a_global_mean_replays_as_one_job(op_type, attrs, x_shape):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    node = Node(op_type, "pool", ["x"], ["y"], attrs)
    expected, got = _replayed(node, [x], (*x_shape[:2], 1, 1))
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_an_average_pool_counting_its_padding_is_not_bound_to_the_mean():
    node = Node("AveragePool", "pool", ["x"], ["y"], AveragePoolAttrs(kernel_shape=(9, 9), pads=(1, 1, 1, 1), count_include_pad=1))
    x = RNG.standard_normal((1, 4, 7, 7)).astype(np.float32)
    call = KERNELS[("AveragePool", "default")].bind(node, array_infos([x]), [np.empty((1, 4, 1, 1), np.float32)], None)
    assert getattr(call, "capture", None) is None


@pytest.mark.parametrize("in_place", [False, True], ids=["own-y", "in-place"])
def test_a_relu_replays_as_one_compiled_pass(in_place):
    x = RNG.standard_normal((1, 136, 28, 28)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, -0.0, 0.0]
    node = Node("Relu", "relu", ["x"], ["y"])
    kernel = KERNELS[("Relu", "default")]
    target = x if in_place else np.full(x.shape, np.nan, np.float32)
    expected = np.maximum(x, 0)
    call = kernel.bind(node, array_infos([x]), [target], None)
    with threads.own_threads(2, spin=True):
        outputs, jobs = call.capture([x])
        spin_pool.replay_on(spin_pool.JobScript(jobs), threads.spinning())
    assert outputs[0] is target
    np.testing.assert_array_equal(target, expected)  # NaN passes through, as in numpy


def test_a_float64_relu_is_not_bound():
    x = RNG.standard_normal((2, 3)).astype(np.float64)
    call = KERNELS[("Relu", "default")].bind(Node("Relu", "relu", ["x"], ["y"]), array_infos([x]), [np.empty_like(x)], None)
    assert getattr(call, "capture", None) is None
    np.testing.assert_array_equal(call([x])[0], np.maximum(x, 0))


@pytest.mark.parametrize("spin", [True, False], ids=["spinning", "one-thread"])
@pytest.mark.parametrize("x_shape", [(1, 96, 27, 27), (2, 7, 5, 3)])
def test_an_lrn_replays_as_its_compiled_pass(x_shape, spin):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    node = Node("LRN", "lrn", ["x"], ["y"], LRNAttrs(size=5, alpha=1e-4, beta=0.75, bias=1.0))
    expected, got = _replayed(node, [x], x_shape, spin)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("x_shape", "perm"), [
    ((1, 100, 6), (1, 0, 2)),  # lstm-gesture's input to time-major at batch 1: a copy
    ((16, 100, 6), (1, 0, 2)),  # ... and at 16: [16, 100] planes of 6 floats transposed
    ((2, 1, 3, 1), (1, 0, 3, 2)),  # only unit axes move
    ((2, 3, 4), (2, 0, 1)),
    ((2, 4, 6, 5, 5), (0, 2, 1, 3, 4)),  # a channel shuffle
])  # fmt: skip
def test_a_transpose_swapping_two_groups_of_axes_replays_as_one_job(x_shape, perm):
    from hetflow.ops.tensor import Transpose

    x = RNG.standard_normal(x_shape).astype(np.float32)
    node = Node("Transpose", "t", ["x"], ["y"], Transpose.Attrs(perm=perm))
    expected, got = _replayed(node, [x], tuple(x_shape[a] for a in perm))
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    np.testing.assert_array_equal(got, expected)


def test_a_transpose_that_reorders_memory_is_not_captured():
    from hetflow.ops.tensor import Transpose

    x = RNG.standard_normal((2, 100, 6)).astype(np.float32)
    node = Node("Transpose", "t", ["x"], ["y"], Transpose.Attrs(perm=(2, 1, 0)))
    call = KERNELS[("Transpose", "default")].bind(node, array_infos([x]), [np.empty((6, 100, 2), np.float32)], None)
    assert getattr(call, "capture", None) is None


@pytest.mark.parametrize(("planes", "rows", "columns", "chunks"), [(7, 16, 5, 1), (100, 64, 6, 4), (1, 512, 1, 1), (3, 1, 9, 2)])
def test_planes_transposed_by_a_job_are_numpys_transposes(planes, rows, columns, chunks):
    from hetflow.devices.cpu.kernels.jit_copy import transpose_planes_job

    x = RNG.standard_normal((planes, rows, columns)).astype(np.float32)
    room = np.full(planes * rows * columns + 8, np.nan, np.float32)  # Y, then floats that stay untouched
    y = room[: x.size]
    with threads.own_threads(2, spin=True):
        spin_pool.replay_on(spin_pool.JobScript([transpose_planes_job(x, y, planes, rows, columns, chunks)]),
                            threads.spinning())  # fmt: skip
    np.testing.assert_array_equal(y.reshape(planes, columns, rows), x.transpose(0, 2, 1))
    assert np.isnan(room[x.size :]).all()
    with pytest.raises(ValueError, match="planes x rows x columns x inner"):
        transpose_planes_job(x, y[:-1], planes, rows, columns)
