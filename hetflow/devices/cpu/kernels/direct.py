"""CPU Conv kernel ``direct_fma``: 2-D convolutions of one group by the direct kernels.

``jit_direct_same`` (vectors of 16 positions read from X and stored into Y where they lie, for windows
that keep the map's size), ``jit_direct`` (the same on zero-bordered copies of X's planes, for the other
stride-1 windows), on small maps ``jit_direct_lanes`` (vectors of 16 kernels), and for strided windows on
a few input channels (the image stems) ``jit_direct_phases``: register-blocked FMAs, no im2col columns,
no GEMM. They win where a GEMM's operand is thin -- few input or output channels, where im2col's columns
cost more than the products -- and on windows Winograd does not cover (5x5, dilated); the cost model
(``hetflow.ops.conv.heuristic_conv_algorithm``) says where, and ``hetflow tune`` measures it per layer.

float32 only (float16 is computed in float32 by ``run_conv``, as every CPU Conv is). The bias and a
fused Relu or Clip (``own_gemm.clamp_bounds``) are applied as the products are stored into Y; any other
fused activation runs after. The weights are blocked once per weight array (``BLOCKED_WEIGHTS``); the
padded planes and the products of each thread's part (none for ``jit_direct_same``) come from the node's
workspace, sized for every core this process may use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetflow.devices.base import BoundCall, InputInfos, with_capture
from hetflow.devices.cpu.kernels import jit_direct, jit_direct_lanes
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, aligned, image_contiguous
from hetflow.devices.cpu.kernels.conv import FINISHING, conv_kernel, target_y, window_of
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_epilogue import NO_ACTIVATION, activation_code, activation_job
from hetflow.devices.cpu.kernels.own_gemm import clamp_bounds
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.threads import available_cores, in_numba_pool, intra_op_threads, spinning
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import DIRECT_FMA, conv_window, direct_unsupported
from hetflow.ops.spatial import geometry

#: Weights blocked for the direct kernels, per (weight array, kernels per block).
BLOCKED_WEIGHTS = WeightCache(jit_direct.blocked_weights)


def _supports_direct(node: Node, inputs: InputInfos) -> str | None:
    spec = window_of(node, inputs)
    if isinstance(spec, str):
        return spec
    x = inputs[0] if inputs is not None else None
    return direct_unsupported(spec, node.attrs.group, None if x is None else x.dtype)


def _weight_block(variant) -> int:  # noqa: ANN001
    return jit_direct_lanes.BLOCK_KERNELS if variant is jit_direct_lanes else jit_direct.KERNEL_BLOCK


def _part_shapes(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    geo = geometry(conv_window(node.attrs, tuple(w_shape)), tuple(x_shape[2:]))
    return jit_direct_lanes.variant(geo, int(w_shape[0]), x_shape).buffer_shapes(int(x_shape[1]), int(w_shape[0]), geo)


def workspace_bytes(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> int:
    """The kernel's scratch: every core's part, its padded planes and its products (float32)."""
    parts = available_cores()
    return sum(aligned(parts * math.prod(shape) * 4) for shape in _part_shapes(node, x_shape, w_shape))


def blocked_weight_bytes(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> int:
    """What ``BLOCKED_WEIGHTS`` keeps for the node once it has run: W with its kernels padded to whole
    blocks of the chosen variant (float32)."""
    geo = geometry(conv_window(node.attrs, tuple(w_shape)), tuple(x_shape[2:]))
    block = _weight_block(jit_direct_lanes.variant(geo, int(w_shape[0]), x_shape))
    kernels = jit_direct.round_up(int(w_shape[0]), block)
    return kernels * math.prod(int(d) for d in w_shape[1:]) * 4


def computed_products(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> int:
    """Multiply-adds the chosen variant carries out, those it computes and drops included (pad columns,
    kernels and positions padded to whole blocks): what its time follows, rather than the Conv's MACs."""
    geo = geometry(conv_window(node.attrs, tuple(w_shape)), tuple(x_shape[2:]))
    variant = jit_direct_lanes.variant(geo, int(w_shape[0]), x_shape)
    return variant.computed_products(int(x_shape[0]), int(x_shape[1]), int(w_shape[0]), geo)


def _workspace(node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype) -> int:
    return workspace_bytes(node, x_shape, w_shape)


def _direct(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None,
    bounds: jit_direct.Bounds,
) -> np.ndarray:  # fmt: skip
    """Y (into ``y`` when given), plus the bias when given, clamped to ``bounds``."""
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    y = target_y(y, (x.shape[0], w.shape[0], *geo.out), x.dtype)
    variant = jit_direct_lanes.variant(geo, int(w.shape[0]), x.shape)
    parts = available_cores()
    planes, products = variant.buffer_shapes(int(x.shape[1]), int(w.shape[0]), geo)
    buffers = jit_direct.PartBuffers(
        scratch.take((parts, *planes), np.float32), scratch.take((parts, *products), np.float32)
    )
    wt = BLOCKED_WEIGHTS.get(w, _weight_block(variant))
    return variant.conv2d(x, w, bias, geo, bounds, y, wt=wt, buffers=buffers)


#: Computed products per share from which, in numba's pool (``in_numba_pool``), a batch smaller than
#: the threads has each image's kernel blocks shared out there (``bind_block_split``). One image, two
#: threads against one, one process, min us: 20 -> 50 5x5 at 12x12 (2.7M) 35 -> 24, 32 -> 32 5x5 at
#: 16x16 (7.4M) 139 -> 80, 32 -> 64 5x5 at 8x8 (3.3M, lanes) 47 -> 28, 3 -> 32 5x5 at 32x32 (2.6M) 45 ->
#: 36; 64 -> 40 3x3 at 6x6 (1.5M) 22 -> 23 lost, 1 -> 20 5x5 at 28x28 (0.4M) 11 -> 10.
MIN_PRODUCTS_PER_NATIVE_SHARE = 1_000_000
#: From this many computed products a share of one image's kernel blocks, or of a batch's images, splits
#: on spinning threads (``threads.spinning``).
MIN_PRODUCTS_PER_SPIN_SHARE = 500_000


def _prepare(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """``direct_fma`` bound to a float32 node's shapes and buffers (``Kernel.prepare``): the geometry,
    the variant, the scratch's parts and the epilogue are worked out here once; a call that fits one
    thread is then the compiled loop, a larger one the variant's split ``conv2d``."""
    x_info, w_info = inputs[0], inputs[1]
    if x_info is None or w_info is None or x_info.dtype != np.float32 or w_info.dtype != np.float32:
        return None
    if node.attrs.residual:
        return None  # the shared epilogue (``conv.run_conv``) adds the residual
    x_shape, w_shape = tuple(x_info.shape), tuple(w_info.shape)
    channels, kernels = int(x_shape[1]), int(w_shape[0])
    geo = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
    y_shape = (int(x_shape[0]), kernels, *geo.out)
    variant = jit_direct_lanes.variant(geo, kernels, x_shape)
    block = _weight_block(variant)
    planes, products = variant.buffer_shapes(channels, kernels, geo)
    scratch = Scratch(workspace)
    parts = available_cores()
    buffers = jit_direct.PartBuffers(
        scratch.take((parts, *planes), np.float32), scratch.take((parts, *products), np.float32)
    )
    bounds, after = copied_out(node.attrs.fused)
    after_code, *after_constants = activation_code(after)
    one_part = variant.bind_one_part(x_shape, kernels, geo, bounds, buffers)
    products_computed = variant.computed_products(y_shape[0], channels, kernels, geo)
    # In numba's pool, a batch smaller than the threads shares out each image's kernel blocks.
    native_parts = min(parts, products_computed // MIN_PRODUCTS_PER_NATIVE_SHARE)
    # On spinning threads (``own_threads(spin=True)``), likewise from MIN_PRODUCTS_PER_SPIN_SHARE a share.
    spin_parts = min(parts, products_computed // MIN_PRODUCTS_PER_SPIN_SHARE)
    # On the spinning pool: one image's kernel blocks, or (as many images as threads or more) runs of images.
    split = variant.bind_block_split(x_shape, kernels, geo, bounds, buffers)
    splits = spin_parts > 1
    blocks = jit_direct.round_up(kernels, block) // block
    most = jit_direct.most_threads(products_computed, y_shape[0], blocks)
    target = out[0] if out is not None else None
    fits = target is not None and target.shape == y_shape and target.dtype == np.float32
    if not fits or not image_contiguous(target):
        target = None
    no_bias = np.zeros(kernels, np.float32)

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x, w = arrays[0], arrays[1]
        b = arrays[2] if len(arrays) > 2 else None
        bias = no_bias if b is None else np.ascontiguousarray(b, np.float32)
        y = np.empty(y_shape, np.float32) if target is None else target
        wt = BLOCKED_WEIGHTS.get(w, block)
        threads = intra_op_threads()
        pool = spinning()
        if splits and pool is not None:
            split(np.ascontiguousarray(x), wt, bias, y, min(threads, spin_parts), pool)
        elif splits and y_shape[0] < native_parts and threads > y_shape[0] and in_numba_pool():
            split(np.ascontiguousarray(x), wt, bias, y, min(threads, native_parts))
        elif most == 1 or threads == 1:
            one_part(np.ascontiguousarray(x), wt, bias, y)
        else:
            variant.conv2d(np.ascontiguousarray(x), w, bias, geo, bounds, y, wt=wt, buffers=buffers)
        apply_activation(y, after)
        return [y]

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The call as one share job, split on the spinning pool as ``call`` splits, else in one chunk; then
        a job applying a fused activation the copy-out does not (LeakyRelu), split alike."""
        x, w = arrays[0], arrays[1]
        if not x.flags.c_contiguous:  # type: ignore[union-attr]
            return None
        y = np.empty(y_shape, np.float32) if target is None else target
        # A fused activation the copy-out does not apply (LeakyRelu) is a job of its own over Y.
        if after is not None and (after_code == NO_ACTIVATION or not y.flags.c_contiguous):
            return None
        b = arrays[2] if len(arrays) > 2 else None
        bias = no_bias if b is None else np.ascontiguousarray(b, np.float32)
        parts = min(intra_op_threads(), spin_parts) if splits and spinning() is not None else 1
        jobs = [split.job(x, BLOCKED_WEIGHTS.get(w, block), bias, y, parts)]
        if after is not None:
            flat = y.reshape(-1)
            jobs.append(activation_job(flat, flat, after_code, *after_constants, chunks=parts))
        return [y], jobs

    return with_capture(call, capture)


@conv_kernel(DIRECT_FMA, supports=_supports_direct, workspace=_workspace, prepare=_prepare)
def direct_fma(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """2-D group-1 float32 Conv by the direct kernels (bias and activation left to the caller)."""
    return _direct(node, x, w, y, scratch, None, jit_direct.NO_BOUNDS)


def _finishing(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """``direct_fma`` with the bias, and a fused Relu or Clip, applied as the products are copied out."""
    bounds, after = copied_out(node.attrs.fused)
    return _direct(node, x, w, y, scratch, bias, bounds), after is None


def copied_out(fused: FusedActivation | None) -> tuple[jit_direct.Bounds, FusedActivation | None]:
    """The bounds the direct kernels clamp Y to as they copy it out (none, a Relu's or a Clip's), and the
    fused activation left to apply after them (any other: LeakyRelu, Sigmoid...), or None.

    Why: MobileNet v2's 3 -> 32 stem at batch 16 ran its ReLU6 as a job of its own over a 25 MB output
    (0.9 ms of a 67 ms run)."""
    found = clamp_bounds(fused)
    if found is None:
        return jit_direct.NO_BOUNDS, fused
    return jit_direct.bounds_of(*found), None


FINISHING[direct_fma] = _finishing
