"""The dense kernel (``jit_dense``) against numpy, and the Gemm nodes bound to it (``kernels.dense``):
which ones run there, their packed weights, and the memory budget."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import dense, jit_dense, jit_lane_gemm
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
from hetflow.devices.cpu.kernels.jit_epilogue import CLIP, LEAKY_RELU, NO_ACTIVATION, RELU
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo, WeightInfo
from hetflow.ops.gemm import GemmAttrs
from hetflow.runtime.budget import transformed_weight_bytes, without_winograd
from hetflow.runtime.session import InferenceSession
from tests.helpers import run_onnxruntime

RNG = np.random.default_rng(11)

# (rows, depth, columns): rows past whole tiles of 6, columns past whole vectors of 16 and panels of 64,
# depth past whole chunks of 256, single rows, columns and depths.
SHAPES = [(1, 1, 1), (4, 33, 10), (6, 256, 64), (7, 257, 65), (13, 600, 130), (16, 800, 500), (20, 3, 17)]
ACTIVATIONS = {
    "none": (NO_ACTIVATION, 0.0, 0.0, lambda v: v),
    "relu": (RELU, 0.0, 0.0, lambda v: np.maximum(v, 0)),
    "clip": (CLIP, -0.5, 0.75, lambda v: np.clip(v, -0.5, 0.75)),
    "leaky": (LEAKY_RELU, 0.1, 0.0, lambda v: np.where(v < 0, 0.1 * v, v)),
}


def _operands(rows: int, depth: int, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = RNG.standard_normal((rows, depth)).astype(np.float32)
    w = RNG.standard_normal((columns, depth)).astype(np.float32)  # B transposed, as a Gemm's transB weight
    bias = RNG.standard_normal(columns).astype(np.float32)
    return a, w, bias


def _reference(a: np.ndarray, w: np.ndarray, bias: np.ndarray, activation: str) -> np.ndarray:
    return ACTIVATIONS[activation][3](a.astype(np.float64) @ w.T.astype(np.float64) + bias)


def _dense(a, b, ldb, panel, bias, activation, columns, shares=1):  # noqa: ANN001, ANN202
    """Every share of ``dense_share`` into a NaN-filled Y."""
    rows, depth = a.shape
    code, alpha, beta, _ = ACTIVATIONS[activation]
    y = np.full((rows, columns), np.nan, np.float32)
    for share in range(shares):
        jit_dense.dense_share(a.reshape(-1), depth, b, ldb, panel, y.reshape(-1), columns, bias,
                              activation_constants(code, alpha, beta), rows, columns, depth, share, shares)  # fmt: skip
    return y


@pytest.mark.parametrize(("rows", "depth", "columns"), SHAPES)
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_packed_panels_match_numpy(rows: int, depth: int, columns: int, activation: str) -> None:
    a, w, bias = _operands(rows, depth, columns)
    panels = jit_dense.packed_panels(w)
    y = _dense(a, panels, jit_dense.TILE_COLUMNS, jit_dense.TILE_COLUMNS * depth, bias, activation, columns)
    np.testing.assert_allclose(y, _reference(a, w, bias, activation), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("rows", "depth", "columns"), SHAPES)
def test_a_plain_row_major_b_matches_numpy(rows: int, depth: int, columns: int) -> None:
    a, w, bias = _operands(rows, depth, columns)
    b = np.ascontiguousarray(w.T).reshape(-1)  # [K, N] as it lies: panels 64 columns wide, rows N apart
    y = _dense(a, b, columns, jit_dense.TILE_COLUMNS, bias, "relu", columns)
    np.testing.assert_allclose(y, _reference(a, w, bias, "relu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shares", [2, 3, 7])
def test_shares_write_every_output_once(shares: int) -> None:
    a, w, bias = _operands(9, 70, 300)
    depth = a.shape[1]
    y = _dense(a, jit_dense.packed_panels(w), 64, 64 * depth, bias, "none", 300, shares)
    np.testing.assert_allclose(y, _reference(a, w, bias, "none"), rtol=1e-4, atol=1e-4)


def test_the_spinning_pool_runs_the_shares() -> None:
    a, w, bias = _operands(16, 300, 200)
    panels = jit_dense.packed_panels(w)
    y = np.full((16, 200), np.nan, np.float32)
    constants = activation_constants(RELU, 0.0, 0.0)
    job = jit_dense.share_job(a.reshape(-1), 300, panels, 64, 64 * 300, y.reshape(-1), 200, bias, constants, 16, 200,
                              300, jit_dense.shares_for(200, 2))  # fmt: skip
    job.run(threads.spin_pool(2))
    np.testing.assert_allclose(y, _reference(a, w, bias, "relu"), rtol=1e-4, atol=1e-4)


# -- Gemm nodes ----------------------------------------------------------------------------------------
def _gemm_node(**attrs: object) -> Node:
    return Node("Gemm", "fc", ["a", "b", "c"], ["y"], attrs=GemmAttrs(**attrs))  # type: ignore[arg-type]


def _infos(rows: int, b_shape: tuple[int, int], weight: bool = True, bias: tuple[int, ...] | None = (500,)):
    b_type = WeightInfo if weight else TensorInfo
    f32 = np.dtype(np.float32)
    return TensorInfo((rows, 800), f32), b_type(b_shape, f32), None if bias is None else TensorInfo(bias, f32)


@pytest.mark.parametrize(
    ("node", "infos", "runs"),
    [
        (_gemm_node(transB=1), _infos(16, (500, 800)), True),
        (_gemm_node(transB=0), _infos(16, (800, 500)), True),
        (_gemm_node(transB=1), _infos(16, (500, 800), bias=(1, 500)), True),
        (_gemm_node(transB=1), _infos(16, (500, 800), bias=None), True),
        (_gemm_node(transB=1), _infos(dense.DENSE_MIN_ROWS - 1, (500, 800)), False),  # GEMV-like: BLAS
        (_gemm_node(transB=1), _infos(16, (500, 800), weight=False), False),  # B not a weight
        (_gemm_node(transB=1, alpha=2.0), _infos(16, (500, 800)), False),
        (_gemm_node(transB=1, transA=1), _infos(16, (500, 800)), False),
        (_gemm_node(transB=1), _infos(16, (500, 800), bias=(16, 500)), False),  # C is not one row of biases
        (_gemm_node(transB=1, beta=0.5), _infos(16, (500, 800)), False),
        (_gemm_node(transB=1, packed_weights=False), _infos(16, (500, 800)), False),  # a budget said no
        (_gemm_node(transB=1), (TensorInfo((16, 800), np.dtype(np.float64)), WeightInfo((500, 800), np.dtype(np.float64)), None), False),
    ],
    ids=["transB", "B", "bias-row", "no-bias", "few-rows", "activation-B", "alpha", "transA", "full-C", "beta",
         "budget", "float64"],
)  # fmt: skip
def test_which_gemms_run_dense(node: Node, infos: tuple, runs: bool) -> None:
    assert dense.runs_dense(node, infos) is runs


def test_large_weights_run_dense_at_every_batch() -> None:
    columns = dense.HELD_PACKED_BYTES // (4 * 800) + 1
    large, small = _infos(1, (columns, 800), bias=None), _infos(1, (columns - 1, 800), bias=None)
    assert dense.runs_dense(_gemm_node(transB=1), large)
    assert not dense.runs_dense(_gemm_node(transB=1), small)  # one row of a small B: the GEMV
    symbolic = (TensorInfo(("N", 800), np.dtype(np.float32)), *large[1:])
    assert dense.runs_dense(_gemm_node(transB=1), symbolic)  # the batch does not matter
    assert not dense.runs_dense(_gemm_node(transB=1, packed_weights=False), large)
    assert not dense.runs_dense(_gemm_node(transB=1), None)  # shapes unknown


@pytest.mark.parametrize("trans_b", [True, False], ids=["transB", "B"])
@pytest.mark.parametrize("block_bytes", [jit_lane_gemm.PACK_BLOCK_BYTES, 3000], ids=["blocks", "small-blocks"])
@pytest.mark.parametrize(("columns", "depth"), [(500, 800), (64, 3), (130, 7), (1, 257)])
def test_panels_read_a_block_at_a_time_match_the_packed_copy(
    monkeypatch, trans_b: bool, block_bytes: int, columns: int, depth: int  # noqa: ANN001
) -> None:
    monkeypatch.setattr(jit_lane_gemm, "PACK_BLOCK_BYTES", block_bytes)
    w = RNG.standard_normal((columns, depth)).astype(np.float32)
    stored = w if trans_b else np.ascontiguousarray(w.T)
    reads: list[int] = []

    def read_rows(start: int, stop: int) -> np.ndarray:
        reads.append(stop - start)
        return stored[start:stop].copy()

    panels = jit_lane_gemm.panels_from_rows(read_rows, columns, depth, trans_b)
    want = np.zeros((-(-columns // 64) * 64, depth), np.float32)
    want[:columns] = w
    np.testing.assert_array_equal(panels, want.reshape(-1, 64, depth).transpose(0, 2, 1).reshape(-1))
    assert sum(reads) == stored.shape[0]


def _fc_model(trans_b: bool, activation: str | None = "Relu", weight_input: bool = False) -> onnx.ModelProto:
    """x [N, 800] -> Gemm 800 -> 500 (+ bias, + activation) -> Gemm 500 -> 10 (B a graph input when
    ``weight_input``)."""
    w1 = RNG.standard_normal((500, 800)).astype(np.float32) / 28
    w2 = RNG.standard_normal((10, 500)).astype(np.float32) / 22
    initializers = [
        numpy_helper.from_array(w1 if trans_b else np.ascontiguousarray(w1.T), "w1"),
        numpy_helper.from_array(RNG.standard_normal(500).astype(np.float32), "b1"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 800])]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, [10, 500]))
    else:
        initializers.append(numpy_helper.from_array(w2, "w2"))
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=int(trans_b))]
    hidden = "h"
    if activation is not None:
        nodes.append(helper.make_node(activation, ["h"], ["h_act"]))
        hidden = "h_act"
    nodes.append(helper.make_node("Gemm", [hidden, "w2"], ["y"], transB=1))
    graph = helper.make_graph(nodes, "fc", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _packed_shapes(monkeypatch) -> list[tuple[int, ...]]:  # noqa: ANN001
    """The shapes of the weights ``dense.PANELS`` packs from now on."""
    packed: list[tuple[int, ...]] = []
    original = dense.PANELS.get
    monkeypatch.setattr(dense.PANELS, "get", lambda b, trans_b: packed.append(b.shape) or original(b, trans_b))
    return packed


@pytest.mark.parametrize("trans_b", [True, False], ids=["transB", "B"])
@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", None])
@pytest.mark.parametrize("session_threads", [1, 2])
def test_a_session_matches_onnxruntime_on_the_dense_kernel(
    monkeypatch, trans_b: bool, activation: str | None, session_threads: int  # noqa: ANN001
) -> None:
    packed = _packed_shapes(monkeypatch)
    model = _fc_model(trans_b, activation)
    session = InferenceSession(model, threads=session_threads)
    for batch in (16, 5):
        x = RNG.standard_normal((batch, 800)).astype(np.float32)
        want = run_onnxruntime(model, {"x": x})[0]
        for _ in range(2):  # the second call reuses the packed weights
            np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert set(packed) == {(500, 800) if trans_b else (800, 500), (10, 500)}


def test_one_example_and_a_b_fed_at_run_time_stay_on_blas(monkeypatch) -> None:  # noqa: ANN001
    packed = _packed_shapes(monkeypatch)
    model = _fc_model(trans_b=True, weight_input=True)
    session = InferenceSession(model, threads=2)
    for batch in (1, 16):
        feeds = {"x": RNG.standard_normal((batch, 800)).astype(np.float32),
                 "w2": RNG.standard_normal((10, 500)).astype(np.float32)}  # fmt: skip
        np.testing.assert_allclose(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-4)
    assert packed == [(500, 800)]  # at batch 16 only, and never the fed B


def test_the_plan_counts_the_packed_weights_and_a_budget_drops_them(monkeypatch) -> None:  # noqa: ANN001
    session = InferenceSession(_fc_model(trans_b=True), threads=2)
    panels = (math.ceil(500 / 64) * 64 * 800 + 64 * 500) * 4
    assert transformed_weight_bytes(session.plan_for({"N": 16})) == panels
    assert transformed_weight_bytes(session.plan_for({"N": 1})) == 0
    fitted = without_winograd(session.plan_for({"N": 16}))
    assert transformed_weight_bytes(fitted) == 0
    assert all(not step.node.attrs.packed_weights for step in fitted.steps)

    packed = _packed_shapes(monkeypatch)
    model = _fc_model(trans_b=True)
    raw = (500 * 800 + 500 + 10 * 500) * 4
    tight = InferenceSession(model, threads=2, memory_budget=raw + (1 << 20))
    x = RNG.standard_normal((16, 800)).astype(np.float32)
    want = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_allclose(tight.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert packed == []
