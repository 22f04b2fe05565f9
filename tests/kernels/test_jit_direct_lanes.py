"""The direct Conv with the kernels as the lanes (``jit_direct_lanes``) against sums over the window taps in
float64, and where the training Conv picks it."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import jit_direct, jit_direct_lanes
from hetflow.devices.cpu.kernels.jit_direct import NO_BOUNDS, RELU_BOUNDS
from hetflow.ops.conv import ConvAttrs
from tests.kernels.test_conv_train import direct_conv
from tests.kernels.test_jit_direct import CASES, IDS, _float32, _geometry, _relative_error

#: More kernels than a block (32) and a pixel count off the position blocks (8): 7x5 = 35 pixels.
WIDE = (ConvAttrs(pads=(1, 1, 1, 1)), (3, 4, 7, 5), (40, 4, 3, 3))


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), [*CASES, WIDE], ids=[*IDS, "two-kernel-blocks"])
def test_conv2d_matches_the_direct_sum(monkeypatch, threads, attrs, x_shape, w_shape):
    """Whole images per thread, or (batch below the thread count) each image's kernel blocks split."""
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: threads)
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_THREAD", 1)  # split even these small layers
    x, w, b = _float32(x_shape, w_shape, w_shape[:1])
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    y = np.full(expected.shape, np.nan, np.float32)
    found = jit_direct_lanes.conv2d(x, w, b, _geometry(attrs, x_shape, w_shape), NO_BOUNDS, y)
    assert found is y
    assert _relative_error(y, expected) < 1e-5


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), [CASES[0], WIDE], ids=[IDS[0], "two-kernel-blocks"])
def test_conv2d_relu_mask_and_no_bias(attrs, x_shape, w_shape):
    """The Relu on the output, X read through a mask, no bias: as ``jit_direct``, bit for bit."""
    x, w, mask = _float32(x_shape, w_shape, x_shape)
    geom = _geometry(attrs, x_shape, w_shape)
    masked = (x * (mask > 0)).astype(np.float64)
    expected = np.maximum(direct_conv(masked, w.astype(np.float64), None, attrs), 0)
    assert 0 < (expected > 0).mean() < 1
    y = jit_direct_lanes.conv2d(x, w, None, geom, RELU_BOUNDS, np.empty(expected.shape, np.float32), mask=mask)
    assert _relative_error(y, expected) < 1e-5 and (y >= 0).all()
    flat = jit_direct.conv2d(x, w, None, geom, RELU_BOUNDS, np.empty(expected.shape, np.float32), mask=mask)
    np.testing.assert_array_equal(y, flat)


def test_position_offsets_skip_the_pad_columns_in_whole_blocks():
    geom = _geometry(ConvAttrs(pads=(1, 1, 1, 1)), (1, 1, 3, 3), (1, 1, 3, 3))
    width = jit_direct.flat_layout(geom).width
    offsets = jit_direct_lanes.position_offsets(geom)
    assert width == 4 and offsets.size == jit_direct_lanes.POSITION_BLOCK * 2
    assert offsets[:9].tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert set(offsets[9:].tolist()) == {10}  # the padding repeats the last pixel


@pytest.mark.parametrize(
    ("pads", "size", "kernels", "lanes"),
    [
        ((1, 1, 1, 1), 32, 32, False),
        ((1, 1, 1, 1), 16, 64, False),
        ((1, 1, 1, 1), 8, 128, False),
        ((1, 1, 1, 1), 7, 256, True),
        ((0, 0, 0, 0), 10, 128, True),
        ((0, 0, 0, 0), 6, 32, True),
        ((1, 1, 1, 1), 8, 8, False),
    ],
)
def test_small_maps_of_whole_kernel_blocks_prefer_the_lanes(pads, size, kernels, lanes):
    """Same windows keep every position of whole vectors (``jit_direct_same``): an 8x8 map all 64, a 7x7
    49 of 64 (56 here); valid windows keep 64 of 80 flat positions of an 8x8 output, 16 of 24 of a 4x4;
    8 kernels would waste three quarters of a block of 32."""
    geom = _geometry(ConvAttrs(pads=pads), (1, 16, size, size), (kernels, 16, 3, 3))
    assert jit_direct_lanes.prefers_lanes(geom, kernels) is lanes
