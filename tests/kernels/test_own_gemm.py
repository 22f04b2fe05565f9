"""The tile GEMM with the Conv epilogue in registers (``jit_tile_gemm``) against numpy, and the pointwise
Conv bound to it (``kernels.own_gemm``) against the BLAS call it replaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice, threads
from hetflow.devices.cpu.kernels import jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import array_infos
from hetflow.ops.conv import POINTWISE, ConvAttrs

RNG = np.random.default_rng(11)
POINTWISE_KERNEL: Kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == POINTWISE)

# (kernels, depth, positions): rows past whole tiles of 6, positions past whole vectors and tiles.
SHAPES = [(1, 1, 1), (7, 13, 101), (6, 64, 64), (13, 5, 130), (50, 300, 49), (16, 96, 300)]


def _gemm(w, x, bias, residual, low, high, items, block_bytes=jit_tile_gemm.BLOCK_BYTES, y=None):  # noqa: ANN001, ANN202
    """``gemm_items`` on numpy arrays: X ``[N, K, P]``; Y ``[N, M, P]`` (a fresh NaN-filled one unless given)."""
    batch, depth, positions = x.shape
    kernels = w.shape[0]
    if y is None:
        y = np.full((batch, kernels, positions), np.nan, np.float32)
    flat_y, y_image = flat_images(y)
    flat_r, r_image = (flat_y, -1) if residual is None else flat_images(residual)
    jit_tile_gemm.gemm_items(
        w.reshape(-1), x, flat_y, y_image, flat_r, r_image, bias,
        np.float32(low), np.float32(high), kernels, positions, 1, np.asarray(items, np.int64).reshape(-1, 3),
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


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_a_product_deeper_than_a_chunk_adds_bias_and_residual_once_and_clamps_at_the_end(residual: bool) -> None:
    depth = 2 * jit_tile_gemm.DEPTH_CHUNK + 301  # three chunks
    assert jit_tile_gemm.chunk_depth(depth) < depth
    w = RNG.standard_normal((13, depth)).astype(np.float32)
    x = RNG.standard_normal((1, depth, 70)).astype(np.float32)
    bias = RNG.standard_normal(13).astype(np.float32) * 10
    r = RNG.standard_normal((1, 13, 70)).astype(np.float32) * 10 if residual else None
    y = _gemm(w, x, bias, r, -20.0, 20.0, [(0, 0, 70)])
    want = np.matmul(w.astype(np.float64), x[0]) + bias[:, None] + (0 if r is None else r[0])
    assert (np.abs(want) > 20).any() and (np.abs(want) < 20).any()  # the clamp bites, after all the chunks
    np.testing.assert_allclose(y[0], np.clip(want, -20, 20), rtol=1e-4, atol=2e-3)


def test_gemm_writes_into_images_that_lie_apart() -> None:
    """Y as one image-strided slice of a Concat's output: the other channels are never written."""
    w = RNG.standard_normal((5, 8)).astype(np.float32)
    x = RNG.standard_normal((2, 8, 70)).astype(np.float32)
    concat = np.full((2, 12, 70), np.nan, np.float32)
    y = concat[:, 4:9]
    _gemm(w, x, np.zeros(5, np.float32), None, -math.inf, math.inf, [(0, 0, 70), (1, 0, 70)], y=y)
    np.testing.assert_allclose(y, np.matmul(w, x), rtol=1e-5, atol=1e-4)
    assert np.isnan(concat[:, :4]).all() and np.isnan(concat[:, 9:]).all()


def _share(w, x, bias, residual, low, high, shares, row_parts, groups=1):  # noqa: ANN001, ANN202
    """Every share of ``gemm_share`` in turn, into a NaN-filled Y (W ``[kernels, depth / groups]``)."""
    batch, _, positions = x.shape
    kernels = w.shape[0]
    y = np.full((batch, kernels, positions), np.nan, np.float32)
    flat_y, y_image = flat_images(y)
    flat_r, r_image = (flat_y, -1) if residual is None else flat_images(residual)
    for share in range(shares):
        jit_tile_gemm.gemm_share(w.reshape(-1), x, flat_y, y_image, flat_r, r_image, bias, np.float32(low),
                                 np.float32(high), kernels, positions, groups, share, shares, row_parts,
                                 jit_tile_gemm.BLOCK_BYTES)  # fmt: skip
    return y


@pytest.mark.parametrize(
    ("batch", "kernels", "depth", "positions"), [(1, 64, 16, 3136), (2, 13, 37, 100), (3, 7, 16, 49), (1, 200, 24, 49)]
)
@pytest.mark.parametrize(("shares", "row_parts"), [(1, 1), (2, 1), (4, 4), (6, 3), (5, 5)])
def test_shares_cover_every_output_once(batch, kernels, depth, positions, shares, row_parts) -> None:  # noqa: ANN001
    """Runs of column tiles by ranges of row blocks: every element of Y written, each with the whole sum."""
    w = RNG.standard_normal((kernels, depth)).astype(np.float32)
    x = RNG.standard_normal((batch, depth, positions)).astype(np.float32)
    bias = RNG.standard_normal(kernels).astype(np.float32)
    r = RNG.standard_normal((batch, kernels, positions)).astype(np.float32)
    y = _share(w, x, bias, r, 0.0, math.inf, shares, row_parts)
    np.testing.assert_allclose(y, np.maximum(np.matmul(w, x) + bias[:, None] + r, 0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("batch", "kernels", "positions", "expected"),
    [(1, 256, 3136, (4, 1)), (1, 2048, 49, (4, 4)), (1, 1024, 196, (4, 4)), (1, 512, 784, (4, 1)),
     (1, 8, 49, (1, 1)), (16, 2048, 49, (4, 4)), (16, 256, 49, (4, 1))],
)  # fmt: skip
def test_spin_shares_split_the_larger_operand(batch, kernels, positions, expected) -> None:  # noqa: ANN001
    """Columns where the images' tiles are enough and X outweighs W, else row blocks (a 7x7 map's
    single tile, 14x14's four under 1024 kernels), on 2 threads."""
    assert own_gemm.spin_shares(batch, kernels, positions, 1, 2) == expected


@pytest.mark.parametrize(("shares", "row_parts"), [(1, 1), (4, 1), (4, 4)])
def test_grouped_shares_multiply_each_group_apart(shares: int, row_parts: int) -> None:
    """Group g: W's and Y's g-th kernels against X's g-th channels (a grouped 1x1 Conv)."""
    groups, kernels, depth, positions = 3, 15, 12, 100
    w = RNG.standard_normal((kernels, depth // groups)).astype(np.float32)
    x = RNG.standard_normal((2, depth, positions)).astype(np.float32)
    bias = RNG.standard_normal(kernels).astype(np.float32)
    y = _share(w, x, bias, None, -math.inf, math.inf, shares, row_parts, groups)
    blocks = np.matmul(w.reshape(groups, 5, 4), x.reshape(2, groups, 4, positions)).reshape(2, kernels, positions)
    np.testing.assert_allclose(y, blocks + bias[:, None], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("batch", "positions", "parts"),
    [(16, 3136, 2), (3, 100, 2), (1, 3136, 2), (1, 49, 4), (2, 12544, 8), (5, 7, 3)],
)
def test_work_items_cover_every_column_once(batch: int, positions: int, parts: int) -> None:
    shares = own_gemm.work_items(batch, positions, parts)
    assert 1 <= len(shares) <= max(parts, batch)
    covered = np.zeros((batch, positions), np.int64)
    for share in shares:
        for image, first, last in share:
            assert first % jit_tile_gemm.TILE_POSITIONS == 0 and first < last
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
    original = jit_tile_gemm.gemm_items
    monkeypatch.setattr(jit_tile_gemm, "gemm_items", lambda *a: calls.append(a) or original(*a))
    with threads.own_threads(2):
        for _ in range(2):
            [y] = call(arrays)
            assert y is target
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    assert len(calls) == 4  # two shares a call: the tile GEMM ran, on both threads


def test_bound_pointwise_on_spinning_threads_matches_blas(monkeypatch) -> None:  # noqa: ANN001
    node, arrays = _pointwise_case(CLIP, True, True)
    expected = POINTWISE_KERNEL.fn(node, arrays)[0]
    call, target = _bound_call(node, arrays)
    monkeypatch.setattr(jit_tile_gemm, "gemm_items", lambda *a: pytest.fail("the Python pool's split ran"))
    with threads.own_threads(2, spin=True):
        [y] = call(arrays)
    assert y is target
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


def test_pointwise_the_tile_gemm_does_not_take_stays_on_blas() -> None:
    node, arrays = _pointwise_case(RELU, True, False, 1, np.float64)
    assert POINTWISE_KERNEL.prepare(node, array_infos(arrays), None, None) is None


@pytest.mark.parametrize("spin", [False, True], ids=["own-threads", "spinning"])
def test_bound_grouped_pointwise_matches_blas(spin: bool) -> None:
    node, arrays = _pointwise_case(RELU, True, True, group=2)
    expected = POINTWISE_KERNEL.fn(node, arrays)[0]
    call, target = _bound_call(node, arrays)
    with threads.own_threads(2, spin=spin):
        [y] = call(arrays)
    assert y is target
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


def test_bound_pointwise_beside_blas_threads_calls_blas(monkeypatch) -> None:  # noqa: ANN001
    """One example beside BLAS's threads keeps OpenBLAS's product (which splits over both cores)."""
    node, arrays = _pointwise_case(RELU, True, True)
    call, _ = _bound_call(node, arrays)
    monkeypatch.setattr(jit_tile_gemm, "gemm_items", lambda *a: pytest.fail("the tile GEMM ran"))
    with threads.blas_threads(2):
        assert not own_gemm.runs_own()
        [y] = call(arrays)
    np.testing.assert_allclose(y, POINTWISE_KERNEL.fn(node, arrays)[0], rtol=1e-5, atol=1e-4)


def test_runs_own_follows_the_thread_arrangement() -> None:
    with threads.blas_threads(1):
        assert own_gemm.runs_own()  # one thread in all: nothing to split
    with threads.own_threads(2):
        assert own_gemm.runs_own()
    with threads.own_threads(2, spin=True):
        assert own_gemm.runs_own()  # shares on the spinning pool
    with threads.blas_threads(2):
        assert not own_gemm.runs_own()


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


def test_a_float32_layer_takes_the_tiles_at_any_batch_and_depth_and_others_stay_on_blas() -> None:
    node = Node("Conv", "conv", ["x", "w", ""], ["y"], ConvAttrs(fused=RELU))
    deep = own_gemm.MAX_DEPTH + 1
    weights = np.zeros((8, deep, 1, 1), np.float32)
    for x in (np.zeros((2, deep, 14, 14), np.float32), np.zeros((1, deep, 14, 14), np.float32)):
        assert POINTWISE_KERNEL.prepare(node, array_infos([x, weights, None]), None, None) is not None
    float64 = [np.zeros((2, 8, 14, 14)), np.zeros((8, 8, 1, 1)), None]
    assert POINTWISE_KERNEL.prepare(node, array_infos(float64), None, None) is None


# -- products of im2col and Winograd in a batch's run --------------------------------------------------
@pytest.mark.parametrize(("batch", "depth", "positions", "groups"), [(3, 27, 100, 1), (1, 36 * 5, 196, 36)])
def test_a_batch_product_runs_on_the_tiles_on_own_threads_only(batch, depth, positions, groups):
    kernels = 8 * groups
    w = RNG.standard_normal((kernels, depth // groups)).astype(np.float32)
    x = RNG.standard_normal((batch, depth, positions)).astype(np.float32)
    y = np.full((batch, kernels, positions), np.nan, np.float32)
    with threads.own_threads(2):
        assert own_gemm.product_on_own_threads(w, x, y, groups=groups)
    grouped_w = w.reshape(groups, kernels // groups, depth // groups)
    grouped_x = x.reshape(batch, groups, depth // groups, positions)
    want = np.matmul(grouped_w, grouped_x).reshape(batch, kernels, positions)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    with threads.blas_threads(2):  # beside BLAS's threads the caller runs BLAS
        assert not own_gemm.product_on_own_threads(w, x, y, groups=groups)
    with threads.own_threads(2):  # float64, or a Y whose images are not contiguous, is BLAS's too
        assert not own_gemm.product_on_own_threads(w.astype(np.float64), x, y, groups=groups)
        assert not own_gemm.product_on_own_threads(w, x, np.zeros((batch, 2 * kernels, positions), np.float32)[:, ::2],
                                                   groups=groups)  # fmt: skip
    concat = np.full((batch, kernels + 5, positions), 7.0, np.float32)  # a Concat's slice: images apart
    with threads.own_threads(2):
        assert own_gemm.product_on_own_threads(w, x, concat[:, 2 : 2 + kernels], groups=groups)
    np.testing.assert_allclose(concat[:, 2 : 2 + kernels], want, rtol=1e-5, atol=1e-4)
    assert (concat[:, :2] == 7).all() and (concat[:, 2 + kernels :] == 7).all()


def test_a_product_too_narrow_to_share_by_columns_is_shared_by_rows(monkeypatch) -> None:
    # One image of 100 columns (one column part) but many multiply-adds: both threads take rows of W.
    w = RNG.standard_normal((96, 2000)).astype(np.float32)
    x = RNG.standard_normal((1, 2000, 100)).astype(np.float32)
    y = np.full((1, 96, 100), np.nan, np.float32)
    shares = []
    share = jit_tile_gemm.gemm_share
    monkeypatch.setattr(jit_tile_gemm, "gemm_share", lambda *a: shares.append(a[12:15]) or share(*a))
    monkeypatch.setattr(own_gemm, "ROW_SPLIT_MIN_MACS", 96 * 2000 * 100)
    with threads.own_threads(2):
        assert own_gemm.product_on_own_threads(w, x, y)
    assert sorted(shares) == [(0, 2, 2), (1, 2, 2)]
    np.testing.assert_allclose(y[0], w @ x[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("side", [13, 31], ids=["a chunk's one product", "a product per image"])
@pytest.mark.parametrize(("channels", "kernels", "group"), [(5, 7, 1), (6, 8, 2)], ids=["plain", "grouped"])
def test_im2col_in_a_batch_multiplies_its_columns_on_the_tiles(monkeypatch, side, channels, kernels, group):
    from hetflow.devices.cpu.kernels import conv

    attrs = ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2), group=group)
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    x = RNG.standard_normal((4, channels, side, side - 2)).astype(np.float32)
    w = RNG.standard_normal((kernels, channels // group, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(kernels).astype(np.float32)
    kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == "im2col")
    want = kernel.fn(node, [x, w, b])[0]
    monkeypatch.setattr(conv, "split_matmul", lambda *args, **kwargs: pytest.fail("BLAS ran the product"))
    with threads.own_threads(2):
        [y] = kernel.fn(node, [x, w, b])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("channels", "kernels", "side", "kernel_size"),
    [(128, 64, 32, 3), (4, 6, 40, 7)],  # W past BAND_MAX_WEIGHT_BYTES: a product per image; else bands
    ids=["per image", "bands"],
)
def test_im2col_in_a_batch_writes_a_concat_slice_on_the_tiles(monkeypatch, channels, kernels, side, kernel_size):
    """Inception's stride-2 layers feed a Concat: Y is a slice whose images lie apart, still the tiles'."""
    from hetflow.devices.cpu.kernels import conv

    pad = kernel_size // 2
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], ConvAttrs(pads=(pad,) * 4, strides=(2, 2), fused=RELU))
    x = RNG.standard_normal((2, channels, side, side - 2)).astype(np.float32)
    w = RNG.standard_normal((kernels, channels, kernel_size, kernel_size)).astype(np.float32)
    b = RNG.standard_normal(kernels).astype(np.float32)
    kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == "im2col")
    want = kernel.fn(node, [x, w, b])[0]
    concat = np.full((2, kernels + 3, *want.shape[2:]), 7.0, np.float32)
    monkeypatch.setattr(conv, "split_matmul", lambda *args, **kwargs: pytest.fail("BLAS ran the product"))
    with threads.own_threads(2):
        [y] = kernel.fn(node, [x, w, b], [concat[:, 1 : 1 + kernels]])
    assert np.shares_memory(y, concat)
    np.testing.assert_allclose(concat[:, 1 : 1 + kernels], want, rtol=1e-4, atol=1e-3)
    assert (concat[:, 0] == 7).all() and (concat[:, 1 + kernels :] == 7).all()


@pytest.mark.parametrize("fused", [None, RELU, FusedActivation("Sigmoid")], ids=["none", "relu", "sigmoid"])
def test_a_batchs_im2col_runs_in_bands_with_its_bias_and_activation_in_the_tiles(monkeypatch, fused):

    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], ConvAttrs(pads=(3, 3, 3, 3), strides=(2, 2), fused=fused))
    x = RNG.standard_normal((3, 3, 40, 36)).astype(np.float32)  # a 7x7 stride-2 first layer, in small
    w = RNG.standard_normal((10, 3, 7, 7)).astype(np.float32)
    b = RNG.standard_normal(10).astype(np.float32)
    kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == "im2col")
    want = kernel.fn(node, [x, w, b])[0]
    calls = []
    real = own_gemm.bands_on_own_threads
    monkeypatch.setattr(own_gemm, "bands_on_own_threads", lambda *args: calls.append(args) or real(*args))
    with threads.own_threads(2):
        [y] = kernel.fn(node, [x, w, b])
    assert len(calls) == 1 and calls[0][5] is not None  # the bias went into the tiles
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


def test_a_spinning_run_multiplies_a_grouped_product_on_its_pool_and_leaves_an_ungrouped_one_to_blas(monkeypatch):
    """AlexNet's grouped layers at a batch: one tile-GEMM job on the spinning pool (BLAS is held at one
    thread there, and its stacked calls per image and group were slow); an ungrouped product stays BLAS's."""
    from tests.helpers import record_spin_jobs

    batch, kernels, depth, positions, groups = 3, 16, 24, 50, 2
    w = RNG.standard_normal((kernels, depth // groups)).astype(np.float32)
    x = RNG.standard_normal((batch, depth, positions)).astype(np.float32)
    concat = np.full((batch, kernels + 3, positions), 7.0, np.float32)  # Y a Concat's slice: images apart
    jobs = record_spin_jobs(monkeypatch, min_outputs=None)
    with threads.own_threads(2, spin=True, hold_blas=True):
        assert own_gemm.product_on_own_threads(w, x, concat[:, 1 : 1 + kernels], groups=groups)
        assert not own_gemm.product_on_own_threads(w[:, :12], x[:, :12], np.empty((batch, kernels, positions), np.float32))
    grouped = np.matmul(w.reshape(groups, kernels // groups, depth // groups), x.reshape(batch, groups, depth // groups, positions))
    np.testing.assert_allclose(concat[:, 1 : 1 + kernels], grouped.reshape(batch, kernels, positions), rtol=1e-5, atol=1e-4)
    assert (concat[:, 0] == 7).all() and (concat[:, 1 + kernels :] == 7).all()
    assert [job for job, _ in jobs] == [jit_tile_gemm.job_address()]
