"""The direct weight gradient (``jit_direct_grad``) against sums over the window taps in float64, and
the training Conv's float32 backward through it."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu.kernels import conv_train, jit_direct_grad
from hetflow.ops.conv import ConvAttrs
from tests.kernels.test_conv_train import direct_grads
from tests.kernels.test_jit_direct import CASES, IDS, _float32, _geometry, _relative_error

#: More kernels than a block (32): two blocks, the second part padding.
WIDE = (ConvAttrs(pads=(1, 1, 1, 1)), (3, 4, 6, 5), (40, 4, 3, 3))


def _expected(x: np.ndarray, dy: np.ndarray, w_shape: tuple[int, ...], attrs: ConvAttrs) -> np.ndarray:
    placeholder = np.zeros(w_shape)
    return direct_grads(x.astype(np.float64), placeholder, dy.astype(np.float64), attrs)[1]


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), [*CASES, WIDE], ids=[*IDS, "two-kernel-blocks"])
def test_weight_gradient_matches_the_direct_sum(monkeypatch, threads, attrs, x_shape, w_shape):
    monkeypatch.setattr(jit_direct_grad, "intra_op_threads", lambda: threads)
    geom = _geometry(attrs, x_shape, w_shape)
    (x,) = _float32(x_shape)
    (dy,) = _float32((x_shape[0], w_shape[0], *geom.out))
    dw, db = jit_direct_grad.weight_gradient(x, dy, geom)
    assert dw.shape == w_shape and dw.dtype == np.float32 and dw.flags.c_contiguous
    assert _relative_error(dw, _expected(x, dy, w_shape, attrs)) < 1e-5
    assert db.shape == w_shape[:1] and db.dtype == np.float32
    assert _relative_error(db, dy.astype(np.float64).sum(axis=(0, 2, 3))) < 1e-5


@pytest.mark.parametrize("chunk_bytes", [1, 13000])
def test_weight_gradient_over_chunks_and_through_the_mask(monkeypatch, chunk_bytes):
    """One image per chunk, or a few with a short last chunk; dY read as ``dY * (mask > 0)``."""
    monkeypatch.setattr(jit_direct_grad, "CHUNK_BYTES", chunk_bytes)
    attrs, x_shape, w_shape = (ConvAttrs(pads=(1, 2, 1, 0)), (5, 3, 7, 6), (20, 3, 3, 3))
    geom = _geometry(attrs, x_shape, w_shape)
    x, dy, mask = _float32(x_shape, (5, 20, *geom.out), (5, 20, *geom.out))
    masked = dy * (mask > 0)
    dw, db = jit_direct_grad.weight_gradient(x, dy, geom, mask=mask)
    assert _relative_error(dw, _expected(x, masked, w_shape, attrs)) < 1e-5
    assert _relative_error(db, masked.astype(np.float64).sum(axis=(0, 2, 3))) < 1e-5


def test_masked_gradient_keeps_nan():
    """The mask multiplies, as the numpy rule: a NaN in dY under a zero mask stays NaN."""
    attrs, x_shape, w_shape = CASES[0]
    geom = _geometry(attrs, x_shape, w_shape)
    x, dy = _float32(x_shape, (x_shape[0], w_shape[0], *geom.out))
    dy[0, 0, 0, 0] = np.nan
    mask = np.ones_like(dy)
    mask[0, 0, 0, 0] = -1
    dw, db = jit_direct_grad.weight_gradient(x, dy, geom, mask=mask)
    assert np.isnan(dw[0]).any() and np.isnan(db[0])
    assert np.isfinite(dw[1:]).all() and np.isfinite(db[1:]).all()


def test_pair_offsets_cover_every_channel_and_tap_in_whole_blocks():
    offsets = jit_direct_grad.pair_offsets(2, 100, (0, 1, 10, 11))
    assert offsets.size % jit_direct_grad.PAIR_BLOCK == 0
    assert offsets[:8].tolist() == [0, 1, 10, 11, 100, 101, 110, 111]
    assert not offsets[8:].any()


@pytest.mark.parametrize(
    ("want_x", "want_w", "want_b"), [(False, True, False), (False, False, True), (True, False, False)]
)
def test_training_conv_returns_only_the_wanted_gradients(want_x, want_w, want_b):
    """dW without dB (a Conv with no bias) by the direct gradients; dB alone by the chunked pass; dX
    alone (a frozen layer) by the direct kernel."""
    attrs, x_shape, w_shape = CASES[0]
    x, w = _float32(x_shape, w_shape)
    dy = _float32((x_shape[0], w_shape[0], *_geometry(attrs, x_shape, w_shape).out))[0]
    grads = conv_train.conv_backward(x, w, dy, attrs, want_x=want_x, want_w=want_w, want_b=want_b)
    expected_dx, expected_dw = direct_grads(
        x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64), attrs
    )
    assert (grads.x is None) != want_x and (grads.w is None) != want_w and (grads.b is None) != want_b
    if want_x:
        assert _relative_error(grads.x, expected_dx) < 1e-5
    if want_w:
        assert _relative_error(grads.w, expected_dw) < 1e-5
    if want_b:
        assert _relative_error(grads.b, dy.astype(np.float64).sum(axis=(0, 2, 3))) < 1e-5
