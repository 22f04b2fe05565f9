"""The pointwise Conv on hetflow's own GEMM (``jit_packed_gemm``) where a run's threads are its own.

OpenBLAS multiplies a 1x1 Conv's weights by its input planes about as fast as ``jit_packed_gemm`` does
on one core, but then the epilogue (bias, activation, a folded residual) passes over Y once more; the
packed GEMM finishes each tile in registers. It runs where each thread computes its own images or
columns: a batch on hetflow's own threads (``threads.owns_threads``, the Python pool), or a
one-thread session. One example beside BLAS's threads keeps OpenBLAS, which splits a product over
both cores (its spinning workers would take the core a split of ours needs), and so do spinning and
numba-pool runs, whose splits are arranged by ``jit_gemm``.

The weights are packed into the node's workspace on every call (``M x K`` floats, read once, against
the ``M x K x P`` multiply-adds of every image), so that nothing outlives the call and weights updated
in place (training) are always read fresh.

A/B at batch 16, 2 threads, alternating processes (``benchmarks/ab.py``, minimums): mobilenetv2 0.82x the
time, squeezenet 0.91x, googlenet and inception_v2 0.97x, resnet50 0.96x, densenet121 0.99x. Sessions of
one thread at batch 1: mobilenetv2 0.93x, resnet50 and googlenet 0.99x.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.base import BoundCall
from hetflow.devices.cpu.kernels import jit_packed_gemm
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, aligned, flat_images
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.threads import in_numba_pool, intra_op_threads, owns_threads, parallel_for, spinning
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo

#: Output columns per part below which an image is not split between threads (a few tiles each).
MIN_COLUMNS_PER_PART = 4 * jit_packed_gemm.TILE_POSITIONS


#: Input channels above which a layer keeps OpenBLAS, unless its map is at most one tile wide. With a
#: deep X each tile's columns come from L2 for every row block, where OpenBLAS packs them once; its
#: product then costs enough that the epilogue pass saved matters little. Measured inside resnet50 at
#: batch 16 (per layer, min of 3 runs): 512 -> 256 at 28x28 11.1 ms on BLAS, 11.5 packed, 1024 -> 512
#: at 14x14 11.7 both; 128 -> 512 at 28x28 8.3 -> 7.3, 256 -> 1024 at 14x14 7.1 -> 6.5, and 512 -> 2048
#: at 7x7 (49 positions, one tile) 8.8 -> 7.7. densenet121 (1x1 layers up to 1024 deep) lost 2% with
#: every layer packed.
MAX_DEPTH = 256


def takes(node: Node, x_dtype: np.dtype, w_dtype: np.dtype, x_shape: Sequence[int]) -> bool:
    """Whether a pointwise Conv node runs on the packed GEMM (where ``runs_packed`` lets it): float32, one
    group, and at most ``MAX_DEPTH`` input channels unless its map is at most one tile wide."""
    if node.attrs.group != 1 or x_dtype != np.float32 or w_dtype != np.float32:
        return False
    positions = math.prod(int(d) for d in x_shape[2:])
    return int(x_shape[1]) <= MAX_DEPTH or positions <= jit_packed_gemm.TILE_POSITIONS


def workspace_bytes(node: Node, x_shape: Sequence[int], w_shape: Sequence[int], dtype: np.dtype) -> int:
    """The packed weights, where the node runs on the packed GEMM (0 elsewhere)."""
    if not takes(node, np.dtype(dtype), np.dtype(dtype), x_shape):
        return 0
    return aligned(math.prod(jit_packed_gemm.packed_shape(int(w_shape[0]), int(w_shape[1]))) * 4)


def runs_packed() -> bool:
    """Whether the running call gives the pointwise Conv to the packed GEMM (see the module docstring)."""
    if spinning() is not None or in_numba_pool():
        return False
    return owns_threads() or intra_op_threads() == 1


def clamp_bounds(fused: FusedActivation | None) -> tuple[float, float] | None:
    """(low, high) of the activation the tiles apply as a clamp: none, Relu, or Clip; None for any other."""
    if fused is None:
        return -math.inf, math.inf
    if fused.op_type == "Relu":
        return 0.0, math.inf
    if fused.op_type == "Clip":
        return float(fused.alpha), float(fused.beta)
    return None


def work_items(batch: int, positions: int, parts: int) -> list[np.ndarray]:
    """``(image, first column, last column)`` rows for each of up to ``parts`` threads: whole images
    while there are at least as many as parts, else each image's columns in ranges of whole tiles."""
    if batch >= parts:
        bounds = [batch * p // parts for p in range(parts + 1)]
        return [
            np.array([(n, 0, positions) for n in range(bounds[p], bounds[p + 1])], np.int64).reshape(-1, 3)
            for p in range(parts)
        ]  # fmt: skip
    tile = jit_packed_gemm.TILE_POSITIONS
    per_image = max(1, min(-(-parts // batch), positions // MIN_COLUMNS_PER_PART))
    tiles = -(-positions // tile)
    items = []
    for n in range(batch):
        cuts = [min(positions, tiles * s // per_image * tile) for s in range(per_image + 1)]
        items += [np.array([(n, a, b)], np.int64) for a, b in zip(cuts, cuts[1:]) if b > a]
    return items


def prepare_pointwise(
    fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
) -> Callable[[Node, Sequence[TensorInfo | None], Out, np.ndarray | None], BoundCall | None]:
    """The pointwise kernel's ``prepare``: ``fallback(node, arrays, out, workspace)`` (the BLAS kernel, with the
    shared epilogue) where ``runs_packed`` is false or the arrays do not fit, the packed GEMM elsewhere."""

    def prepare(
        node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
    ) -> BoundCall | None:
        x_info, w_info = inputs[0], inputs[1]
        if x_info is None or w_info is None or not takes(node, x_info.dtype, w_info.dtype, x_info.shape):
            return None
        batch, channels, *spatial = (int(d) for d in x_info.shape)
        kernels, positions = int(w_info.shape[0]), math.prod(spatial)
        bounds = clamp_bounds(node.attrs.fused)
        y_shape = (batch, kernels, *spatial)
        scratch = Scratch(workspace)
        packed = scratch.take(jit_packed_gemm.packed_shape(kernels, channels), np.float32)
        flat_packed = packed.reshape(-1)  # the same memory: pack_into writes ``packed``
        target = out[0] if out is not None else None
        if target is not None and (target.shape != y_shape or target.dtype != np.float32):
            target = None
        low, high = (np.float32(b) for b in bounds or (-math.inf, math.inf))
        after = None if bounds is not None else node.attrs.fused
        no_bias = np.zeros(kernels, np.float32)
        residual_at = 3 if node.attrs.residual else None
        shares: dict[int, list[np.ndarray]] = {}

        def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            if not runs_packed():
                return [fallback(node, arrays, out, workspace)]
            y = np.empty(y_shape, np.float32) if target is None else target
            residual = arrays[residual_at] if residual_at is not None else None
            flat_y = flat_images(y)
            flat_r = None if residual is None else _flat_residual(residual, y_shape)
            if flat_y is None or (residual is not None and flat_r is None):
                return [fallback(node, arrays, out, workspace)]
            x, w, b = arrays[0], arrays[1], arrays[2] if len(arrays) > 2 else None
            jit_packed_gemm.pack_into(w.reshape(kernels, channels), packed)  # type: ignore[union-attr]
            bias = no_bias if b is None else np.ascontiguousarray(b, np.float32)
            x = np.ascontiguousarray(x).reshape(batch, channels, positions)  # type: ignore[union-attr]
            r, r_image = (flat_y[0], -1) if flat_r is None else flat_r
            threads = intra_op_threads()
            items = shares.get(threads)
            if items is None:
                items = shares[threads] = work_items(batch, positions, threads)

            def part(index: int) -> None:
                jit_packed_gemm.gemm_items(flat_packed, x, flat_y[0], flat_y[1], r, r_image, bias, low, high,
                                           kernels, positions, items[index], jit_packed_gemm.BLOCK_BYTES)  # fmt: skip

            parallel_for(part, len(items), threads)
            apply_activation(y, after)
            return [y]

        return call

    return prepare


def _flat_residual(residual: np.ndarray, y_shape: tuple[int, ...]) -> tuple[np.ndarray, int] | None:
    """A folded residual as a flat float32 array and its image stride, where it has Y's shape."""
    if residual.shape != y_shape or residual.dtype != np.float32:
        return None
    return flat_images(residual)
