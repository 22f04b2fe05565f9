"""Add and Sum with a fused activation on the CPU (the compiled one-pass kernel and the numpy fallbacks)
against numpy: every activation, in place, broadcasting, three inputs, strided outputs, float64, the
two-thread split; and the backward rules refusing a fused node."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.threads import BLAS
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.elementwise import Add, Sum, SumAttrs
from tests.kernels.test_depthwise_jit import ACTIVATIONS, _activate

CPU = CPUDevice()
RNG = np.random.default_rng(31)


def _run(op_type: str, arrays: list[np.ndarray], fused: FusedActivation | None, out=None) -> np.ndarray:
    names = [f"x{i}" for i in range(len(arrays))]
    node = Node(op_type, "s", names, ["y"], SumAttrs(fused=fused))
    kernel = CPU.kernels.lookup(node, [TensorInfo(a.shape, a.dtype) for a in arrays])
    assert kernel is not None
    return kernel.fn(node, arrays, None if out is None else [out])[0]


def _reference(arrays: list[np.ndarray], fused: FusedActivation | None) -> np.ndarray:
    total = arrays[0].astype(np.float64)
    for array in arrays[1:]:
        total = total + array
    return _activate(total, fused)


@pytest.mark.parametrize("fused", ACTIVATIONS, ids=lambda f: "none" if f is None else f.op_type)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("op_type", "shapes"),
    [("Add", [(2, 3, 4, 5)] * 2), ("Add", [(2, 3, 4, 5), (3, 1, 1)]), ("Add", [(7,)] * 2),
     ("Sum", [(2, 3, 6)] * 2), ("Sum", [(2, 3, 6)] * 3)],
    ids=["same", "broadcast", "1-d", "sum-2", "sum-3"],
)  # fmt: skip
def test_matches_numpy(op_type, shapes, dtype, fused):
    arrays = [RNG.standard_normal(shape).astype(dtype) for shape in shapes]
    got = _run(op_type, arrays, fused)
    assert got.dtype == dtype
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, _reference(arrays, fused), rtol=tolerance, atol=tolerance)


def test_runs_in_place_into_an_input():
    a, b = (RNG.standard_normal((2, 4, 3, 3)).astype(np.float32) for _ in range(2))
    expected = _reference([a, b], FusedActivation("Relu"))
    got = _run("Add", [a, b], FusedActivation("Relu"), out=a)
    assert np.shares_memory(got, a)
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6)


def test_writes_into_a_strided_slice():
    a, b = (RNG.standard_normal((2, 3, 4, 4)).astype(np.float32) for _ in range(2))
    concat = np.full((2, 5, 4, 4), np.nan, np.float32)
    got = _run("Add", [a, b], FusedActivation("Clip", -0.5, 0.5), out=concat[:, 1:4])
    assert np.shares_memory(got, concat)
    np.testing.assert_allclose(concat[:, 1:4], _reference([a, b], FusedActivation("Clip", -0.5, 0.5)), rtol=1e-6)
    assert np.isnan(concat[:, :1]).all() and np.isnan(concat[:, 4:]).all()


def test_two_threads_split_the_planes_and_agree_with_one(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_residual
    from tests.helpers import record_splits

    a, b = (RNG.standard_normal((3, 8, 6, 6)).astype(np.float32) for _ in range(2))
    splits = record_splits(monkeypatch, jit_residual)
    previous = BLAS.get()
    try:
        BLAS.set(1)
        single = _run("Add", [a, b], FusedActivation("LeakyRelu", 0.3))
        assert splits == []
        BLAS.set(2)
        split = _run("Add", [a, b], FusedActivation("LeakyRelu", 0.3))
        assert splits == [2]
    finally:
        if previous is not None:
            BLAS.set(previous)
    np.testing.assert_array_equal(single, split)


@pytest.mark.parametrize("op", [Add(), Sum()], ids=["Add", "Sum"])
def test_backward_refuses_a_fused_node(op):
    x = RNG.standard_normal((2, 3))
    node = Node(op.op_type, "s", ["a", "b"], ["y"], SumAttrs(fused=FusedActivation("Relu")))
    with pytest.raises(ValueError, match="fused activation"):
        op.backward(node, [x, x], [x], [np.ones_like(x)])
