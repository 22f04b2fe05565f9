"""The tile GEMM over a batch's images end to end (``jit_span_gemm``) against numpy, and where the
pointwise Conv takes it (``own_gemm.tile_share_job``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice, threads
from hetflow.devices.cpu.kernels import jit_span_gemm, jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import array_infos
from hetflow.ops.conv import POINTWISE, ConvAttrs

RNG = np.random.default_rng(23)
POINTWISE_KERNEL: Kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == POINTWISE)


def _span(w, x, bias, residual, low, high, shares=1, row_parts=1, y=None, block_bytes=jit_tile_gemm.BLOCK_BYTES):  # noqa: ANN001, ANN202, E501
    """Every share of ``span_share`` in turn, into ``y`` (a fresh NaN-filled ``[N, M, P]`` unless given)."""
    batch, _, positions = x.shape
    kernels = w.shape[0]
    if y is None:
        y = np.full((batch, kernels, positions), np.nan, np.float32)
    flat_y, y_image = flat_images(y)
    flat_r, r_image = (flat_y, -1) if residual is None else flat_images(residual)
    for share in range(shares):
        jit_span_gemm.span_share(w.reshape(-1), x, flat_y, y_image, flat_r, r_image, bias, np.float32(low),
                                 np.float32(high), kernels, share, shares, row_parts, block_bytes)  # fmt: skip
    return y


# (batch, kernels, depth, positions): 7x7 maps whose tiles run into the next image (or the next two, 17
# positions), rows past whole blocks of 6, the last tile short of 64.
SHAPES = [(16, 13, 40, 49), (2, 7, 5, 49), (5, 6, 3, 17), (3, 20, 64, 100), (4, 1, 1, 16)]


@pytest.mark.parametrize(("batch", "kernels", "depth", "positions"), SHAPES)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize(("low", "high"), [(-math.inf, math.inf), (0.0, 6.0)], ids=["none", "relu6"])
def test_span_gemm_matches_numpy(batch, kernels, depth, positions, residual, low, high) -> None:  # noqa: ANN001
    w = RNG.standard_normal((kernels, depth)).astype(np.float32)
    x = RNG.standard_normal((batch, depth, positions)).astype(np.float32)
    bias = RNG.standard_normal(kernels).astype(np.float32)
    r = RNG.standard_normal((batch, kernels, positions)).astype(np.float32) if residual else None
    y = _span(w, x, bias, r, low, high)
    want = np.matmul(w, x) + bias[:, None] + (0 if r is None else r)
    np.testing.assert_allclose(y, np.clip(want, low, high), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("shares", "row_parts"), [(2, 1), (4, 4), (6, 3), (5, 5), (13, 1)])
def test_span_shares_cover_every_output_once(shares: int, row_parts: int) -> None:
    w = RNG.standard_normal((50, 24)).astype(np.float32)
    x = RNG.standard_normal((7, 24, 49)).astype(np.float32)
    bias = RNG.standard_normal(50).astype(np.float32)
    r = RNG.standard_normal((7, 50, 49)).astype(np.float32)
    y = _span(w, x, bias, r, 0.0, math.inf, shares, row_parts)
    np.testing.assert_allclose(y, np.maximum(np.matmul(w, x) + bias[:, None] + r, 0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_a_deep_span_product_adds_bias_and_residual_once_and_clamps_at_the_end(residual: bool) -> None:
    depth = jit_tile_gemm.DEPTH_CHUNK + 300
    w = RNG.standard_normal((8, depth)).astype(np.float32) / 30
    x = RNG.standard_normal((3, depth, 49)).astype(np.float32)
    bias = RNG.standard_normal(8).astype(np.float32)
    r = RNG.standard_normal((3, 8, 49)).astype(np.float32) if residual else None
    y = _span(w, x, bias, r, -0.5, 0.5)
    want = np.matmul(w, x) + bias[:, None] + (0 if r is None else r)
    np.testing.assert_allclose(y, np.clip(want, -0.5, 0.5), rtol=1e-4, atol=1e-4)


def test_span_gemm_writes_into_images_that_lie_apart() -> None:
    """Y as one image-strided slice of a Concat's output: the other channels are never written."""
    w = RNG.standard_normal((5, 8)).astype(np.float32)
    x = RNG.standard_normal((4, 8, 49)).astype(np.float32)
    concat = np.full((4, 12, 49), np.nan, np.float32)
    y = concat[:, 4:9]
    _span(w, x, np.zeros(5, np.float32), None, -math.inf, math.inf, y=y, block_bytes=1)
    np.testing.assert_allclose(y, np.matmul(w, x), rtol=1e-5, atol=1e-4)
    assert np.isnan(concat[:, :4]).all() and np.isnan(concat[:, 9:]).all()


@pytest.mark.parametrize(
    ("batch", "positions", "groups", "pays"),
    [(16, 49, 1, True), (2, 49, 1, True), (1, 49, 1, False), (16, 49, 2, False), (16, 9, 1, False),
     (16, 196, 1, False), (16, 784, 1, False), (16, 17, 1, True)],
)  # fmt: skip
def test_spans_pay_where_per_image_tiles_leave_lanes_empty(batch, positions, groups, pays) -> None:  # noqa: ANN001
    """7x7 maps (49 of 64 lanes) in a batch; not one image, groups, maps under a vector, or maps whose
    per-image tiles are nearly full (14x14: 196 of 208)."""
    assert jit_span_gemm.spans_pay(batch, positions, groups) is pays


def test_a_spinning_batch_pointwise_on_a_7x7_map_runs_on_the_spans(monkeypatch) -> None:  # noqa: ANN001
    """The bound pointwise Conv at batch 4 on a 7x7 map: the span job, the BLAS call's result."""
    x = RNG.standard_normal((4, 16, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((30, 16, 1, 1)).astype(np.float32)
    b = RNG.standard_normal(30).astype(np.float32)
    r = RNG.standard_normal((4, 30, 7, 7)).astype(np.float32)
    node = Node("Conv", "conv", ["x", "w", "b", "r"], ["y"],
                ConvAttrs(fused=FusedActivation("Clip", 0.0, 6.0), residual=True))  # fmt: skip
    arrays = [x, w, b, r]
    expected = POINTWISE_KERNEL.fn(node, arrays)[0]
    out = [np.full((4, 30, 7, 7), np.nan, np.float32)]
    call = POINTWISE_KERNEL.bind(node, array_infos(arrays), out, None)
    jobs = []
    original = jit_span_gemm.share_job
    monkeypatch.setattr(jit_span_gemm, "share_job", lambda *a: jobs.append(a) or original(*a))
    with threads.own_threads(2, spin=True):
        [y] = call(arrays)
    assert jobs, "the span job did not run"
    assert y is out[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


def test_one_image_keeps_the_per_image_tiles() -> None:
    x = np.zeros((1, 16, 49), np.float32)
    job = own_gemm.tile_share_job(np.zeros(30 * 16, np.float32), x, np.zeros(30 * 49, np.float32), 30 * 49,
                                  np.zeros(1, np.float32), -1, np.zeros(30, np.float32), own_gemm.NO_BOUNDS, 30, 1,
                                  (1, 1))  # fmt: skip
    assert job.address == jit_tile_gemm.job_address() != jit_span_gemm.job_address()
