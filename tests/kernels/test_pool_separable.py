"""The separable 2-D pooling paths (flat stride-1, strided) against the plain loop over window taps."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.kernels import buffers
from hetflow.devices.cpu.kernels import pool as cpu_pool
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.base import TensorInfo

CPU = CPUDevice()
RNG = np.random.default_rng(3)

CASES = [
    ({"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 1, 1)}, (2, 3, 11, 12)),
    ({"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}, (1, 4, 7, 9)),
    ({"kernel_shape": (2, 3), "strides": (2, 1), "pads": (1, 0, 0, 2)}, (2, 2, 9, 8)),
    ({"kernel_shape": (3, 2), "strides": (3, 2), "ceil_mode": 1}, (1, 3, 10, 11)),
    ({"kernel_shape": (3, 3), "strides": (1, 2), "dilations": (2, 1), "pads": (2, 1, 2, 1)}, (2, 2, 9, 10)),
    ({"kernel_shape": (7, 7)}, (2, 5, 7, 7)),
    ({"kernel_shape": (1, 1), "strides": (2, 2)}, (1, 2, 5, 5)),
]


def _pool(op_type: str, attrs: dict, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    node = Node(op_type, "pool", ["x"], ["y"], registry.get(op_type).Attrs(**attrs))
    (kernel,) = CPU.kernels.candidates(node, [TensorInfo(x.shape, x.dtype)])
    nbytes = kernel.workspace(node, [TensorInfo(x.shape, x.dtype)]) if kernel.workspace else 0
    workspace = np.full(nbytes, 0xFF, np.uint8)  # dirty, as another step may have left it
    return kernel.fn(node, [x], None if out is None else [out], workspace)[0]


@pytest.mark.parametrize("strided_min_row", [0, 1 << 30], ids=["strided-views", "flat-views"])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("attrs", "shape"), CASES)
def test_separable_path_matches_the_tap_loop(monkeypatch, op_type, attrs, shape, strided_min_row):
    monkeypatch.setattr(cpu_pool, "STRIDED_MIN_ROW", strided_min_row)
    if op_type == "AveragePool":
        attrs = {**attrs, "count_include_pad": int(sum(shape) % 2)}
    x = RNG.standard_normal(shape).astype(np.float32)
    overflows = buffers.OVERFLOWS[0]
    separable = _pool(op_type, attrs, x)
    assert buffers.OVERFLOWS[0] == overflows  # fits the workspace it declared
    monkeypatch.setattr(cpu_pool, "_fast_2d", lambda node, rank: False)
    looped = _pool(op_type, attrs, x)
    assert separable.shape == looped.shape
    np.testing.assert_allclose(separable, looped, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strided_min_row", [0, 1 << 30], ids=["strided-views", "flat-views"])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_separable_path_writes_into_a_strided_slice(monkeypatch, op_type, strided_min_row):
    monkeypatch.setattr(cpu_pool, "STRIDED_MIN_ROW", strided_min_row)
    attrs, shape = CASES[0]
    x = RNG.standard_normal(shape).astype(np.float32)
    expected = _pool(op_type, attrs, x)
    concat = np.full((shape[0], shape[1] + 2, *expected.shape[2:]), np.nan, np.float32)
    got = _pool(op_type, attrs, x, out=concat[:, 1 : 1 + shape[1]])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(concat[:, 1 : 1 + shape[1]], expected, rtol=1e-6)
    assert np.isnan(concat[:, 0]).all() and np.isnan(concat[:, -1]).all()


def test_average_pool_float16_sums_in_float32():
    x = (RNG.standard_normal((1, 2, 9, 9)) * 100).astype(np.float16)
    y = _pool("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2)}, x)
    assert y.dtype == np.float16
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    np.testing.assert_allclose(y, windows.mean(axis=(-1, -2)), rtol=2e-3)
