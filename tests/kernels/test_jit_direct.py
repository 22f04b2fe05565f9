"""The direct Conv over flattened planes (``jit_direct``) and the training Conv's float32 path through it,
against sums over the window taps in float64."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import (
    conv_train,
    jit_direct,
    jit_direct_grad,
    jit_direct_lanes,
)
from hetflow.devices.cpu.kernels.jit_direct import NO_BOUNDS, RELU_BOUNDS
from hetflow.ops.activation import FusedActivation
from hetflow.ops.conv import ConvAttrs, conv_window
from hetflow.ops.spatial import Geometry, geometry
from tests.kernels.test_conv_train import direct_conv, direct_grads

RNG = np.random.default_rng(23)

#: (attrs, X shape, W shape), stride 1 and one group: odd sizes, fewer and more kernels than a block (8),
#: asymmetric pads, dilations, 1x1, 5x5, maps narrower than a vector and wider than a block (32).
CASES = [
    (ConvAttrs(pads=(1, 1, 1, 1)), (2, 5, 9, 13), (11, 5, 3, 3)),
    (ConvAttrs(pads=(2, 1, 0, 2)), (3, 4, 7, 7), (17, 4, 5, 5)),
    (ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2)), (2, 6, 12, 10), (9, 6, 3, 3)),
    (ConvAttrs(), (2, 16, 1, 1), (24, 16, 1, 1)),
    (ConvAttrs(), (1, 3, 6, 40), (3, 3, 1, 3)),
    (ConvAttrs(pads=(0, 1, 0, 1)), (2, 7, 3, 35), (8, 7, 2, 3)),
]
IDS = ["pad1", "5x5-asym", "dilated", "1x1-on-1x1", "wide-row", "2x3"]


def _geometry(attrs: ConvAttrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> Geometry:
    return geometry(conv_window(attrs, w_shape), x_shape[2:])


def _float32(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [RNG.standard_normal(shape).astype(np.float32) for shape in shapes]


def _relative_error(found: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(found - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_conv2d_matches_the_direct_sum(monkeypatch, threads, attrs, x_shape, w_shape):
    """Whole images per thread, or (batch below the thread count) each image's kernel blocks split."""
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: threads)
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_THREAD", 1)  # split even these small layers
    x, w, b = _float32(x_shape, w_shape, w_shape[:1])
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    y = np.full(expected.shape, np.nan, np.float32)
    found = jit_direct.conv2d(x, w, b, _geometry(attrs, x_shape, w_shape), NO_BOUNDS, y)
    assert found is y
    assert _relative_error(y, expected) < 1e-5


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES[:3], ids=IDS[:3])
def test_conv2d_relu_and_no_bias(attrs, x_shape, w_shape):
    x, w = _float32(x_shape, w_shape)
    expected = np.maximum(direct_conv(x.astype(np.float64), w.astype(np.float64), None, attrs), 0)
    assert 0 < (expected > 0).mean() < 1
    y = jit_direct.conv2d(x, w, None, _geometry(attrs, x_shape, w_shape), RELU_BOUNDS, np.empty(expected.shape, np.float32))
    assert _relative_error(y, expected) < 1e-5
    assert (y >= 0).all()


def test_conv2d_reads_x_through_the_mask():
    attrs, x_shape, w_shape = CASES[0]
    x, w, mask = _float32(x_shape, w_shape, x_shape)
    masked = (x * (mask > 0)).astype(np.float64)
    expected = direct_conv(masked, w.astype(np.float64), None, attrs)
    y = jit_direct.conv2d(
        x, w, None, _geometry(attrs, x_shape, w_shape), NO_BOUNDS, np.empty(expected.shape, np.float32), mask=mask
    )
    assert _relative_error(y, expected) < 1e-5


def test_supports_states_what_it_cannot_compute():
    geom = _geometry(ConvAttrs(pads=(1, 1, 1, 1)), (1, 4, 8, 8), (4, 4, 3, 3))
    assert jit_direct.supports(geom, 1, np.dtype(np.float32)) is None
    assert "float32" in jit_direct.supports(geom, 1, np.dtype(np.float64))
    assert "group 1" in jit_direct.supports(geom, 2, np.dtype(np.float32))
    strided = _geometry(ConvAttrs(strides=(2, 2)), (1, 4, 8, 8), (4, 4, 3, 3))
    assert "stride 1" in jit_direct.supports(strided, 1, np.dtype(np.float32))
    flat = _geometry(ConvAttrs(pads=(1, 1)), (1, 4, 8), (4, 4, 3))
    assert "2-D" in jit_direct.supports(flat, 1, np.dtype(np.float32))


def test_input_gradient_geometry():
    geom = _geometry(ConvAttrs(pads=(2, 1, 0, 2), dilations=(1, 2)), (1, 2, 9, 11), (3, 2, 5, 3))
    found = jit_direct.input_gradient_geometry(geom)
    assert found is not None
    for axis, gradient in zip(geom.axes, found.axes):
        reach = axis.dilation * (axis.kernel - 1)
        assert (gradient.size, gradient.out) == (axis.out, axis.size)
        assert (gradient.pad_begin, gradient.pad_end) == (reach - axis.pad_begin, reach - axis.pad_end)
    # A pad wider than the window reaches: some inputs are read by no window.
    wide = _geometry(ConvAttrs(pads=(3, 0, 0, 0)), (1, 2, 5, 5), (2, 2, 3, 3))
    assert jit_direct.input_gradient_geometry(wide) is None


RELU = FusedActivation("Relu")


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_training_conv_float32_runs_direct(monkeypatch, attrs, x_shape, w_shape):
    """float32 stride-1 layers: forward and dX by a direct kernel (any variant), dW and dB by the
    direct weight gradient, Relu fused."""
    calls = []

    def counted(module, name, label):  # noqa: ANN001, ANN202
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, **kw: calls.append(label) or original(*args, **kw))

    counted(jit_direct_lanes, "direct_conv2d", "conv")
    counted(jit_direct_grad, "weight_gradient", "dW")
    x, w, b = _float32(x_shape, w_shape, w_shape[:1])
    fused = dataclasses.replace(attrs, fused=RELU)
    wide = [a.astype(np.float64) for a in (x, w, b)]
    expected_y = np.maximum(direct_conv(*wide, attrs), 0)
    y = conv_train.conv_forward(x, w, b, fused)
    assert y.dtype == np.float32 and _relative_error(y, expected_y) < 1e-5
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    grads = conv_train.conv_backward(x, w, dy, fused, want_x=True, want_w=True, want_b=True, y=y)
    masked = dy.astype(np.float64) * (y > 0)
    expected_dx, expected_dw = direct_grads(wide[0], wide[1], masked, attrs)
    assert _relative_error(grads.x, expected_dx) < 1e-5
    assert _relative_error(grads.w, expected_dw) < 1e-5
    assert _relative_error(grads.b, masked.sum(axis=(0, 2, 3))) < 1e-5
    assert calls == ["conv", "conv", "dW"]  # the forward, dX, then dW


def test_training_conv_falls_back_where_direct_cannot():
    """Strided float32 layers and pads past the window's reach (dX) take the GEMM route, still right."""
    for attrs, x_shape, w_shape in [
        (ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), (2, 3, 9, 8), (5, 3, 3, 3)),
        (ConvAttrs(pads=(3, 0, 0, 0)), (2, 3, 5, 5), (4, 3, 3, 3)),
    ]:
        x, w = _float32(x_shape, w_shape)
        y = conv_train.conv_forward(x, w, None, attrs)
        assert _relative_error(y, direct_conv(x.astype(np.float64), w.astype(np.float64), None, attrs)) < 1e-5
        dy = RNG.standard_normal(y.shape).astype(np.float32)
        grads = conv_train.conv_backward(x, w, dy, attrs, want_x=True, want_w=True)
        expected_dx, expected_dw = direct_grads(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64), attrs)
        assert _relative_error(grads.x, expected_dx) < 1e-5
        assert _relative_error(grads.w, expected_dw) < 1e-5


def test_small_layers_stay_on_one_thread(monkeypatch):
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: 4)
    many = 100  # images
    assert jit_direct.split_threads(jit_direct.MIN_PRODUCTS_PER_THREAD - 1, many, 1) == 1
    assert jit_direct.split_threads(2 * jit_direct.MIN_PRODUCTS_PER_THREAD, many, 1) == 2
    assert jit_direct.split_threads(100 * jit_direct.MIN_PRODUCTS_PER_THREAD, many, 1) == 4
    # One image shares its kernel blocks only from MIN_PRODUCTS_PER_SHARE a share, and never over more
    # threads than it has blocks.
    share = jit_direct.MIN_PRODUCTS_PER_SHARE
    assert jit_direct.split_threads(2 * share - 1, 1, 8) == 1
    assert jit_direct.split_threads(2 * share, 1, 8) == 2
    assert jit_direct.split_threads(100 * share, 1, 3) == 3
    # Two images on four threads: one thread an image, more once shares of an image are worth it.
    assert jit_direct.split_threads(3 * share, 2, 8) == 3
    assert jit_direct.split_threads(share, 2, 8) == 2
    # LeNet's conv1 at batch 1 (1 -> 20, 5x5 on 28x28): ~0.4M products, one thread, no hand-off.
    parts = []
    monkeypatch.setattr(jit_direct, "parallel_for", lambda body, count, threads: parts.append(threads) or [
        body(i) for i in range(count)])  # fmt: skip
    attrs, x_shape, w_shape = ConvAttrs(), (1, 1, 28, 28), (20, 1, 5, 5)
    x, w, b = _float32(x_shape, w_shape, w_shape[:1])
    y = np.empty((1, 20, 24, 24), np.float32)
    jit_direct.conv2d(x, w, b, _geometry(attrs, x_shape, w_shape), NO_BOUNDS, y)
    assert parts == [1]
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    assert _relative_error(y, expected) < 1e-5


def test_computed_products_count_the_dropped_work():
    from hetflow.devices.cpu.kernels import jit_direct_lanes

    # LeNet's conv2 (20 -> 50, 5x5 on 12x12): 8x8 outputs on rows 12 wide (96 flat positions, already
    # whole blocks of 32) and 50 kernels in 7 blocks of 8.
    geom = _geometry(ConvAttrs(), (1, 20, 12, 12), (50, 20, 5, 5))
    assert jit_direct.computed_products(2, 20, 50, geom) == 2 * 96 * 56 * 20 * 25
    # The lanes variant: 64 pixels (whole blocks of 8) and 50 kernels in 2 blocks of 32.
    assert jit_direct_lanes.computed_products(2, 20, 50, geom) == 2 * 64 * 64 * 20 * 25


@pytest.mark.parametrize("bounds", [NO_BOUNDS, RELU_BOUNDS, (np.float32(0.0), np.float32(6.0)),
                                    (np.float32(-1.5e-3), np.float32(-0.0)), (np.float32(-3.0), np.float32(2.5e38))])
def test_bounds_round_trip_through_a_job_word(bounds):
    """A share job carries its bounds as one int64 of its argument block, both float32s bit for bit."""
    word = jit_direct.bounds_word(bounds)
    assert isinstance(word, int) and -(2**63) <= word < 2**63
    low, high = jit_direct.word_bounds(np.int64(word))
    assert np.float32(low).tobytes() == np.float32(bounds[0]).tobytes()
    assert np.float32(high).tobytes() == np.float32(bounds[1]).tobytes()


@pytest.mark.parametrize("fused", [
    FusedActivation("Clip", alpha=0.0, beta=6.0),  # MobileNet v2's ReLU6
    FusedActivation("Clip", alpha=-0.25, beta=0.5),
    FusedActivation("Relu"),
    FusedActivation("LeakyRelu", alpha=0.1),
], ids=["relu6", "clip", "relu", "leaky"])  # fmt: skip
@pytest.mark.parametrize(("variant", "strides", "pads", "x_shape"), [
    ("jit_direct_phases", (2, 2), (1, 1, 1, 1), (1, 5, 33, 33)),
    ("jit_direct_stems", (2, 2), (1, 1, 1, 1), (1, 3, 33, 33)),
    ("jit_direct_stems", (2, 2), (0, 1, 1, 0), (1, 3, 20, 35)),
    ("jit_direct_phases", (2, 2), (0, 1, 1, 0), (2, 3, 20, 35)),  # a batch's stem
    ("jit_direct_same", (1, 1), (1, 1, 1, 1), (2, 5, 9, 13)),
    ("jit_direct", (1, 1), (0, 0, 0, 0), (2, 5, 9, 13)),
    ("jit_direct_lanes", (1, 1), (0, 0, 0, 0), (1, 64, 7, 7)),
])  # fmt: skip
def test_a_fused_clip_is_clamped_in_the_copy_out(fused, variant, strides, pads, x_shape):
    """Each direct variant clamps Y to a fused Relu's or Clip's bounds as it copies it out: a captured run
    replays one job (a LeakyRelu, which no copy-out applies, a second over Y), and Y is the clamped sum."""
    from hetflow.devices.cpu import CPUDevice, spin_pool, threads
    from hetflow.graph import Node
    from hetflow.ops.base import array_infos

    attrs = ConvAttrs(kernel_shape=(3, 3), pads=pads, strides=strides, fused=fused)
    x, w, b = _float32(x_shape, (32, x_shape[1], 3, 3), (32,))
    x *= 4  # so that outputs pass both of the clips' bounds
    plain = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    if fused.op_type == "LeakyRelu":
        expected = np.where(plain < 0, plain * fused.alpha, plain)
    else:
        expected = np.clip(plain, fused.alpha if fused.op_type == "Clip" else 0.0,
                           fused.beta if fused.op_type == "Clip" else np.inf)  # fmt: skip
    assert (plain < expected.min()).any() or fused.op_type == "LeakyRelu"
    chosen = jit_direct_lanes.variant(geometry(conv_window(attrs, w.shape), x_shape[2:]), 32, x_shape)
    assert chosen.__name__.rsplit(".", 1)[1] == variant
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == "direct_fma")
    target = np.full(expected.shape, np.nan, np.float32)
    call = kernel.bind(node, array_infos([x, w, b]), [target], np.empty(1 << 22, np.uint8))
    with threads.own_threads(2, spin=True):
        outputs, jobs = call.capture([x, w, b])
        assert outputs[0] is target and len(jobs) == (2 if fused.op_type == "LeakyRelu" else 1)
        spin_pool.replay_on(spin_pool.JobScript(jobs), threads.spinning())
    assert np.abs(target - expected).max() / np.abs(plain).max() < 1e-5
