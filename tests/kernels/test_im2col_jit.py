"""The compiled inference im2col (``jit_im2col``) against numpy's windows of the padded input, in both
column layouts, and the im2col Conv kernel built on it against a direct float64 sum."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import conv as conv_kernels
from hetflow.devices.cpu.kernels.jit_im2col import im2col
from hetflow.graph import Node
from hetflow.ops.conv import ConvAttrs
from hetflow.ops.spatial import WindowSpec, geometry
from tests.helpers import record_spin_jobs, record_splits
from tests.kernels.test_conv_train import direct_conv

RNG = np.random.default_rng(5)

#: (X shape, kernel, strides, dilations, pads begin+end): padding wider than a tap's reach, strides that
#: skip the last columns, dilations, asymmetric pads, a 1x1 window, a window as wide as the input.
CASES = [
    ((1, 1, 28, 28), (5, 5), (1, 1), (1, 1), (0, 0, 0, 0)),
    ((2, 3, 9, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((3, 4, 11, 10), (5, 3), (2, 3), (1, 1), (2, 0, 1, 2)),
    ((2, 2, 12, 13), (3, 3), (1, 2), (2, 3), (3, 1, 0, 4)),
    ((1, 3, 23, 23), (11, 11), (4, 4), (1, 1), (2, 2, 2, 2)),
    ((2, 5, 6, 6), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
    ((1, 2, 4, 5), (4, 5), (1, 1), (1, 1), (3, 4, 3, 4)),
]


def _numpy_columns(x: np.ndarray, spec: WindowSpec) -> np.ndarray:
    """``[n, C*taps, P]`` from the 6-D windows view of numpy's padded copy."""
    geo = geometry(spec, x.shape[2:])
    windows = geo.windows(geo.pad(x))
    return np.ascontiguousarray(windows).reshape(x.shape[0], -1, int(np.prod(geo.out)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_columns_match_numpy_windows_in_both_layouts(case: tuple, dtype: type) -> None:
    shape, kernel, strides, dilations, pads = case
    spec = WindowSpec(kernel, strides, dilations, pads)
    x = RNG.standard_normal(shape).astype(dtype)
    geo = geometry(spec, shape[2:])
    expected = _numpy_columns(x, spec)

    # Stale contents must be overwritten, padding included.
    image_major = np.full(expected.shape, np.nan, dtype)
    im2col(x, geo, image_major)
    np.testing.assert_array_equal(image_major, expected)

    channel_major = np.full((expected.shape[1], shape[0] * expected.shape[2]), np.nan, dtype)
    im2col(x, geo, channel_major, channel_major=True)
    np.testing.assert_array_equal(channel_major, expected.transpose(1, 0, 2).reshape(channel_major.shape))


def test_columns_split_over_threads_equal_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetflow.devices.cpu.kernels import jit_im2col

    spec = WindowSpec((3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    x = RNG.standard_normal((2, 5, 9, 8)).astype(np.float32)
    geo = geometry(spec, x.shape[2:])
    expected = _numpy_columns(x, spec)
    splits = record_splits(monkeypatch, jit_im2col)
    monkeypatch.setattr(threads, "intra_op_threads", lambda: 2)
    columns = np.full_like(expected, np.nan)
    jit_im2col.im2col(x, geo, columns)
    channel_major = np.full((expected.shape[1], 2 * expected.shape[2]), np.nan, np.float32)
    jit_im2col.im2col(x, geo, channel_major, channel_major=True)
    assert splits == [2, 2]
    np.testing.assert_array_equal(columns, expected)
    np.testing.assert_array_equal(channel_major, expected.transpose(1, 0, 2).reshape(channel_major.shape))


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_a_spinning_run_builds_the_columns_on_its_pool(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    shape, kernel, strides, dilations, pads = case
    spec = WindowSpec(kernel, strides, dilations, pads)
    x = RNG.standard_normal(shape).astype(np.float32)
    geo = geometry(spec, shape[2:])
    expected = _numpy_columns(x, spec)
    jobs = record_spin_jobs(monkeypatch, min_outputs=1)
    for channel_major in (False, True):
        columns = np.full((expected.shape[1], shape[0] * expected.shape[2]) if channel_major else expected.shape,
                          np.nan, np.float32)  # fmt: skip
        with threads.own_threads(2, spin=True):
            im2col(x, geo, columns, channel_major=channel_major)
        if channel_major:
            columns = columns.reshape(expected.shape[1], shape[0], -1).transpose(1, 0, 2)
        np.testing.assert_array_equal(columns, expected)
    # Every X with two channels or more is split into ranges of channels there.
    split = [] if shape[1] == 1 else [min(shape[1], 2 * threads.SPIN_SHARES_PER_THREAD)] * 2
    assert [chunks for _, chunks in jobs] == split


@pytest.mark.parametrize("batch", [1, 3])
def test_im2col_conv_on_compiled_columns_matches_direct_sum(batch: int) -> None:
    # 5x6 output positions: under WHOLE_CHUNK_MAX_POSITIONS, so batch 3 takes the channel-major GEMM.
    attrs = ConvAttrs(pads=(2, 1, 0, 2), strides=(2, 1))
    x = RNG.standard_normal((batch, 4, 10, 5)).astype(np.float32)
    w = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs=attrs)
    y = conv_kernels.run_conv(conv_kernels.im2col, node, [x, w, b])
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
