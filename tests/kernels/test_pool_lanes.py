"""The float32 pools' vector loop (``jit_pool_lanes``) against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import (
    jit_pool,
    jit_pool_lanes,
    jit_pool_rows,
    jit_pool_strided,
    window_lanes,
)
from hetflow.ops import registry
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import Geometry, geometry
from tests.helpers import pool_reference, record_spin_jobs

RNG = np.random.default_rng(11)

CASES = [  # (attrs, x shape): each vector shape (rows of 1, 2 and 4 outputs a vector), both strides
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 32, 32, 32)),  # cifar10-quick's pools
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 32, 16, 16)),
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 64, 8, 8)),
    # (3x3/1 windows padded by one on every side run jit_pool_same: these are padded otherwise.)
    ({"kernel_shape": (3, 3), "pads": (1, 1, 1, 0)}, (2, 11, 7, 7)),  # 6 outputs a row: two rows a vector
    ({"kernel_shape": (3, 3), "pads": (1, 0, 1, 0)}, (1, 9, 3, 4)),  # four rows a vector, 3 of them alive
    ({"kernel_shape": (3, 3), "pads": (1, 1, 1, 0)}, (1, 3, 19, 37)),  # rows of 36: chunks of 16, a tail
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, (2, 5, 45, 70)),  # stride 2, 3 chunks
    ({"kernel_shape": (2, 2), "strides": (2, 2)}, (3, 5, 14, 14)),  # tiling windows, 7 outputs a row
    ({"kernel_shape": (3, 2), "strides": (3, 2)}, (1, 2, 10, 7)),
    ({"kernel_shape": (5, 4), "strides": (3, 2), "pads": (2, 1, 2, 1), "ceil_mode": 1}, (1, 3, 13, 12)),
    ({"kernel_shape": (3, 3), "dilations": (2, 2), "pads": (2, 1, 1, 2)}, (2, 10, 11, 10)),
    ({"kernel_shape": (3, 3), "strides": (2, 2), "dilations": (2, 3), "pads": (3, 0, 1, 2)}, (1, 17, 15, 9)),
    ({"kernel_shape": (4, 1), "strides": (1, 2), "pads": (3, 0, 3, 0)}, (1, 4, 5, 6)),  # rows all padding
    ({"kernel_shape": (1, 5), "strides": (3, 1), "pads": (0, 4, 0, 4)}, (1, 3, 7, 3)),  # columns too
    ({"kernel_shape": (7, 7), "pads": (1, 1, 0, 0)}, (2, 3, 7, 7)),  # near global, 1x1 output
]


def _geometry(attrs: dict, shape: tuple[int, ...]) -> Geometry:
    return geometry(pool_window(registry.get("MaxPool").Attrs(**attrs)), shape[2:])


def _pool(
    x: np.ndarray, geo: Geometry, op_type: str, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(Y by ``jit_pool.pool_2d``, the float64 reference)."""
    scale = None if op_type == "MaxPool" else (1.0 / geo.window_counts(include_pad=bool(x.shape[1] % 2)))
    y = np.full((*x.shape[:2], *geo.out), np.nan, np.float32) if out is None else out
    jit_pool.pool_2d(x, y, geo, None if scale is None else scale.astype(np.float32), None)
    return y, pool_reference(x.astype(np.float64), geo, scale)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), CASES)
def test_lanes_match_the_float64_reference(op_type, attrs, shape):
    geo = _geometry(attrs, shape)
    assert jit_pool_lanes.applies(geo, np.dtype(np.float32))
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, geo, op_type)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), [CASES[1], CASES[4], CASES[5], CASES[9]])
def test_lanes_write_into_a_strided_slice_and_only_there(op_type, attrs, shape):
    geo = _geometry(attrs, shape)
    x = RNG.standard_normal((3, *shape[1:])).astype(np.float32)  # three images: blocks end at each
    concat = np.full((3, shape[1] + 3, *geo.out), 7.0, np.float32)
    y, expected = _pool(x, geo, op_type, out=concat[:, 1 : 1 + shape[1]])
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)
    assert (concat[:, 0] == 7).all() and (concat[:, 1 + shape[1] :] == 7).all()


@pytest.mark.parametrize(("attrs", "shape"), [CASES[0], CASES[2], CASES[3], CASES[5], CASES[10]])
def test_lanes_max_keeps_nan_and_infinities(attrs, shape):
    geo = _geometry(attrs, shape)
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, flat.size // 40, replace=False)] = np.nan
    flat[RNG.choice(flat.size, flat.size // 40, replace=False)] = np.inf  # NaN beside +inf stays NaN
    flat[RNG.choice(flat.size, flat.size // 40, replace=False)] = -np.inf
    x[0, -1] = -np.inf  # a plane of -inf: -inf, never the padding's value standing in for it
    y, expected = _pool(x, geo, "MaxPool")
    assert np.isnan(expected).any() and np.isposinf(expected).any()
    np.testing.assert_array_equal(y, expected)  # NaN where the reference has it, every other value exact


SWEPT = [  # 3x3/1 windows with rows long enough to sweep (``jit_pool_rows``): each block shape and edge
    ({"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}, (1, 4, 20, 20)),
    ({"kernel_shape": (3, 3), "pads": (1, 0, 1, 0)}, (2, 3, 9, 20)),  # 9 rows: a block of 7, a short one of 2
    ({"kernel_shape": (3, 3), "pads": (0, 1, 0, 1)}, (1, 3, 14, 16)),  # 12: 7, then 5 of a block of 7
]
STRIPS = [  # 3x3/2 windows, which the strips take (``jit_pool_strided``): each edge
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 1, 1)}, (1, 4, 66, 66)),  # Inception's
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 2, 23, 68)),  # overhang right and below
    # Rows shorter than a vector of 16 outputs and longer than one: SqueezeNet's 27, 14 padded.
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 3, 29, 55)),
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, (2, 2, 11, 28)),
]


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), SWEPT)
def test_swept_rows_match_the_float64_reference(op_type, attrs, shape):
    geo = _geometry(attrs, shape)
    (kh, kw), (sh, sw) = (axis.kernel for axis in geo.axes), (axis.stride for axis in geo.axes)
    assert jit_pool_rows.sweeps(kh, kw, sh, sw, 1, 1, geo.out[1])
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, geo, op_type)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), STRIPS)
def test_strided_windows_in_strips_match_the_float64_reference(op_type, attrs, shape):
    geo = _geometry(attrs, shape)
    (kh, kw), (sh, sw) = (axis.kernel for axis in geo.axes), (axis.stride for axis in geo.axes)
    assert jit_pool_strided.takes(kh, kw, sh, sw, 1, 1) and not jit_pool_rows.sweeps(kh, kw, sh, sw, 1, 1, 64)
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, geo, op_type)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


def test_swept_max_computes_a_plane_with_nan_again_exactly():
    attrs, shape = SWEPT[0]
    geo = _geometry(attrs, shape)
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 1, 5, 7] = np.nan  # plane 1 only: its windows over (5, 7) are NaN, the other planes untouched
    x[0, 2, 9, 9] = np.inf
    y, expected = _pool(x, geo, "MaxPool")
    assert np.isnan(y[0, 1]).sum() == np.isnan(expected[0, 1]).sum() > 0
    assert not np.isnan(y[0, [0, 2, 3]]).any()
    np.testing.assert_array_equal(y, expected)


STREAMED = [  # maps past the cache (X of PREFETCH_MIN_FLOATS or more), where the loops prefetch
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, (4, 1024, 32, 33)),  # strips: many small planes
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (2, 64, 182, 182)),  # strips
]


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), STREAMED)
def test_maps_past_the_cache_prefetch_and_match_the_reference(op_type, attrs, shape):
    assert np.prod(shape) >= window_lanes.PREFETCH_MIN_FLOATS
    geo = _geometry(attrs, shape)
    x = RNG.standard_normal(shape).astype(np.float32)
    y, expected = _pool(x, geo, op_type)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


def test_rows_sweep_only_three_by_three_windows_with_rows_long_enough_per_stride():
    assert jit_pool_rows.sweeps(3, 3, 1, 1, 1, 1, 16) and not jit_pool_rows.sweeps(3, 3, 1, 1, 1, 1, 15)
    assert not jit_pool_rows.sweeps(3, 3, 2, 2, 1, 1, 64)  # 3x3/2: the strips' (``jit_pool_strided``)
    assert not jit_pool_rows.sweeps(2, 2, 2, 2, 1, 1, 64)  # windows that tile: no row to share
    assert not jit_pool_rows.sweeps(3, 3, 1, 2, 1, 1, 64) and not jit_pool_rows.sweeps(3, 3, 1, 1, 2, 2, 64)


def test_lanes_max_padding_never_wins():
    attrs, shape = CASES[3]
    geo = _geometry(attrs, shape)
    x = -1000 - np.abs(RNG.standard_normal(shape)).astype(np.float32)
    y, expected = _pool(x, geo, "MaxPool")
    assert (y <= -1000).all()
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("planes", [1, 7, 8, 9, 17])
def test_lanes_blocks_of_planes_of_any_count(planes):
    # Blocks of 8 planes; a short last block computes its last plane again and stores it once.
    attrs, shape = CASES[1]
    geo = _geometry(attrs, (planes, 1, *shape[2:]))
    x = RNG.standard_normal((planes, 1, *shape[2:])).astype(np.float32)
    for op_type in ("MaxPool", "AveragePool"):
        y, expected = _pool(x, geo, op_type)
        np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


def test_lanes_run_float32_with_column_strides_one_and_two_only():
    float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
    assert jit_pool_lanes.applies(
        _geometry({"kernel_shape": (3, 3), "strides": (3, 2)}, (1, 1, 9, 9)), float32
    )
    assert not jit_pool_lanes.applies(
        _geometry({"kernel_shape": (3, 3), "strides": (2, 3)}, (1, 1, 9, 9)), float32
    )
    assert not jit_pool_lanes.applies(_geometry({"kernel_shape": (3, 3)}, (1, 1, 9, 9)), float64)
    geo = _geometry({"kernel_shape": (3, 3), "strides": (2, 2)}, (1, 1, 9, 9))
    assert jit_pool.workspace_bytes(geo, float32, 4) == 0 < jit_pool.workspace_bytes(geo, float64, 4)


def test_two_by_two_windows_over_long_rows_keep_the_tiling_loop(monkeypatch):
    calls = []
    real = jit_pool_lanes.vector_planes
    monkeypatch.setattr(jit_pool_lanes, "vector_planes", lambda *args: calls.append(args) or real(*args))
    long_rows = _geometry({"kernel_shape": (2, 2), "strides": (2, 2)}, (1, 1, 32, 32))  # rows of 16 outputs
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    y, expected = _pool(x, long_rows, "MaxPool")
    assert not calls
    np.testing.assert_array_equal(y, expected)
    short_rows = _geometry({"kernel_shape": (2, 2), "strides": (2, 2)}, (1, 1, 14, 14))  # rows of 7
    y, expected = _pool(x[..., :14, :14].copy(), short_rows, "MaxPool")
    assert len(calls) == 1
    np.testing.assert_array_equal(y, expected)


def test_the_vector_loop_refuses_arrays_other_than_float32():
    from numba.core.errors import TypingError

    x, y, scale = np.zeros((1, 2, 8, 8)), np.zeros(32), np.ones((1, 1))  # float64: its IR reads float32
    with pytest.raises(TypingError):
        jit_pool_lanes.vector_planes(x, y, 32, 4, 4, 0, 2, 3, 3, 2, 2, 1, 1, 0, 0, True, scale)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_a_spinning_run_shares_a_large_pools_planes_out_on_its_pool(monkeypatch, op_type):
    """On spinning threads a pool too large to bind (``bind_small_pool``) still splits its planes as
    chunks of a spin-pool job, never on the Python pool, into a strided slice as into a whole Y."""
    from hetflow.devices.cpu import threads

    attrs, shape = CASES[6]  # stride 2, 3 chunks a row, two images
    geo = _geometry(attrs, shape)
    jobs = record_spin_jobs(monkeypatch)
    x = RNG.standard_normal(shape).astype(np.float32)
    concat = np.full((shape[0], shape[1] + 2, *geo.out), 7.0, np.float32)
    with threads.own_threads(2, spin=True):
        y, expected = _pool(x, geo, op_type, out=concat[:, 1 : 1 + shape[1]])
    assert [chunks for _, chunks in jobs] == [4]
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)
    assert (concat[:, 0] == 7).all() and (concat[:, -1] == 7).all()
