"""The 3x3 stride-1 pools padded by one (``jit_pool_same``) against a float64 numpy reference, and that
``jit_pool.pool_2d`` gives them that loop."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_pool, jit_pool_lanes, jit_pool_same
from hetflow.ops import registry
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import Geometry, geometry
from tests.helpers import pool_reference, record_spin_jobs

RNG = np.random.default_rng(5)
SAME = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}

SHAPES = [
    (2, 11, 7, 7),  # planes shorter than a vector pass: blocks of 21 planes, across the two images
    (1, 40, 14, 14),  # Inception's branch pools: blocks of 6 planes, a short last block
    (3, 5, 28, 28),  # 784 floats: blocks of 2 planes
    (1, 3, 40, 56),  # a plane longer than a block
    (2, 4, 2, 2),  # the smallest map taken: every position at an edge
    (1, 6, 5, 1),  # one column: no neighbour left or right
    (1, 2, 2, 33),  # two rows
]


def _geometry(attrs: dict, shape: tuple[int, ...]) -> Geometry:
    return geometry(pool_window(registry.get("MaxPool").Attrs(**attrs)), shape[2:])


def _scale(geo: Geometry, include_pad: bool) -> np.ndarray:
    return (1.0 / geo.window_counts(include_pad=include_pad)).astype(np.float32)


def _pool(x: np.ndarray, op_type: str, include_pad: bool = False, out: np.ndarray | None = None):
    """(Y by ``jit_pool.pool_2d``, the float64 reference)."""
    geo = _geometry(SAME, x.shape)
    scale = None if op_type == "MaxPool" else _scale(geo, include_pad)
    y = np.full(x.shape, np.nan, np.float32) if out is None else out
    jit_pool.pool_2d(x, y, geo, scale, None)
    return y, pool_reference(x.astype(np.float64), geo, None if scale is None else scale.astype(np.float64))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("op_type", "include_pad"), [("MaxPool", False), ("AveragePool", False), ("AveragePool", True)])
def test_same_pools_match_the_float64_reference(shape, op_type, include_pad):
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, op_type, include_pad)
    if op_type == "MaxPool":
        np.testing.assert_array_equal(y, expected)  # a maximum is exact
    else:
        np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_2d_gives_same_windows_this_loop(op_type):
    # The passes sum in another order than the vector loop: their float32 results are this loop's bit
    # for bit, and some differ from the vector loop's.
    shape = (2, 24, 14, 14)
    geo = _geometry(SAME, shape)
    assert jit_pool_same.takes(3, 3, 1, 1, 1, 1, 1, 1, 14, 14, *geo.out)
    x = RNG.standard_normal(shape).astype(np.float32)
    scale = _scale(geo, False)
    is_max = op_type == "MaxPool"
    y, _ = _pool(x, op_type)
    own, lanes = np.empty(x.size, np.float32), np.empty(x.size, np.float32)
    planes = shape[0] * shape[1]
    jit_pool_same.pool_planes(x, own, x[0].size, 0, planes, is_max, scale)
    jit_pool_lanes._vector_planes(x, lanes, x[0].size, 14, 14, 0, planes, 3, 3, 1, 1, 1, 1, 1, 1, is_max, scale)
    np.testing.assert_array_equal(y.reshape(-1), own)
    if not is_max:
        assert (own != lanes).any()


def test_only_three_by_three_stride_one_windows_padded_by_one_are_taken():
    assert jit_pool_same.takes(3, 3, 1, 1, 1, 1, 1, 1, 7, 7, 7, 7)
    assert jit_pool_same.takes(3, 3, 1, 1, 1, 1, 1, 1, 2, 1, 2, 1)
    assert not jit_pool_same.takes(3, 3, 1, 1, 1, 1, 1, 1, 1, 7, 1, 7)  # one row
    assert not jit_pool_same.takes(3, 3, 1, 1, 1, 1, 0, 0, 7, 7, 5, 5)  # no padding
    assert not jit_pool_same.takes(3, 3, 1, 1, 1, 1, 1, 1, 7, 7, 6, 7)  # no padding below
    assert not jit_pool_same.takes(3, 3, 2, 2, 1, 1, 1, 1, 14, 14, 7, 7)  # stride 2
    assert not jit_pool_same.takes(3, 3, 1, 1, 2, 2, 1, 1, 7, 7, 5, 5)  # dilated
    assert not jit_pool_same.takes(5, 5, 1, 1, 1, 1, 2, 2, 7, 7, 7, 7)  # another window


def test_same_max_keeps_nan_and_infinities():
    shape = (2, 9, 14, 14)
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    for value in (np.nan, np.inf, -np.inf):
        flat[RNG.choice(flat.size, flat.size // 40, replace=False)] = value
    x[0, 3] = -np.inf  # a plane of -inf stays -inf: the padding never stands in for it
    x[1, 2, 0, 0] = np.nan  # NaN in a corner spreads to its window's outputs only
    y, expected = _pool(x, "MaxPool")
    assert np.isnan(expected).any() and np.isposinf(expected).any() and (expected[0, 3] == -np.inf).all()
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_same_pools_write_into_a_strided_slice_and_only_there(op_type):
    x = RNG.standard_normal((3, 5, 7, 7)).astype(np.float32)  # blocks stop at each image's last plane
    concat = np.full((3, 9, 7, 7), 7.0, np.float32)
    y, expected = _pool(x, op_type, out=concat[:, 2:7])
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)
    assert (concat[:, :2] == 7).all() and (concat[:, 7:] == 7).all()


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_a_spinning_run_shares_same_pools_out_on_its_pool(monkeypatch, op_type):
    jobs = record_spin_jobs(monkeypatch)
    x = RNG.standard_normal((1, 64, 14, 14)).astype(np.float32)
    with threads.own_threads(2, spin=True):
        y, expected = _pool(x, op_type)
    assert [chunks for _, chunks in jobs] == [4]
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)
