"""One image's im2col Conv in bands of output rows on the tile GEMM (``jit_band_gemm``), and the im2col
and auto Conv kernels bound to it on spinning threads (``own_gemm.prepare_bands``), against a float64
direct sum and the plain kernels."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice, threads
from hetflow.devices.cpu.kernels import jit_band_gemm, jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.jit_im2col import _fill_address
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo, array_infos
from hetflow.ops.conv import AUTO, IM2COL, ConvAttrs
from tests.helpers import record_spin_jobs
from tests.kernels.test_conv_algorithms import _direct_conv

RNG = np.random.default_rng(23)
KERNELS: dict[str, Kernel] = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}
RELU = FusedActivation("Relu")
CLIP = FusedActivation("Clip", 0.0, 6.0)

# (X shape, W shape, attrs): kernels past whole row blocks of 6, rows past whole vectors, strides,
# dilations, asymmetric pads, a 7x7 stride-2 first layer.
CASES = [
    ((1, 3, 32, 32), (32, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2))),
    ((1, 5, 17, 19), (13, 5, 3, 3), ConvAttrs(pads=(1, 0, 2, 1))),
    ((1, 4, 23, 21), (7, 4, 5, 3), ConvAttrs(pads=(2, 1, 2, 1), strides=(2, 3), dilations=(1, 2))),
    ((1, 3, 64, 64), (20, 3, 7, 7), ConvAttrs(pads=(3, 3, 3, 3), strides=(2, 2))),
]


def _arrays(x_shape, w_shape):  # noqa: ANN001, ANN202
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    return x, w, b


def _expected(x, w, b, attrs, low=-np.inf, high=np.inf):  # noqa: ANN001, ANN202
    return np.clip(_direct_conv(x, w, b, attrs), low, high)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CASES)
@pytest.mark.parametrize("bands", [1, 2, 5, 1000])
def test_bands_match_a_direct_sum(x_shape, w_shape, attrs, bands) -> None:  # noqa: ANN001
    """Every band count (1000: past one a row, clipped to the rows) gives the whole Conv, clamped."""
    from hetflow.ops.conv import conv_window
    from hetflow.ops.spatial import geometry

    x, w, b = _arrays(x_shape, w_shape)
    rows, cols = geometry(conv_window(attrs, w_shape), x_shape[2:]).axes
    kernels, depth = w_shape[0], w_shape[1] * rows.kernel * cols.kernel
    y = np.full(kernels * rows.out * cols.out, np.nan, np.float32)
    columns = np.full(depth * rows.out * cols.out, np.nan, np.float32)
    bands = min(bands, rows.out)
    for band in range(bands):
        jit_band_gemm.band(x, w.reshape(-1), b, np.float32(0.0), np.float32(6.0), y, 0, columns, kernels,
                           rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation,
                           rows.pad_begin, cols.pad_begin, rows.out, cols.out, rows.out * band // bands,
                           rows.out * (band + 1) // bands, jit_tile_gemm.BLOCK_BYTES)  # fmt: skip
    want = _expected(x, w, b, attrs, 0.0, 6.0)
    np.testing.assert_allclose(y.reshape(want.shape), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("band_rows", [1, 3, 100])
def test_rows_in_bands_reusing_one_stretch_match_a_direct_sum(band_rows) -> None:  # noqa: ANN001
    """A share's rows taken ``band_rows`` at a time, every band's columns in the same stretch, the stretch
    only as long as one band needs: nothing is written past it."""
    from hetflow.ops.conv import conv_window
    from hetflow.ops.spatial import geometry

    x_shape, w_shape, attrs = CASES[2]
    x, w, b = _arrays(x_shape, w_shape)
    rows, cols = geometry(conv_window(attrs, w_shape), x_shape[2:]).axes
    kernels, depth = w_shape[0], w_shape[1] * rows.kernel * cols.kernel
    y = np.full(kernels * rows.out * cols.out, np.nan, np.float32)
    stretch = depth * min(band_rows, rows.out) * cols.out
    columns = np.full(stretch + 16, -7.0, np.float32)
    jit_band_gemm.rows(x, w.reshape(-1), b, np.float32(-np.inf), np.float32(np.inf), y, 0, columns[:stretch],
                       kernels, rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation,
                       rows.pad_begin, cols.pad_begin, rows.out, cols.out, 0, rows.out, band_rows,
                       jit_tile_gemm.BLOCK_BYTES)  # fmt: skip
    want = _expected(x, w, b, attrs)
    np.testing.assert_allclose(y.reshape(want.shape), want, rtol=1e-5, atol=1e-4)
    assert (columns[stretch:] == -7.0).all()


def _bind(kernel: Kernel, node: Node, arrays: list):  # noqa: ANN202
    """The kernel bound into a dirty output buffer and workspace, with that buffer."""
    infos = array_infos(arrays)
    out = [np.full(kernel.fn(node, arrays)[0].shape, np.nan, np.float32)]
    nbytes = kernel.workspace(node, infos)
    workspace = np.full(nbytes, 0xFF, np.uint8) if nbytes else None
    return kernel.bind(node, infos, out, workspace), out[0]


#: A strided layer on 5 channels: one the automatic choice leaves to im2col (on up to 4 channels, the
#: image stems, it takes the direct kernel on phase planes).
FIVE_CHANNELS = ((1, 5, 32, 32), (32, 5, 3, 3), CASES[0][2])


@pytest.mark.parametrize(("algorithm", "case"), [(IM2COL, CASES[0]), (IM2COL, FIVE_CHANNELS), (AUTO, FIVE_CHANNELS)],
                         ids=["im2col", "im2col-5", "auto-5"])  # fmt: skip
@pytest.mark.parametrize("fused", [None, RELU, CLIP], ids=["none", "relu", "clip"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_bound_on_spinning_threads_runs_the_bands(monkeypatch, algorithm, case, fused, bias) -> None:  # noqa: ANN001
    x_shape, w_shape, attrs = case
    x, w, b = _arrays(x_shape, w_shape)
    arrays = [x, w, b if bias else None]
    node = Node("Conv", "conv", ["x", "w", "b" if bias else ""], ["y"], ConvAttrs(**{**attrs.__dict__, "fused": fused}))
    kernel = KERNELS[algorithm]
    expected = kernel.fn(node, arrays)[0]
    call, target = _bind(kernel, node, arrays)
    jobs = record_spin_jobs(monkeypatch, min_outputs=None)
    with threads.own_threads(2, spin=True):
        for _ in range(2):  # the second call reuses the buffers the first wrote
            [y] = call(arrays)
            assert y is target
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    depth = w_shape[1] * w_shape[2] * w_shape[3]
    assert [chunks for _, chunks in jobs] == [own_gemm.band_plan(depth, 16, 16, 2)[0]] * 2


DECLINED = [
    ("two images", (2, 3, 16, 16), (8, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32),
    ("groups", (1, 4, 16, 16), (8, 2, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2), np.float32),
    ("sigmoid", (1, 3, 16, 16), (8, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), fused=FusedActivation("Sigmoid")),
     np.float32),
    ("float64", (1, 3, 16, 16), (8, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float64),
    ("1-D", (1, 3, 16), (8, 3, 3), ConvAttrs(pads=(1, 1)), np.float32),
]  # fmt: skip


@pytest.mark.parametrize(("case", "x_shape", "w_shape", "attrs", "dtype"), DECLINED, ids=[c[0] for c in DECLINED])
def test_bands_decline_what_the_tiles_do_not_run(case, x_shape, w_shape, attrs, dtype) -> None:  # noqa: ANN001
    node = Node("Conv", "conv", ["x", "w"], ["y"], attrs)
    infos = [TensorInfo(x_shape, np.dtype(dtype)), TensorInfo(w_shape, np.dtype(dtype))]
    assert own_gemm.band_geometry(node, *infos) is None
    assert KERNELS[IM2COL].prepare(node, infos, None, None) is None


def test_a_shallow_conv_with_a_folded_residual_runs_as_whole_columns_not_bands(monkeypatch) -> None:  # noqa: ANN001
    attrs = ConvAttrs(strides=(2, 2), residual=True, fused=RELU)  # ResNet's 1x1 stride-2 projection, in small
    node = Node("Conv", "conv", ["x", "w", "b", "r"], ["y"], attrs)
    x, w, b = _arrays((1, 24, 13, 13), (40, 24, 1, 1))
    infos = [TensorInfo(x.shape, np.dtype(np.float32)), TensorInfo(w.shape, np.dtype(np.float32))]
    assert own_gemm.band_geometry(node, *infos) is None  # bands add no residual
    assert isinstance(KERNELS[IM2COL].prepare(node, infos, None, None), own_gemm._ColumnsCall)
    arrays = [x, w, b, RNG.standard_normal((1, 40, 7, 7)).astype(np.float32)]
    expected = KERNELS[IM2COL].fn(node, arrays)[0]
    call, target = _bind(KERNELS[IM2COL], node, arrays)
    jobs = record_spin_jobs(monkeypatch, min_outputs=None)
    with threads.own_threads(2, spin=True):
        [y] = call(arrays)
    assert y is target and [job for job, _ in jobs] == [jit_tile_gemm.job_address()]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


def test_auto_binds_the_bands_only_where_it_picks_im2col() -> None:
    pointwise = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs())
    infos = [TensorInfo((1, 16, 8, 8), np.dtype(np.float32)), TensorInfo((8, 16, 1, 1), np.dtype(np.float32))]
    assert KERNELS[AUTO].prepare(pointwise, infos, None, None) is None


@pytest.mark.parametrize(("depth", "out_h", "out_w", "threads", "plan"), [
    (27, 112, 112, 2, (4, 28)),  # 1.35 MB of columns: a share's 28 rows are one band
    (147, 112, 112, 2, (4, 7)),  # 7.4 MB: bands of at most BAND_BYTES, 4 a share
    (27, 3, 40, 2, (3, 1)),  # no more shares than output rows
    (27, 112, 112, 1, (2, 43)),  # one thread: two shares, each a band of 43 rows and one of 13
])  # fmt: skip
def test_band_plan(depth, out_h, out_w, threads, plan) -> None:  # noqa: ANN001
    assert own_gemm.band_plan(depth, out_h, out_w, threads) == plan


@pytest.mark.parametrize(("depth", "out_h", "out_w"), [(64, 55, 55), (27, 112, 112), (147, 112, 112), (16, 13, 13)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_band_plan_fits_one_images_columns_the_kernel_declares(depth, out_h, out_w, threads) -> None:  # noqa: ANN001
    columns = depth * out_h * out_w * 4  # the im2col kernel's workspace at one image
    shares, band_rows = own_gemm.band_plan(depth, out_h, out_w, threads, columns)
    assert shares * band_rows * depth * out_w * 4 <= columns
    assert (shares, band_rows) <= own_gemm.band_plan(depth, out_h, out_w, threads) and band_rows >= 1


# -- columns too deep for bands: built whole, then the tile GEMM ---------------------------------------
DEEP = [
    ((1, 32, 9, 11), (20, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), RELU),  # 288 column rows, one tile wide
    ((1, 40, 17, 15), (13, 40, 3, 3), ConvAttrs(pads=(1, 0, 1, 2), strides=(2, 2)), CLIP),
    ((1, 300, 10, 10), (70, 300, 1, 1), ConvAttrs(strides=(2, 2)), None),  # a strided 1x1 projection
    ((1, 30, 20, 20), (9, 30, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), FusedActivation("Sigmoid")),  # after the tiles
]


def _bound_im2col(x_shape, w_shape, attrs, fused, residual):  # noqa: ANN001, ANN202
    """An im2col Conv (with a folded residual, if asked) bound into a dirty Y: (node, arrays, the plain
    kernel's Y, the bound call, its Y)."""
    x, w, b = _arrays(x_shape, w_shape)
    node = Node("Conv", "conv", ["x", "w", "b", *(["r"] if residual else [])], ["y"],
                ConvAttrs(**{**attrs.__dict__, "fused": fused, "residual": residual}))  # fmt: skip
    y_shape = _direct_conv(x, w, b, attrs).shape
    arrays = [x, w, b, *([RNG.standard_normal(y_shape).astype(np.float32)] if residual else [])]
    expected = KERNELS[IM2COL].fn(node, arrays)[0]
    call, target = _bind(KERNELS[IM2COL], node, arrays)
    return node, arrays, expected, call, target


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "fused"), DEEP)
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
def test_deep_columns_on_spinning_threads_run_the_tile_gemm(monkeypatch, x_shape, w_shape, attrs, fused,
                                                            residual) -> None:  # noqa: ANN001
    node, arrays, expected, call, target = _bound_im2col(x_shape, w_shape, attrs, fused, residual)
    jobs = _spin_twice(monkeypatch, call, arrays, expected, target)
    # Each call: the columns (on the pool too where they split), then the product.
    products = [job for job, _ in jobs if job == jit_tile_gemm.job_address()]
    assert len(products) == 2 and {job for job, _ in jobs} <= {jit_tile_gemm.job_address(), _fill_address()}


def _spin_twice(monkeypatch, call, arrays, expected, target) -> list:  # noqa: ANN001
    """Two calls of a bound im2col on spinning threads, each checked against ``expected`` in ``target``
    (the second reuses the columns and Y the first wrote); the spin jobs they ran."""
    jobs = record_spin_jobs(monkeypatch, min_outputs=None)
    with threads.own_threads(2, spin=True):
        for _ in range(2):
            [y] = call(arrays)
            assert y is target
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    return jobs


@pytest.mark.parametrize(("case", "packer", "bounds"), [
    ((*CASES[1], RELU), jit_band_gemm, (0.0, np.inf)),
    (DEEP[1], jit_tile_gemm, (0.0, 6.0)),
], ids=["bands", "whole columns"])  # fmt: skip
def test_bound_off_a_spinning_run_calls_the_plain_kernel(monkeypatch, case, packer, bounds) -> None:  # noqa: ANN001
    """Bands and whole columns run only on a spinning run: elsewhere the bound call is im2col with BLAS."""
    x_shape, w_shape, attrs, fused = case
    x, w, b = _arrays(x_shape, w_shape)
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], ConvAttrs(**{**attrs.__dict__, "fused": fused}))
    call, target = _bind(KERNELS[IM2COL], node, [x, w, b])
    monkeypatch.setattr(packer, "pack_job", lambda *args: pytest.fail("the tile GEMM ran"))
    for context in (threads.own_threads(1), threads.own_threads(2), threads.blas_threads(2)):
        with context:
            [y] = call([x, w, b])
        assert y is target
        np.testing.assert_allclose(y, _expected(x, w, b, node.attrs, *bounds), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("case", "x_shape", "w_shape", "attrs", "dtype", "columns"), [
    ("shallow: bands", (1, 3, 16, 16), (8, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32, False),
    ("deep", (1, 32, 16, 16), (8, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32, True),
    ("two images", (2, 32, 16, 16), (8, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32, False),
    ("groups", (1, 64, 16, 16), (8, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2), np.float32, False),
    ("float64", (1, 32, 16, 16), (8, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float64, False),
    ("1-D", (1, 300, 16), (8, 300, 3), ConvAttrs(pads=(1, 1)), np.float32, False),
    ("ZFNet's second layer", (1, 96, 54, 54), (256, 96, 5, 5), ConvAttrs(pads=(2, 2, 2, 2), strides=(2, 2)),
     np.float32, True),  # 7 MB of columns
    ("columns past the cap", (1, 64, 112, 112), (64, 64, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32,
     False),  # 29 MB of columns
])  # fmt: skip
def test_which_convs_run_as_whole_columns(case, x_shape, w_shape, attrs, dtype, columns) -> None:  # noqa: ANN001
    node = Node("Conv", "conv", ["x", "w"], ["y"], attrs)
    infos = [TensorInfo(x_shape, np.dtype(dtype)), TensorInfo(w_shape, np.dtype(dtype))]
    assert (own_gemm.columns_geometry(node, *infos) is not None) is columns
    assert isinstance(KERNELS[IM2COL].prepare(node, infos, None, None), own_gemm._ColumnsCall) is columns


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "fused", "residual", "jobs"), [
    (*CASES[0], RELU, False, 1),  # bands: one job
    (*DEEP[0], False, 2),  # whole columns: the fill, then the product
    (*DEEP[2], True, 2),  # a strided 1x1 projection with its folded residual
])  # fmt: skip
def test_a_capture_replays_the_bound_call_as_its_jobs(x_shape, w_shape, attrs, fused, residual, jobs) -> None:  # noqa: ANN001
    """What a captured run replays: the same Y, in the planned buffer, with no Python between the jobs."""
    from hetflow.devices.cpu import spin_pool

    node, arrays, expected, call, target = _bound_im2col(x_shape, w_shape, attrs, fused, residual)
    with threads.own_threads(2, spin=True):
        outputs, captured = call.capture(arrays)
        assert outputs[0] is target and len(captured) == jobs
        target[...] = np.nan
        spin_pool.replay_on(spin_pool.JobScript(captured), threads.spinning())
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-4)


def test_no_capture_off_a_spinning_run() -> None:
    x, w, b = _arrays(*DEEP[0][:2])
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], DEEP[0][2])
    call, _ = _bind(KERNELS[IM2COL], node, [x, w, b])
    with threads.own_threads(2):
        assert call.capture([x, w, b]) is None


# -- a batch's columns, a chunk of images at a time, where BLAS is the narrower ----------------------------
BATCHES = [
    ((3, 24, 24, 24), (40, 24, 1, 1), ConvAttrs(strides=(2, 2)), RELU, True),  # ResNet's projection, in small
    # Weights past what a batch's bands take (276 KB; an image's columns 553 KB, past one band).
    ((2, 64, 30, 31), (120, 64, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), CLIP, False),
    ((2, 40, 24, 24), (70, 40, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), FusedActivation("Sigmoid"),
     True),  # an activation after the tiles
]  # fmt: skip


@pytest.fixture
def narrow_blas(monkeypatch):  # noqa: ANN001, ANN201
    """BLAS taken to be narrower than the tiles, as on a CPU with AVX-512 whose OpenBLAS has no such kernels."""
    from hetflow.devices.cpu.kernels import conv

    monkeypatch.setattr(conv, "blas_is_narrow", lambda: True)
    monkeypatch.setattr(conv, "IM2COL_CHUNK_BYTES", 1)  # one image a chunk: the chunks' offsets are tested


def _prepared_for_batch(node: Node, arrays: list, target: np.ndarray) -> bool:
    """Whether the im2col kernel prepares ``node`` (Y handed as ``target``) as chunks of a batch's columns."""
    return isinstance(KERNELS[IM2COL].prepare(node, array_infos(arrays), [target], None), own_gemm._BatchColumnsCall)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "fused", "residual"), BATCHES)
def test_a_batch_runs_chunks_of_whole_columns_on_the_tiles(monkeypatch, narrow_blas, x_shape, w_shape, attrs, fused,
                                                           residual) -> None:  # noqa: ANN001
    node, arrays, expected, call, target = _bound_im2col(x_shape, w_shape, attrs, fused, residual)
    assert _prepared_for_batch(node, arrays, target)
    jobs = _spin_twice(monkeypatch, call, arrays, expected, target)
    products = [job for job, _ in jobs if job == jit_tile_gemm.job_address()]
    assert len(products) == 2 * x_shape[0]  # a product per image (chunk) and call


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "fused", "residual"), BATCHES[:2])
def test_a_batch_of_columns_is_captured_as_fills_and_products(narrow_blas, x_shape, w_shape, attrs, fused,
                                                              residual) -> None:  # noqa: ANN001
    from hetflow.devices.cpu import spin_pool

    node, arrays, expected, call, target = _bound_im2col(x_shape, w_shape, attrs, fused, residual)
    with threads.own_threads(2, spin=True):
        outputs, captured = call.capture(arrays)
        assert outputs[0] is target and len(captured) == 2 * x_shape[0]
        target[...] = np.nan
        spin_pool.replay_on(spin_pool.JobScript(captured), threads.spinning())
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-4)
    with threads.own_threads(2):
        assert call.capture(arrays) is None  # off a spinning run


def test_a_batch_off_a_spinning_run_calls_the_plain_kernel(monkeypatch, narrow_blas) -> None:  # noqa: ANN001
    node, arrays, expected, call, target = _bound_im2col(*BATCHES[0])
    monkeypatch.setattr(jit_tile_gemm, "pack_job", lambda *args: pytest.fail("the tile GEMM ran on a spin job"))
    with threads.own_threads(2):
        [y] = call(arrays)
    assert y is target
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("case", "x_shape", "w_shape", "attrs", "narrow", "taken"), [
    ("strided 3x3", (2, 64, 56, 56), (128, 64, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), True, True),
    ("wide BLAS", (2, 64, 56, 56), (128, 64, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), False, False),
    ("strided 1x1, wide BLAS", (2, 512, 56, 56), (512, 512, 1, 1), ConvAttrs(strides=(2, 2)), False, True),
    ("a 7x7 map: one product over the chunk", (4, 64, 14, 14), (64, 64, 3, 3),
     ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), True, False),
    ("small weights: the batch's bands", (4, 8, 28, 28), (16, 8, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), True, False),
    ("groups", (4, 64, 28, 28), (64, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2), True, False),
    ("one image", (1, 32, 28, 28), (64, 32, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), True, False),
])  # fmt: skip
def test_which_batches_run_as_chunks_of_columns(monkeypatch, case, x_shape, w_shape, attrs, narrow, taken) -> None:  # noqa: ANN001
    from hetflow.devices.cpu.kernels import conv

    monkeypatch.setattr(conv, "blas_is_narrow", lambda: narrow)
    node = Node("Conv", "conv", ["x", "w"], ["y"], attrs)
    x, w, _ = _arrays(x_shape, w_shape)
    target = np.empty(KERNELS[IM2COL].fn(node, [x, w])[0].shape, np.float32)
    assert _prepared_for_batch(node, [x, w], target) is taken


def test_blas_is_narrow_only_on_an_avx512_cpu_with_openblas_built_narrower(monkeypatch) -> None:  # noqa: ANN001
    import llvmlite.binding as llvm

    class Library:
        def __init__(self, info):  # noqa: ANN001
            self._info = info

        def info(self):  # noqa: ANN202
            return self._info

    def check(avx512: bool, info: dict) -> bool:
        monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: {"avx512f": avx512})
        controller = type("Controller", (), {"select": lambda self, **_: type("S", (), {"lib_controllers": [Library(info)]})()})
        monkeypatch.setattr(threads, "ThreadpoolController", controller)
        threads.blas_is_narrow.cache_clear()
        try:
            return threads.blas_is_narrow()
        finally:
            threads.blas_is_narrow.cache_clear()

    assert check(True, {"internal_api": "openblas", "architecture": "Haswell"})
    assert not check(True, {"internal_api": "openblas", "architecture": "SkylakeX"})
    assert not check(False, {"internal_api": "openblas", "architecture": "Haswell"})
    assert not check(True, {"internal_api": "mkl"})
