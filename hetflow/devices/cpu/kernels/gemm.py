"""CPU kernels: Gemm and MatMul through BLAS (``np.matmul``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node


@cpu_kernel("Gemm")
def gemm(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``alpha * A' @ B' + beta * C``, then the fused activation; float and integer types, dtype preserved.

    Transposes are views (BLAS reads them with its transpose flags, no copy). With the default
    ``alpha == beta == 1`` the result is one BLAS call plus one in-place add of ``C``; a fused
    activation (``attrs.fused``, set by ``passes.fuse_activation``) is applied in place after it.
    """
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    attrs = node.attrs
    y = np.matmul(a.T if attrs.transA else a, b.T if attrs.transB else b)
    if attrs.alpha != 1:
        y = _scaled(y, attrs.alpha, out=y)
    if c is not None and attrs.beta != 0:
        # NOTE: C broadcasts unidirectionally to Y, so adding it in place never reshapes Y.
        y += c if attrs.beta == 1 else _scaled(c, attrs.beta)
    apply_activation(y, attrs.fused)
    return [y]


def _scaled(x: np.ndarray, factor: float, out: np.ndarray | None = None) -> np.ndarray:
    """``factor * x`` in x's dtype (integers are scaled exactly in float64, then truncated)."""
    if x.dtype.kind == "f":
        return np.multiply(x, x.dtype.type(factor), out=out)
    return (x * factor).astype(x.dtype)


@cpu_kernel("MatMul")
def matmul(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """numpy ``matmul`` (batched, broadcasting, 1-D operands); float and integer types.

    A stack of matrices times a single matrix is folded into one large GEMM, which BLAS runs far
    faster than numpy's loop of small ones.
    """
    a, b = inputs
    assert a is not None and b is not None
    if a.ndim > 2 and b.ndim == 2 and a.size:
        rows = np.matmul(a.reshape(-1, a.shape[-1]), b)
        return [rows.reshape(*a.shape[:-1], b.shape[-1])]
    return [np.asarray(np.matmul(a, b))]
