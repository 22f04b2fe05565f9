"""The compiled LRN (``jit_lrn``) through the CPU kernel, against ONNX's definition in float64: window
sizes (odd, even, wider than the channels), every exponent path, signs of alpha, dtypes, runs of
positions that end inside a plane, splits over threads and over a spinning run's pool."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_lrn
from hetflow.devices.cpu.kernels.norm import lrn
from hetflow.ops.norm import lrn_window
from tests.helpers import record_spin_jobs

RNG = np.random.default_rng(11)


def _reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    squares = np.zeros_like(x64)
    before, after = lrn_window(size)
    for c in range(x.shape[1]):
        squares[:, c] = np.sum(x64[:, max(0, c - before) : c + after + 1] ** 2, axis=1)
    return x64 / (bias + alpha / size * squares) ** beta


def _node(size: int = 5, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(attrs=SimpleNamespace(size=size, alpha=alpha, beta=beta, bias=bias))


@pytest.mark.parametrize("shape", [(3, 7, 5, 9), (1, 13, 4, 4), (5, 3, 2, 2), (2, 9, 31), (4, 6), (1, 6, 20, 30)])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 9])
def test_matches_the_definition(shape, size):
    x = RNG.standard_normal(shape).astype(np.float32) * 4
    actual = lrn(_node(size, alpha=0.05, bias=1.5), [x])[0]
    assert actual.dtype == np.float32 and actual.shape == x.shape
    np.testing.assert_allclose(actual, _reference(x, size, 0.05, 0.75, 1.5), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6, 2.0])
@pytest.mark.parametrize("alpha", [0.05, -0.01, 0.0])
def test_exponents_and_signs(beta, alpha):
    x = RNG.standard_normal((2, 11, 3, 5)).astype(np.float32)
    actual = lrn(_node(5, alpha=alpha, beta=beta, bias=2.0), [x])[0]
    np.testing.assert_allclose(actual, _reference(x, 5, alpha, beta, 2.0), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float16, 2e-3)])
def test_other_dtypes_keep_their_type(dtype, rtol):
    x = RNG.standard_normal((2, 7, 4, 3)).astype(dtype)
    actual = lrn(_node(3, alpha=0.1), [x])[0]
    assert actual.dtype == dtype
    np.testing.assert_allclose(actual, _reference(x, 3, 0.1, 0.75, 1.0), rtol=rtol, atol=1e-3 if dtype == np.float16 else 0)


def test_alexnet_layer_in_runs_that_end_inside_planes():
    # 55 x 55 = 3025 positions: 11 runs of 256, the last of 209.
    x = RNG.standard_normal((2, 96, 55, 55)).astype(np.float32) * 20
    actual = lrn(_node(5, alpha=1e-4, beta=0.75, bias=1.0), [x])[0]
    np.testing.assert_allclose(actual, _reference(x, 5, 1e-4, 0.75, 1.0), rtol=2e-6, atol=1e-7)


def test_writes_into_a_strided_slice():
    x = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)
    concat = np.full((2, 7, 6, 6), np.nan, np.float32)
    actual = lrn(_node(3, alpha=0.1), [x], [concat[:, 2:6]])[0]
    np.testing.assert_allclose(concat[:, 2:6], _reference(x, 3, 0.1, 0.75, 1.0), rtol=2e-6, atol=1e-7)
    assert np.shares_memory(actual, concat)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 6:]).all()


def test_two_threads_split_the_runs_and_agree_with_one(monkeypatch):
    from tests.helpers import record_splits

    x = RNG.standard_normal((2, 16, 40, 40)).astype(np.float32)
    splits = record_splits(monkeypatch, jit_lrn)
    previous = threads.BLAS.get()
    try:
        threads.BLAS.set(1)
        single = lrn(_node(), [x])[0]
        assert splits == []
        threads.BLAS.set(2)
        split = lrn(_node(), [x])[0]
        assert splits == [2]
    finally:
        if previous is not None:
            threads.BLAS.set(previous)
    np.testing.assert_array_equal(single, split)


def test_a_spinning_run_shares_the_runs_out_on_its_pool(monkeypatch):
    x = RNG.standard_normal((1, 24, 30, 30)).astype(np.float32)
    with threads.own_threads(1):
        single = lrn(_node(), [x])[0]
    jobs = record_spin_jobs(monkeypatch)
    with threads.own_threads(2, spin=True):
        spun = lrn(_node(), [x])[0]
    assert [chunks for _, chunks in jobs] == [min(4, 900 // jit_lrn.RUN + 1)]
    np.testing.assert_array_equal(spun, single)
