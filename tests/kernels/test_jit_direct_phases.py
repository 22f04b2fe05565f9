"""The strided direct Conv on phase planes (``jit_direct_phases``), alone and as the CPU's ``direct_fma``
kernel, against sums over the window taps in float64."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow import InferenceSession
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_direct, jit_direct_lanes, jit_direct_phases
from hetflow.devices.cpu.kernels.jit_direct import NO_BOUNDS, RELU_BOUNDS, bounds_of
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.ops.conv import (
    DIRECT_FMA,
    IM2COL,
    ConvAttrs,
    conv_window,
    direct_unsupported,
    heuristic_conv_algorithm,
)
from tests.kernels.test_conv_train import direct_conv
from tests.kernels.test_jit_direct import _geometry, _relative_error

RNG = np.random.default_rng(29)

#: (attrs, X shape, W shape): the stems' 7x7/2 and 11x11/4, odd sizes and pads, asymmetric strides,
#: a dilated window, ceil-free maps the last window does not reach the end of.
CASES = [
    (ConvAttrs(strides=(2, 2), pads=(3, 3, 3, 3)), (2, 3, 23, 23), (11, 3, 7, 7)),
    (ConvAttrs(strides=(4, 4)), (1, 3, 31, 31), (17, 3, 11, 11)),
    (ConvAttrs(strides=(3, 2), pads=(1, 0, 2, 1)), (3, 2, 14, 17), (9, 2, 5, 3)),
    (ConvAttrs(strides=(2, 2), pads=(2, 2, 2, 2), dilations=(2, 2)), (2, 4, 13, 12), (8, 4, 3, 3)),
    (ConvAttrs(strides=(2, 2)), (1, 1, 10, 40), (5, 1, 2, 2)),
    # Deeper layers (the tuner measures the direct kernel there): channels in several chunks, a 5x5/2.
    (ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), (1, 40, 14, 14), (24, 40, 3, 3)),
    (ConvAttrs(strides=(2, 2), pads=(2, 2, 2, 2)), (2, 19, 15, 15), (9, 19, 5, 5)),
]
IDS = ["7x7s2", "11x11s4", "5x3-s3x2-asym", "dilated", "2x2-wide", "3x3s2-deep", "5x5s2-deep"]


def _case(attrs: ConvAttrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...]):  # noqa: ANN202
    x, w, b = (RNG.standard_normal(shape).astype(np.float32) for shape in (x_shape, w_shape, w_shape[:1]))
    expected = direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs)
    return x, w, b, expected


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_conv2d_matches_the_direct_sum(monkeypatch, threads, attrs, x_shape, w_shape):
    """Whole images per thread, or (batch below the thread count) each image's kernel blocks shared."""
    monkeypatch.setattr(jit_direct, "intra_op_threads", lambda: threads)
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_THREAD", 1)  # split even these small layers
    monkeypatch.setattr(jit_direct, "MIN_PRODUCTS_PER_SHARE", 1)  # and one image's kernel blocks
    x, w, b, expected = _case(attrs, x_shape, w_shape)
    geom = _geometry(attrs, x_shape, w_shape)
    assert jit_direct_lanes.variant(geom, w_shape[0], x_shape) is jit_direct_phases
    y = np.full(expected.shape, np.nan, np.float32)
    assert jit_direct_phases.conv2d(x, w, b, geom, NO_BOUNDS, y) is y
    assert _relative_error(y, expected) < 1e-5


@pytest.mark.parametrize("bounds", [RELU_BOUNDS, bounds_of(-0.5, 0.5)], ids=["relu", "clip"])
@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES[:3], ids=IDS[:3])
def test_bound_calls_one_part_and_shared_blocks(attrs, x_shape, w_shape, bounds):
    """The prepared calls: one thread over every image, and one image's kernel blocks shared out on
    numba's threads and on a spinning pool (each share fills its own phase planes); with a fused Relu or
    Clip, clamped as the products are copied out."""
    x, w, b, expected = _case(attrs, (1, *x_shape[1:]), w_shape)
    scale = float(np.abs(expected).max())  # the products' own: a clipped max would hide their rounding
    expected = np.clip(expected, *bounds)
    geom = _geometry(attrs, x.shape, w_shape)
    kernels = w_shape[0]
    buffers = jit_direct.PartBuffers.allocate(3, jit_direct_phases.buffer_shapes(x.shape[1], kernels, geom))
    wt = jit_direct.blocked_weights(w)
    results = []
    y = np.full(expected.shape, np.nan, np.float32)
    jit_direct_phases.bind_one_part(x.shape, kernels, geom, bounds, buffers)(x, wt, b, y)
    results.append(y)
    split = jit_direct_phases.bind_block_split(x.shape, kernels, geom, bounds, buffers)
    y = np.full(expected.shape, np.nan, np.float32)
    split(x, wt, b, y, 3)
    results.append(y)
    with own_threads(2, spin=True):
        pool = spinning()
        assert isinstance(pool, spin_pool.SpinPool)
        y = np.full(expected.shape, np.nan, np.float32)
        split(x, wt, b, y, 2, pool)
        results.append(y)
    for y in results:
        assert np.abs(y - expected).max() / scale < 1e-5 and (y >= bounds[0]).all() and (y <= bounds[1]).all()


@pytest.mark.parametrize(("attrs", "x_shape", "w_shape"), CASES, ids=IDS)
def test_phase_planes_hold_the_padded_input(attrs: ConvAttrs, x_shape: tuple, w_shape: tuple) -> None:
    """Every padded pixel lands in its phase at its row and column over the strides; the rest is zero
    (whatever the scratch held before)."""
    if x_shape[0] < 2:
        x_shape = (2, *x_shape[1:])
    x = RNG.standard_normal(x_shape).astype(np.float32)
    geom = _geometry(attrs, x_shape, w_shape)
    layout = jit_direct_phases.phase_layout(geom)
    xp = np.full((x_shape[1], layout.plane), np.nan, np.float32)
    jit_direct_phases.fill_phase_planes(x, 1, layout.window, layout.width, xp)
    top, left, row_stride, column_stride, size = (int(v) for v in layout.window)
    padded = np.zeros((x_shape[1], *(a.padded for a in geom.axes)), np.float32)
    padded[:, top:top + x_shape[2], left:left + x_shape[3]] = x[1]
    for qr in range(row_stride):
        for qc in range(column_stride):
            phase = padded[:, qr::row_stride, qc::column_stride]
            start = (qr * column_stride + qc) * size
            planes = xp[:, start:start + size]
            rows = planes[:, : phase.shape[1] * layout.width].reshape(x_shape[1], phase.shape[1], layout.width)
            np.testing.assert_array_equal(rows[:, :, : phase.shape[2]], phase)
            assert not rows[:, :, phase.shape[2]:].any()
            assert not planes[:, phase.shape[1] * layout.width:].any()


def test_the_cost_model_runs_strided_windows_direct_on_stems_and_a_batchs_wide_3x3_layers():
    """The stems (3 channels) take the direct kernel, one image's as a batch's (a 3x3/2 one read in place
    by ``jit_direct_stems``), but for one image's other 3x3 stems of under 64 kernels (im2col's columns
    copy each input little there, the phase planes' fill costs each share); a deeper strided layer
    stays with im2col for one image, and for a batch where its output is under 14 wide or its window
    not 3x3, though the direct kernel supports it (the tuner measures it there)."""
    float32 = np.dtype(np.float32)
    stem = conv_window(ConvAttrs(strides=(2, 2), pads=(3, 3, 3, 3)), (64, 3, 7, 7))
    assert heuristic_conv_algorithm(stem, (16, 3, 224, 224), 64, 1, float32) == DIRECT_FMA
    assert heuristic_conv_algorithm(stem, (1, 3, 224, 224), 64, 1, float32) == DIRECT_FMA
    small_stem = conv_window(ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), (32, 3, 3, 3))
    assert heuristic_conv_algorithm(small_stem, (16, 3, 224, 224), 32, 1, float32) == DIRECT_FMA
    assert heuristic_conv_algorithm(small_stem, (1, 3, 224, 224), 32, 1, float32) == DIRECT_FMA
    stride_3_stem = conv_window(ConvAttrs(strides=(3, 3), pads=(1, 1, 1, 1)), (32, 3, 3, 3))
    assert heuristic_conv_algorithm(stride_3_stem, (1, 3, 224, 224), 32, 1, float32) == IM2COL
    squeezenet_stem = conv_window(ConvAttrs(strides=(2, 2)), (64, 3, 3, 3))
    assert heuristic_conv_algorithm(squeezenet_stem, (1, 3, 224, 224), 64, 1, float32) == DIRECT_FMA
    deep = conv_window(ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1)), (128, 64, 3, 3))
    assert heuristic_conv_algorithm(deep, (1, 64, 56, 56), 128, 1, float32) != DIRECT_FMA
    assert heuristic_conv_algorithm(deep, (16, 64, 56, 56), 128, 1, float32) == DIRECT_FMA
    assert heuristic_conv_algorithm(deep, (16, 64, 28, 28), 128, 1, float32) == DIRECT_FMA  # 14x14 out
    assert heuristic_conv_algorithm(deep, (16, 64, 26, 26), 128, 1, float32) != DIRECT_FMA  # 13x13 out
    assert heuristic_conv_algorithm(deep, (16, 64, 14, 14), 128, 1, float32) != DIRECT_FMA  # 7x7 out
    wide_window = conv_window(ConvAttrs(strides=(2, 2), pads=(2, 2, 2, 2)), (128, 64, 5, 5))
    assert heuristic_conv_algorithm(wide_window, (16, 64, 56, 56), 128, 1, float32) != DIRECT_FMA
    projection = conv_window(ConvAttrs(strides=(2, 2)), (512, 256, 1, 1))
    assert heuristic_conv_algorithm(projection, (16, 256, 56, 56), 512, 1, float32) != DIRECT_FMA
    assert direct_unsupported(deep, 1, float32) is None


def test_a_stem_in_a_session_matches_onnx_runtime():
    """GoogLeNet's stem with its Relu, at batch 2 (where the cost model picks the direct kernel), through
    a session, against ONNX Runtime."""
    import onnxruntime as ort

    w = (RNG.standard_normal((64, 3, 7, 7)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[3, 3, 3, 3], strides=[2, 2]),
         helper.make_node("Relu", ["c"], ["y"])],
        "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = RNG.standard_normal((2, 3, 64, 64)).astype(np.float32)
    session = InferenceSession(model)
    assert [step.kernel.algorithm for step in session.plan_for({}).steps] == [DIRECT_FMA]
    found = session.run(None, {"x": x})[0]
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _relative_error(found, expected) < 1e-5


@pytest.mark.parametrize(
    ("activation", "reference"),
    [
        (helper.make_node("Clip", ["c", "low", "high"], ["y"]), lambda v: np.clip(v, 0.0, 6.0)),
        (helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1), lambda v: np.where(v < 0, 0.1 * v, v)),
    ],
    ids=["clip", "leaky-relu"],
)
def test_a_stem_with_an_activation_the_copy_out_leaves_is_replayed_whole(activation, reference, tmp_path):
    """A direct stem followed by an activation the copy-out does not apply (MobileNet's ReLU6) is captured
    as its share job and a job for the activation: every step of the run replays, none is called from
    Python, and Y is the float64 sum's, run after run."""
    w = RNG.standard_normal((16, 3, 7, 7)).astype(np.float32) * 0.3
    b = RNG.standard_normal(16).astype(np.float32)
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("low", 0.0), ("high", 6.0))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3]), activation],
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), *bounds],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = InferenceSession(model, threads=2, tuning_cache=str(tmp_path / "tuning.jsonl"))
    [step] = session.plan_for({}).steps
    assert step.kernel.algorithm == DIRECT_FMA
    x = RNG.standard_normal((1, 3, 40, 40)).astype(np.float32)
    attrs = ConvAttrs(strides=(2, 2), pads=(3, 3, 3, 3))
    expected = reference(direct_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), attrs))
    for _ in range(4):
        (y,) = session.run(None, {"x": x})
        assert _relative_error(y, expected) < 1e-5
    assert session.replay_report() == {"replayed": [step.node.name], "called": []}
