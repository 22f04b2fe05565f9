"""CPU kernels: Gemm and MatMul through BLAS (``np.matmul``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.buffers import Out, deliver, output
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import split_matmul
from hetflow.graph import Node


@cpu_kernel("Gemm", writes_out=True)
def gemm(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """``alpha * A' @ B' + beta * C``, then the fused activation; float and integer types, dtype preserved.

    Transposes are views (BLAS reads them with its transpose flags, no copy). With the default
    ``alpha == beta == 1`` the result is one BLAS call plus one in-place add of ``C``; a fused
    activation (``attrs.fused``, set by ``passes.fuse_activation``) is applied in place after it.
    """
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    attrs = node.attrs
    a = a.T if attrs.transA else a
    b = b.T if attrs.transB else b
    y = output(out, 0, (a.shape[0], b.shape[1]), np.result_type(a, b))
    split_matmul(a, b, out=y)
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


@cpu_kernel("MatMul", writes_out=True)
def matmul(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """numpy ``matmul`` (batched, broadcasting, 1-D operands); float and integer types.

    A stack of matrices times a single matrix is folded into one large GEMM, which BLAS runs far
    faster than numpy's loop of small ones.
    """
    a, b = inputs
    assert a is not None and b is not None
    dtype = np.result_type(a, b)
    if a.ndim > 2 and b.ndim == 2 and a.size:
        y = output(out, 0, (*a.shape[:-1], b.shape[-1]), dtype)
        if not y.flags.c_contiguous:
            # NOTE: a strided slice cannot be seen as one matrix of rows: compute, then copy in.
            rows = np.matmul(a.reshape(-1, a.shape[-1]), b)
            return [deliver(out, 0, rows.reshape(y.shape))]
        np.matmul(a.reshape(-1, a.shape[-1]), b, out=y.reshape(-1, b.shape[-1]))
        return [y]
    if a.ndim == 2 and b.ndim == 2:
        return [np.matmul(a, b, out=output(out, 0, (a.shape[0], b.shape[1]), dtype))]
    return [deliver(out, 0, np.asarray(np.matmul(a, b)))]
