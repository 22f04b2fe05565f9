"""The training Gemm (``gemm_train``): its row-split product against ``a @ b``, its forward against the
formula, its backward against the numpy rule in float64, and the two-thread split against one thread."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import gemm_train
from hetflow.devices.cpu.threads import BLAS
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.gemm import Gemm, GemmAttrs
from hetflow.train.kernels import training_kernel

RNG = np.random.default_rng(5)

#: (attrs, A shape, B shape, C shape or None): transposes, scales, every way C broadcasts.
CASES = [
    (GemmAttrs(transB=1), (7, 5), (3, 5), (3,)),
    (GemmAttrs(), (7, 5), (5, 3), (7, 3)),
    (GemmAttrs(transA=1, alpha=0.5, beta=2.0), (5, 7), (5, 3), (7, 1)),
    (GemmAttrs(transA=1, transB=1, alpha=-1.5), (5, 7), (3, 5), ()),
    (GemmAttrs(beta=0.0), (4, 6), (6, 2), (2,)),
    (GemmAttrs(transB=1), (9, 4), (6, 4), None),
]
IDS = ["transB-row-bias", "full-C", "transA-scaled-column-C", "both-scalar-C", "beta0", "no-C"]


@pytest.fixture(params=["one thread", "two threads"])
def threads(request, monkeypatch):
    """Products run whole, or split in two ranges of rows (the threshold lowered so small ones split)."""
    calls: list[int] = []
    original = gemm_train.parallel_for

    def counting(body, count, threads=None):
        calls.append(count)
        original(body, count, threads)

    monkeypatch.setattr(gemm_train, "parallel_for", counting)
    if request.param == "two threads":
        monkeypatch.setattr(gemm_train, "intra_op_threads", lambda: 2)
        monkeypatch.setattr(gemm_train, "MIN_MACS_PER_THREAD", 1)
    return calls


def _operands(a_shape, b_shape, c_shape):
    a, b = RNG.standard_normal(a_shape), RNG.standard_normal(b_shape)
    return a, b, None if c_shape is None else RNG.standard_normal(c_shape)


@pytest.mark.parametrize(("rows", "depth", "columns"), [(1, 3, 4), (7, 5, 3), (64, 33, 17)])
@pytest.mark.parametrize("transposed", [False, True])
def test_split_matmul_is_the_product(threads, rows, depth, columns, transposed):
    a = RNG.standard_normal((depth, rows)).T if transposed else RNG.standard_normal((rows, depth))
    b = RNG.standard_normal((columns, depth)).T
    np.testing.assert_allclose(gemm_train.split_matmul(a, b), a @ b, rtol=1e-13, atol=1e-13)
    # Two threads split every product of two rows or more; one thread never does.
    assert threads == [min(2 if gemm_train.MIN_MACS_PER_THREAD == 1 else 1, rows)]


def test_split_matmul_holds_blas_at_one_thread(monkeypatch):
    held: list[int] = []
    monkeypatch.setattr(BLAS, "hold", lambda count: held.append(count))
    monkeypatch.setattr(BLAS, "restore", lambda previous: None)
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((3, 2))
    gemm_train.split_matmul(a, b)
    assert held == [1]


def test_two_threads_agree_with_one(monkeypatch):
    a, b = RNG.standard_normal((128, 300)), RNG.standard_normal((300, 40))
    one = gemm_train.split_matmul(a, b)
    monkeypatch.setattr(gemm_train, "intra_op_threads", lambda: 2)
    monkeypatch.setattr(gemm_train, "MIN_MACS_PER_THREAD", 1)
    np.testing.assert_allclose(gemm_train.split_matmul(a, b), one, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(("attrs", "a_shape", "b_shape", "c_shape"), CASES, ids=IDS)
def test_forward_matches_the_formula(threads, attrs, a_shape, b_shape, c_shape):
    a, b, c = _operands(a_shape, b_shape, c_shape)
    a2 = a.T if attrs.transA else a
    b2 = b.T if attrs.transB else b
    expected = attrs.alpha * (a2 @ b2) + (0 if c is None else attrs.beta * c)
    np.testing.assert_allclose(gemm_train.gemm_forward(a, b, c, attrs), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(("attrs", "a_shape", "b_shape", "c_shape"), CASES, ids=IDS)
def test_backward_matches_the_numpy_rule(threads, attrs, a_shape, b_shape, c_shape):
    a, b, c = _operands(a_shape, b_shape, c_shape)
    inputs = [a, b] if c is None else [a, b, c]
    node = Node("Gemm", "fc", ["a", "b", "c"][: len(inputs)], ["y"], attrs)
    dy = RNG.standard_normal(_y_shape(a, b, attrs))
    for wanted in itertools.product([False, True], repeat=3):
        found = gemm_train.gemm_backward(a, b, None if c is None else c.shape, dy, attrs, wanted)
        reference = Gemm().backward(node, inputs, [None], [dy], list(wanted[: len(inputs)]))
        for index, ours in enumerate(found[: len(inputs)]):
            theirs = reference[index]
            assert (ours is None) == (theirs is None)
            if theirs is not None:
                assert ours.shape == inputs[index].shape
                np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-13)


def _y_shape(a: np.ndarray, b: np.ndarray, attrs: GemmAttrs) -> tuple[int, int]:
    return (a.shape[1] if attrs.transA else a.shape[0], b.shape[0] if attrs.transB else b.shape[1])


def test_float32_stays_float32():
    a, b, c = (x.astype(np.float32) for x in _operands((6, 4), (3, 4), (3,)))
    attrs = GemmAttrs(transB=1, alpha=0.5)
    y = gemm_train.gemm_forward(a, b, c, attrs)
    grads = gemm_train.gemm_backward(a, b, c.shape, np.ones_like(y), attrs, (True, True, True))
    assert y.dtype == grads.a.dtype == grads.b.dtype == grads.c.dtype == np.float32


def test_fused_activations_are_refused():
    a, b, _ = _operands((3, 4), (4, 2), None)
    with pytest.raises(ValueError, match="no activation"):
        gemm_train.gemm_forward(a, b, None, GemmAttrs(fused=FusedActivation("Relu")))


def test_training_forward_runs_the_split_gemm_and_hands_other_dtypes_back():
    node = Node("Gemm", "fc", ["a", "b", "c"], ["y"], GemmAttrs(transB=1))
    forward = training_kernel(node)
    assert forward is not None
    a, b, c = _operands((5, 4), (3, 4), (3,))
    np.testing.assert_allclose(forward(node, [a, b, c])[0], a @ b.T + c, rtol=1e-13)
    ints = [a.astype(np.int32), b.astype(np.int32), c.astype(np.int32)]
    np.testing.assert_array_equal(forward(node, ints)[0], ints[0] @ ints[1].T + ints[2])
    fused = Node("Gemm", "fc", ["a", "b"], ["y"], GemmAttrs(fused=FusedActivation("Relu")))
    assert training_kernel(fused) is None
