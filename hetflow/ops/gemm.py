"""Matrix products: Gemm (``alpha * A' B' + beta * C``) and MatMul (numpy's batched ``matmul``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, broadcast, check_broadcasts_to, format_shape, is_static
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import (
    Arrays,
    Cost,
    GemmDims,
    Grads,
    OpDef,
    TensorInfo,
    Wanted,
    nbytes,
    numel,
    reduce_to_shape,
    wants,
)
from hetflow.ops.registry import register_op


def _same_dtype(a: TensorInfo, b: TensorInfo, op_type: str) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"{op_type} inputs have different dtypes {a.dtype} and {b.dtype}")


def _check_reduction(k_a: Dim, k_b: Dim, a: Shape, b: Shape, op_type: str) -> None:
    # NOTE: two different symbols may still agree at run time; only two different integers cannot.
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        raise ValueError(
            f"{op_type} reduction dimensions differ: A {format_shape(a)} has K={k_a}, "
            f"B {format_shape(b)} has K={k_b}"
        )


def _product(dims: Sequence[Dim]) -> int | None:
    """The product of integer dims, or None when one is symbolic."""
    if not is_static(dims):
        return None
    return int(np.prod(dims, dtype=np.int64))


def _matmul_cost(
    dims: GemmDims | None, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo], flops: int
) -> Cost:
    macs = 0 if dims is None else dims.n * dims.m * dims.k * dims.count
    return Cost(
        macs=macs,
        flops=flops,
        bytes_read=sum(nbytes(i) for i in inputs),
        bytes_written=sum(nbytes(o) for o in outputs),
        gemm=dims,
    )


@dataclass(frozen=True)
class GemmAttrs:
    """Gemm's attributes (see ``Gemm``)."""

    alpha: float = 1.0
    beta: float = 1.0
    transA: int = 0  # noqa: N815  (ONNX's spelling)
    transB: int = 0  # noqa: N815
    #: hetflow-internal, not an ONNX attribute: the activation fused into the epilogue.
    fused: FusedActivation | None = None
    #: hetflow-internal: the CPU may keep B packed for its dense kernel (``kernels.dense``), a copy beside
    #: the raw weights; a memory budget too small for such copies clears it (``runtime.budget``).
    packed_weights: bool = True


@register_op
class Gemm(OpDef):
    """``Y = alpha * A' @ B' + beta * C`` with ``A'`` = ``A`` or ``A.T`` (``transA``), likewise ``B'``.

    Inputs:
        A: ``[M, K]`` (``[K, M]`` with ``transA``).
        B: ``[K, N]`` (``[N, K]`` with ``transB``).
        C: optional, unidirectionally broadcastable to ``[M, N]``.

    Attributes:
        alpha: scale of the product (default 1).
        beta: scale of ``C`` (default 1).
        transA: transpose ``A`` first (default 0).
        transB: transpose ``B`` first (default 0).

    Cost: ``M*N*K`` MACs as ``GemmDims(n=N, m=M, k=K)``; scaling and adding ``C`` count as flops.
    """

    op_type = "Gemm"
    Attrs = GemmAttrs
    num_inputs = (2, 3)

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        _same_dtype(a, b, "Gemm")
        m, n, _ = self.dims(node, a.shape, b.shape)
        c = inputs[2] if len(inputs) > 2 else None
        if c is not None:
            _same_dtype(a, c, "Gemm")
            check_broadcasts_to(c.shape, (m, n), "C")
        return [TensorInfo((m, n), a.dtype)]

    @staticmethod
    def dims(node: Node, a: Shape, b: Shape) -> tuple[Dim, Dim, Dim]:
        """``(M, N, K)`` from the shapes of A and B; raises ValueError when they do not fit."""
        if len(a) != 2 or len(b) != 2:
            raise ValueError(f"Gemm needs 2-D A and B, got {format_shape(a)} and {format_shape(b)}")
        m, k_a = (a[1], a[0]) if node.attrs.transA else (a[0], a[1])
        k_b, n = (b[1], b[0]) if node.attrs.transB else (b[0], b[1])
        _check_reduction(k_a, k_b, a, b, "Gemm")
        return m, n, k_a

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        m, n, k = self.dims(node, a.shape, b.shape)
        dims = GemmDims(n=int(n), m=int(m), k=int(k)) if is_static((m, n, k)) else None
        adds_c = len(inputs) > 2 and inputs[2] is not None and node.attrs.beta != 0
        per_element = (
            (1 if node.attrs.alpha != 1 else 0)
            + (1 if adds_c else 0)
            + (1 if adds_c and node.attrs.beta != 1 else 0)
        )
        return _matmul_cost(dims, inputs, outputs, flops=per_element * numel(outputs[0]))

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (0, 1), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """``dA' = alpha dY B'^T``, ``dB' = alpha A'^T dY`` (transposed back), ``dC = beta dY`` summed over
        the axes C was broadcast along."""
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        dy = grad_outputs[0]
        assert a is not None and b is not None
        attrs = node.attrs
        if attrs.fused is not None:
            raise ValueError(f"Gemm '{node.name}' has a fused activation; train the unoptimised graph")
        grads: Grads = [None] * len(inputs)
        if dy is None:
            return grads
        a2 = a.T if attrs.transA else a
        b2 = b.T if attrs.transB else b
        scaled = dy * attrs.alpha if attrs.alpha != 1 else dy
        if wants(wanted, 0):
            # NOTE: computed directly in A's layout: (dY B'^T)^T = B' dY^T.
            da = b2 @ scaled.T if attrs.transA else scaled @ b2.T
            grads[0] = da.astype(a.dtype, copy=False)
        if wants(wanted, 1):
            db = scaled.T @ a2 if attrs.transB else a2.T @ scaled
            grads[1] = db.astype(b.dtype, copy=False)
        if c is not None and wants(wanted, 2):
            grads[2] = reduce_to_shape(dy * attrs.beta, c.shape).astype(c.dtype, copy=False)
        return grads


@register_op
class MatMul(OpDef):
    """Matrix product with numpy's ``matmul`` semantics.

    Operands of rank >= 2 are stacks of matrices whose leading (batch) dimensions broadcast; a 1-D
    ``A`` is a row vector and a 1-D ``B`` a column vector, whose added dimension is removed from the
    result.

    Cost: ``batch*M*N*K`` MACs. ``GemmDims(n=N, m=M, k=K, count=batch)`` when B is batched; when B is
    a single matrix the batch is folded into the rows (``m = batch*M``, ``count = 1``), since the kernel
    then runs one large GEMM.
    """

    op_type = "MatMul"
    num_inputs = (2, 2)

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        a, b = inputs
        assert a is not None and b is not None
        _same_dtype(a, b, "MatMul")
        return [TensorInfo(matmul_shape(a.shape, b.shape), a.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        a, b = inputs
        assert a is not None and b is not None
        return _matmul_cost(matmul_gemm_dims(a.shape, b.shape), inputs, outputs, flops=0)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (0, 1), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """``dA = dY B^T`` and ``dB = A^T dY`` on the operands promoted to matrices, summed over broadcast
        batch axes and reshaped back (1-D operands included)."""
        a, b = inputs
        dy = grad_outputs[0]
        assert a is not None and b is not None
        grads: Grads = [None, None]
        if dy is None:
            return grads
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        dy2 = dy
        if a.ndim == 1:
            dy2 = np.expand_dims(dy2, -2 if b.ndim > 1 else -1)
        if b.ndim == 1:
            dy2 = np.expand_dims(dy2, -1)
        if wants(wanted, 0):
            da = np.matmul(dy2, np.swapaxes(b2, -1, -2))
            grads[0] = reduce_to_shape(da, a2.shape).reshape(a.shape).astype(a.dtype, copy=False)
        if wants(wanted, 1):
            db = np.matmul(np.swapaxes(a2, -1, -2), dy2)
            grads[1] = reduce_to_shape(db, b2.shape).reshape(b.shape).astype(b.dtype, copy=False)
        return grads


def _as_matrices(a: Shape, b: Shape) -> tuple[Shape, Shape]:
    """Shapes with 1-D operands promoted to matrices (row vector A, column vector B)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"MatMul needs operands of rank >= 1, got {format_shape(a)} and {format_shape(b)}")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    _check_reduction(a2[-1], b2[-2], tuple(a), tuple(b), "MatMul")
    return a2, b2


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """The result shape of ``matmul(A, B)``; raises ValueError when the shapes do not fit."""
    a2, b2 = _as_matrices(a, b)
    try:
        batch = broadcast(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(
            f"MatMul batch dimensions of {format_shape(a)} and {format_shape(b)} do not broadcast"
        ) from None
    rows: tuple[Dim, ...] = (a2[-2],) if len(a) > 1 else ()
    cols: tuple[Dim, ...] = (b2[-1],) if len(b) > 1 else ()
    return (*batch, *rows, *cols)


def matmul_gemm_dims(a: Shape, b: Shape) -> GemmDims | None:
    """The GEMM(s) ``matmul(A, B)`` runs, or None while a dimension is symbolic."""
    a2, b2 = _as_matrices(a, b)
    batch = _product(broadcast(a2[:-2], b2[:-2]))
    m, k, n = a2[-2], a2[-1], b2[-1]
    if batch is None or not is_static((m, k, n)):
        return None
    assert isinstance(m, int) and isinstance(k, int) and isinstance(n, int)
    if len(b2) == 2:
        return GemmDims(n=n, m=batch * m, k=k)
    return GemmDims(n=n, m=m, k=k, count=batch)
