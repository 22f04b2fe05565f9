"""Winograd F(2,3) and F(4,3) with the compiled transforms, against an independent float64 direct sum:
asymmetric pads, maps that are not whole tiles, bands of tile rows, every fused activation, strided
outputs, float64, split over threads."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.kernels import jit_winograd, jit_winograd_lanes, winograd
from hetflow.devices.cpu.kernels.buffers import Scratch
from hetflow.devices.cpu.threads import BLAS
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import WINOGRAD_F23, WINOGRAD_F43, ConvAttrs
from tests.helpers import record_spin_jobs
from tests.kernels.test_conv_algorithms import _direct_conv
from tests.kernels.test_depthwise_jit import ACTIVATIONS, _activate

KERNELS = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}
WINOGRADS = (WINOGRAD_F23, WINOGRAD_F43)
RNG = np.random.default_rng(23)

CASES = [
    ((2, 5, 9, 11), 4, (1, 1, 1, 1)),
    ((1, 3, 12, 10), 6, (1, 0, 0, 1)),  # asymmetric: the last tiles read past X
    ((3, 2, 7, 7), 3, (0, 0, 0, 0)),  # a 5x5 output: F(4,3)'s second tile is cropped
    ((1, 4, 3, 3), 2, (2, 2, 2, 2)),  # padding larger than one
    ((1, 3, 40, 6), 5, (1, 1, 1, 1)),  # tall: several bands of tile rows at F(2,3)'s 3-tile rows
]


def _case(x_shape, kernels, dtype=np.float32):
    x = RNG.standard_normal(x_shape).astype(dtype)
    w = RNG.standard_normal((kernels, x_shape[1], 3, 3)).astype(dtype)
    b = RNG.standard_normal(kernels).astype(dtype)
    return x, w, b


def _run(algorithm: str, attrs: ConvAttrs, x, w, b, out=None):
    node = Node("Conv", "c", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]
    kernel = KERNELS[algorithm]
    assert kernel.reason_unsupported(node, infos) is None
    workspace = np.empty(kernel.workspace(node, infos) + 64, np.uint8)
    return kernel.fn(node, [x, w, b], None if out is None else [out], workspace)[0]


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "loops"])
@pytest.mark.parametrize("algorithm", WINOGRADS)
@pytest.mark.parametrize(("x_shape", "kernels", "pads"), CASES)
def test_matches_a_direct_sum(algorithm, x_shape, kernels, pads, lanes, monkeypatch):
    """Through the tiles-in-lanes transforms where the CPU has them, and through the loops (what a CPU
    without AVX-512, and float64, runs)."""
    monkeypatch.setattr(jit_winograd, "BAND_TILES", 7)  # several bands, a partial last one, on small maps
    if not lanes:
        monkeypatch.setattr(jit_winograd_lanes, "applies", lambda dtype: False)
    x, w, b = _case(x_shape, kernels)
    attrs = ConvAttrs(pads=pads)
    got = _run(algorithm, attrs, x, w, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _direct_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fused", ACTIVATIONS, ids=lambda f: "none" if f is None else f.op_type)
@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_every_fused_activation(algorithm, fused):
    x, w, b = _case((2, 3, 10, 9), 5)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), fused=fused)
    expected = _activate(_direct_conv(x, w, b, ConvAttrs(pads=(1, 1, 1, 1))), fused)
    np.testing.assert_allclose(_run(algorithm, attrs, x, w, b), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_float64_is_computed_in_float64(algorithm):
    x, w, b = _case((2, 3, 9, 8), 4, np.float64)
    attrs = ConvAttrs(pads=(1, 1, 0, 1))
    got = _run(algorithm, attrs, x, w, b)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _direct_conv(x, w, b, attrs), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_writes_into_a_strided_slice(algorithm):
    x, w, b = _case((2, 4, 9, 9), 3)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), fused=FusedActivation("Relu"))
    concat = np.full((2, 7, 9, 9), np.nan, np.float32)
    got = _run(algorithm, attrs, x, w, b, out=concat[:, 2:5])
    expected = _activate(_direct_conv(x, w, b, attrs), attrs.fused)
    np.testing.assert_allclose(concat[:, 2:5], expected, rtol=1e-4, atol=1e-4)
    assert np.shares_memory(got, concat)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 5:]).all()


def test_the_output_transform_writes_a_y_whose_images_are_not_contiguous():
    """Y cut along its rows (each image's planes apart): written through a contiguous Y, then copied."""
    x, w, b = _case((2, 4, 9, 9), 3)
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    m = 2
    node = Node("Conv", "c", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]
    scratch = Scratch(np.empty(KERNELS[WINOGRAD_F23].workspace(node, infos), np.uint8))
    taller = np.full((2, 3, 11, 9), np.nan, np.float32)
    y, _ = winograd.winograd(node, x, w, m, taller[:, :, 1:10], scratch, b)
    np.testing.assert_allclose(taller[:, :, 1:10], _direct_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)
    assert np.isnan(taller[:, :, 0]).all() and np.isnan(taller[:, :, 10]).all()


def test_a_layer_with_small_transformed_weights_takes_small_passes():
    """Passes hold at most ``PASS_PER_U`` times U's bytes (at least ``MIN_PASS_BYTES``, at most
    ``PASS_BYTES``): GoogLeNet's 64 -> 192 layer at 56x56 and batch 16 in passes of a few images, not all 16."""
    node = Node("Conv", "c", ["x", "w", "b"], ["y"], ConvAttrs(pads=(1, 1, 1, 1)))
    f32 = np.dtype(np.float32)
    small, large = (192, 64, 3, 3), (512, 512, 3, 3)
    assert winograd.pass_bytes(small, f32, 4) == winograd.PASS_PER_U * 36 * 192 * 64 * 4  # U: 1.8 MB
    assert winograd.pass_bytes((16, 16, 3, 3), f32, 4) == winograd.MIN_PASS_BYTES
    assert winograd.pass_bytes(large, f32, 4) == winograd.PASS_BYTES  # U 37.7 MB: passes stay large
    one_image = sum(winograd._image_scratch(node, (16, 64, 56, 56), small, f32, 4))
    images = winograd.images_per_pass(node, (16, 64, 56, 56), small, f32, 4)
    assert images * one_image <= winograd.pass_bytes(small, f32, 4) < (images + 1) * one_image
    assert images < 16


@pytest.mark.parametrize("algorithm", WINOGRADS)
@pytest.mark.parametrize("fused", [None, FusedActivation("Relu")], ids=["none", "Relu"])
def test_a_batch_goes_through_in_passes_of_whole_images(algorithm, fused, monkeypatch):
    x, w, b = _case((5, 3, 10, 9), 4)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), fused=fused)
    node = Node("Conv", "c", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]
    whole_batch = KERNELS[algorithm].workspace(node, infos)
    m = {WINOGRAD_F23: 2, WINOGRAD_F43: 4}[algorithm]
    one_image = sum(winograd._image_scratch(node, x.shape, w.shape, x.dtype, m))
    monkeypatch.setattr(winograd, "PASS_BYTES", 2 * one_image)  # passes of 2, 2 and 1 images
    assert winograd.images_per_pass(node, x.shape, w.shape, x.dtype, m) == 2
    assert KERNELS[algorithm].workspace(node, infos) < 0.5 * whole_batch
    concat = np.full((5, 6, 10, 9), np.nan, np.float32)
    _run(algorithm, attrs, x, w, b, out=concat[:, 1:5])
    expected = _activate(_direct_conv(x, w, b, ConvAttrs(pads=(1, 1, 1, 1))), fused)
    np.testing.assert_allclose(concat[:, 1:5], expected, rtol=1e-4, atol=1e-4)
    assert np.isnan(concat[:, :1]).all() and np.isnan(concat[:, 5:]).all()


@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_two_threads_split_the_planes_and_agree_with_one(algorithm, monkeypatch):
    from hetflow.devices.cpu import threads

    x, w, b = _case((3, 6, 14, 13), 8)
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_BESIDE_BLAS_THREADS", 1)
    previous = BLAS.get()
    try:
        BLAS.set(1)
        single = _run(algorithm, attrs, x, w, b)
        BLAS.set(2)
        split = _run(algorithm, attrs, x, w, b)
    finally:
        if previous is not None:
            BLAS.set(previous)
    np.testing.assert_allclose(split, single, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("algorithm", WINOGRADS)
@pytest.mark.parametrize("fused", [None, FusedActivation("Relu"), FusedActivation("Sigmoid")], ids=["none", "relu", "sigmoid"])
@pytest.mark.parametrize(("x_shape", "kernels", "pads"), [CASES[0], CASES[2], CASES[4]])
def test_a_spinning_run_shares_both_transforms_out_on_its_pool(algorithm, fused, x_shape, kernels, pads, monkeypatch):
    """On spinning threads each transform is one spin-pool job of two shares a thread (their coefficients
    rebuilt inside the job for F(2,3) and F(4,3)), with the one-thread result."""
    from hetflow.devices.cpu import threads

    x, w, b = _case(x_shape, kernels)
    attrs = ConvAttrs(pads=pads, fused=fused)
    with threads.own_threads(1):
        single = _run(algorithm, attrs, x, w, b)
    jobs = record_spin_jobs(monkeypatch, min_outputs=1)
    with threads.own_threads(2, spin=True, hold_blas=True):
        spun = _run(algorithm, attrs, x, w, b)
    if jit_winograd_lanes.applies(np.float32):  # the tiles in the lanes; the output's Sigmoid left behind
        output = jit_winograd._output_address() if fused == FusedActivation("Sigmoid") else None
        transform_jobs = {jit_winograd_lanes.job_addresses()[0], output or jit_winograd_lanes.job_addresses()[1]}
    else:
        transform_jobs = {jit_winograd._input_address(), jit_winograd._output_address()}
    assert transform_jobs <= {job for job, _ in jobs}
    np.testing.assert_allclose(spun, single, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_spinning_run_writes_a_concat_slice_on_its_pool(batch, monkeypatch):
    """Y a slice of a Concat's output (its images apart): the output job writes each image's planes in
    place, on the pool, and nothing around the slice."""
    from hetflow.devices.cpu import threads

    x, w, b = _case((batch, 4, 9, 9), 3)
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    jobs = record_spin_jobs(monkeypatch, min_outputs=1)
    concat = np.full((batch, 7, 9, 9), np.nan, np.float32)
    with threads.own_threads(2, spin=True):
        _run(WINOGRAD_F23, attrs, x, w, b, out=concat[:, 2:5])
    np.testing.assert_allclose(concat[:, 2:5], _direct_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 5:]).all()
    output = jit_winograd_lanes.job_addresses()[1] if jit_winograd_lanes.applies(np.float32) else None
    assert (output or jit_winograd._output_address()) in {job for job, _ in jobs}


@pytest.mark.parametrize(("elements", "kernels", "channels", "count"), [
    (16, 24, 20, 49),  # F(2,3) on a 14x14 map: one tile of columns
    (36, 7, 13, 5),  # fewer elements' worth of work than shares, odd sizes
    (36, 16, 16, 196),  # F(4,3) on 56x56: four tiles of columns, the last one partial
])  # fmt: skip
def test_a_spinning_run_multiplies_the_elements_on_the_tile_gemm(elements, kernels, channels, count, monkeypatch):
    from hetflow.devices.cpu import threads
    from hetflow.devices.cpu.kernels import jit_tile_gemm, winograd

    rng = np.random.default_rng(5)
    u = rng.standard_normal((elements, kernels, channels)).astype(np.float32)
    v = rng.standard_normal((elements, channels, count)).astype(np.float32)
    products = np.full((elements, kernels, count), np.nan, np.float32)
    jobs = record_spin_jobs(monkeypatch, min_outputs=1)
    with threads.own_threads(2, spin=True, hold_blas=True):
        winograd.multiply_elements(u, v, products)
    np.testing.assert_allclose(products, np.matmul(u, v), rtol=1e-5, atol=1e-5)
    assert jit_tile_gemm.job_address() in {job for job, _ in jobs}


@pytest.mark.parametrize("count", [5, 196, 784])
def test_a_batch_on_own_threads_multiplies_the_elements_on_the_tile_gemm_not_blas(count, monkeypatch):
    from hetflow.devices.cpu import threads
    from hetflow.devices.cpu.kernels import winograd

    rng = np.random.default_rng(6)
    u = rng.standard_normal((36, 9, 11)).astype(np.float32)
    v = rng.standard_normal((36, 11, count)).astype(np.float32)
    products = np.full((36, 9, count), np.nan, np.float32)
    monkeypatch.setattr(winograd, "split_matmul", lambda *args, **kwargs: pytest.fail("BLAS ran the products"))
    with threads.own_threads(2):
        winograd.multiply_elements(u, v, products)
    np.testing.assert_allclose(products, np.matmul(u, v), rtol=1e-5, atol=1e-5)


def _prepared(algorithm: str, attrs: ConvAttrs, x, w, b, target, workspace_extra: int = 64):  # noqa: ANN001, ANN202
    """The kernel's bound call for a node whose Y the plan places in ``target``."""
    node = Node("Conv", "c", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]
    kernel = KERNELS[algorithm]
    workspace = np.empty(kernel.workspace(node, infos) + workspace_extra, np.uint8)
    return kernel.prepare(node, infos, [target], workspace)


@pytest.mark.parametrize("algorithm", WINOGRADS)
@pytest.mark.parametrize("fused", [None, FusedActivation("Relu")], ids=["none", "relu"])
@pytest.mark.parametrize("passes", [1, 3])
def test_a_capture_replays_the_layer_as_jobs_into_the_planned_y(algorithm, fused, passes, monkeypatch):
    """A captured run replays the transforms and products as spin-pool jobs, pass after pass, with no
    Python between them: Y written where the plan placed it, the direct sum's values, run after run."""
    from hetflow.devices.cpu import spin_pool, threads

    x, w, b = _case((3, 5, 11, 10), 6)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), fused=fused)
    if passes > 1:
        node = Node("Conv", "c", ["x", "w", "b"], ["y"], attrs)
        m = winograd.WINOGRAD_TILE[algorithm]
        monkeypatch.setattr(winograd, "PASS_BYTES", sum(winograd._image_scratch(node, x.shape, w.shape, x.dtype, m)))
    target = np.full((3, 6, 11, 10), np.nan, np.float32)
    bound = _prepared(algorithm, attrs, x, w, b, target)
    with threads.own_threads(2, spin=True, hold_blas=True):
        outputs, jobs = bound.capture([x, w, b])
        assert outputs[0] is target and len(jobs) == 3 * passes
        target[...] = np.nan
        for _ in range(2):
            spin_pool.replay_on(spin_pool.JobScript(jobs), threads.spinning())
    expected = _activate(_direct_conv(x, w, b, ConvAttrs(pads=(1, 1, 1, 1))), fused)
    np.testing.assert_allclose(target, expected, rtol=1e-4, atol=1e-4)


def test_a_capture_writes_a_concat_slice_of_a_batch_in_place():
    from hetflow.devices.cpu import spin_pool, threads

    x, w, b = _case((3, 4, 9, 9), 5)
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    concat = np.full((3, 9, 9, 9), np.nan, np.float32)
    bound = _prepared(WINOGRAD_F43, attrs, x, w, b, concat[:, 1:6])
    with threads.own_threads(2, spin=True, hold_blas=True):
        outputs, jobs = bound.capture([x, w, b])
        concat[...] = np.nan
        spin_pool.replay_on(spin_pool.JobScript(jobs), threads.spinning())
    np.testing.assert_allclose(concat[:, 1:6], _direct_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)
    assert np.isnan(concat[:, :1]).all() and np.isnan(concat[:, 6:]).all()


def test_a_capture_leaves_an_activation_the_output_transform_cannot_apply_to_the_call():
    x, w, b = _case((1, 4, 9, 9), 3)
    attrs = ConvAttrs(pads=(1, 1, 1, 1), fused=FusedActivation("Sigmoid"))
    bound = _prepared(WINOGRAD_F43, attrs, x, w, b, np.empty((1, 3, 9, 9), np.float32))
    assert bound.capture([x, w, b]) is None
    y = bound([x, w, b])[0]
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-_direct_conv(x, w, b, ConvAttrs(pads=(1, 1, 1, 1))))), rtol=1e-4,
                               atol=1e-5)  # fmt: skip


def test_a_float64_node_is_not_bound():
    x, w, b = _case((1, 4, 9, 9), 3, np.float64)
    assert _prepared(WINOGRAD_F23, ConvAttrs(pads=(1, 1, 1, 1)), x, w, b, np.empty((1, 3, 9, 9))) is None
