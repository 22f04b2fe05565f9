"""CPU kernels: Gemm and MatMul through BLAS (``np.matmul``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels import jit_gemm
from hetflow.devices.cpu.kernels.buffers import Out, deliver, output
from hetflow.devices.cpu.kernels.dense import DenseCall, runs_dense
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_epilogue import (
    COMPILED_DTYPES,
    NO_ACTIVATION,
    activation_code,
    finish_rows,
    finish_rows_job,
)
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import matmul_for, spin_product_parts, split_matmul
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo


def _prepare_gemm(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: object
) -> BoundCall | None:
    """``gemm`` bound to a float node with ``alpha == 1`` (``Kernel.prepare``): Y's buffer and the
    transposes are settled once; a call is the product, the in-place add of C and the activation. A
    fully connected layer at a batch (``dense.runs_dense``) runs on hetflow's dense kernel instead."""
    a_info, b_info = inputs[0], inputs[1]
    attrs = node.attrs
    if a_info is None or b_info is None or attrs.alpha != 1 or len(a_info.shape) != 2 or len(b_info.shape) != 2:
        return None
    dtype = np.result_type(a_info.dtype, b_info.dtype)
    if dtype.kind != "f":
        return None
    trans_a, trans_b, beta, fused = bool(attrs.transA), bool(attrs.transB), attrs.beta, attrs.fused
    shape = (int(a_info.shape[1 if trans_a else 0]), int(b_info.shape[0 if trans_b else 1]))
    target = out[0] if out is not None else None
    if target is not None and (target.shape != shape or target.dtype != dtype):
        target = None
    c_info = inputs[2] if len(inputs) > 2 else None
    if c_info is None or beta == 0:
        row_bias = True
    else:
        row_bias = beta == 1 and tuple(c_info.shape) in ((shape[1],), (1, shape[1])) and c_info.dtype == dtype
    code, alpha, limit = activation_code(fused)
    compiled = row_bias and dtype in COMPILED_DTYPES and (fused is None or code != NO_ACTIVATION)
    constants = np.array([alpha, limit, 0.0], dtype)
    no_bias = np.zeros(shape[1], dtype)
    macs = shape[0] * shape[1] * int(a_info.shape[0 if trans_a else 1])
    product = matmul_for(macs)

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        a, b = arrays[0], arrays[1]
        c = arrays[2] if len(arrays) > 2 and beta != 0 else None
        y = np.empty(shape, dtype) if target is None else target
        product(a.T if trans_a else a, b.T if trans_b else b, out=y)  # type: ignore[union-attr]
        if compiled:
            if c is not None or code != NO_ACTIVATION:
                finish_rows(y, no_bias if c is None else c.reshape(-1), c is not None, code, constants)
            return [y]
        if c is not None:
            y += c if beta == 1 else _scaled(c, beta)
        apply_activation(y, fused)
        return [y]

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The product as a spin-pool job (split as ``split_matmul`` splits it on a spinning run), then
        the bias and activation as another."""
        a, b = arrays[0], arrays[1]
        c = arrays[2] if len(arrays) > 2 and beta != 0 else None
        finishes = c is not None or code != NO_ACTIVATION
        if finishes and (not compiled or dtype != np.float32):
            return None
        y = np.empty(shape, dtype) if target is None else target
        parts = spin_product_parts(macs, shape[1])
        job = jit_gemm.product_job(a.T if trans_a else a, b.T if trans_b else b, y, parts)  # type: ignore[union-attr]
        if job is None or not y.flags.c_contiguous:
            return None
        if not finishes:
            return [y], [job]
        bias = no_bias if c is None else np.ascontiguousarray(c.reshape(-1))
        return [y], [job, finish_rows_job(y, bias, c is not None, code, constants)]

    if runs_dense(node, inputs):
        return DenseCall(node, a_info, b_info, out, call)
    return with_capture(call, capture)


@cpu_kernel("Gemm", writes_out=True, prepare=_prepare_gemm)
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
