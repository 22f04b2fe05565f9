"""Training Gemm on the CPU: its products split over the kernel threads, BLAS held at one thread.

A training step's convolutions and pools split their work over hetflow's kernel threads with BLAS at one
thread (``conv_train``, ``jit_backward``). Left to BLAS, the fully connected layers' GEMMs run on
OpenBLAS's own threads instead, and after each such call OpenBLAS's workers busy-wait (about 0.1 s by
default, ``OPENBLAS_THREAD_TIMEOUT``) for more work, on the cores the next layers' split needs. Measured on
the mentee at batch 128, two threads: the backward pass of the layers right after the FC layers (pool3,
conv5, pool2, conv4) ran 1.2-1.4x faster than on one thread instead of 1.7x, and the step 1.5x instead of
1.75x with the workers' wait cut short. Here the GEMMs split their rows over the kernel threads (which
block, not spin, when idle), so OpenBLAS's workers never wake during a step.

The sums are the numpy rule's (``hetflow.ops.gemm.Gemm``): each block of rows of a product is the same
dot products, computed by the same BLAS.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hetflow.devices.cpu.kernels.buffers import step_empty
from hetflow.devices.cpu.threads import blas_threads, intra_op_threads, parallel_for
from hetflow.ops.base import reduce_to_shape
from hetflow.ops.gemm import GemmAttrs

#: Multiply-adds per thread below which a product runs whole in the calling thread (still at one BLAS
#: thread): a hand-off costs ~20-50 us, about 2-4 M multiply-adds on one core.
MIN_MACS_PER_THREAD = 4_000_000


def split_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of 2-D ``a`` ``[M, K]`` and ``b`` ``[K, N]`` (any strides: transposed views are read in
    place), in ranges of a's rows over the kernel threads, with BLAS at one thread throughout."""
    rows, depth = a.shape
    columns = b.shape[1]
    out = step_empty((rows, columns), np.result_type(a, b))
    threads = max(1, min(intra_op_threads(), rows, rows * depth * columns // MIN_MACS_PER_THREAD))
    bounds = [rows * part // threads for part in range(threads + 1)]

    def rows_of(part: int) -> None:
        block = slice(bounds[part], bounds[part + 1])
        np.matmul(a[block], b, out=out[block])

    with blas_threads(1):
        parallel_for(rows_of, threads, threads)
    return out


def gemm_forward(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, attrs: GemmAttrs) -> np.ndarray:
    """``alpha * A' @ B' + beta * C`` (2-D float operands of one dtype, C broadcast to Y; no fused
    activation), the product by ``split_matmul``."""
    if attrs.fused is not None:
        raise ValueError("the training Gemm fuses no activation")
    y = split_matmul(a.T if attrs.transA else a, b.T if attrs.transB else b)
    if attrs.alpha != 1:
        y *= y.dtype.type(attrs.alpha)
    if c is not None and attrs.beta != 0:
        y += c if attrs.beta == 1 else c * c.dtype.type(attrs.beta)
    return y


class GemmGrads(NamedTuple):
    """The gradients ``gemm_backward`` computed (None where not wanted)."""

    a: np.ndarray | None
    b: np.ndarray | None
    c: np.ndarray | None


def gemm_backward(
    a: np.ndarray,
    b: np.ndarray,
    c_shape: tuple[int, ...] | None,
    dy: np.ndarray,
    attrs: GemmAttrs,
    wanted: tuple[bool, bool, bool],
) -> GemmGrads:
    """dA, dB and dC of ``Y = alpha * A' @ B' + beta * C``, each in its operand's layout: ``dA' = alpha dY
    B'^T``, ``dB' = alpha A'^T dY`` (products by ``split_matmul``), ``dC = beta dY`` summed over the axes C
    was broadcast along (``c_shape``: C's shape, None without C)."""
    a2 = a.T if attrs.transA else a
    b2 = b.T if attrs.transB else b
    scaled = dy * dy.dtype.type(attrs.alpha) if attrs.alpha != 1 else dy
    da = db = dc = None
    if wanted[0]:
        # NOTE: computed directly in A's layout: (dY B'^T)^T = B' dY^T.
        da = split_matmul(b2, scaled.T) if attrs.transA else split_matmul(scaled, b2.T)
    if wanted[1]:
        db = split_matmul(scaled.T, a2) if attrs.transB else split_matmul(a2.T, scaled)
    if c_shape is not None and wanted[2]:
        dc = reduce_to_shape(dy * dy.dtype.type(attrs.beta), c_shape)
    return GemmGrads(da, db, dc)
