"""The 3x3 stride-2 max and average pools in strips (``jit_pool_strided``) against a float64 numpy
reference: padding, ceil mode, maps narrower and wider than a strip, NaN and infinities, slices of a
Concat, the spinning pool; and that ``jit_pool.pool_2d`` gives them that loop."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_pool, jit_pool_lanes, jit_pool_strided
from hetflow.ops import registry
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import Geometry, geometry
from tests.helpers import pool_reference, record_spin_jobs

RNG = np.random.default_rng(11)

CASES = [
    ((1, 7, 27, 27), {}),  # SqueezeNet's third pool: 13 outputs, the strip's last lanes unused
    ((2, 3, 55, 55), {}),  # two strips, the second of 11 columns; two images
    ((1, 4, 56, 56), {"ceil_mode": 1}),  # ceil mode: the last window reads past the map
    ((1, 3, 112, 112), {"pads": (1, 1, 1, 1)}),  # ResNet-50's pool: padding on every side
    ((1, 5, 14, 14), {"ceil_mode": 1, "pads": (0, 1, 0, 1)}),  # padding on one side only, and ceil
    ((3, 2, 9, 33), {}),  # a wide, short map
    ((1, 2, 3, 3), {}),  # one window
    ((1, 2, 4, 4), {"pads": (1, 1, 1, 1), "ceil_mode": 1}),  # every window at an edge
    ((1, 1, 1, 40), {"pads": (1, 0, 1, 0)}),  # one row, the rows above and below padding
]


def _geometry(attrs: dict, shape: tuple[int, ...]) -> Geometry:
    full = {"kernel_shape": (3, 3), "strides": (2, 2), **attrs}
    return geometry(pool_window(registry.get("MaxPool").Attrs(**full)), shape[2:])


def _scale(geo: Geometry) -> np.ndarray:
    """An average's reciprocal window counts ``[OH, OW]``, padding excluded (and a different factor for
    every output, so a misplaced one shows)."""
    ones = np.ones((1, 1, *(axis.size for axis in geo.axes)))
    counts = pool_reference(ones, geo, np.ones(geo.out))[0, 0]
    return (1.0 / counts * (1.0 + np.arange(counts.size).reshape(counts.shape) / 1000)).astype(np.float32)


def _pool(
    x: np.ndarray, attrs: dict, out: np.ndarray | None = None, average: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(Y by ``jit_pool.pool_2d``, the float64 reference): the maximum, or the ``_scale``d sum."""
    geo = _geometry(attrs, x.shape)
    scale = _scale(geo) if average else None
    y = np.full((*x.shape[:2], *geo.out), np.nan, np.float32) if out is None else out
    jit_pool.pool_2d(x, y, geo, scale, None)
    return y, pool_reference(x.astype(np.float64), geo, None if scale is None else scale.astype(np.float64))


def _strips(x: np.ndarray, attrs: dict, average: bool = False) -> tuple[np.ndarray, list[bool]]:
    """Every plane of ``x`` by ``jit_pool_strided.pool_plane`` alone, and whether each met a NaN."""
    geo = _geometry(attrs, x.shape)
    (out_h, out_w), (rows, cols) = geo.out, geo.axes
    height, width = x.shape[2:]
    scale = _scale(geo).reshape(-1) if average else np.ones(1, np.float32)
    y = np.full(x.shape[0] * x.shape[1] * out_h * out_w, np.nan, np.float32)
    flat = x.reshape(-1)
    nans = [
        jit_pool_strided.pool_plane(flat, plane * height * width, height, width, rows.pad_begin, cols.pad_begin, y,
                                    plane * out_h * out_w, out_h, out_w, not average, scale)
        for plane in range(x.shape[0] * x.shape[1])
    ]  # fmt: skip
    return y.reshape(*x.shape[:2], out_h, out_w), nans


@pytest.mark.parametrize(("shape", "attrs"), CASES)
def test_strips_match_the_float64_reference(shape, attrs):
    x = RNG.standard_normal(shape).astype(np.float32)
    y, nans = _strips(x, attrs)
    assert not any(nans)
    _, expected = _pool(x, attrs)
    np.testing.assert_array_equal(y, expected)  # a maximum is exact


@pytest.mark.parametrize(("shape", "attrs"), CASES)
def test_pool_2d_takes_the_strips_and_matches_the_reference(shape, attrs):
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, attrs)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(y, _strips(x, attrs)[0])


@pytest.mark.parametrize(("shape", "attrs"), CASES)
def test_average_strips_match_the_float64_reference(shape, attrs):
    """cifar10-quick's pools: the sum of each window (padding adds zero) times its own factor."""
    x = RNG.standard_normal(shape).astype(np.float32)
    y, nans = _strips(x, attrs, average=True)
    assert not any(nans)
    pooled, expected = _pool(x, attrs, average=True)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pooled, y)


def test_an_average_carries_a_nan_and_infinities():
    x = RNG.standard_normal((1, 3, 27, 27)).astype(np.float32)
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 10, 10] = np.inf
    x[0, 2, 10, 10], x[0, 2, 10, 11] = np.inf, -np.inf
    with np.errstate(invalid="ignore"):  # the reference's inf - inf
        y, _ = _pool(x, {}, average=True)
    assert np.isnan(y[0, 0, 1:3, 1:3]).all() and np.isnan(y[0, 0]).sum() == 4
    assert np.isposinf(y[0, 1, 4:6, 4:6]).all() and np.isposinf(y[0, 1]).sum() == 4
    assert np.isnan(y[0, 2, 4:6, 5]).all()  # inf - inf in the windows that hold both


def test_only_three_by_three_stride_two_undilated_windows_are_taken():
    assert jit_pool_strided.takes(3, 3, 2, 2, 1, 1)
    assert not jit_pool_strided.takes(3, 3, 1, 1, 1, 1)  # stride 1
    assert not jit_pool_strided.takes(3, 3, 2, 1, 1, 1)  # strides differ
    assert not jit_pool_strided.takes(2, 2, 2, 2, 1, 1)  # another window
    assert not jit_pool_strided.takes(3, 3, 2, 2, 2, 2)  # dilated


def test_a_plane_that_meets_a_nan_is_pooled_again_exactly():
    shape = (1, 6, 28, 28)  # 13 windows a row: the last column is read by none
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 1, 5, 7] = np.nan  # inside a window: spreads to that window's outputs
    x[0, 3, 26, 27] = np.nan  # read by the strips' loads, by no window
    x[0, 4] = np.inf
    x[0, 5] = -np.inf  # a plane of -inf stays -inf
    _, nans = _strips(x, {})
    assert nans[1] and nans[3] and not nans[0] and not nans[4]
    y, expected = _pool(x, {})
    assert np.isnan(expected[0, 1]).sum() >= 1 and not np.isnan(expected[0, 3]).any()
    np.testing.assert_array_equal(y, expected)


def test_strips_write_into_a_slice_of_a_concat_and_only_there():
    x = RNG.standard_normal((2, 5, 27, 27)).astype(np.float32)
    concat = np.full((2, 9, 13, 13), 7.0, np.float32)
    y, expected = _pool(x, {}, out=concat[:, 2:7])
    np.testing.assert_array_equal(y, expected)
    assert (concat[:, :2] == 7).all() and (concat[:, 7:] == 7).all()


def test_a_spinning_run_shares_the_strips_out_on_its_pool(monkeypatch):
    jobs = record_spin_jobs(monkeypatch)
    x = RNG.standard_normal((1, 256, 27, 27)).astype(np.float32)
    with threads.own_threads(2, spin=True):
        y, expected = _pool(x, {})
    assert jobs and all(chunks > 1 for _, chunks in jobs)
    np.testing.assert_array_equal(y, expected)


def test_the_strips_agree_with_the_vector_loop_they_replace():
    x = RNG.standard_normal((2, 8, 31, 29)).astype(np.float32)
    geo = _geometry({"pads": (1, 1, 1, 1), "ceil_mode": 1}, x.shape)
    out_h, out_w = geo.out
    strips, lanes = np.empty(16 * out_h * out_w, np.float32), np.empty(16 * out_h * out_w, np.float32)
    scale = np.ones((1, 1), np.float32)
    jit_pool_lanes.vector_planes(x, strips, 8 * out_h * out_w, out_h, out_w, 0, 16, 3, 3, 2, 2, 1, 1, 1, 1, True, scale)
    jit_pool_lanes._vector_planes(x, lanes, 8 * out_h * out_w, out_h, out_w, 0, 16, 3, 3, 2, 2, 1, 1, 1, 1, True,
                                  scale)  # fmt: skip
    np.testing.assert_array_equal(strips, lanes)
