"""OpenCL kernels against the CPU device's kernels (and numpy) on odd shapes.

The device and its programs are shared by every test (``opencl`` fixture), so each kernel variant is
built once per session (about half a second each on PoCL).
"""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.opencl.kernels.elementwise import BINARY_OPS, UNARY_OPS, broadcast_meta
from hetflow.devices.opencl.kernels.gemm import (
    GEMM_SPACE,
    GemmConfig,
    gemm_configs,
    prepare_gemm,
    run_gemm,
)
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.gemm import GemmAttrs
from hetflow.ops.softmax import SoftmaxAttrs

CPU = CPUDevice()
RNG = np.random.default_rng(0)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _node(op_type: str, attrs: object = None, inputs: int = 2) -> Node:
    return Node(op_type, f"{op_type.lower()}0", [f"i{i}" for i in range(inputs)], ["y"], attrs=attrs)


def _both(opencl, node: Node, inputs: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    infos = [None if x is None else TensorInfo(x.shape, x.dtype) for x in inputs]
    kernel = opencl.kernels.lookup(node, infos)
    assert kernel is not None, opencl.kernels.reason_unsupported(node, infos)
    [got] = kernel.fn(node, inputs)
    [expected] = CPU.kernels.lookup(node, infos).fn(node, [None if x is None else x.copy() for x in inputs])
    assert got.shape == expected.shape and got.dtype == expected.dtype
    return got, expected


def _close(got: np.ndarray, expected: np.ndarray, rtol: float = 1e-5) -> None:
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * scale)


# -- GEMM --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 13, 5), (65, 33, 129), (256, 256, 256)])
def test_matmul_matches_cpu_on_odd_sizes(opencl, m, k, n):
    got, expected = _both(opencl, _node("MatMul"), [_random(m, k), _random(k, n)])
    _close(got, expected)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((2, 3, 7, 5), (5, 9)),
        ((3, 7, 5), (3, 5, 4)),
        ((1, 7, 5), (4, 5, 6)),
        ((5,), (5, 3)),
        ((2, 4, 5), (5,)),
    ],
)
def test_matmul_batches_broadcasts_and_vectors(opencl, a_shape, b_shape):
    got, expected = _both(opencl, _node("MatMul"), [_random(*a_shape), _random(*b_shape)])
    _close(got, expected)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (9,), (1, 9), (11, 1), (11, 9)])
def test_gemm_transposes_alpha_beta_and_bias(opencl, trans_a, trans_b, c_shape):
    m, k, n = 11, 6, 9
    a = _random(k, m) if trans_a else _random(m, k)
    b = _random(n, k) if trans_b else _random(k, n)
    inputs = [a, b] if c_shape is None else [a, b, _random(*c_shape)]
    attrs = GemmAttrs(alpha=0.5, beta=-2.0, transA=trans_a, transB=trans_b)
    got, expected = _both(opencl, _node("Gemm", attrs, len(inputs)), inputs)
    _close(got, expected)


@pytest.mark.parametrize(
    "fused",
    [FusedActivation("Relu"), FusedActivation("LeakyRelu", 0.1), FusedActivation("Clip", -0.5, 0.5),
     FusedActivation("Sigmoid"), FusedActivation("Tanh")],
)  # fmt: skip
def test_gemm_fused_activation(opencl, fused):
    inputs = [_random(10, 7), _random(7, 12), _random(12)]
    got, expected = _both(opencl, _node("Gemm", GemmAttrs(fused=fused), 3), inputs)
    _close(got, expected)


@pytest.mark.parametrize(
    "config",
    [GemmConfig(rm=1, rn=1, vw=1, kt=8, wgm=2, wgn=2, local=1), GemmConfig(rm=2, rn=2, vw=4, kt=8, wgm=2, wgn=4,
     local=1), GemmConfig(rm=8, rn=1, vw=16, kt=16, wgm=1, wgn=1, local=0)],
)  # fmt: skip
def test_other_points_of_the_space_are_correct(opencl, config):
    a, b = _random(1, 37, 21), _random(1, 21, 45)
    _close(run_gemm(opencl, a, b, config=config), a @ b)


def test_prepared_launch_survives_other_launches_of_the_same_kernel(opencl):
    # Kernel objects are shared per program variant: a launch must not run with another's arguments.
    a, b = _random(1, 9, 5), _random(1, 5, 7)
    launch = prepare_gemm(opencl, a, b)
    other = _random(1, 30, 5)
    _close(run_gemm(opencl, other, b), other @ b)
    launch.enqueue()
    _close(launch.result(), a @ b)


def test_concurrent_launches_from_threads(opencl):
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(_random(1, 8 + i, 6), _random(1, 6, 5 + i)) for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: run_gemm(opencl, *p), pairs))
    for (a, b), got in zip(pairs, results):
        _close(got, a @ b)


def test_gemm_space_is_declared_and_enumerable():
    assert {k.name for k in GEMM_SPACE} == set(GemmConfig.__dataclass_fields__)
    configs = gemm_configs(max_work_group=64)
    assert GemmConfig() in configs
    assert all(c.wgm * c.wgn <= 64 for c in configs)


def test_float64_is_left_to_the_cpu(opencl):
    infos = [TensorInfo((2, 2), np.dtype(np.float64))] * 2
    assert "float32" in opencl.kernels.reason_unsupported(_node("MatMul"), infos)


# -- elementwise ---------------------------------------------------------------------------------------

BROADCASTS = [((5, 7), (5, 7)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((2, 3, 4, 5), (5,)), ((1, 6), (3, 1))]


@pytest.mark.parametrize("op_type", sorted(BINARY_OPS))
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS)
def test_binary_ops_broadcast_like_numpy(opencl, op_type, a_shape, b_shape):
    a, b = _random(*a_shape), _random(*b_shape)
    if op_type == "Div":
        b = np.where(np.abs(b) < 0.1, np.float32(1), b)
    got, expected = _both(opencl, _node(op_type), [a, b])
    _close(got, expected, rtol=1e-6)


def test_broadcast_meta_gives_zero_strides_on_broadcast_axes():
    meta = broadcast_meta((3, 4, 5), (4, 1), (3, 4, 5)).reshape(3, -1)
    assert list(meta[0, :3]) == [3, 4, 5]
    assert list(meta[1, :3]) == [0, 1, 0]
    assert list(meta[2, :3]) == [20, 5, 1]


UNARY_CASES = {
    "Relu": (None, []),
    "Sigmoid": (None, []),
    "Tanh": (None, []),
    "LeakyRelu": ("leaky", []),
    "Clip": (None, [np.float32(-0.7), np.float32(1.2)]),
}


@pytest.mark.parametrize("op_type", sorted(UNARY_OPS))
@pytest.mark.parametrize("shape", [(1,), (3, 17), (2, 3, 5, 7)])
def test_unary_ops_match_cpu(opencl, op_type, shape):
    from hetflow.ops.activation import LeakyReluAttrs

    attrs = LeakyReluAttrs(alpha=0.2) if op_type == "LeakyRelu" else None
    bounds = UNARY_CASES[op_type][1]
    x = _random(*shape) * 4
    got, expected = _both(opencl, _node(op_type, attrs, 1 + len(bounds)), [x, *bounds])
    _close(got, expected, rtol=1e-6)


def test_clip_with_one_bound_and_nan(opencl):
    x = np.array([-3, -0.5, np.nan, 2], np.float32)
    got, expected = _both(opencl, _node("Clip", None, 3), [x, None, np.array(1, np.float32)])
    np.testing.assert_array_equal(got, expected)


# -- softmax -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (3, 1000), (2, 3, 7)])
def test_softmax_last_axis(opencl, shape):
    x = _random(*shape) * 10
    got, expected = _both(opencl, _node("Softmax", SoftmaxAttrs(axis=-1), 1), [x])
    _close(got, expected)


def test_softmax_coerced_2d(opencl):
    x = _random(2, 3, 5)
    got, expected = _both(opencl, _node("Softmax", SoftmaxAttrs(axis=1, coerce_2d=1), 1), [x])
    _close(got, expected)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [((2, 3, 4), 1), ((3, 5), 0), ((2, 3, 7), -1), ((4,), 0)])
def test_softmax_on_any_axis(opencl, op_type, shape, axis):
    x = _random(*shape) * 5
    got, expected = _both(opencl, _node(op_type, SoftmaxAttrs(axis=axis), 1), [x])
    _close(got, expected)


def test_log_softmax_coerced_2d(opencl):
    x = _random(2, 3, 5)
    got, expected = _both(opencl, _node("LogSoftmax", SoftmaxAttrs(axis=1, coerce_2d=1), 1), [x])
    _close(got, expected)
