"""The direct Conv of "same" windows read and stored in place (``jit_direct_same``), alone and as the CPU's
``direct_fma`` kernel, against sums over the window taps in float64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow import InferenceSession
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_direct, jit_direct_lanes, jit_direct_same
from hetflow.devices.cpu.kernels.jit_direct import NO_BOUNDS, RELU_BOUNDS, bounds_of
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.ops.conv import DIRECT_FMA, ConvAttrs
from tests.kernels.test_conv_train import direct_conv
from tests.kernels.test_jit_direct import _geometry, _relative_error
from tests.kernels.test_jit_direct_phases import _case

RNG = np.random.default_rng(31)

#: (attrs, X shape, W shape) of windows that keep the map's size: odd maps and kernel counts off the
#: blocks (8), an even kernel with SAME_UPPER-style pads, dilation, 1x1 on 1x1, a 1x3 window on a map
#: wider than a block, a map of fewer positions than a vector, channels in two chunks and part of a third
#: (``CHANNEL_CHUNK``), a plane of one block and a whole pair of vectors, and one that ends mid-vector.
CASES = [
    (ConvAttrs(pads=(1, 1, 1, 1)), (2, 5, 9, 13), (11, 5, 3, 3)),
    (ConvAttrs(pads=(1, 1, 2, 2)), (3, 4, 7, 7), (17, 4, 4, 4)),
    (ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2)), (2, 6, 12, 10), (9, 6, 3, 3)),
    (ConvAttrs(), (2, 16, 1, 1), (24, 16, 1, 1)),
    (ConvAttrs(pads=(0, 1, 0, 1)), (1, 3, 6, 40), (3, 3, 1, 3)),
    (ConvAttrs(pads=(2, 2, 2, 2)), (2, 3, 3, 3), (8, 3, 5, 5)),
    (ConvAttrs(pads=(1, 1, 1, 1)), (2, 19, 6, 9), (10, 19, 3, 3)),
    (ConvAttrs(pads=(1, 1, 1, 1)), (1, 6, 8, 10), (9, 6, 3, 3)),
    (ConvAttrs(pads=(1, 1, 1, 1)), (1, 7, 5, 11), (40, 7, 3, 3)),
]
IDS = ["pad1", "4x4-same-upper", "dilated", "1x1-on-1x1", "1x3-wide-row", "3x3-map-5x5", "19-channels",
       "80-positions", "55-positions"]


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_conv2d_matches_the_direct_sum(monkeypatch, threads, attrs, x_shape, w_shape):
    """Whole images per thread, or (batch below the thread count) each image's kernel blocks shared; every
    position of Y written (it starts as NaN), none past it."""
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: threads)
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_THREAD", 1)  # split even these small layers
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_SHARE", 1)  # and one image's kernel blocks
    x, w, b, expected = _case(attrs, x_shape, w_shape)
    geom = _geometry(attrs, x_shape, w_shape)
    assert jit_direct_same.applies(geom)
    # One guard plane past Y: a store past its last position would land there.
    guarded = np.full((expected.size + 64,), np.nan, np.float32)
    y = guarded[: expected.size].reshape(expected.shape)
    assert jit_direct_same.conv2d(x, w, b, geom, NO_BOUNDS, y) is y
    assert _relative_error(y, expected) < 1e-5
    assert np.isnan(guarded[expected.size :]).all()


@pytest.mark.parametrize("bounds", [RELU_BOUNDS, bounds_of(-0.5, 0.5)], ids=["relu", "clip"])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES[:3] + CASES[-1:], ids=IDS[:3] + IDS[-1:])
def test_bound_calls_one_part_and_shared_blocks(attrs, x_shape, w_shape, bounds):
    """The prepared calls with a fused Relu or Clip, into a Concat's image-strided slice (its other
    channels left alone): one thread over every image, every image's kernel blocks shared out on numba's
    threads and on a spinning pool."""
    x, w, b, expected = _case(attrs, x_shape, w_shape)
    scale = float(np.abs(expected).max())  # the products' own: a clipped max would hide their rounding
    expected = np.clip(expected, *bounds)
    geom = _geometry(attrs, x_shape, w_shape)
    kernels = w_shape[0]
    buffers = jit_direct.PartBuffers.allocate(4, jit_direct_same.buffer_shapes(x_shape[1], kernels, geom))
    wt = jit_direct.blocked_weights(w)
    concats = [np.full((x_shape[0], kernels + 3, *expected.shape[2:]), np.nan, np.float32) for _ in range(3)]
    results = [concat[:, 2 : 2 + kernels] for concat in concats]
    jit_direct_same.bind_one_part(x.shape, kernels, geom, bounds, buffers)(x, wt, b, results[0])
    split = jit_direct_same.bind_block_split(x.shape, kernels, geom, bounds, buffers)
    split(x, wt, b, results[1], 4)
    with own_threads(2, spin=True):
        pool = spinning()
        assert isinstance(pool, spin_pool.SpinPool)
        split(x, wt, b, results[2], 2, pool)
    for concat in concats:
        assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 2 + kernels :]).all()
    for y in results:
        assert np.abs(y - expected).max() / scale < 1e-5 and (y >= bounds[0]).all() and (y <= bounds[1]).all()


def test_relu_keeps_nan_and_no_bias_is_zero():
    """A NaN read by a window stays NaN through the fused Relu (as the Relu op's); without a bias the
    sums are the taps' alone."""
    attrs, x_shape, w_shape = CASES[0]
    x, w, _, _ = _case(attrs, x_shape, w_shape)
    x[0, 0, 4, 6] = np.nan
    geom = _geometry(attrs, x_shape, w_shape)
    y = jit_direct_same.conv2d(x, w, None, geom, RELU_BOUNDS, np.empty((x_shape[0], w_shape[0], *x_shape[2:]), np.float32))
    assert np.isnan(y[0, :, 3:6, 5:8]).all() and not np.isnan(y[1]).any()
    clean = np.nan_to_num(x.astype(np.float64))
    expected = np.maximum(direct_conv(clean, w.astype(np.float64), None, attrs), 0)
    keep = ~np.isnan(y)
    assert np.abs(y[keep] - expected[keep]).max() / np.abs(expected).max() < 1e-5


def test_a_relu_mask_on_x_goes_to_the_flat_kernel():
    """X read through a backward's mask: ``jit_direct``'s result, bit for bit."""
    attrs, x_shape, w_shape = CASES[0]
    x, w, mask = (RNG.standard_normal(shape).astype(np.float32) for shape in (x_shape, w_shape, x_shape))
    geom = _geometry(attrs, x_shape, w_shape)
    out_shape = (x_shape[0], w_shape[0], *x_shape[2:])
    found = jit_direct_same.conv2d(x, w, None, geom, NO_BOUNDS, np.empty(out_shape, np.float32), mask=mask)
    flat = jit_direct.conv2d(x, w, None, geom, NO_BOUNDS, np.empty(out_shape, np.float32), mask=mask)
    np.testing.assert_array_equal(found, flat)


def test_masks_mark_the_lanes_that_read_pixels():
    """3x3 pad 1 on a 3x5 map (15 positions, one vector): the top-left tap reads from row 1, column 1 on;
    the centre tap every position; no lane past the plane's end."""
    geom = _geometry(ConvAttrs(pads=(1, 1, 1, 1)), (1, 1, 3, 5), (1, 1, 3, 3))
    layout = jit_direct_same.same_layout(geom)
    assert layout.plane == 15 and layout.offsets.tolist() == [-6, -5, -4, -1, 0, 1, 4, 5, 6]
    lanes = [{lane for lane in range(16) if int(mask) >> lane & 1} for mask in layout.masks]
    assert lanes[0] == {6, 7, 8, 9, 11, 12, 13, 14}  # (1..2, 1..4)
    assert lanes[4] == set(range(15))
    assert lanes[8] == {0, 1, 2, 3, 5, 6, 7, 8}  # (0..1, 0..3)


@pytest.mark.parametrize(
    ("attrs", "size", "applies"),
    [
        (ConvAttrs(pads=(1, 1, 1, 1)), 9, True),
        (ConvAttrs(), 9, False),  # valid: the map shrinks
        (ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), 9, False),
        (ConvAttrs(pads=(1, 1, 0, 0)), 9, False),  # asymmetric, and the map shrinks
    ],
)
def test_applies_to_windows_that_keep_the_size(attrs, size, applies):
    assert jit_direct_same.applies(_geometry(attrs, (1, 2, size, size), (4, 2, 3, 3))) is applies


@pytest.mark.parametrize(
    ("pads", "size", "kernels", "chosen"),
    [
        ((1, 1, 1, 1), 32, 32, jit_direct_same),
        ((1, 1, 1, 1), 8, 128, jit_direct_same),  # 64 positions in 4 whole vectors
        ((1, 1, 1, 1), 7, 256, jit_direct_lanes),  # 49 positions: 64 here, 56 in the lanes
        ((0, 0, 0, 0), 10, 128, jit_direct_lanes),  # valid 8x8 out: 80 flat positions for 64
        ((0, 0, 0, 0), 34, 32, jit_direct),
    ],
)
def test_variant_keeps_the_most_of_its_work(pads, size, kernels, chosen):
    geom = _geometry(ConvAttrs(pads=pads), (1, 16, size, size), (kernels, 16, 3, 3))
    assert jit_direct_lanes.variant(geom, kernels, (1, 16, size, size)) is chosen


def _conv_relu_model(batch: int, channels: int, size: int, kernels: int) -> onnx.ModelProto:
    w = RNG.standard_normal((kernels, channels, 3, 3)).astype(np.float32) * 0.2
    b = RNG.standard_normal(kernels).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "same",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("batch", [1, 3])
def test_a_session_runs_the_layer_here(batch, tmp_path, monkeypatch):
    """A session's ``direct_fma`` Conv + Relu on a same window takes this variant and matches the float64
    sum, run after run (captured and replayed from the third run). (Winograd in the lanes would take the
    layer: held off.)"""
    from hetflow.ops import conv

    monkeypatch.setattr(conv, "_winograd_in_lanes", lambda dtype: False)
    model = _conv_relu_model(batch, 32, 16, 40)
    x = RNG.standard_normal((batch, 32, 16, 16)).astype(np.float32)
    session = InferenceSession(model, threads=2, tuning_cache=str(tmp_path / "tuning.jsonl"))
    [step] = session.plan_for({}).steps
    assert step.kernel.algorithm == DIRECT_FMA
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    expected = np.maximum(direct_conv(x.astype(np.float64), init["w"], init["b"], ConvAttrs(pads=(1, 1, 1, 1))), 0)
    for _ in range(4):
        (y,) = session.run(None, {"x": x})
        assert _relative_error(y, expected) < 1e-5
