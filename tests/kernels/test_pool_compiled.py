"""The compiled 2-D pools against the plain numpy loop over window taps."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.kernels import buffers
from hetflow.devices.cpu.kernels import pool as cpu_pool
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.base import TensorInfo
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import geometry

CPU = CPUDevice()
RNG = np.random.default_rng(3)

CASES = [  # pads, ceil mode, odd sizes, a 1x1 output, dilation, large and strided windows, blocks of rows
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 1, 1)}, (2, 3, 11, 12)),
    ({"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}, (1, 4, 7, 9)),
    ({"kernel_shape": (2, 2), "strides": (2, 2), "pads": (1, 0, 0, 1)}, (2, 2, 9, 8)),
    ({"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, (1, 3, 10, 11)),
    ({"kernel_shape": (2, 2), "strides": (1, 1)}, (3, 2, 5, 6)),
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, (1, 2, 3, 3)),
    ({"kernel_shape": (3, 3), "dilations": (2, 2), "pads": (2, 1, 1, 2)}, (2, 2, 11, 10)),
    ({"kernel_shape": (5, 4), "strides": (3, 2), "pads": (2, 1, 2, 1), "ceil_mode": 1}, (1, 3, 13, 12)),
    ({"kernel_shape": (7, 7), "pads": (1, 1, 0, 0)}, (2, 3, 7, 7)),  # global-sized, padded
    ({"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}, (1, 2, 70, 66)),  # two row blocks
    ({"kernel_shape": (2, 2), "strides": (2, 2)}, (2, 3, 8, 9)),  # windows tiling X (a column left over)
    ({"kernel_shape": (3, 2), "strides": (3, 2)}, (1, 2, 10, 7)),
    ({"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}, (2, 50, 7, 7)),  # stacks of 45 planes
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 1, 1)}, (2, 37, 14, 13)),  # stacks, strided
]
#: The cases whose windows tile X (a max pool runs ``jit_pool.tile_loop`` on them).
TILED = (10, 11)


def _pool(op_type: str, attrs: dict, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    node = Node(op_type, "pool", ["x"], ["y"], registry.get(op_type).Attrs(**attrs))
    (kernel,) = CPU.kernels.candidates(node, [TensorInfo(x.shape, x.dtype)])
    nbytes = kernel.workspace(node, [TensorInfo(x.shape, x.dtype)]) if kernel.workspace else 0
    workspace = np.full(nbytes, 0xFF, np.uint8)  # dirty, as another step may have left it
    return kernel.fn(node, [x], None if out is None else [out], workspace)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), CASES)
def test_compiled_pool_matches_the_tap_loop(monkeypatch, op_type, attrs, shape, dtype):
    if op_type == "AveragePool":
        attrs = {**attrs, "count_include_pad": int(sum(shape) % 2)}
    x = RNG.standard_normal(shape).astype(dtype)
    node = Node(op_type, "pool", ["x"], ["y"], registry.get(op_type).Attrs(**attrs))
    assert cpu_pool._compiled(node, geometry(pool_window(node.attrs), shape[2:]), x.dtype)
    overflows = buffers.OVERFLOWS[0]
    compiled = _pool(op_type, attrs, x)
    assert buffers.OVERFLOWS[0] == overflows  # fits the workspace it declared
    monkeypatch.setattr(cpu_pool, "_compiled", lambda node, rank, dtype: False)
    looped = _pool(op_type, attrs, x)
    assert compiled.shape == looped.shape and compiled.dtype == looped.dtype == dtype
    np.testing.assert_allclose(compiled, looped, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [0, TILED[0]])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_compiled_pool_writes_into_a_strided_slice(op_type, case):
    attrs, shape = CASES[case]
    x = RNG.standard_normal(shape).astype(np.float32)
    expected = _pool(op_type, attrs, x)
    concat = np.full((shape[0], shape[1] + 2, *expected.shape[2:]), np.nan, np.float32)
    got = _pool(op_type, attrs, x, out=concat[:, 1 : 1 + shape[1]])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(concat[:, 1 : 1 + shape[1]], expected, rtol=1e-6)
    assert np.isnan(concat[:, 0]).all() and np.isnan(concat[:, -1]).all()


def test_average_pool_float16_sums_in_float32():
    x = (RNG.standard_normal((1, 2, 9, 9)) * 100).astype(np.float16)
    y = _pool("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2)}, x)  # compiled in float32
    assert y.dtype == np.float16
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    np.testing.assert_allclose(y, windows.mean(axis=(-1, -2)), rtol=2e-3)


def test_max_pool_keeps_nan_and_ignores_padding():
    x = -np.abs(RNG.standard_normal((1, 2, 5, 5))).astype(np.float32)  # all negative: padding must not win
    x[0, 1, 2, 2] = np.nan
    y = _pool("MaxPool", {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}, x)
    assert (y[0, 0] < 0).all()
    assert np.isnan(y[0, 1, 1:4, 1:4]).all() and np.isnan(y[0, 1]).sum() == 9


def test_tiling_windows_skip_the_phase_planes_and_keep_nan(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_pool

    assert [i for i, (attrs, shape) in enumerate(CASES) if jit_pool.tiles_input(
        geometry(pool_window(registry.get("MaxPool").Attrs(**attrs)), shape[2:]))] == list(TILED)  # fmt: skip
    attrs, shape = CASES[TILED[0]]
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    calls = []
    monkeypatch.setattr(jit_pool, "_planes", lambda *args: calls.append(args))  # the phase planes' loop
    y = _pool("MaxPool", attrs, x)
    assert not calls
    windows = np.lib.stride_tricks.sliding_window_view(x[..., :8], (2, 2), axis=(2, 3))[:, :, ::2, ::2]
    np.testing.assert_array_equal(y, windows.max(axis=(-1, -2)))  # numpy's max: NaN propagates
    assert np.isnan(y[0, 1, 1, 1]) and np.isnan(y).sum() == 1


def test_integer_pools_and_indices_keep_the_numpy_loop():
    common = Node("MaxPool", "p", ["x"], ["y"], registry.get("MaxPool").Attrs(kernel_shape=(3, 3)))
    with_indices = Node("MaxPool", "p", ["x"], ["y", "i"], registry.get("MaxPool").Attrs(kernel_shape=(3, 3)))
    geo = geometry(pool_window(common.attrs), (9, 9))
    assert cpu_pool._compiled(common, geo, np.dtype(np.float32))
    assert not cpu_pool._compiled(common, geo, np.dtype(np.int8))
    assert not cpu_pool._compiled(with_indices, geo, np.dtype(np.float32))
    x = RNG.integers(-100, 100, (1, 2, 9, 9)).astype(np.int8)
    y = _pool("MaxPool", {"kernel_shape": (3, 3)}, x)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    np.testing.assert_array_equal(y, windows.max(axis=(-1, -2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # the lanes' loop, the phase planes'
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_two_threads_split_the_planes_and_agree_with_one(monkeypatch, op_type, dtype):
    from hetflow.devices.cpu.kernels import jit_pool, jit_pool_lanes
    from hetflow.devices.cpu.threads import BLAS
    from tests.helpers import record_splits

    # NOTE: the float64 cases draw from a generator of their own, leaving the module's stream (and so
    # the inputs of the tests after this one) as it was.
    source = RNG if dtype == np.float32 else np.random.default_rng(5)
    x = source.standard_normal((3, 7, 12, 12)).astype(dtype)
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}
    splits = record_splits(monkeypatch, jit_pool_lanes if dtype == np.float32 else jit_pool)
    previous = BLAS.get()
    try:
        BLAS.set(1)
        single = _pool(op_type, attrs, x)
        assert splits == []
        BLAS.set(2)
        split = _pool(op_type, attrs, x)
        assert splits == [2]
    finally:
        if previous is not None:
            BLAS.set(previous)
    np.testing.assert_array_equal(single, split)


WHOLE_MAP = [  # the one window is the whole input: strides and ceil mode change nothing
    ({"kernel_shape": (7, 7)}, (2, 5, 7, 7)),
    ({"kernel_shape": (6, 4), "strides": (2, 3), "ceil_mode": 1}, (1, 3, 6, 4)),
    ({"kernel_shape": (1, 1)}, (2, 2, 1, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), WHOLE_MAP)
def test_a_window_over_the_whole_map_is_one_reduction(monkeypatch, op_type, attrs, shape, dtype):
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    assert geometry(pool_window(registry.get(op_type).Attrs(**attrs)), shape[2:]).covers_input
    calls = []
    real = cpu_pool._global_pool
    monkeypatch.setattr(cpu_pool, "_global_pool", lambda *a: calls.append(a[0]) or real(*a))
    concat = np.full((shape[0], shape[1] + 2, 1, 1), np.nan, dtype)
    y = _pool(op_type, attrs, x, out=concat[:, 1 : 1 + shape[1]])
    assert len(calls) == 1 and y.dtype == dtype and y.shape == (*shape[:2], 1, 1)
    wide = x.astype(np.float64)
    expected = wide.max(axis=(2, 3), keepdims=True) if op_type == "MaxPool" else wide.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(concat[:, 1 : 1 + shape[1]], expected, rtol=2e-3 if dtype == np.float16 else 1e-6)
    assert np.isnan(concat[:, 0]).all() and np.isnan(concat[:, -1]).all()


@pytest.mark.parametrize("include_pad", [0, 1])
def test_a_single_window_over_the_input_and_its_padding_is_one_reduction(include_pad):
    # GoogLeNet's last pool: a 7x7 window over a 6x6 map padded by one at the end.
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    attrs = {"kernel_shape": (7, 7), "pads": (0, 0, 1, 1), "count_include_pad": include_pad}
    assert geometry(pool_window(registry.get("AveragePool").Attrs(**attrs)), (6, 6)).covers_input
    y = _pool("AveragePool", attrs, x)
    expected = x.sum(axis=(2, 3), keepdims=True) / (49 if include_pad else 36)
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    np.testing.assert_allclose(_pool("MaxPool", {"kernel_shape": (7, 7), "pads": (0, 0, 1, 1)}, x),
                               x.max(axis=(2, 3), keepdims=True))  # fmt: skip


def test_windows_that_miss_part_of_the_input_are_not_a_reduction():
    def covers(attrs: dict, spatial: tuple[int, int]) -> bool:
        return geometry(pool_window(registry.get("MaxPool").Attrs(**attrs)), spatial).covers_input

    assert not covers({"kernel_shape": (3, 3), "dilations": (2, 2)}, (5, 5))  # one window, gaps in it
    assert not covers({"kernel_shape": (5, 5), "pads": (1, 1, 1, 1)}, (5, 5))  # 3x3 windows
    assert not covers({"kernel_shape": (3, 3), "strides": (2, 2)}, (4, 4))  # one window, the last row out
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    y = _pool("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2)}, x)
    np.testing.assert_array_equal(y, x[:, :, :3, :3].max(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_the_phase_planes_come_from_the_workspace(op_type, dtype):
    import tracemalloc

    # cifar10-quick's pool1 (3x3/2 on 32x32x32, float64 phases ~330 KB per part) at batch 8; in float32
    # the lanes' loop runs it, reading X where it lies: no workspace, and nothing allocated either.
    x = RNG.standard_normal((8, 32, 32, 32)).astype(dtype)
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}
    node = Node(op_type, "pool", ["x"], ["y"], registry.get(op_type).Attrs(**attrs))
    (kernel,) = CPU.kernels.candidates(node, [TensorInfo(x.shape, x.dtype)])
    nbytes = kernel.workspace(node, [TensorInfo(x.shape, x.dtype)])
    assert nbytes > 100_000 if dtype == np.float64 else nbytes == 0
    workspace = np.full(nbytes, 0xFF, np.uint8)
    y = np.empty((8, 32, 16, 16), dtype)
    kernel.fn(node, [x], [y], workspace)  # warm
    tracemalloc.start()
    try:
        kernel.fn(node, [x], [y], workspace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000, peak
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=np.nan), (3, 3), axis=(2, 3)
    )[:, :, ::2, ::2]
    expected = np.nanmax(windows, axis=(-1, -2)) if op_type == "MaxPool" else np.nanmean(windows, axis=(-1, -2))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_a_workspace_of_one_part_still_serves_two_threads():
    from hetflow.devices.cpu.kernels import jit_pool
    from hetflow.devices.cpu.threads import BLAS

    x = RNG.standard_normal((3, 7, 12, 12))  # float64: the phase planes (float32 takes no workspace)
    geo = geometry(pool_window(registry.get("MaxPool").Attrs(kernel_shape=(3, 3), pads=(1, 1, 1, 1))), (12, 12))
    one_part = np.full(jit_pool.workspace_bytes(geo, x.dtype, 1), 0xFF, np.uint8)
    assert one_part.size
    previous = BLAS.get()
    try:
        BLAS.set(2)
        y = np.empty((3, 7, 12, 12))
        jit_pool.pool_2d(x, y, geo, None, one_part)
    finally:
        if previous is not None:
            BLAS.set(previous)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    np.testing.assert_array_equal(y, windows.max(axis=(-1, -2)))
