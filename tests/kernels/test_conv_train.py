"""The training Conv (chunked forward and backward) and its compiled im2col / col2im, against direct sums
over the window taps in float64."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import conv_train, jit_columns
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.conv import Conv, ConvAttrs, channel_col2im, channel_columns, conv_window
from hetflow.ops.spatial import Geometry, geometry

RNG = np.random.default_rng(11)

#: (attrs, X shape, W shape): odd sizes, asymmetric pads, strides, dilations, groups, depthwise, 1-D, 3-D.
CASES = [
    (ConvAttrs(pads=(1, 1, 1, 1)), (3, 4, 7, 6), (5, 4, 3, 3)),
    (ConvAttrs(pads=(0, 2, 1, 0), strides=(2, 1), dilations=(1, 2)), (2, 6, 9, 8), (4, 6, 3, 2)),
    (ConvAttrs(strides=(3, 2)), (2, 3, 10, 7), (2, 3, 2, 3)),
    (ConvAttrs(group=2, pads=(2, 1, 0, 1), strides=(1, 2)), (3, 4, 7, 6), (6, 2, 3, 3)),
    (ConvAttrs(group=3, pads=(1, 1, 1, 1)), (2, 3, 5, 5), (6, 1, 3, 3)),
    (ConvAttrs(), (2, 5, 4, 4), (3, 5, 1, 1)),
    (ConvAttrs(auto_pad="SAME_UPPER", strides=(2, 2)), (2, 3, 6, 5), (4, 3, 3, 3)),
    (ConvAttrs(pads=(1, 2), strides=(2,), dilations=(2,)), (3, 4, 11), (5, 4, 3)),
    (ConvAttrs(pads=(1, 0, 1, 0, 1, 1)), (2, 2, 4, 3, 5), (3, 2, 3, 2, 2)),
]
IDS = ["pad1", "asym-stride-dilation", "stride3", "group2", "depthwise", "1x1", "same-upper", "1d", "3d"]


def _geometry(attrs: ConvAttrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> Geometry:
    return geometry(conv_window(attrs, w_shape), x_shape[2:])


def _tap_views(padded: np.ndarray, geom: Geometry) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    return [(tap, (slice(None), slice(None), *geom.tap_slices(tap))) for tap in geom.taps()]


def direct_conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: ConvAttrs) -> np.ndarray:
    """Y as a sum over the window taps of per-group channel contractions (float64)."""
    geom = _geometry(attrs, x.shape, w.shape)
    group = attrs.group
    padded = geom.pad(x)
    batch, kernels = x.shape[0], w.shape[0]
    y = np.zeros((batch, group, kernels // group, *geom.out))
    wg = w.reshape(group, kernels // group, w.shape[1], *w.shape[2:])
    for tap, where in _tap_views(padded, geom):
        window = padded[where].reshape(batch, group, w.shape[1], *geom.out)
        y += np.einsum("gkc,ngc...->ngk...", wg[(..., *tap)], window)
    y = y.reshape(batch, kernels, *geom.out)
    if bias is not None:
        y += bias.reshape(kernels, *(1,) * len(geom.out))
    return y


def direct_grads(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, attrs: ConvAttrs
) -> tuple[np.ndarray, np.ndarray]:
    """(dX, dW) as sums over the window taps (float64): each tap's window read by dW, written by dX."""
    geom = _geometry(attrs, x.shape, w.shape)
    group = attrs.group
    padded = geom.pad(x)
    dpadded = np.zeros_like(padded)
    batch, kernels, per_group = x.shape[0], w.shape[0], w.shape[1]
    wg = w.reshape(group, kernels // group, per_group, *w.shape[2:])
    dyg = dy.reshape(batch, group, kernels // group, *geom.out)
    dw = np.zeros_like(wg)
    for tap, where in _tap_views(padded, geom):
        window = padded[where].reshape(batch, group, per_group, *geom.out)
        flat_window = window.reshape(batch, group, per_group, -1)
        dw[(..., *tap)] = np.einsum("ngkp,ngcp->gkc", dyg.reshape(*dyg.shape[:3], -1), flat_window)
        dwindow = np.einsum("gkc,ngk...->ngc...", wg[(..., *tap)], dyg)
        dpadded[where] += dwindow.reshape(batch, group * per_group, *geom.out)
    interior = tuple(slice(a.pad_begin, a.pad_begin + a.size) for a in geom.axes)
    return dpadded[(slice(None), slice(None), *interior)], dw.reshape(w.shape)


@pytest.fixture(params=["one chunk", "chunks of 2 images", "one image per chunk"])
def chunking(request, monkeypatch):
    """Chunk sizes that make every batch here one chunk, several with a short last one, or single images."""
    if request.param == "chunks of 2 images":
        monkeypatch.setattr(conv_train, "conv_layout", _forcing_images(conv_train.conv_layout, images=2))
    elif request.param == "one image per chunk":
        monkeypatch.setattr(conv_train, "CHUNK_BYTES", 1)
    return request.param


def _forcing_images(layout_fn, images: int):
    def layout(*args):
        found = layout_fn(*args)
        return dataclasses.replace(found, images=min(images, found.batch))

    return layout


@pytest.fixture(params=["chunk GEMMs", "per-image GEMMs", "position-major columns"])
def forward_gemms(request, monkeypatch):
    """Whether the forward multiplies channel-major columns, a chunk of several images by one GEMM or by
    one per image, or position-major columns (wherever the layer allows: 2-D, one group)."""
    monkeypatch.setattr(conv_train, "PER_IMAGE_POSITIONS", 1 if request.param == "per-image GEMMs" else 10**9)
    monkeypatch.setattr(conv_train, "POSITION_MAJOR_CHANNELS", 1 if request.param == "position-major columns" else 10**9)
    return request.param


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_forward_matches_the_direct_sum(chunking, forward_gemms, attrs, x_shape, w_shape):
    x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
    y = conv_train.conv_forward(x, w, b, attrs)
    np.testing.assert_allclose(y, direct_conv(x, w, b, attrs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        conv_train.conv_forward(x, w, None, attrs), direct_conv(x, w, None, attrs), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_backward_matches_the_direct_sum(chunking, attrs, x_shape, w_shape):
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    dy = RNG.standard_normal(direct_conv(x, w, None, attrs).shape)
    grads = conv_train.conv_backward(x, w, dy, attrs, want_x=True, want_w=True, want_b=True)
    expected_dx, expected_dw = direct_grads(x, w, dy, attrs)
    np.testing.assert_allclose(grads.x, expected_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.w, expected_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.b, dy.sum(axis=(0, *range(2, dy.ndim))), rtol=1e-12, atol=1e-12)


RELU = FusedActivation("Relu")


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_fused_relu_forward_is_the_relu_of_the_direct_sum(chunking, forward_gemms, attrs, x_shape, w_shape):
    x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
    fused = dataclasses.replace(attrs, fused=RELU)
    expected = np.maximum(direct_conv(x, w, b, attrs), 0)
    np.testing.assert_allclose(conv_train.conv_forward(x, w, b, fused), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_fused_relu_backward_masks_dy_by_the_output(chunking, attrs, x_shape, w_shape):
    """dX, dW and dB of Relu(Conv) are the Conv's for ``dY * (Y > 0)``, Y the fused output."""
    x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
    y = np.maximum(direct_conv(x, w, b, attrs), 0)
    assert 0 < (y > 0).mean() < 1
    dy = RNG.standard_normal(y.shape)
    fused = dataclasses.replace(attrs, fused=RELU)
    grads = conv_train.conv_backward(x, w, dy, fused, want_x=True, want_w=True, want_b=True, y=y)
    masked = dy * (y > 0)
    expected_dx, expected_dw = direct_grads(x, w, masked, attrs)
    np.testing.assert_allclose(grads.x, expected_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.w, expected_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads.b, masked.sum(axis=(0, *range(2, dy.ndim))), rtol=1e-12, atol=1e-12)


def test_fused_relu_two_threads(forward_gemms, monkeypatch):
    monkeypatch.setattr(conv_train, "CHUNK_BYTES", 1)
    monkeypatch.setattr(conv_train, "intra_op_threads", lambda: 2)
    attrs, x_shape, w_shape = CASES[1]
    fused = dataclasses.replace(attrs, fused=RELU)
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    y = conv_train.conv_forward(x, w, None, fused)
    np.testing.assert_allclose(y, np.maximum(direct_conv(x, w, None, attrs), 0), rtol=1e-12, atol=1e-12)
    dy = RNG.standard_normal(y.shape)
    dx, dw, _ = conv_train.conv_backward(x, w, dy, fused, want_x=True, want_w=True, y=y)
    expected_dx, expected_dw = direct_grads(x, w, dy * (y > 0), attrs)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-12, atol=1e-12)


def test_other_fused_activations_are_refused():
    attrs, x_shape, w_shape = CASES[0]
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    with pytest.raises(ValueError, match="only Relu"):
        conv_train.conv_forward(x, w, None, dataclasses.replace(attrs, fused=FusedActivation("Sigmoid")))


def test_backward_computes_only_what_is_wanted(chunking):
    attrs, x_shape, w_shape = CASES[3]
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    dy = RNG.standard_normal(direct_conv(x, w, None, attrs).shape)
    every = conv_train.conv_backward(x, w, dy, attrs, want_x=True, want_w=True, want_b=True)
    for want in itertools.product([False, True], repeat=3):
        some = conv_train.conv_backward(x, w, dy, attrs, *want)
        for wanted, got, full in zip(want, some, every):
            if wanted:
                # Not bitwise: how the work splits over threads follows what is wanted, and so does
                # the summation order (1-ulp differences on a 16-core machine).
                np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-12)
            else:
                assert got is None


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES[:5], ids=IDS[:5])
def test_backward_agrees_with_the_numpy_rule(attrs, x_shape, w_shape):
    x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    dy = RNG.standard_normal(direct_conv(x, w, b, attrs).shape)
    reference = Conv().backward(node, [x, w, b], [None], [dy])
    grads = conv_train.conv_backward(x, w, dy, attrs, want_x=True, want_w=True, want_b=True)
    for ours, theirs in zip(grads, reference):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_float32_matches_float64(chunking):
    attrs, x_shape, w_shape = CASES[1]
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    dy = RNG.standard_normal(direct_conv(x, w, None, attrs).shape)
    y32 = conv_train.conv_forward(x.astype(np.float32), w.astype(np.float32), None, attrs)
    dx32, dw32, _ = conv_train.conv_backward(*(a.astype(np.float32) for a in (x, w, dy)), attrs, True, True)
    assert y32.dtype == dx32.dtype == dw32.dtype == np.float32
    expected_dx, expected_dw = direct_grads(x, w, dy, attrs)
    np.testing.assert_allclose(y32, direct_conv(x, w, None, attrs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx32, expected_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw32, expected_dw, rtol=1e-4, atol=1e-4)


def test_two_threads_split_the_batch_and_sum_dw(monkeypatch):
    """Each thread takes whole chunks with BLAS at one thread; dW and dB sum the threads' partial sums."""
    monkeypatch.setattr(conv_train, "CHUNK_BYTES", 1)
    monkeypatch.setattr(conv_train, "intra_op_threads", lambda: 2)
    held: list[int] = []
    monkeypatch.setattr(threads.BLAS, "hold", lambda count: held.append(count))
    attrs, x_shape, w_shape = CASES[3]
    x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
    dy = RNG.standard_normal(direct_conv(x, w, None, attrs).shape)
    dx, dw, db = conv_train.conv_backward(x, w, dy, attrs, want_x=True, want_w=True, want_b=True)
    expected_dx, expected_dw = direct_grads(x, w, dy, attrs)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        conv_train.conv_forward(x, w, None, attrs), direct_conv(x, w, None, attrs), rtol=1e-12
    )
    assert held == [1, 1]


# -- compiled im2col / col2im ------------------------------------------------------------------------
COLUMN_CASES = [case for case in CASES if len(case[1]) == 4]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), COLUMN_CASES)
@pytest.mark.parametrize(("first", "count"), [(0, 1), (1, 1), (0, 2)])
def test_im2col_2d_matches_channel_columns(attrs, x_shape, w_shape, first, count, dtype):
    x = RNG.standard_normal(x_shape).astype(dtype)
    geom = _geometry(attrs, x_shape, w_shape)
    positions = int(np.prod(geom.out))
    cols = np.full((x_shape[1] * int(np.prod(geom.kernel)), count * positions), np.nan, dtype)
    jit_columns.im2col_2d(x, first, count, geom, cols)
    expected = channel_columns(x[first : first + count], geom).reshape(cols.shape)
    np.testing.assert_array_equal(cols, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), COLUMN_CASES)
@pytest.mark.parametrize(("first", "count"), [(0, 1), (1, 1), (0, 2)])
def test_position_columns_2d_are_the_channel_columns_reordered(attrs, x_shape, w_shape, first, count, dtype):
    """Rows (image, oy, ox), columns (i, j, c); one scratch serves every call, its padding staying zero."""
    x = RNG.standard_normal(x_shape).astype(dtype)
    geom = _geometry(attrs, x_shape, w_shape)
    channels, taps, positions = x_shape[1], int(np.prod(geom.kernel)), int(np.prod(geom.out))
    scratch = jit_columns.pixel_scratch(x_shape, geom, dtype)
    for start in (first, first):  # twice: the second call reuses the scratch the first one filled
        cols = np.full((count * positions, taps * channels), np.nan, dtype)
        jit_columns.position_columns_2d(x, start, count, geom, cols, scratch)
        channel_major = channel_columns(x[start : start + count], geom).reshape(channels, taps, -1)
        np.testing.assert_array_equal(cols, channel_major.transpose(2, 1, 0).reshape(cols.shape))


@pytest.mark.parametrize("relu", [False, True])
def test_planes_from_products_transposes_and_adds_the_bias(relu):
    count, positions, kernels = 2, 5, 3
    products = RNG.standard_normal((count * positions, kernels))
    bias = RNG.standard_normal(kernels)
    y = np.full((4, kernels, positions), np.nan)
    jit_columns.planes_from_products(products, bias, relu, y, 1, count)
    expected = products.reshape(count, positions, kernels).transpose(0, 2, 1) + bias[:, None]
    np.testing.assert_array_equal(y[1:3], np.maximum(expected, 0) if relu else expected)
    assert np.isnan(y[[0, 3]]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), COLUMN_CASES)
def test_col2im_2d_matches_channel_col2im(attrs, x_shape, w_shape, dtype):
    geom = _geometry(attrs, x_shape, w_shape)
    first, count = 1, x_shape[0] - 1
    rows = x_shape[1] * int(np.prod(geom.kernel))
    dcols = RNG.standard_normal((rows, count * int(np.prod(geom.out)))).astype(dtype)
    dx = np.full(x_shape, np.nan, dtype)  # images outside the range stay untouched
    jit_columns.col2im_2d(dcols, geom, dx, first, count)
    expected = channel_col2im(dcols, geom, (count, *x_shape[1:]))
    np.testing.assert_array_equal(dx[first:], expected)
    assert np.isnan(dx[:first]).all()
