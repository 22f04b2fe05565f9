"""The compiled 2-D depthwise kernel against an independent float64 direct sum: strides, dilations,
asymmetric pads, channel multipliers, blocks of rows, every fused activation, strided outputs, split
over threads."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.threads import BLAS
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import DEPTHWISE, ConvAttrs
from tests.helpers import record_spin_jobs
from tests.kernels.test_conv_algorithms import _direct_conv

KERNEL = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}[DEPTHWISE]
RNG = np.random.default_rng(11)

CASES = [
    ((2, 5, 9, 11), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=5)),
    ((1, 4, 12, 10), 1, (3, 3), ConvAttrs(pads=(1, 0, 0, 1), strides=(2, 2), group=4)),
    ((3, 3, 13, 14), 2, (5, 3), ConvAttrs(pads=(2, 1, 1, 2), strides=(3, 2), group=3)),
    ((1, 6, 11, 11), 1, (3, 3), ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2), group=6)),
    ((2, 2, 7, 9), 3, (1, 4), ConvAttrs(pads=(0, 2, 0, 1), strides=(1, 3), group=2)),
    ((1, 8, 5, 5), 1, (5, 5), ConvAttrs(group=8)),  # one output position
    ((1, 2, 80, 75), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2)),  # two blocks of rows, the last partial
    # The vector kernel's shapes (jit_depthwise_lanes): 2 and 4 output rows per vector, rows of more than
    # one vector, blocks of planes that end inside an image, column stride 2 with padding on both sides.
    ((2, 11, 7, 7), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=11)),
    ((3, 9, 4, 4), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=9)),
    ((1, 3, 8, 37), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=3)),
    ((2, 10, 15, 15), 1, (5, 5), ConvAttrs(pads=(2, 2, 2, 2), strides=(2, 2), group=10)),
    ((1, 17, 14, 14), 1, (3, 3), ConvAttrs(pads=(0, 1, 2, 1), strides=(1, 2), dilations=(2, 1), group=17)),
    # The swept rows (jit_depthwise_rows): a block of 7 with 2 rows unstored, 7 + a short block of 4, 7 +
    # 7 + 2, rows of several vectors with a partial last one, a map one row high, stride 2 over odd widths.
    ((1, 3, 5, 40), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=3)),
    ((2, 4, 11, 33), 1, (5, 5), ConvAttrs(pads=(2, 2, 2, 2), group=4)),
    ((1, 2, 16, 16), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2)),
    ((1, 2, 1, 20), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2)),
    ((1, 5, 17, 35), 1, (3, 3), ConvAttrs(pads=(0, 1, 1, 0), strides=(2, 2), group=5)),
    ((1, 3, 23, 41), 1, (5, 5), ConvAttrs(pads=(2, 2, 2, 2), strides=(2, 2), group=3)),
]
#: Maps past the cache (window_lanes.PREFETCH_MIN_FLOATS floats or more): the vectors' loop prefetches
#: the rows below, the sweep the next block's rows.
STREAMED = [
    ((2, 1024, 45, 46), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(1, 2), group=1024)),  # vectors
    ((2, 512, 64, 65), 1, (3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=512)),  # swept rows
]

ACTIVATIONS = [None, FusedActivation("Relu"), FusedActivation("Clip", 0.0, 6.0),
               FusedActivation("LeakyRelu", 0.1), FusedActivation("Sigmoid"), FusedActivation("Tanh")]


def _activate(y: np.ndarray, fused: FusedActivation | None) -> np.ndarray:
    if fused is None:
        return y
    return {
        "Relu": lambda v: np.maximum(v, 0),
        "Clip": lambda v: np.clip(v, fused.alpha, fused.beta),
        "LeakyRelu": lambda v: np.where(v < 0, v * fused.alpha, v),
        "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
        "Tanh": np.tanh,
    }[fused.op_type](y)


def _case(x_shape, multiplier, kernel, dtype=np.float32):
    channels = x_shape[1]
    x = RNG.standard_normal(x_shape).astype(dtype)
    w = RNG.standard_normal((channels * multiplier, 1, *kernel)).astype(dtype)
    b = RNG.standard_normal(channels * multiplier).astype(dtype)
    return x, w, b


def _run(attrs: ConvAttrs, x, w, b, out=None):
    node = Node("Conv", "dw", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]
    assert KERNEL.reason_unsupported(node, infos) is None
    assert KERNEL.workspace(node, infos) == 0  # the compiled path needs no workspace
    return KERNEL.fn(node, [x, w, b], None if out is None else [out], None)[0]


@pytest.fixture(params=["vectors", "phases"])
def float32_kernel(request, monkeypatch):
    """Which compiled kernel runs a float32 layer with one kernel per channel: the vector kernel
    (``jit_depthwise_lanes``, where it applies) or the phase-plane kernel it replaces there."""
    from hetflow.devices.cpu.kernels import jit_depthwise_lanes

    if request.param == "phases":
        monkeypatch.setattr(jit_depthwise_lanes, "applies", lambda *args: False)
    return request.param


@pytest.mark.parametrize("fused", ACTIVATIONS, ids=lambda f: "none" if f is None else f.op_type)
@pytest.mark.parametrize(("x_shape", "multiplier", "kernel", "attrs"), CASES)
def test_matches_a_direct_sum(x_shape, multiplier, kernel, attrs, fused, float32_kernel):
    x, w, b = _case(x_shape, multiplier, kernel)
    attrs = ConvAttrs(**{**attrs.__dict__, "fused": fused})
    expected = _activate(_direct_conv(x, w, b, attrs), fused)
    got = _run(attrs, x, w, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("x_shape", "multiplier", "kernel", "attrs"), STREAMED)
def test_maps_past_the_cache_match_a_direct_sum(x_shape, multiplier, kernel, attrs):
    from hetflow.devices.cpu.kernels import window_lanes

    assert np.prod(x_shape) >= window_lanes.PREFETCH_MIN_FLOATS
    x, w, b = _case(x_shape, multiplier, kernel)
    np.testing.assert_allclose(_run(attrs, x, w, b), _direct_conv(x, w, b, attrs), rtol=1e-5, atol=1e-5)


def test_float64_is_computed_in_float64():
    x, w, b = _case((1, 3, 8, 8), 1, (3, 3), np.float64)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), group=3)
    got = _run(attrs, x, w, b)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _direct_conv(x, w, b, attrs), rtol=1e-12, atol=1e-12)


def test_writes_into_a_strided_slice():
    x, w, b = _case((2, 4, 9, 9), 1, (3, 3))
    attrs = ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2), group=4, fused=FusedActivation("Relu"))
    concat = np.full((2, 7, 5, 5), np.nan, np.float32)
    got = _run(attrs, x, w, b, out=concat[:, 2:6])
    expected = _activate(_direct_conv(x, w, b, attrs), attrs.fused)
    np.testing.assert_allclose(concat[:, 2:6], expected, rtol=1e-5, atol=1e-5)
    assert np.shares_memory(got, concat)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 6:]).all()


def test_nan_passes_through_the_fused_activation():
    x, w, b = _case((1, 2, 6, 6), 1, (3, 3))
    x[0, 1, 3, 3] = np.nan
    attrs = ConvAttrs(pads=(1, 1, 1, 1), group=2, fused=FusedActivation("Relu"))
    got = _run(attrs, x, w, b)
    assert np.isnan(got[0, 1, 2:5, 2:5]).all() and not np.isnan(got[0, 0]).any()


@pytest.mark.parametrize("multiplier", [1, 2], ids=["vectors", "phases"])
def test_two_threads_split_the_planes_and_agree_with_one(monkeypatch, multiplier):
    from hetflow.devices.cpu.kernels import jit_depthwise, jit_depthwise_lanes
    from tests.helpers import record_splits

    x, w, b = _case((4, 16, 20, 20), multiplier, (3, 3))
    attrs = ConvAttrs(pads=(1, 1, 1, 1), group=16)
    splits = record_splits(monkeypatch, jit_depthwise_lanes if multiplier == 1 else jit_depthwise)
    previous = BLAS.get()
    try:
        BLAS.set(1)
        single = _run(attrs, x, w, b)
        assert splits == []
        BLAS.set(2)
        split = _run(attrs, x, w, b)
        assert splits == [2]
    finally:
        if previous is not None:
            BLAS.set(previous)
    np.testing.assert_array_equal(single, split)


@pytest.mark.parametrize(
    ("x_shape", "attrs", "concat"),
    [
        ((1, 24, 14, 14), ConvAttrs(pads=(1, 1, 1, 1), group=24, fused=FusedActivation("Clip", 0.0, 6.0)), False),
        ((1, 24, 15, 15), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2), group=24, shuffle_groups=4), False),
        ((2, 12, 9, 9), ConvAttrs(pads=(1, 1, 1, 1), group=12, fused=FusedActivation("Relu")), True),
    ],
    ids=["clip", "shuffled-strided", "two-images-into-a-slice"],
)
def test_a_spinning_run_shares_the_planes_out_on_its_pool(monkeypatch, x_shape, attrs, concat):
    """On spinning threads the planes are chunks of one spin-pool job (not the Python pool's ranges),
    claimed by both threads, with the one-thread result."""
    from hetflow.devices.cpu import threads

    x, w, b = _case(x_shape, 1, (3, 3))
    with threads.own_threads(1):
        single = _run(attrs, x, w, b)
    jobs = record_spin_jobs(monkeypatch)
    out = None
    if concat:
        whole = np.full((x_shape[0], x_shape[1] + 3, *single.shape[2:]), np.nan, np.float32)
        out = whole[:, 1 : 1 + x_shape[1]]
    with threads.own_threads(2, spin=True):
        spun = _run(attrs, x, w, b, out=out)
    assert [chunks for _, chunks in jobs] == [4]
    np.testing.assert_array_equal(spun, single)
    if concat:
        assert np.isnan(whole[:, 0]).all() and np.isnan(whole[:, -2:]).all()


@pytest.mark.parametrize(
    ("window", "strides", "dilations", "swept"),
    [((3, 3), (1, 1), (1, 1), True), ((5, 5), (2, 2), (1, 1), True), ((3, 3), (1, 2), (1, 1), False),
     ((3, 3), (1, 1), (2, 2), False), ((5, 3), (1, 1), (1, 1), False), ((7, 7), (1, 1), (1, 1), False)],
)  # fmt: skip
def test_square_windows_without_dilation_are_swept_in_rows(window, strides, dilations, swept):
    from hetflow.devices.cpu.kernels import jit_depthwise_rows

    assert jit_depthwise_rows.sweeps(*window, *strides, *dilations) is swept
