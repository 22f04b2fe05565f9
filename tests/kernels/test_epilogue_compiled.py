"""The compiled Conv epilogue (bias + fused activation in one pass) against numpy's two passes."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu.kernels.epilogue import add_channel_bias, apply_activation, finish_channels
from hetflow.devices.cpu.kernels.jit_epilogue import finish_planes
from hetflow.ops.activation import FusedActivation

RNG = np.random.default_rng(5)
ACTIVATIONS = [None, FusedActivation("Relu"), FusedActivation("Clip", 0.0, 6.0),
               FusedActivation("Clip", -0.5, 0.25), FusedActivation("LeakyRelu", 0.1)]  # fmt: skip


def _numpy_epilogue(y: np.ndarray, bias: np.ndarray | None, fused: FusedActivation | None) -> np.ndarray:
    expected = y.copy()
    add_channel_bias(expected, bias)
    apply_activation(expected, fused)
    return expected


@pytest.mark.parametrize("fused", ACTIVATIONS, ids=lambda f: f.op_type if f else "none")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_one_pass_matches_numpy_and_keeps_nan(fused, dtype, with_bias):
    y = (RNG.standard_normal((3, 5, 7, 9)) * 4).astype(dtype)
    y[1, 2, 3, 4] = np.nan
    bias = RNG.standard_normal(5).astype(np.float32) if with_bias else None  # cast to Y's dtype
    expected = _numpy_epilogue(y, bias, fused)
    assert finish_planes(y, bias, fused)
    np.testing.assert_array_equal(y, expected)  # the same arithmetic, element by element
    assert np.isnan(y[1, 2, 3, 4])


def test_a_concat_slice_is_finished_in_place_and_its_neighbours_untouched():
    whole = np.full((2, 7, 4, 4), np.nan, np.float32)
    part = whole[:, 2:5]
    part[...] = RNG.standard_normal(part.shape)
    bias = RNG.standard_normal(3).astype(np.float32)
    expected = _numpy_epilogue(np.ascontiguousarray(part), bias, FusedActivation("Relu"))
    finish_channels(part, bias, FusedActivation("Relu"))
    np.testing.assert_array_equal(whole[:, 2:5], expected)
    assert np.isnan(whole[:, :2]).all() and np.isnan(whole[:, 5:]).all()


@pytest.mark.parametrize(
    ("y", "fused"),
    [
        (np.ones((1, 2, 3), np.float32), FusedActivation("Sigmoid")),  # transcendental: numpy's
        (np.ones((1, 2, 3), np.float16), FusedActivation("Relu")),  # not a compiled dtype
    ],
)
def test_what_the_loop_does_not_take_is_left_to_numpy(y, fused):
    before = y.copy()
    assert not finish_planes(y, np.ones(y.shape[1], np.float32), fused)
    np.testing.assert_array_equal(y, before)
    expected = _numpy_epilogue(y, np.ones(y.shape[1], np.float32), fused)
    finish_channels(y, np.ones(y.shape[1], np.float32), fused)
    np.testing.assert_allclose(y.astype(np.float64), expected.astype(np.float64), rtol=1e-6)


def test_a_map_with_no_planes_view_is_refused_untouched():
    y = np.ones((2, 3, 4, 4), np.float32)[:, :, ::2]  # rows apart: no [N, C, P] view without a copy
    assert not finish_planes(y, np.ones(3, np.float32), FusedActivation("Relu"))
    assert (y == 1).all()


@pytest.mark.parametrize("own", [True, False], ids=["own-threads", "beside-blas-threads"])
def test_a_run_on_its_own_threads_splits_the_planes(monkeypatch, own):
    """A batch run (``own_threads``) splits the epilogue's planes; beside BLAS's threads it stays whole;
    either way the result is the unsplit pass's, bit for bit."""
    from hetflow.devices.cpu import threads
    from hetflow.devices.cpu.kernels import jit_epilogue
    from tests.helpers import record_splits

    rng = np.random.default_rng(3)
    y = rng.standard_normal((4, 6, 9, 7)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    fused = FusedActivation("Clip", -0.5, 0.5)
    expected = y.copy()
    assert finish_planes(expected, bias, fused)
    splits = record_splits(monkeypatch, jit_epilogue)
    if not own:
        monkeypatch.setattr(threads, "_own_threads", None)
    with threads.own_threads(2, numba_pool=True) if own else threads.blas_threads(2):
        assert finish_planes(y, bias, fused)
    assert splits == ([2] if own else [])
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("fused", ACTIVATIONS[1:], ids=lambda f: f.op_type)
@pytest.mark.parametrize("chunks", [1, 3])
def test_an_activation_job_covers_every_element_in_its_chunks(fused, chunks):
    """``activation_job`` in place over a flat Y, its chunks run one after another (as a pool would run
    them on its threads): every element activated once, NaN kept, as numpy's epilogue does."""
    from hetflow.devices.cpu import spin_pool
    from hetflow.devices.cpu.kernels.jit_epilogue import activation_code, activation_job

    y = (RNG.standard_normal(1001) * 4).astype(np.float32)
    y[500] = np.nan
    expected = _numpy_epilogue(y, None, fused)
    code, alpha, beta = activation_code(fused)
    spin_pool.replay_alone(spin_pool.JobScript([activation_job(y, y, code, alpha, beta, chunks=chunks)]))
    np.testing.assert_array_equal(y, expected)
