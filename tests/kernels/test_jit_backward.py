"""The compiled MaxPool and Relu backward passes (and MaxPool's Indices forward) against a direct
per-window reference and the ops' numpy rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_backward
from hetflow.devices.cpu.kernels.jit_pool import pool_2d, tiles_input
from hetflow.devices.cpu.kernels.pool import max_pool
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.pool import MaxPoolAttrs, pool_window
from hetflow.ops.spatial import Geometry, geometry

RNG = np.random.default_rng(5)

#: (attrs, X shape): non-overlapping and overlapping windows, pads, strides, dilations, ceil mode.
POOL_CASES = [
    (MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)), (2, 3, 8, 8)),
    (MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)), (1, 2, 7, 9)),
    (MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), (2, 3, 9, 7)),
    (MaxPoolAttrs(kernel_shape=(3, 2), strides=(1, 2), pads=(0, 1, 2, 1), dilations=(2, 1)), (2, 3, 9, 7)),
    (MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), (1, 2, 8, 8)),
    (MaxPoolAttrs(kernel_shape=(3, 3), strides=(1, 1), pads=(2, 2, 2, 2)), (1, 1, 2, 3)),
    # Windows that tile the plane (stride = window), with padding, ceil mode and uncovered borders.
    (MaxPoolAttrs(kernel_shape=(3, 2), strides=(3, 2), pads=(1, 0, 2, 1)), (2, 3, 10, 7)),
    (MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 0, 0), ceil_mode=1), (1, 2, 6, 7)),
    (MaxPoolAttrs(kernel_shape=(3, 3), strides=(3, 3)), (1, 2, 11, 10)),
    (MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2), pads=(3, 3, 3, 3)), (1, 1, 2, 3)),
]
POOL_IDS = [
    "2x2", "2x2-odd", "3x3-pad", "dilated-asym", "ceil", "pad-past-input",
    "tiled-3x2-pad", "tiled-ceil-pad", "tiled-3x3-uncovered", "tiled-pad-past-input",
]  # fmt: skip


def direct_max_pool_backward(x: np.ndarray, dy: np.ndarray, geom: Geometry) -> np.ndarray:
    """Window by window: dY to the first maximum in row-major tap order, padding reading -inf."""
    dx = np.zeros_like(x)
    rows, cols = geom.axes
    for n, c, oy, ox in itertools.product(*map(range, dy.shape)):
        taps = []
        for i, j in itertools.product(range(rows.kernel), range(cols.kernel)):
            iy = oy * rows.stride + i * rows.dilation - rows.pad_begin
            ix = ox * cols.stride + j * cols.dilation - cols.pad_begin
            inside = 0 <= iy < x.shape[2] and 0 <= ix < x.shape[3]
            taps.append((x[n, c, iy, ix] if inside else -np.inf, (iy, ix) if inside else None))
        winner = taps[int(np.argmax([value for value, _ in taps]))][1]
        if winner is not None:
            dx[n, c, winner[0], winner[1]] += dy[n, c, oy, ox]
    return dx


def _pool_inputs(
    attrs: MaxPoolAttrs, shape: tuple[int, ...], dtype: type
) -> tuple[np.ndarray, np.ndarray, Geometry]:
    geom = geometry(pool_window(attrs), shape[2:])
    x = RNG.standard_normal(shape).astype(dtype)
    x[0, 0, 0, :2] = x[0, 0, 1, 0]  # ties: the first in tap order wins
    dy = RNG.standard_normal((shape[0], shape[1], *geom.out)).astype(dtype)
    return x, dy, geom


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "shape"), POOL_CASES, ids=POOL_IDS)
def test_max_pool_backward_matches_the_direct_loop(attrs, shape, dtype):
    x, dy, geom = _pool_inputs(attrs, shape, dtype)
    got = jit_backward.max_pool_backward_2d(x, dy, geom)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, direct_max_pool_backward(x, dy, geom), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("attrs", "shape"), POOL_CASES, ids=POOL_IDS)
def test_max_pool_backward_agrees_with_the_numpy_rule(attrs, shape):
    x, dy, geom = _pool_inputs(attrs, shape, np.float64)
    node = Node("MaxPool", "pool", ["x"], ["y"], attrs)
    reference = registry.get("MaxPool").backward(node, [x], [None], [dy])[0]
    got = jit_backward.max_pool_backward_2d(x, dy, geom)
    if all(a.stride >= (a.kernel - 1) * a.dilation + 1 for a in geom.axes):
        np.testing.assert_array_equal(got, reference)  # each input in one window: the same sums
    else:
        np.testing.assert_allclose(got, reference, rtol=1e-14, atol=1e-14)


def test_max_pool_backward_nan_and_infinite_windows():
    """A NaN wins its window (the first NaN), and a window of -inf keeps its first tap, as ``argmax``."""
    attrs, shape = POOL_CASES[2]
    x, dy, geom = _pool_inputs(attrs, shape, np.float64)
    x[0, 0, 1, 1] = np.nan
    x[0, 0, 2, 2] = np.nan
    x[1, 2, :3, :3] = -np.inf
    node = Node("MaxPool", "pool", ["x"], ["y"], attrs)
    reference = registry.get("MaxPool").backward(node, [x], [None], [dy])[0]
    got = jit_backward.max_pool_backward_2d(x, dy, geom)
    np.testing.assert_allclose(got, reference, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(got, direct_max_pool_backward(x, dy, geom), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("case", [3, 6], ids=["dilated-asym", "tiled-3x2-pad"])
def test_max_pool_backward_split_over_threads(monkeypatch, case):
    monkeypatch.setattr(threads, "intra_op_threads", lambda: 2)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_BESIDE_BLAS_THREADS", 1)
    attrs, shape = POOL_CASES[case]
    x, dy, geom = _pool_inputs(attrs, shape, np.float32)
    np.testing.assert_allclose(
        jit_backward.max_pool_backward_2d(x, dy, geom), direct_max_pool_backward(x, dy, geom), rtol=1e-6
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "shape"), POOL_CASES, ids=POOL_IDS)
def test_max_pool_indices_give_the_forward_and_the_backward(attrs, shape, dtype):
    """Y is the compiled max pool's; dY scattered by the Indices is the per-window search's dX, bit for
    bit; the Indices are the CPU kernel's ONNX Indices (ties to the first tap)."""
    x, dy, geom = _pool_inputs(attrs, shape, dtype)
    y, indices = jit_backward.max_pool_indices_2d(x, geom)
    expected_y = np.empty_like(y)
    pool_2d(x, expected_y, geom, None)
    np.testing.assert_array_equal(y, expected_y)
    node = Node("MaxPool", "pool", ["x"], ["y", "indices"], attrs)
    expected_indices = max_pool(node, [x])[1]
    real = indices >= 0  # -1: the padding won (a window of padding only, in "pad-past-input")
    np.testing.assert_array_equal(indices[real], expected_indices[real])
    dx = jit_backward.max_pool_scatter_2d(indices, dy, x.shape)
    np.testing.assert_array_equal(dx, jit_backward.max_pool_backward_2d(x, dy, geom))


def test_max_pool_indices_nan_and_infinite_windows():
    """As the search: a NaN wins its window (the first NaN), a window of -inf keeps its first tap, and a
    window whose first tap is padding and the rest -inf drops its gradient."""
    attrs, shape = POOL_CASES[2]
    x, dy, geom = _pool_inputs(attrs, shape, np.float64)
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = np.nan
    x[1, 2, :3, :3] = -np.inf
    y, indices = jit_backward.max_pool_indices_2d(x, geom)
    assert indices[1, 2, 0, 0] == -1 and np.isnan(y[0, 0, 0, 0])
    dx = jit_backward.max_pool_scatter_2d(indices, dy, x.shape)
    np.testing.assert_array_equal(dx, direct_max_pool_backward(x, dy, geom))


def test_windows_that_tile_the_input_skip_the_phase_planes():
    """Stride = window, no padding, every window inside X: the tiling loop; anything else: phases."""
    tiled = [tiles_input(geometry(pool_window(attrs), shape[2:])) for attrs, shape in POOL_CASES]
    assert [POOL_IDS[i] for i, t in enumerate(tiled) if t] == ["2x2", "2x2-odd", "tiled-3x3-uncovered"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiled_max_pool_indices_ties_nan_and_infinity(dtype):
    """The tiling loop keeps the search's rules: ties and -inf windows go to the first tap, the first
    NaN wins."""
    attrs, shape = POOL_CASES[0]
    x, dy, geom = _pool_inputs(attrs, shape, dtype)
    x[0, 0, :2, :2] = 1.0  # a tie: the first tap
    x[0, 1, 2:4, 2:4] = -np.inf
    x[1, 0, 0, 1] = x[1, 0, 1, 0] = np.nan  # the first NaN in row-major order
    y, indices = jit_backward.max_pool_indices_2d(x, geom)
    plane = shape[2] * shape[3]
    assert indices[0, 0, 0, 0] == 0 and y[0, 0, 0, 0] == 1.0
    assert indices[0, 1, 1, 1] == plane + 2 * shape[3] + 2 and y[0, 1, 1, 1] == -np.inf
    assert indices[1, 0, 0, 0] == shape[1] * plane + 1 and np.isnan(y[1, 0, 0, 0])
    np.testing.assert_array_equal(
        jit_backward.max_pool_scatter_2d(indices, dy, x.shape), direct_max_pool_backward(x, dy, geom)
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [30, 32, 34, 50], ids=["short-rows", "vector-rows", "odd-half", "long-rows"])
def test_2x2_max_pool_rows_ties_nan_and_infinity(dtype, width):
    """2x2/2 windows over rows long enough for the vectorised row loop (and just too short for it):
    values from {0, 1, 2} tie in most windows, with NaNs and -inf among them. Y and the Indices are
    argmax's over each window's taps in row-major order (the first maximum; the first NaN), and so is
    the inference pool's Y."""
    attrs = MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2))
    shape = (2, 3, 6, width)
    geom = geometry(pool_window(attrs), shape[2:])
    x = RNG.integers(0, 3, shape).astype(dtype)
    x.reshape(-1)[::37] = np.nan
    x.reshape(-1)[5::41] = -np.inf
    dy = RNG.standard_normal((shape[0], shape[1], *geom.out)).astype(dtype)
    y, indices = jit_backward.max_pool_indices_2d(x, geom)
    out_h, out_w = geom.out
    taps = x.reshape(*shape[:2], out_h, 2, out_w, 2).transpose(0, 1, 2, 4, 3, 5).reshape(*shape[:2], out_h, out_w, 4)
    winner = np.argmax(taps, axis=-1)
    expected_y = np.take_along_axis(taps, winner[..., None], axis=-1)[..., 0]
    n, c, oy, ox = np.indices(winner.shape)
    expected_indices = ((n * shape[1] + c) * shape[2] + 2 * oy + winner // 2) * shape[3] + 2 * ox + winner % 2
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_array_equal(
        jit_backward.max_pool_scatter_2d(indices, dy, x.shape), direct_max_pool_backward(x, dy, geom)
    )
    plain = np.empty_like(y)
    pool_2d(x, plain, geom, None)
    np.testing.assert_array_equal(plain, expected_y)


@pytest.mark.parametrize("case", [0, 3, 6], ids=["2x2", "dilated-asym", "tiled-3x2-pad"])
def test_max_pool_indices_split_over_threads(monkeypatch, case):
    attrs, shape = POOL_CASES[case]
    x, dy, geom = _pool_inputs(attrs, shape, np.float32)
    y, indices = jit_backward.max_pool_indices_2d(x, geom)
    dx = jit_backward.max_pool_scatter_2d(indices, dy, x.shape)
    monkeypatch.setattr(threads, "intra_op_threads", lambda: 2)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_BESIDE_BLAS_THREADS", 1)
    split_y, split_indices = jit_backward.max_pool_indices_2d(x, geom)
    np.testing.assert_array_equal(split_y, y)
    np.testing.assert_array_equal(split_indices, indices)
    np.testing.assert_array_equal(jit_backward.max_pool_scatter_2d(indices, dy, x.shape), dx)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 7, 2), (10_000,), (2, 4099)])
def test_relu_backward_is_the_numpy_rule(monkeypatch, shape, dtype):
    monkeypatch.setattr(threads, "intra_op_threads", lambda: 2)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_BESIDE_BLAS_THREADS", 1)
    x = RNG.standard_normal(shape).astype(dtype)
    x.reshape(-1)[:3] = (0.0, -0.0, np.nan)
    dy = RNG.standard_normal(shape).astype(dtype)
    dy.reshape(-1)[3:6] = (np.nan, -np.inf, -1.0)
    x.reshape(-1)[3:6] = (-1.0, -1.0, -2.0)  # dY * 0: NaN, NaN and -0.0, as numpy gives
    node = Node("Relu", "relu", ["x"], ["y"])
    reference = registry.get("Relu").backward(node, [x], [None], [dy])[0]
    got = jit_backward.relu_backward(x, dy)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, reference)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(reference))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("first", "count"), [(0, 1), (2, 1), (1, 3), (0, 4)])
def test_relu_masked_chunk_is_dy_times_the_mask_laid_out_by_kernel(first, count, dtype):
    """``out[k, n*P + p] = dY[first + n, k, p] * (Y > 0)``: the numpy Relu rule's numbers (NaN and inf in
    dY, -0.0 and NaN in Y), in the training Conv's ``[K, count*P]`` chunk layout."""
    y = RNG.standard_normal((4, 3, 7)).astype(dtype)
    dy = RNG.standard_normal((4, 3, 7)).astype(dtype)
    y[first, 0, :3] = (0.0, -0.0, np.nan)
    dy[first, 1, :3] = (np.nan, -np.inf, np.inf)
    y[first, 1, :3] = (-1.0, 2.0, -2.0)
    out = np.full((3, count * 7), 7.0, dtype)
    jit_backward.relu_masked_chunk(dy, y, first, count, out)
    part = slice(first, first + count)
    with np.errstate(invalid="ignore"):  # inf * 0
        expected = (dy[part] * (y[part] > 0)).transpose(1, 0, 2).reshape(3, count * 7)
    np.testing.assert_array_equal(out, expected)
