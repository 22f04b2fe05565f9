"""OpenCL Conv algorithms (im2col + tiled GEMM, Winograd F(2,3), direct, depthwise) against the CPU
device on odd shapes, padding, strides, dilations, groups, batch > 1 and fused activations."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.opencl.kernels.conv import ALGORITHMS, DIRECT
from hetflow.devices.opencl.kernels.gemm import GemmConfig
from hetflow.ops.activation import FusedActivation
from hetflow.ops.conv import DEPTHWISE, IM2COL, WINOGRAD_F23
from tests.devices.opencl_helpers import assert_close, infos, make_node, random, run_both

RNG = np.random.default_rng(1)

#: (X shape, W shape, attrs) of layers every general algorithm must compute.
GENERAL = [
    ((2, 3, 11, 13), (5, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((1, 4, 12, 9), (6, 2, 3, 3), {"pads": (1, 0, 2, 1), "strides": (2, 1), "group": 2}),
    ((2, 8, 7, 9), (16, 8, 1, 1), {}),
    ((1, 5, 9, 9), (7, 5, 3, 3), {"dilations": (2, 2), "pads": (2, 2, 2, 2)}),
    ((3, 6, 10, 10), (4, 6, 5, 3), {"strides": (3, 2), "pads": (2, 1, 0, 1)}),
    ((1, 3, 17, 17), (8, 3, 7, 7), {"strides": (2, 2), "auto_pad": "SAME_UPPER"}),
    ((2, 6, 5, 6), (9, 2, 2, 2), {"group": 3, "strides": (2, 2)}),
]


@pytest.mark.parametrize("algorithm", [IM2COL, DIRECT])
@pytest.mark.parametrize("x_shape, w_shape, attrs", GENERAL)
def test_general_algorithms_match_cpu(opencl, algorithm, x_shape, w_shape, attrs):
    inputs = [random(RNG, *x_shape), random(RNG, *w_shape), random(RNG, w_shape[0])]
    got, expected = run_both(opencl, make_node("Conv", inputs, **attrs), inputs, algorithm)
    assert_close(got[0], expected[0])


WINOGRAD = [
    ((2, 3, 11, 13), (5, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((1, 16, 15, 17), (9, 16, 3, 3), {"pads": (1, 1, 0, 2)}),
    ((2, 7, 6, 5), (4, 7, 3, 3), {}),
    ((1, 2, 3, 3), (3, 2, 3, 3), {"auto_pad": "SAME_LOWER"}),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", WINOGRAD)
def test_winograd_f23_matches_cpu(opencl, x_shape, w_shape, attrs):
    inputs = [random(RNG, *x_shape), random(RNG, *w_shape), random(RNG, w_shape[0])]
    got, expected = run_both(opencl, make_node("Conv", inputs, **attrs), inputs, WINOGRAD_F23)
    assert_close(got[0], expected[0], rtol=2e-5)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 6, 9, 10), (12, 1, 3, 3), {"pads": (1, 1, 1, 1), "group": 6}),
        ((1, 5, 8, 7), (5, 1, 3, 3), {"strides": (2, 2), "pads": (1, 0, 1, 1), "group": 5}),
        ((1, 4, 9, 9), (4, 1, 5, 5), {"dilations": (2, 1), "pads": (4, 2, 4, 2), "group": 4}),
    ],
)
def test_depthwise_matches_cpu(opencl, x_shape, w_shape, attrs):
    inputs = [random(RNG, *x_shape), random(RNG, *w_shape), random(RNG, w_shape[0])]
    got, expected = run_both(opencl, make_node("Conv", inputs, **attrs), inputs, DEPTHWISE)
    assert_close(got[0], expected[0])


@pytest.mark.parametrize(
    "fused",
    [FusedActivation("Relu"), FusedActivation("LeakyRelu", 0.1), FusedActivation("Clip", -0.5, 0.5),
     FusedActivation("Sigmoid"), FusedActivation("Tanh")],
)  # fmt: skip
@pytest.mark.parametrize("algorithm", [IM2COL, WINOGRAD_F23, DIRECT])
def test_fused_bias_and_activation(opencl, algorithm, fused):
    inputs = [random(RNG, 2, 4, 7, 6), random(RNG, 5, 4, 3, 3), random(RNG, 5)]
    node = make_node("Conv", inputs, pads=(1, 1, 1, 1), fused=fused)
    got, expected = run_both(opencl, node, inputs, algorithm)
    assert_close(got[0], expected[0], rtol=2e-5)


@pytest.mark.parametrize("algorithm", [IM2COL, WINOGRAD_F23, DIRECT])
def test_without_bias(opencl, algorithm):
    inputs = [random(RNG, 1, 3, 8, 8), random(RNG, 4, 3, 3, 3)]
    got, expected = run_both(opencl, make_node("Conv", inputs), inputs, algorithm)
    assert_close(got[0], expected[0], rtol=2e-5)


def test_im2col_with_another_gemm_configuration(opencl, monkeypatch):
    # The im2col kernel writes the GEMM's panels for whatever configuration the device chooses.
    inputs = [random(RNG, 2, 4, 9, 7), random(RNG, 6, 2, 3, 3), random(RNG, 6)]
    node = make_node("Conv", inputs, group=2, pads=(1, 1, 1, 1))
    for config in (GemmConfig(rm=2, rn=1, vw=4, kt=8, wgm=2, wgn=2, local=1), GemmConfig(rm=8, rn=1, vw=16)):
        monkeypatch.setattr(opencl, "gemm_config", lambda *args, config=config: config)
        got, expected = run_both(opencl, node, inputs, IM2COL)
        assert_close(got[0], expected[0])


def test_read_only_weights_are_packed_once_per_array(opencl):
    inputs = [random(RNG, 1, 3, 6, 6), random(RNG, 4, 3, 3, 3)]
    node = make_node("Conv", inputs, pads=(1, 1, 1, 1))
    before = len(opencl.resident)
    run_both(opencl, node, inputs, IM2COL)
    assert len(opencl.resident) == before  # writable: packed afresh on every call
    inputs[1].flags.writeable = False  # as a graph's initializers are
    got, expected = run_both(opencl, node, inputs, IM2COL)
    assert len(opencl.resident) == before + 1
    again, _ = run_both(opencl, node, inputs, IM2COL)
    assert len(opencl.resident) == before + 1
    assert_close(got[0], expected[0])
    assert_close(again[0], expected[0])


def test_algorithms_are_registered_like_the_cpu_device(opencl):
    assert [k.algorithm for k in opencl.kernels.kernels["Conv"]] == list(ALGORITHMS)
    inputs = [random(RNG, 1, 4, 8, 8), random(RNG, 4, 1, 3, 3)]
    node = make_node("Conv", inputs, group=4)
    assert [k.algorithm for k in opencl.kernels.candidates(node, infos(inputs))] == [DEPTHWISE, IM2COL, DIRECT]
    strided = make_node("Conv", inputs, strides=(2, 2), group=4)
    reason = [k for k in opencl.kernels.kernels["Conv"] if k.algorithm == WINOGRAD_F23][0].reason_unsupported(
        strided, infos(inputs)
    )
    assert reason is not None and "winograd" in reason


@pytest.mark.parametrize("algorithm", [IM2COL, DIRECT])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [((2, 3, 17), (5, 3, 4), {"pads": (2, 1), "strides": (2,)}),
     ((1, 4, 9), (6, 2, 3), {"group": 2, "dilations": (2,), "auto_pad": "SAME_UPPER"})],
)  # fmt: skip
def test_1d_convolution_runs_as_2d(opencl, algorithm, x_shape, w_shape, attrs):
    inputs = [random(RNG, *x_shape), random(RNG, *w_shape), random(RNG, w_shape[0])]
    got, expected = run_both(opencl, make_node("Conv", inputs, **attrs), inputs, algorithm)
    assert_close(got[0], expected[0])


def test_3d_convolution_is_left_to_the_cpu(opencl):
    inputs = [random(RNG, 1, 2, 4, 4, 4), random(RNG, 3, 2, 3, 3, 3)]
    reason = opencl.kernels.reason_unsupported(make_node("Conv", inputs), infos(inputs))
    assert reason is not None and "2-D" in reason


def test_layer_sizes_are_kept_per_attributes_and_shapes():
    from hetflow.devices.opencl.kernels.conv import _layer
    from hetflow.graph import Node
    from hetflow.ops.conv import ConvAttrs

    padded = Node("Conv", "a", ["x", "w"], ["y"], attrs=ConvAttrs(pads=(1, 1, 1, 1)))
    same = Node("Conv", "b", ["x", "w"], ["y"], attrs=ConvAttrs(pads=(1, 1, 1, 1)))
    strided = Node("Conv", "c", ["x", "w"], ["y"], attrs=ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)))
    layer = _layer(padded, (1, 4, 9, 9), (8, 4, 3, 3))
    assert _layer(same, [1, 4, 9, 9], np.array([8, 4, 3, 3])) is layer  # one entry for equal attributes
    assert (layer.oh, layer.ow) == (9, 9)
    assert _layer(strided, (1, 4, 9, 9), (8, 4, 3, 3)).oh == 5
    assert _layer(padded, (2, 4, 9, 9), (8, 4, 3, 3)).n == 2
