"""The packed-weight GEMM with the Conv epilogue in registers (``jit_packed_gemm``) against numpy, and
the pointwise Conv bound to it (``kernels.packed``) against the BLAS call it replaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice, threads
from hetflow.devices.cpu.kernels import jit_packed_gemm, packed
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import array_infos
from hetflow.ops.conv import POINTWISE, ConvAttrs

RNG = np.random.default_rng(11)
POINTWISE_KERNEL: Kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == POINTWISE)

# (kernels, depth, positions): rows past whole tiles of 6, positions past whole vectors and tiles.
SHAPES = [(1, 1, 1), (7, 13, 101), (6, 64, 64), (13, 5, 130), (50, 300, 49), (16, 96, 300)]


def _gemm(w, x, bias, residual, low, high, items, block_bytes=jit_packed_gemm.BLOCK_BYTES, y=None):  # noqa: ANN001, ANN202
    """``gemm_items`` on numpy arrays: X ``[N, K, P]``; Y ``[N, M, P]`` (a fresh NaN-filled one unless given)."""
    batch, depth, positions = x.shape
    kernels = w.shape[0]
    if y is None:
        y = np.full((batch, kernels, positions), np.nan, np.float32)
    flat_y, y_image = flat_images(y)
    flat_r, r_image = (flat_y, -1) if residual is None else flat_images(residual)
    jit_packed_gemm.gemm_items(
        jit_packed_gemm.pack_weights(w).reshape(-1), x, flat_y, y_image, flat_r, r_image, bias,
        np.float32(low), np.float32(high), kernels, positions, np.asarray(items, np.int64).reshape(-1, 3),
        block_bytes,
    )  # fmt: skip
    return y


@pytest.mark.parametrize(("kernels", "depth", "positions"), SHAPES)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize(
    ("low", "high"), [(-math.inf, math.inf), (0.0, math.inf), (0.0, 6.0)], ids=["none", "relu", "relu6"]
)
def test_gemm_matches_numpy(
    kernels: int, depth: int, positions: int, residual: bool, low: float, high: float
) -> None:
    w = RNG.standard_normal((kernels, depth)).astype(np.float32)
    x = RNG.standard_normal((2, depth, positions)).astype(np.float32)
    bias = RNG.standard_normal(kernels).astype(np.float32)
    r = RNG.standard_normal((2, kernels, positions)).astype(np.float32) if residual else None
    y = _gemm(w, x, bias, r, low, high, [(0, 0, positions), (1, 0, positions)])
    want = np.matmul(w, x) + bias[:, None] + (0 if r is None else r)
    np.testing.assert_allclose(y, np.clip(want, low, high), rtol=1e-5, atol=1e-4)


def test_gemm_writes_only_the_columns_and_images_it_is_given() -> None:
    w = RNG.standard_normal((9, 20)).astype(np.float32)
    x = RNG.standard_normal((3, 20, 200)).astype(np.float32)
    bias = np.zeros(9, np.float32)
    y = _gemm(w, x, bias, None, -math.inf, math.inf, [(1, 64, 150)])
    np.testing.assert_allclose(y[1, :, 64:150], w @ x[1, :, 64:150], rtol=1e-5, atol=1e-4)
    assert np.isnan(y[1, :, :64]).all() and np.isnan(y[1, :, 150:]).all()
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all()


@pytest.mark.parametrize("block_bytes", [1, 64 * 20 * 4, 1 << 20], ids=["one-tile", "exact", "whole"])
def test_gemm_result_does_not_depend_on_the_column_block(block_bytes: int) -> None:
    w = RNG.standard_normal((20, 20)).astype(np.float32)
    x = RNG.standard_normal((1, 20, 333)).astype(np.float32)
    bias = RNG.standard_normal(20).astype(np.float32)
    y = _gemm(w, x, bias, None, 0.0, math.inf, [(0, 0, 333)], block_bytes)
    np.testing.assert_allclose(y[0], np.maximum(w @ x[0] + bias[:, None], 0), rtol=1e-5, atol=1e-4)


def test_gemm_writes_into_images_that_lie_apart() -> None:
    """Y as one image-strided slice of a Concat's output: the other channels are never written."""
    w = RNG.standard_normal((5, 8)).astype(np.float32)
    x = RNG.standard_normal((2, 8, 70)).astype(np.float32)
    concat = np.full((2, 12, 70), np.nan, np.float32)
    y = concat[:, 4:9]
    _gemm(w, x, np.zeros(5, np.float32), None, -math.inf, math.inf, [(0, 0, 70), (1, 0, 70)], y=y)
    np.testing.assert_allclose(y, np.matmul(w, x), rtol=1e-5, atol=1e-4)
    assert np.isnan(concat[:, :4]).all() and np.isnan(concat[:, 9:]).all()


def test_packed_weights_hold_each_row_blocks_weights_together() -> None:
    w = RNG.standard_normal((13, 7)).astype(np.float32)
    target = np.full(jit_packed_gemm.packed_shape(13, 7), np.nan, np.float32)
    jit_packed_gemm.pack_into(w, target)
    padded = np.zeros((18, 7), np.float32)  # three blocks of six rows, rows 13..17 zero
    padded[:13] = w
    np.testing.assert_array_equal(target, padded.reshape(3, 6, 7).transpose(0, 2, 1))
    np.testing.assert_array_equal(jit_packed_gemm.pack_weights(w), target)


@pytest.mark.parametrize(
    ("batch", "positions", "parts"),
    [(16, 3136, 2), (3, 100, 2), (1, 3136, 2), (1, 49, 4), (2, 12544, 8), (5, 7, 3)],
)
def test_work_items_cover_every_column_once(batch: int, positions: int, parts: int) -> None:
    shares = packed.work_items(batch, positions, parts)
    assert 1 <= len(shares) <= max(parts, batch)
    covered = np.zeros((batch, positions), np.int64)
    for share in shares:
        for image, first, last in share:
            assert first % jit_packed_gemm.TILE_POSITIONS == 0 and first < last
            covered[image, first:last] += 1
    assert (covered == 1).all()


# -- the pointwise Conv bound to it --------------------------------------------------------------------
RELU = FusedActivation("Relu")
CLIP = FusedActivation("Clip", 0.0, 6.0)
LEAKY = FusedActivation("LeakyRelu", 0.1)


def _pointwise_case(
    fused: FusedActivation | None, bias: bool, residual: bool, group: int = 1, dtype=np.float32
):  # noqa: ANN001, ANN202
    x = RNG.standard_normal((3, 8, 9, 11)).astype(dtype)
    w = RNG.standard_normal((14, 8 // group, 1, 1)).astype(dtype)
    b = RNG.standard_normal(14).astype(dtype) if bias else None
    r = RNG.standard_normal((3, 14, 9, 11)).astype(dtype) if residual else None
    node = Node("Conv", "conv", ["x", "w", "b" if bias else "", *(["r"] if residual else [])], ["y"],
                ConvAttrs(group=group, fused=fused, residual=residual))  # fmt: skip
    return node, [x, w, b, *([r] if residual else [])]


def _bound_call(node: Node, arrays: list):  # noqa: ANN202
    """The bound call into a dirty output buffer and workspace, with that buffer."""
    infos = array_infos(arrays)
    out = [np.full((3, 14, 9, 11), np.nan, arrays[0].dtype)]
    nbytes = POINTWISE_KERNEL.workspace(node, infos)
    workspace = np.full(nbytes, 0xFF, np.uint8) if nbytes else None
    return POINTWISE_KERNEL.bind(node, infos, out, workspace), out[0]


@pytest.mark.parametrize("fused", [None, RELU, CLIP, LEAKY], ids=["plain", "relu", "clip", "leaky"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
def test_bound_pointwise_on_own_threads_matches_blas(fused, bias: bool, residual: bool, monkeypatch) -> None:  # noqa: ANN001
    node, arrays = _pointwise_case(fused, bias, residual)
    expected = POINTWISE_KERNEL.fn(node, arrays)[0]
    call, target = _bound_call(node, arrays)
    calls = []
    original = jit_packed_gemm.gemm_items
    monkeypatch.setattr(jit_packed_gemm, "gemm_items", lambda *a: calls.append(a) or original(*a))
    with threads.own_threads(2):
        for _ in range(2):
            [y] = call(arrays)
            assert y is target
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    assert len(calls) == 4  # two shares a call: the packed GEMM ran, on both threads


@pytest.mark.parametrize(("group", "dtype"), [(2, np.float32), (1, np.float64)], ids=["grouped", "float64"])
def test_pointwise_the_packed_gemm_does_not_take_stays_on_blas(group: int, dtype: type) -> None:
    node, arrays = _pointwise_case(RELU, True, False, group, dtype)
    assert POINTWISE_KERNEL.prepare(node, array_infos(arrays), None, None) is None
    assert packed.workspace_bytes(node, (3, 8, 9, 11), (14, 8 // group, 1, 1), np.dtype(dtype)) == 0


def test_bound_pointwise_beside_blas_threads_calls_blas(monkeypatch) -> None:  # noqa: ANN001
    """One example beside BLAS's threads keeps OpenBLAS's product (which splits over both cores)."""
    node, arrays = _pointwise_case(RELU, True, True)
    call, _ = _bound_call(node, arrays)
    monkeypatch.setattr(jit_packed_gemm, "gemm_items", lambda *a: pytest.fail("the packed GEMM ran"))
    with threads.blas_threads(2):
        assert not packed.runs_packed()
        [y] = call(arrays)
    np.testing.assert_allclose(y, POINTWISE_KERNEL.fn(node, arrays)[0], rtol=1e-5, atol=1e-4)


def test_runs_packed_follows_the_thread_arrangement() -> None:
    with threads.blas_threads(1):
        assert packed.runs_packed()  # one thread in all: nothing to split
    with threads.own_threads(2):
        assert packed.runs_packed()
    with threads.own_threads(2, spin=True):
        assert not packed.runs_packed()  # spinning runs split their products in jit_gemm


def test_bound_pointwise_rejects_a_residual_of_another_shape() -> None:
    """A residual that does not have Y's shape goes to the shared epilogue (which broadcasts it)."""
    node, arrays = _pointwise_case(None, True, True)
    arrays[3] = RNG.standard_normal((1, 14, 1, 1)).astype(np.float32)
    call, _ = _bound_call(node, arrays)
    with threads.own_threads(2):
        [y] = call(arrays)
    x, w, b, r = arrays
    want = np.einsum("kc,nchw->nkhw", w[:, :, 0, 0], x) + b[None, :, None, None] + r
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


def test_a_deep_layer_over_a_wide_map_stays_on_blas() -> None:
    """Past MAX_DEPTH input channels OpenBLAS keeps the layer, unless the map is at most one tile wide."""
    node = Node("Conv", "conv", ["x", "w", ""], ["y"], ConvAttrs(fused=RELU))
    deep = packed.MAX_DEPTH + 1
    wide = [np.zeros((2, deep, 14, 14), np.float32), np.zeros((8, deep, 1, 1), np.float32), None]
    narrow = [np.zeros((2, deep, 7, 7), np.float32), np.zeros((8, deep, 1, 1), np.float32), None]
    assert POINTWISE_KERNEL.prepare(node, array_infos(wide), None, None) is None
    assert POINTWISE_KERNEL.workspace(node, array_infos(wide)) == 0
    assert POINTWISE_KERNEL.prepare(node, array_infos(narrow), None, None) is not None
