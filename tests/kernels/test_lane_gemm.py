"""The GEMM with the kernels in the vector lanes (``jit_lane_gemm``) against numpy, the pointwise Conv
and the deep im2col Conv bound to it where ``own_gemm.lanes_pay``, and its packed weights under a
memory budget."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow.devices.base import Kernel
from hetflow.devices.cpu import CPUDevice, threads
from hetflow.devices.cpu.kernels import jit_lane_gemm, jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import array_infos
from hetflow.ops.conv import POINTWISE, ConvAttrs
from hetflow.runtime.budget import transformed_weight_bytes, without_winograd
from hetflow.runtime.session import InferenceSession

RNG = np.random.default_rng(5)
POINTWISE_KERNEL: Kernel = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == POINTWISE)

# (kernels, depth, positions): kernels past whole tiles of 64 and vectors of 16, positions past whole
# tiles of 6, depth past whole chunks, one position.
SHAPES = [(1, 1, 1), (64, 300, 49), (70, 257, 13), (200, 513, 5), (1000, 40, 1), (130, 20, 7)]


def _lanes(w, x, bias, residual, low, high, shares=1, parts=1):  # noqa: ANN001, ANN202
    """Every share of ``lane_share`` on numpy arrays: X ``[N, K, P]``; Y ``[N, M, P]`` (NaN-filled first)."""
    batch, _, positions = x.shape
    kernels = w.shape[0]
    y = np.full((batch, kernels, positions), np.nan, np.float32)
    flat_y, y_image = flat_images(y)
    flat_r, r_image = (flat_y, -1) if residual is None else flat_images(residual)
    packed = jit_lane_gemm.packed_weights(w, kernels)
    for share in range(shares):
        jit_lane_gemm.lane_share(packed, x, flat_y, y_image, flat_r, r_image, bias, np.float32(low), np.float32(high),
                                 kernels, parts, share, shares)  # fmt: skip
    return y


@pytest.mark.parametrize(("kernels", "depth", "positions"), SHAPES)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize(("low", "high"), [(-math.inf, math.inf), (0.0, 6.0)], ids=["none", "relu6"])
def test_lanes_match_numpy(kernels: int, depth: int, positions: int, residual: bool, low: float, high: float) -> None:
    w = RNG.standard_normal((kernels, depth)).astype(np.float32)
    x = RNG.standard_normal((2, depth, positions)).astype(np.float32)
    bias = RNG.standard_normal(kernels).astype(np.float32)
    r = RNG.standard_normal((2, kernels, positions)).astype(np.float32) if residual else None
    y = _lanes(w, x, bias, r, low, high)
    want = np.matmul(w, x) + bias[:, None] + (0 if r is None else r)
    np.testing.assert_allclose(y, np.clip(want, low, high), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("shares", "parts"), [(2, 1), (3, 1), (5, 1), (4, 2), (7, 3), (10, 2), (1, 9)])
def test_shares_write_every_output_once(shares: int, parts: int) -> None:
    """Kernel tiles, or parts of their positions, shared out: together the shares write all of Y (a
    missed tile or part stays NaN), each position of a part with its own residual."""
    w = RNG.standard_normal((300, 64)).astype(np.float32)
    x = RNG.standard_normal((2, 64, 49)).astype(np.float32)
    r = RNG.standard_normal((2, 300, 49)).astype(np.float32)
    y = _lanes(w, x, np.zeros(300, np.float32), r, -math.inf, math.inf, shares, parts)
    np.testing.assert_allclose(y, np.matmul(w, x) + r, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("kernels", "positions", "threads", "parts"),
    [(320, 49, 2, 2), (960, 49, 2, 2), (1280, 49, 2, 1), (2048, 49, 2, 1), (320, 49, 1, 1), (320, 5, 2, 1),
     (320, 7, 2, 2), (1000, 1, 2, 1), (192, 49, 4, 4)],
)  # fmt: skip
def test_a_tile_is_split_by_positions_only_where_the_tiles_do_not_share_out_evenly(
    kernels: int, positions: int, threads: int, parts: int
) -> None:
    assert jit_lane_gemm.position_parts(kernels, positions, threads) == parts


def test_packed_weights_lay_each_tile_depth_major_with_zero_kernels_past_the_end() -> None:
    w = RNG.standard_normal((70, 3, 1, 1)).astype(np.float32)
    packed = jit_lane_gemm.packed_weights(w, 70).reshape(2, 3, jit_lane_gemm.TILE_KERNELS)
    np.testing.assert_array_equal(packed[0], w.reshape(70, 3)[:64].T)
    np.testing.assert_array_equal(packed[1, :, :6], w.reshape(70, 3)[64:].T)
    assert not packed[1, :, 6:].any()


@pytest.mark.parametrize(
    ("kernels", "depth", "positions", "groups", "expected"),
    [
        (512, 4608, 49, 1, True),  # ResNet-50's 3x3 layers on 7x7: 49 of 64 position lanes
        (512, 2048, 49, 1, True),
        (2048, 512, 49, 1, False),  # too shallow for weights this large (4 MB: they come from DRAM)
        (960, 160, 49, 1, True),  # small weights (600 KB): the FMAs bound the product
        (1280, 320, 49, 1, True),
        (1024, 1024, 36, 1, True),  # deep enough whatever W's size
        (2048, 320, 49, 1, False),  # 2.6 MB of weights
        (1000, 1024, 1, 1, True),  # a classifier as a 1x1 Conv on a 1x1 map
        (160, 1024, 49, 1, False),  # 160 of 192 kernel lanes: no better than 49 of 64
        (512, 128, 49, 1, False),  # too shallow for the scattering epilogue too
        (256, 1024, 196, 1, False),  # 14x14: 196 of 208 position lanes
        (512, 512, 49, 2, False),  # grouped
    ],
)
def test_lanes_pay_where_positions_waste_lanes_and_kernels_fill_them(
    kernels: int, depth: int, positions: int, groups: int, expected: bool
) -> None:
    assert own_gemm.lanes_pay(kernels, depth, positions, groups) is expected
    assert not own_gemm.lanes_pay(kernels, depth, positions, groups, batch=16)  # a batch keeps the tiles


# -- bound to a Conv -----------------------------------------------------------------------------------
def _deep_pointwise(residual: bool, packed_weights: bool = True):  # noqa: ANN202
    """A 1x1 Conv 1024 -> 128 on a 7x7 map (one image) with a fused Relu: the lanes pay."""
    x = RNG.standard_normal((1, 1024, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((128, 1024, 1, 1)).astype(np.float32) / 32
    b = RNG.standard_normal(128).astype(np.float32)
    r = RNG.standard_normal((1, 128, 7, 7)).astype(np.float32) if residual else None
    attrs = ConvAttrs(fused=FusedActivation("Relu"), residual=residual, packed_weights=packed_weights)
    node = Node("Conv", "conv", ["x", "w", "b", *(["r"] if residual else [])], ["y"], attrs)
    return node, [x, w, b, *([r] if residual else [])]


@pytest.mark.parametrize("spin", [False, True], ids=["own-threads", "spinning"])
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
def test_bound_pointwise_runs_in_lanes_and_matches_blas(spin: bool, residual: bool, monkeypatch) -> None:  # noqa: ANN001
    node, arrays = _deep_pointwise(residual)
    expected = POINTWISE_KERNEL.fn(node, arrays)[0]
    out = [np.full(expected.shape, np.nan, np.float32)]
    call = POINTWISE_KERNEL.bind(node, array_infos(arrays), out, None)
    monkeypatch.setattr(jit_tile_gemm, "gemm_items", lambda *a: pytest.fail("the tile GEMM ran"))
    with threads.own_threads(2, spin=spin):
        [y] = call(arrays)
    assert y is out[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    assert own_gemm.LANE_WEIGHTS.get(arrays[1], 128).size == 128 * 1024  # packed once, kept for the next call


def test_a_node_without_packed_weights_stays_on_the_tiles(monkeypatch) -> None:  # noqa: ANN001
    node, arrays = _deep_pointwise(False, packed_weights=False)
    call = POINTWISE_KERNEL.bind(node, array_infos(arrays), None, None)
    monkeypatch.setattr(jit_lane_gemm, "lane_share", lambda *a: pytest.fail("the lane GEMM ran"))
    with threads.own_threads(2):
        [y] = call(arrays)
    np.testing.assert_allclose(y, POINTWISE_KERNEL.fn(node, arrays)[0], rtol=1e-5, atol=1e-4)


def _stage_model() -> bytes:
    """A ResNet-like 7x7 stage: 3x3 1024 -> 128 (im2col columns 9216 deep), 1x1 128 -> 1024 plus the input
    (a folded residual; 128 deep: tiles), Relu; 1x1 1024 -> 128 (lanes) and 128 -> 70 (tiles)."""
    rng = np.random.default_rng(2)
    weights = {
        "w1": rng.standard_normal((128, 1024, 3, 3)).astype(np.float32) / 96,
        "w2": rng.standard_normal((1024, 128, 1, 1)).astype(np.float32) / 11,
        "w3": rng.standard_normal((128, 1024, 1, 1)).astype(np.float32) / 32,
        "w4": rng.standard_normal((70, 128, 1, 1)).astype(np.float32) / 11,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c", "x"], ["d"]),
        helper.make_node("Relu", ["d"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["f"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["f", "w4"], ["y"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "stage", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 70, 7, 7])],
        [numpy_helper.from_array(w, name) for name, w in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _reference(x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(_stage_model(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_session_matches_onnxruntime_with_its_7x7_layers_in_lanes(monkeypatch) -> None:  # noqa: ANN001
    from hetflow.ops import conv

    monkeypatch.setattr(conv, "_winograd_in_lanes", lambda dtype: False)  # its 3x3 layer on im2col's lanes
    x = RNG.standard_normal((1, 1024, 7, 7)).astype(np.float32)
    packed = []
    original = own_gemm.LANE_WEIGHTS.get
    monkeypatch.setattr(own_gemm.LANE_WEIGHTS, "get", lambda w, kernels: packed.append(w.shape) or original(w, kernels))
    session = InferenceSession(_stage_model(), threads=2)
    plan = session.plan_for({})
    assert transformed_weight_bytes(plan) == (128 * 1024 * 9 + 128 * 1024) * 4  # the two that pay, packed
    for _ in range(2):
        np.testing.assert_allclose(session.run(None, {"x": x})[0], _reference(x), rtol=1e-4, atol=1e-4)
    assert set(packed) == {(128, 1024, 3, 3), (128, 1024, 1, 1)}


def test_a_plan_fitted_to_a_budget_keeps_no_packed_weights() -> None:
    session = InferenceSession(_stage_model(), threads=2)
    plan = session.plan_for({})
    assert transformed_weight_bytes(plan) > 0
    fitted = without_winograd(plan)
    assert transformed_weight_bytes(fitted) == 0
    assert all(not s.node.attrs.packed_weights for s in fitted.steps if s.node.op_type == "Conv")


def test_a_tight_budget_runs_the_stage_without_packing(monkeypatch) -> None:  # noqa: ANN001
    x = RNG.standard_normal((1, 1024, 7, 7)).astype(np.float32)
    raw = (128 * 1024 * 9 + 1024 * 128 + 128 * 1024 + 70 * 128) * 4
    monkeypatch.setattr(jit_lane_gemm, "lane_share", lambda *a: pytest.fail("the lane GEMM ran"))
    monkeypatch.setattr(jit_lane_gemm, "job_address", lambda: pytest.fail("the lane GEMM ran"))
    session = InferenceSession(_stage_model(), threads=2, memory_budget=raw + (4 << 20))
    np.testing.assert_allclose(session.run(None, {"x": x})[0], _reference(x), rtol=1e-4, atol=1e-4)
