"""The stems' strided direct Conv read in place (``jit_direct_stems``), alone and as the CPU's
``direct_fma`` kernel, against sums over the window taps in float64 and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow import InferenceSession
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_direct, jit_direct_lanes, jit_direct_phases, jit_direct_stems
from hetflow.devices.cpu.kernels.jit_direct import NO_BOUNDS, RELU_BOUNDS, bounds_of
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.ops.conv import DIRECT_FMA, ConvAttrs
from tests.kernels.test_conv_train import direct_conv
from tests.kernels.test_jit_direct import _geometry, _relative_error

RNG = np.random.default_rng(58)

#: (pads, X shape, W shape): MobileNet v2's stem on a small map, SqueezeNet's (no padding), uneven
#: pads, maps narrower than a vector and wider than two, rows not a whole number of units, kernels not
#: a whole number of blocks, one to four channels, a batch; 7x7 windows (GoogLeNet's stem).
CASES = [
    ((1, 1, 1, 1), (1, 3, 40, 40), (32, 3, 3, 3)),
    ((0, 0, 0, 0), (1, 3, 37, 37), (64, 3, 3, 3)),
    ((0, 1, 1, 0), (2, 3, 20, 35), (13, 3, 3, 3)),
    ((1, 1, 1, 1), (1, 1, 9, 7), (5, 1, 3, 3)),
    ((1, 0, 0, 1), (3, 4, 17, 70), (24, 4, 3, 3)),
    ((1, 1, 1, 1), (1, 2, 3, 3), (8, 2, 3, 3)),
    ((3, 3, 3, 3), (1, 3, 45, 45), (64, 3, 7, 7)),
    ((2, 3, 3, 2), (2, 3, 11, 36), (11, 3, 7, 7)),
]
IDS = ["mobilenet", "squeezenet", "uneven", "narrow", "wide-batch", "tiny", "7x7", "7x7-uneven"]


def _case(pads: tuple[int, ...], x_shape: tuple[int, ...], w_shape: tuple[int, ...]):  # noqa: ANN202
    attrs = ConvAttrs(strides=(2, 2), pads=pads)
    x, w, b = (RNG.standard_normal(shape).astype(np.float32) for shape in (x_shape, w_shape, w_shape[:1]))
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    return attrs, x, w, b, expected


def _inside_nans(x: np.ndarray) -> np.ndarray:
    """``x`` copied into the middle of a larger array of NaN: a read past its ends would show in Y."""
    margin = 64
    room = np.full(x.size + 2 * margin, np.nan, np.float32)
    inside = room[margin : margin + x.size].reshape(x.shape)
    inside[...] = x
    return inside


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("pads", "x_shape", "w_shape"), CASES, ids=IDS)
def test_conv2d_matches_the_direct_sum_and_reads_only_x(monkeypatch, threads, pads, x_shape, w_shape):
    monkeypatch.setattr(jit_direct_stems, "intra_op_threads", lambda: threads)
    attrs, x, w, b, expected = _case(pads, x_shape, w_shape)
    geom = _geometry(attrs, x_shape, w_shape)
    assert jit_direct_stems.applies(geom, x_shape[1])
    y = np.full(expected.shape, np.nan, np.float32)
    assert jit_direct_stems.conv2d(_inside_nans(x), w, b, geom, NO_BOUNDS, y) is y
    assert _relative_error(y, expected) < 1e-5


@pytest.mark.parametrize("bounds", [RELU_BOUNDS, bounds_of(-0.5, 0.5)], ids=["relu", "clip"])
@pytest.mark.parametrize(("pads", "x_shape", "w_shape"), CASES[:3], ids=IDS[:3])
def test_bound_calls_one_part_numba_threads_and_the_spinning_pool(pads, x_shape, w_shape, bounds):
    """The prepared calls: every unit on the calling thread, the units on numba's threads and as a job
    of the spinning pool in 1-4 chunks; a fused Relu or Clip clamps as Y is stored."""
    attrs, x, w, b, expected = _case(pads, x_shape, w_shape)
    scale = float(np.abs(expected).max())
    expected = np.clip(expected, *bounds)
    geom = _geometry(attrs, x_shape, w_shape)
    kernels, wt = w_shape[0], jit_direct.blocked_weights(w)
    results = []
    y = np.full(expected.shape, np.nan, np.float32)
    jit_direct_stems.bind_one_part(x.shape, kernels, geom, bounds, None)(x, wt, b, y)  # type: ignore[arg-type]
    results.append(y)
    split = jit_direct_stems.bind_block_split(x.shape, kernels, geom, bounds, None)  # type: ignore[arg-type]
    y = np.full(expected.shape, np.nan, np.float32)
    split(x, wt, b, y, 3)
    results.append(y)
    with own_threads(2, spin=True):
        pool = spinning()
        assert isinstance(pool, spin_pool.SpinPool)
        for parts in (1, 2, 4):
            y = np.full(expected.shape, np.nan, np.float32)
            split(x, wt, b, y, parts, pool)
            results.append(y)
    for y in results:
        assert np.abs(y - expected).max() / scale < 1e-5 and (y >= bounds[0]).all() and (y <= bounds[1]).all()


@pytest.mark.parametrize(
    ("attrs", "channels", "taken"),
    [
        (ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), 3, True),
        (ConvAttrs(strides=(2, 2)), 4, True),
        (ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), 5, False),  # past the stems' channels
        (ConvAttrs(strides=(1, 1), pads=(1, 1, 1, 1)), 3, False),
        (ConvAttrs(strides=(2, 1), pads=(1, 1, 1, 1)), 3, False),
        (ConvAttrs(strides=(2, 2), pads=(2, 2, 2, 2), dilations=(2, 2)), 3, False),
    ],
)
def test_applies_to_3x3_and_7x7_stride_2_windows_on_few_channels(attrs, channels, taken):
    geom = _geometry(attrs, (1, channels, 32, 32), (16, channels, 3, 3))
    assert jit_direct_stems.applies(geom, channels) is taken
    seven = _geometry(ConvAttrs(strides=(2, 2), pads=(3, 3, 3, 3)), (1, 3, 32, 32), (16, 3, 7, 7))
    assert jit_direct_stems.applies(seven, 3)  # GoogLeNet's and ResNet-50's stems
    five = _geometry(ConvAttrs(strides=(2, 2), pads=(2, 2, 2, 2)), (1, 3, 32, 32), (16, 3, 5, 5))
    assert not jit_direct_stems.applies(five, 3)  # none in the zoo: not compiled


def test_one_images_stem_runs_here_and_a_batchs_on_phase_planes():
    geom = _geometry(ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), (1, 3, 32, 32), (16, 3, 3, 3))
    assert jit_direct_lanes.variant(geom, 16, (1, 3, 32, 32)) is jit_direct_stems
    assert jit_direct_lanes.variant(geom, 16, (2, 3, 32, 32)) is jit_direct_phases


@pytest.mark.parametrize("batch", [1, 2])
def test_mobilenets_stem_in_a_session_matches_onnx_runtime(batch):
    """A 3 -> 32 3x3/2 stem with MobileNet v2's ReLU6, through a session (the cost model runs it direct,
    here), replayed, against ONNX Runtime."""
    import onnxruntime as ort

    w = (RNG.standard_normal((32, 3, 3, 3)) * 0.5).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Clip", ["c", "low", "high"], ["y"])],
        "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.float32(0), "low"), numpy_helper.from_array(np.float32(6), "high")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    session = InferenceSession(model, threads=2)
    assert [step.kernel.algorithm for step in session.plan_for({}).steps] == [DIRECT_FMA]
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for _ in range(3):  # captured, then replayed
        x = (RNG.standard_normal((batch, 3, 96, 96)) * 2).astype(np.float32)
        expected = reference.run(None, {"x": x})[0]
        assert (expected == 6).any() and (expected == 0).any()
        assert _relative_error(session.run(None, {"x": x})[0], expected) < 1e-5
