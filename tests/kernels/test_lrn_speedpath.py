"""The blocked, threaded LRN kernel against ONNX's definition in float64: every block split (whole images,
channel ranges with halos), every exponent path, signs of alpha, dtypes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import norm
from hetflow.devices.cpu.kernels.norm import _lrn_blocks, lrn

RNG = np.random.default_rng(11)


def _reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    squares = np.zeros_like(x64)
    before, after = math.floor((size - 1) / 2), math.ceil((size - 1) / 2)
    for c in range(x.shape[1]):
        squares[:, c] = np.sum(x64[:, max(0, c - before) : c + after + 1] ** 2, axis=1)
    return x64 / (bias + alpha / size * squares) ** beta


def _node(size: int = 5, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(attrs=SimpleNamespace(size=size, alpha=alpha, beta=beta, bias=bias))


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of a few hundred bytes and threads from 1 KiB, so small tensors take every path."""
    monkeypatch.setattr(norm, "_LRN_BLOCK_BYTES", 256)
    monkeypatch.setattr(norm, "_LRN_PARALLEL_BYTES", 1024)


@pytest.mark.parametrize("shape", [(3, 7, 5, 9), (1, 13, 4, 4), (5, 3, 2, 2), (2, 9, 31), (4, 6)])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 9])
def test_blocked_paths_match_the_definition(tiny_blocks, shape, size):
    x = RNG.standard_normal(shape).astype(np.float32) * 4
    actual = lrn(_node(size, alpha=0.05, bias=1.5), [x])[0]
    assert actual.dtype == np.float32 and actual.shape == x.shape
    np.testing.assert_allclose(actual, _reference(x, size, 0.05, 0.75, 1.5), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6, 2.0])
@pytest.mark.parametrize("alpha", [0.05, -0.01, 0.0])
def test_exponents_and_signs(tiny_blocks, beta, alpha):
    x = RNG.standard_normal((2, 11, 3, 5)).astype(np.float32)
    actual = lrn(_node(5, alpha=alpha, beta=beta, bias=2.0), [x])[0]
    np.testing.assert_allclose(actual, _reference(x, 5, alpha, beta, 2.0), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float16, 2e-3)])
def test_other_dtypes_keep_their_type(tiny_blocks, dtype, rtol):
    x = RNG.standard_normal((2, 7, 4, 3)).astype(dtype)
    actual = lrn(_node(3, alpha=0.1), [x])[0]
    assert actual.dtype == dtype
    np.testing.assert_allclose(actual, _reference(x, 3, 0.1, 0.75, 1.0), rtol=rtol, atol=1e-3 if dtype == np.float16 else 0)


def test_alexnet_size_layer_with_default_blocks():
    # 2 x 96 x 55 x 55 float32 (2.3 MB): one image per block is over 1 MiB, so channel ranges with halos.
    x = RNG.standard_normal((2, 96, 55, 55)).astype(np.float32) * 20
    actual = lrn(_node(5, alpha=1e-4, beta=0.75, bias=1.0), [x])[0]
    np.testing.assert_allclose(actual, _reference(x, 5, 1e-4, 0.75, 1.0), rtol=2e-6, atol=1e-7)


def test_blocks_cover_every_image_and_channel_once():
    for shape in [(16, 96, 3025), (1, 192, 3136), (7, 5, 3), (3, 1, 1)]:
        covered = np.zeros(shape[:2], int)
        for n0, n1, c0, c1 in _lrn_blocks(shape, 4):
            covered[n0:n1, c0:c1] += 1
        assert (covered == 1).all(), shape
