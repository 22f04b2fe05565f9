"""im2col of one large image a band of output rows at a time (``conv._banded_gemm``): the same result as
a float64 direct sum, every output row written once, and the bands used only where they apply."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import conv
from hetflow.ops.activation import FusedActivation
from hetflow.ops.conv import IM2COL, ConvAttrs
from tests.kernels.test_conv_algorithms import _direct_conv, _run

RNG = np.random.default_rng(23)


@pytest.fixture
def small_bands(monkeypatch):
    """Bands for any image, three output rows each (so a thread's range ends in a partial band), and
    a record of the bands built."""
    monkeypatch.setattr(conv, "BAND_MIN_COLUMN_BYTES", 1)
    built: list[tuple[int, int]] = []
    fill = conv.compiled_im2col_rows

    def recording(x, geo, columns, top, bottom):  # noqa: ANN001, ANN202
        built.append((top, bottom))
        fill(x, geo, columns, top, bottom)

    monkeypatch.setattr(conv, "compiled_im2col_rows", recording)
    return built


def _case(x_shape, kernels, kernel, group=1):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal((kernels, x_shape[1] // group, *kernel)).astype(np.float32)
    b = RNG.standard_normal(kernels).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize(
    "attrs",
    [ConvAttrs(pads=(3, 3, 3, 3), strides=(2, 2), fused=FusedActivation("Relu")),
     ConvAttrs(pads=(0, 2, 1, 0), dilations=(2, 1)),
     ConvAttrs(strides=(3, 4))],
    ids=["7x7-stride-2-pad-relu", "asymmetric-pad-dilated", "strided-unpadded"],
)  # fmt: skip
def test_bands_match_a_direct_sum_and_cover_every_row(small_bands, monkeypatch, attrs):
    x, w, b = _case((1, 3, 41, 37), 8, (7, 7))
    out_w = conv.geometry(conv.conv_window(attrs, w.shape), x.shape[2:]).out[1]
    monkeypatch.setattr(conv, "BAND_BYTES", 3 * 3 * 49 * out_w * 4)  # columns of 3 output rows
    with threads.blas_threads(2):
        got = _run(IM2COL, attrs, x, w, b)
    expected = _direct_conv(x, w, b, attrs)
    if attrs.fused is not None:
        expected = np.maximum(expected, 0)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    rows = sorted(row for top, bottom in small_bands for row in range(top, bottom))
    assert rows == list(range(got.shape[2]))  # each output row built once
    assert all(bottom - top <= 3 for top, bottom in small_bands) and len(small_bands) > 2


@pytest.mark.parametrize(
    ("x_shape", "group", "count"),
    [((2, 4, 20, 20), 1, 2), ((1, 4, 20, 20), 2, 2), ((1, 4, 20, 20), 1, 1)],
    ids=["two-images", "grouped", "one-thread"],
)
def test_no_bands_where_they_do_not_apply(small_bands, x_shape, group, count):
    x, w, b = _case(x_shape, 6, (3, 3), group)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), group=group)
    with threads.blas_threads(count):
        got = _run(IM2COL, attrs, x, w, b)
    np.testing.assert_allclose(got, _direct_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)
    assert small_bands == []


def test_a_large_first_layer_is_banded_by_default():
    """GoogLeNet's first layer (7x7 stride 2 on 3x224x224: 7.4 MB of columns) is banded on two threads;
    a layer with large weights is not."""
    x = np.zeros((1, 3, 224, 224), np.float32)
    geo = conv.geometry(conv.conv_window(ConvAttrs(pads=(3, 3, 3, 3), strides=(2, 2)), (64, 3, 7, 7)), (224, 224))
    weights = np.zeros((64, 3 * 7 * 7), np.float32)
    with threads.blas_threads(2):
        assert conv._banded(geo, x, weights, 1)
        # ZFNet's second layer: 2.4 MB of weights, read again by every band's GEMM.
        zfnet = conv.geometry(conv.conv_window(ConvAttrs(strides=(2, 2)), (256, 96, 5, 5)), (55, 55))
        assert not conv._banded(zfnet, np.zeros((1, 96, 55, 55), np.float32), np.zeros((256, 2400), np.float32), 1)
    with threads.blas_threads(1):
        assert not conv._banded(geo, x, weights, 1)
