"""Gemm and MatMul: ONNX Runtime parity on odd and broadcast shapes, shape errors, symbolic batch, cost."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.errors import InvalidModelError
from hetflow.ops import GemmDims
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(3)
M, K, N = 7, 5, 3


def _data(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _gemm_operands(trans_a: int, trans_b: int) -> tuple[np.ndarray, np.ndarray]:
    a = _data(K, M) if trans_a else _data(M, K)
    b = _data(N, K) if trans_b else _data(K, N)
    return a, b


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (N,), (M, 1), (1, N), (M, N)])
def test_gemm_matches_onnxruntime(trans_a, trans_b, c_shape):
    a, b = _gemm_operands(trans_a, trans_b)
    constants = {} if c_shape is None else {"c": _data(*c_shape)}
    inputs = ["a", "b"] if c_shape is None else ["a", "b", "c"]
    assert_matches_onnxruntime(
        "Gemm", inputs, {"a": a, "b": b}, constants, transA=trans_a, transB=trans_b, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(("alpha", "beta"), [(2.5, 1.0), (1.0, 0.5), (0.25, -3.0), (1.0, 0.0)])
def test_gemm_alpha_beta_match_onnxruntime(alpha, beta):
    a, b = _gemm_operands(1, 0)
    assert_matches_onnxruntime(
        "Gemm", ["a", "b", "c"], {"a": a, "b": b}, {"c": _data(N)}, alpha=alpha, beta=beta, transA=1,
        rtol=1e-5, atol=1e-5,
    )


def test_gemm_float64_and_c_fed_at_run_time():
    a, b, c = _data(M, K, dtype=np.float64), _data(K, N, dtype=np.float64), _data(M, N, dtype=np.float64)
    y = assert_matches_onnxruntime("Gemm", ["a", "b", "c"], {"a": a, "b": b, "c": c}, alpha=0.5, beta=2.0)
    assert y.dtype == np.float64


def test_gemm_integer_types_are_exact():
    a = RNG.integers(-20, 20, (M, K)).astype(np.int32)
    b = RNG.integers(-20, 20, (K, N)).astype(np.int32)
    c = RNG.integers(-20, 20, (N,)).astype(np.int32)
    y = run_hetflow(node_model("Gemm", ["a", "b", "c"], {"a": a, "b": b}, {"c": c}), {"a": a, "b": b})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, a @ b + c)


def test_gemm_does_not_modify_its_inputs():
    a, b, c = _data(M, K), _data(K, N), _data(M, N)
    copies = [a.copy(), b.copy(), c.copy()]
    feeds = {"a": a, "b": b, "c": c}
    run_hetflow(node_model("Gemm", ["a", "b", "c"], feeds, alpha=2.0), feeds)
    for original, copy in zip((a, b, c), copies):
        np.testing.assert_array_equal(original, copy)


MATMUL_SHAPES = [
    ((M, K), (K, N)),
    ((2, M, K), (K, N)),  # stack times one matrix: folded into one GEMM
    ((2, 3, M, K), (K, N)),
    ((2, M, K), (2, K, N)),
    ((1, M, K), (4, K, N)),
    ((2, 1, M, K), (3, K, N)),
    ((K, N), (2, N, M)),
    ((K,), (K,)),
    ((K,), (K, N)),
    ((K,), (2, K, N)),
    ((2, M, K), (K,)),
    ((M, K), (K,)),
    ((1, K), (K, 1)),
]


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_matches_onnxruntime(a_shape, b_shape):
    a, b = _data(*a_shape), _data(*b_shape)
    y = assert_matches_onnxruntime("MatMul", ["a", "b"], {"a": a, "b": b}, rtol=1e-5, atol=1e-5)
    assert y.shape == np.matmul(a, b).shape


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES[:6], ids=lambda s: "x".join(map(str, s)))
def test_matmul_int64_matches_numpy(a_shape, b_shape):
    a = RNG.integers(-9, 9, a_shape).astype(np.int64)
    b = RNG.integers(-9, 9, b_shape).astype(np.int64)
    y = run_hetflow(node_model("MatMul", ["a", "b"], {"a": a, "b": b}), {"a": a, "b": b})
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, np.matmul(a, b))


def test_matmul_with_a_non_contiguous_stack():
    # A transposed view fed into the folded path must give the same result as numpy.
    a = np.ascontiguousarray(_data(M, 2, K).transpose(1, 0, 2))[:, ::2]
    b = _data(K, N)
    y = run_hetflow(node_model("MatMul", ["a", "b"], {"a": a, "b": b}), {"a": a, "b": b})
    np.testing.assert_allclose(y, np.matmul(a, b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "message"),
    [
        ((3, 4), (5, 6), r"reduction dimensions differ: A \[3, 4\] has K=4, B \[5, 6\] has K=5"),
        ((4,), (5,), "K=4.*K=5"),
        ((2, 3, 4), (3, 4, 5), "batch dimensions of .* do not broadcast"),
    ],
)
def test_matmul_mismatched_shapes_are_rejected(a_shape, b_shape, message):
    a, b = _data(*a_shape), _data(*b_shape)
    model = node_model("MatMul", ["a", "b"], {"a": a, "b": b})
    with pytest.raises(InvalidModelError, match=message):
        run_hetflow(model, {"a": a, "b": b})


def test_matmul_dtype_mismatch_is_rejected():
    a, b = _data(3, 4), _data(4, 5, dtype=np.float64)
    with pytest.raises(InvalidModelError, match="different dtypes"):
        run_hetflow(node_model("MatMul", ["a", "b"], {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize(
    ("attrs", "b_shape", "c_shape", "message"),
    [
        ({}, (6, N), None, "K=5.*K=6"),
        ({"transB": 1}, (K, N), None, "K=5.*K=3"),
        ({}, (K, N), (M,), r"C of shape \[7\] does not broadcast to \[7, 3\]"),
        ({}, (K, N), (2, M, N), "does not broadcast"),
        ({}, (1, K, N), None, "2-D A and B"),
    ],
)
def test_gemm_bad_shapes_are_rejected(attrs, b_shape, c_shape, message):
    a, b = _data(M, K), _data(*b_shape)
    constants = {} if c_shape is None else {"c": _data(*c_shape)}
    inputs = ["a", "b"] if c_shape is None else ["a", "b", "c"]
    model = node_model("Gemm", inputs, {"a": a, "b": b}, constants, **attrs)
    with pytest.raises(InvalidModelError, match=message):
        run_hetflow(model, {"a": a, "b": b})


def test_symbolic_batch_shapes():
    a, b = _data(2, M, K), _data(K, N)
    matmul = node_model("MatMul", ["a", "b"], {"a": a}, {"b": b}, shapes={"a": ["N", M, K]})
    assert inferred_shape(matmul) == ("N", M, N)
    batched = node_model(
        "MatMul", ["a", "b"], {"a": a, "b": _data(2, K, N)}, shapes={"a": ["N", M, K], "b": ["N", K, N]}
    )
    assert inferred_shape(batched) == ("N", M, N)
    gemm = node_model(
        "Gemm", ["a", "b", "c"], {"a": _data(2, K)}, {"b": b, "c": _data(N)}, shapes={"a": ["N", K]}
    )
    assert inferred_shape(gemm) == ("N", N)
    gemm_t = node_model("Gemm", ["a", "b"], {"a": _data(K, 2)}, {"b": b}, shapes={"a": [K, "N"]}, transA=1)
    assert inferred_shape(gemm_t) == ("N", N)


def test_symbolic_batch_runs_with_several_batch_sizes():
    b = _data(K, N)
    model = node_model("MatMul", ["a", "b"], {"a": _data(1, K)}, {"b": b}, shapes={"a": ["N", K]})
    for batch in (1, 4, 9):
        a = _data(batch, K)
        np.testing.assert_allclose(run_hetflow(model, {"a": a}), a @ b, rtol=1e-5, atol=1e-6)


def test_gemm_cost():
    plain = node_cost("Gemm", [(M, K), (K, N), (N,)])
    assert plain.macs == M * N * K
    assert plain.gemm == GemmDims(n=N, m=M, k=K, count=1)
    assert plain.flops == M * N  # adding C
    assert plain.bytes_read == 4 * (M * K + K * N + N) and plain.bytes_written == 4 * M * N
    scaled = node_cost("Gemm", [(K, M), (N, K), (M, N)], transA=1, transB=1, alpha=2.0, beta=0.5)
    assert scaled.gemm == GemmDims(n=N, m=M, k=K, count=1)
    assert scaled.flops == 3 * M * N  # scale product, scale C, add
    no_bias = node_cost("Gemm", [(M, K), (K, N)])
    assert no_bias.flops == 0 and no_bias.macs == M * N * K


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "dims"),
    [
        ((M, K), (K, N), GemmDims(n=N, m=M, k=K)),
        ((2, 3, M, K), (2, 3, K, N), GemmDims(n=N, m=M, k=K, count=6)),
        ((1, M, K), (4, K, N), GemmDims(n=N, m=M, k=K, count=4)),
        ((4, M, K), (K, N), GemmDims(n=N, m=4 * M, k=K, count=1)),  # folded into one GEMM
        ((K,), (K,), GemmDims(n=1, m=1, k=K)),
        ((K,), (3, K, N), GemmDims(n=N, m=1, k=K, count=3)),
        ((2, M, K), (K,), GemmDims(n=1, m=2 * M, k=K)),
    ],
)
def test_matmul_cost(a_shape, b_shape, dims):
    cost = node_cost("MatMul", [a_shape, b_shape])
    assert cost.gemm == dims
    independent_macs = int(np.prod(np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape)) * K
    assert cost.macs == independent_macs
    assert cost.bytes_read == 4 * (int(np.prod(a_shape)) + int(np.prod(b_shape)))
