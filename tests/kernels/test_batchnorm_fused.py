"""Inference BatchNormalization with a fused activation on the CPU (the compiled one-pass kernel and the
numpy fallbacks) against a float64 reference: every activation, in place, strided outputs, float16,
spatial=0, NaN, the two-thread split; and the backward rule refusing a fused node."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.threads import BLAS
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.norm import BatchNormalization, BatchNormalizationAttrs
from tests.helpers import record_spin_jobs
from tests.kernels.test_depthwise_jit import ACTIVATIONS, _activate

CPU = CPUDevice()
RNG = np.random.default_rng(29)
EPSILON = 1e-3


def _params(channels: int, dtype=np.float32, shape: tuple[int, ...] | None = None) -> list[np.ndarray]:
    shape = shape or (channels,)
    scale, bias, mean = (RNG.standard_normal(shape).astype(dtype) for _ in range(3))
    var = (np.abs(RNG.standard_normal(shape)) + 0.1).astype(dtype)
    return [scale, bias, mean, var]


def _reference(x: np.ndarray, params: list[np.ndarray], fused: FusedActivation | None) -> np.ndarray:
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    shape = scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    y = (x.astype(np.float64) - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + EPSILON)
    return _activate(y * scale.reshape(shape) + bias.reshape(shape), fused)


def _run(x: np.ndarray, params: list[np.ndarray], fused: FusedActivation | None, out=None, spatial: int = 1):
    node = Node("BatchNormalization", "bn", ["x", "s", "b", "m", "v"], ["y"],
                BatchNormalizationAttrs(epsilon=EPSILON, spatial=spatial, fused=fused))
    arrays = [x, *params]
    kernel = CPU.kernels.lookup(node, [TensorInfo(a.shape, a.dtype) for a in arrays])
    assert kernel is not None
    return kernel.fn(node, arrays, None if out is None else [out])[0]


@pytest.mark.parametrize("fused", ACTIVATIONS, ids=lambda f: "none" if f is None else f.op_type)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 5, 7, 6), (3, 4, 9), (1, 3, 2, 3, 4)])
def test_matches_the_float64_reference(shape, dtype, fused):
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    params = _params(shape[1], dtype)
    got = _run(x, params, fused)
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, _reference(x, params, fused), rtol=tolerance, atol=tolerance)


def test_runs_in_place():
    x = RNG.standard_normal((2, 4, 5, 5)).astype(np.float32)
    params = _params(4)
    expected = _reference(x, params, FusedActivation("Relu"))
    got = _run(x, params, FusedActivation("Relu"), out=x)
    assert got is x or np.shares_memory(got, x)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)


def test_writes_into_a_strided_slice():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    params = _params(3)
    concat = np.full((2, 6, 4, 5), np.nan, np.float32)
    got = _run(x, params, FusedActivation("Clip", 0.0, 6.0), out=concat[:, 1:4])
    assert np.shares_memory(got, concat)
    np.testing.assert_allclose(concat[:, 1:4], _reference(x, params, FusedActivation("Clip", 0.0, 6.0)),
                               rtol=1e-5, atol=1e-5)
    assert np.isnan(concat[:, :1]).all() and np.isnan(concat[:, 4:]).all()


def test_float16_and_per_element_parameters_take_the_numpy_path():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float16)
    params = _params(3, np.float16)
    got = _run(x, params, FusedActivation("Relu"))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, _reference(x, params, FusedActivation("Relu")), rtol=2e-3, atol=2e-3)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    params = _params(3, shape=(3, 4))
    got = _run(x, params, FusedActivation("LeakyRelu", 0.2), spatial=0)
    np.testing.assert_allclose(got, _reference(x, params, FusedActivation("LeakyRelu", 0.2)), rtol=1e-5, atol=1e-5)


def test_nan_passes_through_the_fused_relu():
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    x[0, 1, 1, 1] = np.nan
    got = _run(x, _params(2), FusedActivation("Relu"))
    assert np.isnan(got[0, 1, 1, 1]) and np.isnan(got).sum() == 1


def test_two_threads_split_the_planes_and_agree_with_one(monkeypatch):
    from hetflow.devices.cpu.kernels import jit_affine
    from tests.helpers import record_splits

    x = RNG.standard_normal((3, 6, 8, 8)).astype(np.float32)
    params = _params(6)
    splits = record_splits(monkeypatch, jit_affine)
    previous = BLAS.get()
    try:
        BLAS.set(1)
        single = _run(x, params, FusedActivation("Relu"))
        assert splits == []
        BLAS.set(2)
        split = _run(x, params, FusedActivation("Relu"))
        assert splits == [2]
    finally:
        if previous is not None:
            BLAS.set(previous)
    np.testing.assert_array_equal(single, split)


def test_backward_refuses_a_fused_node():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float64)
    params = _params(3, np.float64)
    node = Node("BatchNormalization", "bn", ["x", "s", "b", "m", "v"], ["y"],
                BatchNormalizationAttrs(fused=FusedActivation("Relu")))
    with pytest.raises(ValueError, match="fused activation"):
        BatchNormalization().backward(node, [x, *params], [x], [np.ones_like(x)])


@pytest.mark.parametrize("fused", [None, FusedActivation("Relu"), FusedActivation("Clip", 0.0, 6.0)],
                         ids=["none", "relu", "clip"])  # fmt: skip
def test_a_spinning_run_shares_the_planes_out_on_its_pool(monkeypatch, fused):
    """On spinning threads the planes are chunks of one spin-pool job, never the Python pool's ranges,
    with the one-thread result; so are those of a Concat's channel slices (images apart), read or
    written, and nothing else of the Concat's buffer is written."""
    from hetflow.devices.cpu import threads

    x = RNG.standard_normal((2, 12, 9, 9)).astype(np.float32)  # two images: a channel slice is strided
    params = _params(12)
    with threads.own_threads(1):
        single = _run(x, params, fused)
    jobs = record_spin_jobs(monkeypatch)
    concat = np.full((2, 15, 9, 9), np.nan, np.float32)
    source = np.full((2, 14, 9, 9), np.inf, np.float32)
    source[:, 2:] = x
    with threads.own_threads(2, spin=True):
        spun = _run(x, params, fused)
        _run(x, params, fused, out=concat[:, 1:13])
        from_slice = _run(source[:, 2:], params, fused)
    assert [chunks for _, chunks in jobs] == [4, 4, 4]
    np.testing.assert_array_equal(spun, single)
    np.testing.assert_array_equal(concat[:, 1:13], single)
    np.testing.assert_array_equal(from_slice, single)
    assert np.isnan(concat[:, 0]).all() and np.isnan(concat[:, 13:]).all()
