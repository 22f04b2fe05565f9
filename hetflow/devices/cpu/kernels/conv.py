"""CPU kernels: convolution through BLAS, one registered kernel per algorithm.

The planner picks one kernel per layer (``hetflow.tuning.select``: a measurement from the tuning cache,
else the cost model's ``hetflow.ops.conv.heuristic_conv_algorithm``). Each kernel's ``supports`` says
which layers it can compute:

* ``pointwise`` (1x1, stride 1, unpadded): X viewed as ``[N, group, C/group, P]`` is already the GEMM's
  right operand, so one ``matmul`` per group and image and no copy of X;
* ``depthwise`` (one input channel per group): a loop over the kh*kw taps, each a strided slice of the
  padded input multiplied by one weight per channel and accumulated, vectorised over everything else;
* ``im2col`` (every Conv): the padded input is viewed through ``as_strided`` as ``[N, C, *kernel, *out]``,
  reshaped (the one copy: the im2col buffer ``[N, group, C/group*taps, P]``) and multiplied by the
  weights ``[group, K/group, C/group*taps]`` in one batched ``matmul``;
* ``winograd_f23`` / ``winograd_f43`` (2-D 3x3 stride 1, one group): ``winograd.py``;
* ``direct_fma`` (2-D stride 1, one group, float32): ``direct.py``;
* ``auto`` (every Conv, registered first so that a lookup without shapes finds it): dispatches at run
  time on the concrete shapes with the cost model's heuristic; plans made for a symbolic batch use it.

Every method writes Y as ``[N, group, K/group, P]``, which *is* NCHW-contiguous ``[N, K, *out]``, and ends
with the shared epilogue (bias, fused activation). float32 and float64 are computed in their own
precision; float16 is computed in float32 (numpy has no float16 BLAS) and rounded back.

Memory: every kernel writes Y into the ``out`` view the runtime provides (``writes_out``), which may be
one image-strided slice of a Concat's output (each image's ``[K, *out]`` block contiguous, the images
apart), and takes its temporaries (padded input, im2col columns, Winograd tiles) from its workspace, in
the order and sizes its ``*_scratch`` function declares.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.base import BoundCall, InplaceFn, InputInfos, PrepareFn, with_capture
from hetflow.devices.cpu.kernels import jit_depthwise_lanes, own_gemm
from hetflow.devices.cpu.kernels.buffers import (
    Out,
    Scratch,
    deliver,
    flat_images,
    image_contiguous,
    scratch_bytes,
)
from hetflow.devices.cpu.kernels.epilogue import add_channel_bias, apply_activation, finish_channels
from hetflow.devices.cpu.kernels.jit_depthwise import depthwise_2d, shuffled_channels
from hetflow.devices.cpu.kernels.jit_epilogue import (
    COMPILED_DTYPES,
    NO_ACTIVATION,
    activation_code,
    gathered_planes_job,
)
from hetflow.devices.cpu.kernels.jit_gemm import product_job
from hetflow.devices.cpu.kernels.jit_im2col import im2col as compiled_im2col
from hetflow.devices.cpu.kernels.jit_im2col import im2col_job
from hetflow.devices.cpu.kernels.jit_im2col import im2col_rows as compiled_im2col_rows
from hetflow.devices.cpu.kernels.jit_residual import add_activate
from hetflow.devices.cpu.kernels.jit_residual import compiled as residual_compiled
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import (
    blas_is_narrow,
    blas_threads,
    intra_op_threads,
    parallel_for,
    spin_parts,
    spin_product_parts,
    split_matmul,
)
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import (
    AUTO,
    DEPTHWISE,
    IM2COL,
    POINTWISE,
    ConvAttrs,
    channel_columns,
    conv_algorithm,
    conv_window,
    fused_epilogue,
    heuristic_conv_algorithm,
)
from hetflow.ops.spatial import Geometry, WindowSpec, geometry

#: An algorithm's core: (node, X, W, Y or None, scratch) in the compute dtype -> Y ``[N, K, *out]``
#: before the epilogue. It writes into the given Y when there is one.
ConvBody = Callable[[Node, np.ndarray, np.ndarray, "np.ndarray | None", Scratch], np.ndarray]
#: An algorithm's temporaries in the order it takes them: (node, X shape, W shape, compute dtype) ->
#: [(shape, dtype)].
ScratchFn = Callable[[Node, tuple[int, ...], tuple[int, ...], np.dtype], list[tuple[tuple[int, ...], np.dtype]]]

#: Algorithm name -> its body, for the ``auto`` dispatcher (winograd.py adds its own).
BODIES: dict[str, ConvBody] = {}
#: A body that also adds the bias and, where it can, the fused activation (one pass over Y instead of
#: three): (node, X, W, Y or None, scratch, B or None) -> (Y, whether the activation was applied).
FinishingBody = Callable[
    [Node, np.ndarray, np.ndarray, "np.ndarray | None", Scratch, "np.ndarray | None"], tuple[np.ndarray, bool]
]
#: Registered body -> its finishing form, used when that algorithm is the node's kernel (``auto``
#: dispatches to the plain body and finishes Y itself).
FINISHING: dict[ConvBody, FinishingBody] = {}
#: Algorithm name -> its ``prepare`` (``Kernel.prepare``), for the ``auto`` dispatcher to bind a node to
#: the algorithm the cost model picks (winograd.py adds its own).
PREPARES: dict[str, PrepareFn] = {}
#: Algorithm name -> the workspace bytes it takes.
WORKSPACES: dict[str, Callable[[Node, tuple[int, ...], tuple[int, ...], np.dtype], int]] = {}


def conv_kernel(
    algorithm: str,
    supports: Callable[[Node, InputInfos], str | None] | None,
    workspace: Callable[[Node, tuple[int, ...], tuple[int, ...], np.dtype], int] | None = None,
    prepare: PrepareFn | None = None,
) -> Callable[[ConvBody], ConvBody]:
    """Register ``body`` as the CPU Conv kernel ``algorithm``, wrapped in the shared prologue/epilogue.

    ``workspace(node, x_shape, w_shape, compute_dtype)`` gives the scratch bytes the body takes;
    ``prepare`` binds the whole kernel (prologue and epilogue included) to a node (``Kernel.prepare``).
    """

    def decorate(body: ConvBody) -> ConvBody:
        def supports_node(node: Node, inputs: InputInfos) -> str | None:
            if node.attrs.shuffle_groups and algorithm != DEPTHWISE:
                return f"{algorithm} reads X as it lies; this Conv reads it channel-shuffled"
            return None if supports is None else supports(node, inputs)

        def kernel(
            node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
        ) -> list[np.ndarray]:
            return [run_conv(body, node, inputs, out, workspace)]

        def workspace_bytes(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
            x, w = inputs[0], inputs[1]
            if workspace is None or x is None or w is None:
                return 0
            return workspace(node, tuple(x.shape), tuple(w.shape), compute_dtype(x.dtype))

        functools.update_wrapper(kernel, body)  # __wrapped__ lets tuning hash the body's source
        cpu_kernel(
            "Conv", algorithm=algorithm, supports=supports_node, writes_out=True, inplace=stores_over_residual(algorithm),
            workspace=workspace_bytes, prepare=prepare,
        )(kernel)  # fmt: skip
        BODIES[algorithm] = body
        WORKSPACES[algorithm] = workspace or (lambda *_: 0)
        return body

    return decorate


def stores_over_residual(algorithm: str) -> InplaceFn:
    """The ``Kernel.inplace`` of the Conv kernel ``algorithm``: its folded residual, where the tile GEMM
    (``own_gemm``) takes the node, reading R only where it stores each sum. Y then needs no memory of its
    own and the tiles store into lines they have just read: ResNet-50's 64 -> 256 56x56 layer ran its
    256x64x3136 product at 85 GFLOP/s on one core with R apart, 99 with Y over R, 101 with no residual.
    Elsewhere ``run_conv`` would compute the products apart, in memory of their own, before storing the
    sum over R: Y is then planned apart (ResNet-50 at batch 16 on OpenBLAS: +22% memory at the peak)."""

    def residual_input(node: Node, inputs: InputInfos) -> tuple[int, ...]:
        if not node.attrs.residual or not inputs or inputs[0] is None or inputs[1] is None:
            return ()
        x, w = inputs[0], inputs[1]
        if not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
            return ()
        chosen = _auto_algorithm(node, x.shape, w.shape, x.dtype) if algorithm == AUTO else algorithm
        return (3,) if _tiles_add_residual(chosen, node, x, w) else ()

    return residual_input


def _tiles_add_residual(algorithm: str, node: Node, x: TensorInfo, w: TensorInfo) -> bool:
    """Whether a run gives this Conv, residual and all, to the tile GEMM: a float32 pointwise one, or an
    im2col one on whole columns (one image's, or a batch's where ``_batch_columns_chunk`` chunks it)."""
    if not own_gemm.takes(x.dtype, w.dtype):
        return False
    if algorithm == POINTWISE:
        return True
    if algorithm != IM2COL:
        return False
    if int(x.shape[0]) == 1:
        return own_gemm.im2col_on_tiles(node, x, w) is not None
    return _batch_columns_chunk(node, x, w) is not None


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a Conv computes in: float16 in float32 (numpy has no float16 BLAS), else its own."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def run_conv(
    body: ConvBody,
    node: Node,
    inputs: Sequence[np.ndarray | None],
    out: Out = None,
    workspace: np.ndarray | None = None,
) -> np.ndarray:
    """Convert X and W to the compute dtype, run ``body``, apply bias + fused activation, cast back."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    dtype = x.dtype
    compute = compute_dtype(dtype)
    # NOTE: for float32/float64 these return the arrays themselves, so W keeps its identity (Winograd
    # caches its transformed weights per W array).
    x = np.ascontiguousarray(x, dtype=compute)
    w = np.ascontiguousarray(w, dtype=compute)
    target = out[0] if out is not None else None
    if target is not None and (
        target.dtype != compute or not (target.flags.c_contiguous or image_contiguous(target))
    ):
        target = None
    finishing = FINISHING.get(body)
    if node.attrs.residual:
        residual = inputs[3]
        # The planner may give Y the residual's own memory (``stores_over_residual``): the body's products,
        # which read all of X per output, then go to fresh memory and the sum is stored over R.
        aliased = target is not None and target.shape == residual.shape and np.shares_memory(target, residual)
        y = body(node, x, w, None if aliased else target, Scratch(workspace))
        y = add_residual(y, residual, bias, node.attrs.fused, target if aliased else None)
    elif finishing is None:
        y = body(node, x, w, target, Scratch(workspace))
        finish_channels(y, bias, node.attrs.fused)
    else:
        y, activated = finishing(node, x, w, target, Scratch(workspace), bias)
        if not activated:
            apply_activation(y, node.attrs.fused)
    if y.dtype != dtype:
        return deliver(out, 0, y.astype(dtype))
    return deliver(out, 0, y)


def add_residual(
    y: np.ndarray,
    residual: np.ndarray | None,
    bias: np.ndarray | None,
    fused: FusedActivation | None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """``activation(y + bias + residual)`` (a Conv with a folded residual) stored in ``into`` (it may be the
    residual's memory), else in Y itself: one compiled pass over Y and R where they fit it
    (``jit_residual``), else numpy's. Returns the array it stored in."""
    assert residual is not None
    residual = np.asarray(residual, y.dtype)
    into = y if into is None else into
    if residual_compiled(y, residual, into):
        if not add_activate(y, residual, into, fused, bias):
            apply_activation(into, fused)
        return into
    add_channel_bias(y, bias)
    np.add(y, residual, out=into)
    apply_activation(into, fused)
    return into


def target_y(y: np.ndarray | None, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """The body's output: the provided ``y`` when it has ``shape``, else a new array."""
    if y is not None and y.shape == tuple(shape):
        return y
    return np.empty(shape, dtype)


def as_view(y: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``y`` reshaped without a copy (raises if that is impossible: a write would be lost)."""
    return y.reshape(shape) if y.flags.c_contiguous else np.reshape(y, shape, copy=False)


def pad_into(geo: Geometry, x: np.ndarray, scratch: Scratch, value: float | int = 0) -> np.ndarray:
    """``geo.pad(x, value)`` with the padded copy taken from ``scratch`` (``x`` when none is needed)."""
    if not geo.needs_padding:
        return x
    padded = scratch.take(padded_shape(geo, x.shape), x.dtype)
    # NOTE: the workspace holds other steps' data: only the borders need the padding value.
    for axis, a in enumerate(geo.axes, start=2):
        lead = (slice(None),) * axis
        padded[(*lead, slice(0, a.pad_begin))] = value
        padded[(*lead, slice(a.pad_begin + a.size, None))] = value
    padded[(..., *(slice(a.pad_begin, a.pad_begin + a.size) for a in geo.axes))] = x
    return padded


def padded_shape(geo: Geometry, x_shape: Sequence[int]) -> tuple[int, ...]:
    return (int(x_shape[0]), int(x_shape[1]), *(a.padded for a in geo.axes))


def padding_scratch(geo: Geometry, x_shape: Sequence[int], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The padded copy ``pad_into`` takes, if any."""
    return [(padded_shape(geo, x_shape), dtype)] if geo.needs_padding else []


# -- what each algorithm supports --------------------------------------------------------------------
def window_of(node: Node, inputs: InputInfos) -> WindowSpec | str:
    """The node's window, from W's shape when known, else from ``kernel_shape``; a reason when neither."""
    attrs: ConvAttrs = node.attrs
    if inputs is not None and inputs[1] is not None:
        return conv_window(attrs, inputs[1].shape)
    if not attrs.kernel_shape:
        return "the kernel size is unknown until W's shape is (no kernel_shape attribute)"
    return conv_window(attrs, (0, 0, *attrs.kernel_shape))


def _supports_pointwise(node: Node, inputs: InputInfos) -> str | None:
    spec = window_of(node, inputs)
    if isinstance(spec, str):
        return spec
    # conv_algorithm's channel count only matters for depthwise; 0 never matches a group.
    if conv_algorithm(spec, 0, node.attrs.group) != POINTWISE:
        return "pointwise needs a 1x1 kernel, stride 1 and no padding"
    return None


def _supports_depthwise(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None or inputs[0] is None or not isinstance(inputs[0].shape[1], int):
        return "depthwise needs X's channel count"
    channels, group = inputs[0].shape[1], node.attrs.group
    if group == 1 or group != channels:
        return f"depthwise needs group == channels > 1; got group {group}, {channels} channels"
    return None


# -- the algorithms ----------------------------------------------------------------------------------
def _auto_algorithm(node: Node, x_shape: Sequence[int], w_shape: Sequence[int], dtype: np.dtype) -> str:
    spec = conv_window(node.attrs, w_shape)
    return heuristic_conv_algorithm(spec, x_shape, int(w_shape[0]), node.attrs.group, dtype,
                                    *fused_epilogue(node))


def _auto_workspace(node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype) -> int:
    return WORKSPACES[_auto_algorithm(node, x_shape, w_shape, dtype)](node, x_shape, w_shape, dtype)


def with_epilogue(algorithm: str) -> Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray]:
    """The body registered as ``algorithm`` with the shared prologue and epilogue (``run_conv``): a bound
    call's fallback. The body is looked up per call: it is registered after the prepare that falls back."""
    return lambda node, arrays, out, workspace: run_conv(BODIES[algorithm], node, arrays, out, workspace)


# The lambdas look up ``_batch_columns_chunk``, defined below, when a node is prepared.
def _or_blas_chunks(
    prepare: Callable[[Node, Sequence[TensorInfo | None], Out, np.ndarray | None], BoundCall | None],
    algorithm: str,
) -> Callable[[Node, Sequence[TensorInfo | None], Out, np.ndarray | None], BoundCall | None]:
    """``prepare``, or where it binds nothing, ``_ChunkedBlasCall`` (a batch's products on BLAS)."""

    def prepared(node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None) -> BoundCall | None:
        found = prepare(node, inputs, out, workspace)
        if found is not None:
            return found
        return _ChunkedBlasCall.bind(node, inputs, out, workspace, with_epilogue(algorithm))

    return prepared


_auto_bands = _or_blas_chunks(own_gemm.prepare_bands(with_epilogue(AUTO), lambda *a: _batch_columns_chunk(*a)), AUTO)


def _prepare_auto(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """The im2col bands (``own_gemm.prepare_bands``) where the cost model picks im2col, the picked
    algorithm's own ``prepare`` where it has one (``PREPARES``); else none."""
    x, w = inputs[0], inputs[1]
    if x is None or w is None:
        return None
    algorithm = _auto_algorithm(node, x.shape, w.shape, x.dtype)
    if algorithm == IM2COL:
        return _auto_bands(node, inputs, out, workspace)
    prepare = PREPARES.get(algorithm)
    return None if prepare is None else prepare(node, inputs, out, workspace)


@conv_kernel(AUTO, supports=None, workspace=_auto_workspace, prepare=_prepare_auto)
def _auto(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """Any Conv: the cost model's algorithm for the concrete shapes, chosen at run time."""
    return BODIES[_auto_algorithm(node, x.shape, w.shape, x.dtype)](node, x, w, y, scratch)


@conv_kernel(POINTWISE, supports=_supports_pointwise, prepare=own_gemm.prepare_pointwise(with_epilogue(POINTWISE)))
def pointwise(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """1x1 stride-1 unpadded Conv (any group) as one GEMM on X as it lies: no im2col."""
    group = node.attrs.group
    batch, channels, *spatial = x.shape
    kernels = w.shape[0]
    positions = math.prod(spatial)
    y = target_y(y, (batch, kernels, *spatial), x.dtype)
    if group == 1:
        split_matmul(w.reshape(kernels, channels), x.reshape(batch, channels, positions),
                     out=as_view(y, (batch, kernels, positions)))
    else:
        weights = w.reshape(group, kernels // group, channels // group)
        split_matmul(weights, x.reshape(batch, group, channels // group, positions),
                  out=as_view(y, (batch, group, kernels // group, positions)))
    return y


#: im2col builds the columns of this many bytes of images at a time (at least one image): at batch 16
#: whole-batch columns would dominate the arena (118 MiB for GoogLeNet's first layer), and numpy's
#: batched matmul calls BLAS once per image anyway, so chunking costs no GEMM efficiency.
IM2COL_CHUNK_BYTES = 8 << 20


def _im2col_chunk(batch: int, channels: int, taps: int, positions: int, itemsize: int) -> int:
    """Images per im2col chunk."""
    image = max(channels * taps * positions * itemsize, 1)
    return max(1, min(batch, IM2COL_CHUNK_BYTES // image))


#: Below this many output positions per image, a chunk of images is multiplied as one GEMM over the
#: whole chunk (``W [K, C*taps] @ columns [C*taps, n*P]``) rather than numpy's stacked matmul, which
#: calls BLAS once per image: on tiny feature maps each per-image product is too thin to run at the
#: BLAS rate. Measured on one core at batch 16 (interleaved minimums, im2col kernel end to end):
#: 7x7 (K320, C160) 11.5 -> 8.8 ms and 8x8 (K64, C32, 5x5) 3.0 -> 2.5 ms; from 14x14 up the two tie or
#: the channel-major column build costs more than the wider GEMM saves (16x16, 5x5: 7.3 vs 8.6 ms).
WHOLE_CHUNK_MAX_POSITIONS = 128


def _whole_chunk(count: int, group: int, positions: int) -> bool:
    """Whether a chunk of ``count`` images is multiplied as one GEMM (see WHOLE_CHUNK_MAX_POSITIONS)."""
    return count > 1 and group == 1 and positions < WHOLE_CHUNK_MAX_POSITIONS


def _im2col_scratch(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype
) -> list[tuple[tuple[int, ...], np.dtype]]:
    """Per chunk of images: the padded input (when padded and the columns are not compiled) and the
    columns ``[n, C*taps, P]``; a whole-chunk GEMM also takes its products ``[K, n*P]`` (its padded input
    is channel-major, same size)."""
    geo = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
    taps = math.prod(geo.kernel)
    positions = math.prod(geo.out)
    chunk = _im2col_chunk(int(x_shape[0]), int(x_shape[1]), taps, positions, np.dtype(dtype).itemsize)
    part = (chunk, *x_shape[1:])
    columns = ((chunk, int(x_shape[1]) * taps, positions), dtype)
    padding = [] if _compiled_columns(geo, dtype) else padding_scratch(geo, part, dtype)
    requests = [*padding, columns]
    if _whole_chunk(chunk, node.attrs.group, positions):
        requests.append(((int(w_shape[0]), chunk * positions), dtype))
    return requests


@conv_kernel(
    IM2COL, supports=None, workspace=lambda *a: scratch_bytes(_im2col_scratch(*a)),
    prepare=_or_blas_chunks(own_gemm.prepare_bands(with_epilogue(IM2COL), lambda *a: _batch_columns_chunk(*a)), IM2COL),
)  # fmt: skip
def im2col(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """Any Conv (N-d, strides, dilations, groups): im2col buffer + GEMM, a chunk of images at a time."""
    return _im2col(node, x, w, y, scratch)[0]


def _im2col_finishing(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """``im2col`` with the bias and the fused activation: applied as a batch's bands store their tiles
    (``_bands_of_a_batch``; an activation other than a clamp after), else by the shared epilogue pass."""
    bounds = own_gemm.clamp_bounds(node.attrs.fused)
    y, finished = _im2col(node, x, w, y, scratch, bias, bounds)
    if finished:
        return y, bounds is not None
    finish_channels(y, bias, node.attrs.fused)
    return y, True


FINISHING[im2col] = _im2col_finishing


def _im2col(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch,
    bias: np.ndarray | None = None, bounds: tuple[float, float] | None = None,
) -> tuple[np.ndarray, bool]:  # fmt: skip
    """``im2col``'s Y, and whether ``bias`` was added and ``bounds`` (a clamp, or None: none) applied (only
    a batch's bands do both)."""
    group = node.attrs.group
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    batch, channels = x.shape[:2]
    kernels = w.shape[0]
    taps = math.prod(geo.kernel)
    positions = math.prod(geo.out)
    reduction = channels // group * taps
    y = target_y(y, (batch, kernels, *geo.out), x.dtype)
    chunk = _im2col_chunk(batch, channels, taps, positions, x.itemsize)
    weights = w.reshape(kernels, reduction) if group == 1 else w.reshape(group, kernels // group, reduction)
    if _bands_of_a_batch(geo, x, weights, y, group, chunk, scratch, bias, bounds):
        return y, True
    for start in range(0, batch, chunk):
        # NOTE: one chunk (the common case at small batches) needs no slicing.
        part_x, part_y = (x, y) if chunk >= batch else (x[start : start + chunk], y[start : start + chunk])
        count = part_x.shape[0]
        scratch.reset()
        if _whole_chunk(count, group, positions):
            _whole_chunk_gemm(geo, part_x, weights, as_view(part_y, (count, kernels, positions)), scratch)
        else:
            _per_image_gemm(geo, part_x, weights, part_y, group, scratch)
    return y, False


def _bands_of_a_batch(
    geo: Geometry, x: np.ndarray, weights: np.ndarray, y: np.ndarray, group: int, chunk: int, scratch: Scratch,
    bias: np.ndarray | None, bounds: tuple[float, float] | None,
) -> bool:  # fmt: skip
    """Whether the whole batch ran as bands on the tile GEMM (``own_gemm.bands_on_own_threads``), with
    ``bias`` added and clamped to ``bounds`` (None: no clamp) as the tiles are stored: more than one
    image, group 1, compiled columns over maps of at least ``WHOLE_CHUNK_MAX_POSITIONS`` positions,
    weights up to ``BAND_MAX_WEIGHT_BYTES`` (every band reads all of W again: ZFNet's 2.4 MB second layer
    ran its network 1.31x slower in bands at batch 16) unless an image's columns are one band. The bands'
    buffers are one chunk's columns workspace. Inception v2's 7x7 stride-2 first layer at batch 16: 24.5
    -> 12.6 ms (columns built whole per image, then multiplied, before)."""
    batch, channels = int(x.shape[0]), int(x.shape[1])
    kernels, positions = int(weights.shape[0]), math.prod(geo.out)
    if not _batch_bands_take(geo, batch, group, weights.nbytes, weights[0].nbytes, x.dtype):
        return False
    scratch.reset()
    buffer = scratch.take((chunk * channels * math.prod(geo.kernel) * positions,), x.dtype)
    epilogue = (None if bias is None else np.ascontiguousarray(bias, np.float32), bounds or (-math.inf, math.inf))
    products = as_view(y, (batch, kernels, positions))
    return own_gemm.bands_on_own_threads(x, weights, products, geo, buffer, *epilogue)


def _batch_bands_take(geo: Geometry, batch: int, group: int, weight_bytes: int, row_bytes: int, dtype: np.dtype) -> bool:
    """``_bands_of_a_batch``'s rule: more than one image, group 1, compiled columns over maps of at least
    ``WHOLE_CHUNK_MAX_POSITIONS`` positions, weights (``row_bytes`` a kernel) up to
    ``BAND_MAX_WEIGHT_BYTES`` unless an image's columns are one band."""
    positions = math.prod(geo.out)
    if batch < 2 or group != 1 or positions < WHOLE_CHUNK_MAX_POSITIONS or not _compiled_columns(geo, dtype):
        return False
    return weight_bytes <= BAND_MAX_WEIGHT_BYTES or row_bytes * positions <= own_gemm.BAND_BYTES


def _batch_columns_chunk(node: Node, x_info: TensorInfo, w_info: TensorInfo) -> int | None:
    """Images per chunk where a batch's im2col Conv runs as whole columns on the tile GEMM on a spinning
    run (``own_gemm.prepare_bands``), else None: float32, 2-D compiled columns, group 1, more than one
    image, shapes known, BLAS narrower than the tiles (``blas_is_narrow``; elsewhere BLAS keeps these
    products but a 1x1 window's), over maps of ``WHOLE_CHUNK_MAX_POSITIONS`` positions or more, and not
    what a batch's bands take (``_batch_bands_take``) unless it adds a folded residual, which the bands
    leave to a pass of its own. The chunk is the one ``_im2col_scratch`` declares columns for.

    A strided 1x1 window's columns are a quarter of X and its product shallow: on the Zen 4 VM
    (2026-12-06, OpenBLAS on its SkylakeX kernels) ResNet-50's 1x1 stride-2 projections at batch 16 ran
    in-run 23.5 -> 19.3 ms (256 -> 512) and 20.1 -> 17.8 (512 -> 1024) on the tiles, where its 3x3
    stride-2 layers ran slower (26.2 -> 29.4, 21.4 -> 23.4), so those stay on BLAS."""
    x_shape, w_shape = x_info.shape, w_info.shape
    if x_info.dtype != np.float32 or w_info.dtype != np.float32 or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    if not all(isinstance(d, int) for d in (*x_shape, *w_shape)) or x_shape[0] < 2 or node.attrs.group != 1:
        return None
    geo = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
    weight_bytes = 4 * math.prod(w_shape)
    if not _compiled_columns(geo, x_info.dtype) or not (blas_is_narrow() or math.prod(geo.kernel) == 1):
        return None
    if math.prod(geo.out) < WHOLE_CHUNK_MAX_POSITIONS:
        return None  # one product over a chunk's images fills the tiles' lanes (``_whole_chunk_gemm``)
    bands = _batch_bands_take(geo, int(x_shape[0]), 1, weight_bytes, weight_bytes // int(w_shape[0]), x_info.dtype)
    if bands and not node.attrs.residual:  # the bands add no residual as they store
        return None
    return _im2col_chunk(int(x_shape[0]), int(x_shape[1]), math.prod(geo.kernel), math.prod(geo.out), 4)


def _compiled_columns(geo: Geometry, dtype: np.dtype) -> bool:
    """Whether im2col's columns are built by the compiled loop (``jit_im2col``: 2-D, float)."""
    return len(geo.axes) == 2 and np.dtype(dtype) in COMPILED_DTYPES


def _per_image_gemm(
    geo: Geometry, x: np.ndarray, weights: np.ndarray, y: np.ndarray, group: int, scratch: Scratch
) -> None:
    """Columns ``[n, C*taps, P]`` and numpy's stacked matmul (one BLAS call per image and group)."""
    count, channels = x.shape[:2]
    kernels, positions = y.shape[1], math.prod(geo.out)
    if _banded(geo, x, weights, group):
        _banded_gemm(geo, x, weights, as_view(y, (kernels, positions)), scratch)
        return
    # The im2col copy; rows ordered (c, taps...) like W's flattening.
    columns = scratch.take((count, channels * math.prod(geo.kernel), positions), x.dtype)
    if _compiled_columns(geo, x.dtype):
        compiled_im2col(x, geo, columns)
    else:
        windows = geo.windows(pad_into(geo, x, scratch))  # [n, C, *kernel, *out], a view
        np.copyto(columns.reshape(windows.shape), windows)
    products = as_view(y, (count, kernels, positions))
    # NOTE: grouped too: AlexNet's 5x5 group-2 layer at batch 16 ran at ~80 GMAC/s on BLAS's stacked calls.
    if own_gemm.product_on_own_threads(weights, columns, products, groups=group):
        return
    if group == 1:
        split_matmul(weights, columns, out=products)
    else:
        split_matmul(
            weights,
            columns.reshape(count, group, weights.shape[-1], positions),
            out=as_view(y, (count, group, kernels // group, positions)),
        )


#: From this size, one image's im2col columns are built and multiplied a band of output rows at a time,
#: each band by one thread (with BLAS at one thread), instead of whole: the columns of GoogLeNet's,
#: ResNet-50's and Inception v2's 7x7 stride-2 first layer are 7.4 MB, past the L2 cache, so the GEMM read
#: them back from memory, and their build was split by input channel, 3 of them. Bands of ``BAND_BYTES``
#: stay in the cache. Measured on the 2-core VM (that layer alone, 64 kernels, minimums): 1.98 -> 1.35
#: ms; 96 kernels (ZFNet) 2.08 -> 1.73; AlexNet's 11x11 stride-4 layer 1.22 -> 1.07.
BAND_MIN_COLUMN_BYTES = 2 << 20
#: Columns per band (whole output rows, at least one).
BAND_BYTES = 1 << 20
#: Weights up to this size only: each band's GEMM reads all of them again. ZFNet's second layer (2.4 MB
#: of weights, 6.5 MB of columns) in bands ran its network 1.20x slower.
BAND_MAX_WEIGHT_BYTES = 256 << 10


def _banded(geo: Geometry, x: np.ndarray, weights: np.ndarray, group: int) -> bool:
    """Whether ``_per_image_gemm`` multiplies ``x`` (its chunk of images) band by band: one image, group
    1, columns built by the compiled loop, at least ``BAND_MIN_COLUMN_BYTES`` of them, weights up to
    ``BAND_MAX_WEIGHT_BYTES``, two threads."""
    if x.shape[0] != 1 or group != 1 or not _compiled_columns(geo, x.dtype) or intra_op_threads() < 2:
        return False
    column_bytes = int(x.shape[1]) * math.prod(geo.kernel) * math.prod(geo.out) * x.itemsize
    return column_bytes >= BAND_MIN_COLUMN_BYTES and weights.nbytes <= BAND_MAX_WEIGHT_BYTES


def _banded_gemm(geo: Geometry, x: np.ndarray, weights: np.ndarray, y: np.ndarray, scratch: Scratch) -> None:
    """``y [K, P] = weights @ columns`` of the one image ``x``, band of output rows by band: the kernel
    threads each take a range of rows, and build and multiply its bands in a buffer of their own."""
    reduction = weights.shape[1]
    out_h, out_w = geo.out
    band_rows = max(1, BAND_BYTES // (reduction * out_w * x.itemsize))
    threads = min(intra_op_threads(), -(-out_h // band_rows))
    buffers = [scratch.take((reduction * band_rows * out_w,), x.dtype) for _ in range(threads)]

    def rows_of(part: int) -> None:
        first, last = out_h * part // threads, out_h * (part + 1) // threads
        for top in range(first, last, band_rows):
            bottom = min(last, top + band_rows)
            width = (bottom - top) * out_w
            columns = buffers[part][: reduction * width].reshape(reduction, width)
            compiled_im2col_rows(x, geo, columns, top, bottom)
            np.matmul(weights, columns, out=y[:, top * out_w : top * out_w + width])

    with blas_threads(1):
        parallel_for(rows_of, threads, threads)


def _whole_chunk_gemm(geo: Geometry, x: np.ndarray, weights: np.ndarray, y: np.ndarray, scratch: Scratch) -> None:
    """Channel-major columns ``[C*taps, n*P]``, one GEMM, then the products laid out as ``y [n, K, P]``."""
    count, channels = x.shape[:2]
    kernels, positions = weights.shape[0], y.shape[2]
    if _compiled_columns(geo, x.dtype):
        columns = scratch.take((channels, math.prod(geo.kernel), count, *geo.out), x.dtype)
        compiled_im2col(x, geo, columns, channel_major=True)
    else:
        padded = scratch.take((channels, count, *(a.padded for a in geo.axes)), x.dtype) if geo.needs_padding else None
        columns = scratch.take((channels, math.prod(geo.kernel), count, *geo.out), x.dtype)
        channel_columns(x, geo, out=columns, padded=padded)
    products = scratch.take((kernels, count * positions), x.dtype)
    flat_columns = columns.reshape(weights.shape[1], count * positions)
    if not own_gemm.product_on_own_threads(weights, flat_columns[None], products[None]):
        split_matmul(weights, flat_columns, out=products)
    np.copyto(y, products.reshape(kernels, count, positions).transpose(1, 0, 2))


class _ChunkedBlasCall:
    """A batch's ungrouped im2col Conv whose products stay on BLAS (``_im2col``'s chunks of images: on
    small maps one product over a chunk of two or more, ``_whole_chunk``, else one product per image),
    bound so that a captured run replays it: per chunk, the columns (``jit_im2col``), the CBLAS products in
    blocks (``jit_gemm``), and one pass that adds the bias and a folded residual and applies the
    activation (``jit_epilogue.gathered_planes_job``: gathering a chunk's product into Y, or finishing
    Y's own products in place). A call runs the kernel as before (``fallback``).

    Why: these layers (at batch 16, ResNet-50's and Inception v2's stride-2 layers onto 7x7 maps and
    ZFNet's 5x5 stride-2 layer, which stays on BLAS where BLAS is as wide as the tiles) were the steps
    their captured runs still called from Python, so those runs could not become compiled packages
    (``hetflow compile``). A/B at batch 16 (Zen 4 VM): resnet50 1.03 then 1.00, inception_v2 0.99."""

    def __init__(
        self, node: Node, geo: Geometry, chunk: int, target: np.ndarray, depth: int,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> None:  # fmt: skip
        self.node, self.geo, self.fallback, self.workspace = node, geo, fallback, workspace
        self.out = (target,)
        self.depth = depth
        batch = int(target.shape[0])
        self.chunks = [(first, min(batch, first + chunk)) for first in range(0, batch, chunk)]
        self.whole = _whole_chunk(chunk, node.attrs.group, math.prod(geo.out))
        code, alpha, beta = activation_code(node.attrs.fused)
        self.code, self.constants = code, np.array([alpha, beta, 0.0], np.float32)

    @classmethod
    def bind(
        cls, node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
    ) -> _ChunkedBlasCall | None:  # fmt: skip
        """The call where the kernel multiplies a batch's chunks on BLAS (see the class; not one image's
        bands) with compiled columns into a planned float32 Y whose images are each C-contiguous (a
        Concat's slice may be), with an activation the finishing pass applies; else None."""
        x_info, w_info = inputs[0], inputs[1]
        if x_info is None or w_info is None or x_info.dtype != np.float32 or w_info.dtype != np.float32:
            return None
        if len(x_info.shape) != 4 or not all(isinstance(d, int) for d in (*x_info.shape, *w_info.shape)):
            return None
        if node.attrs.group != 1 or (node.attrs.fused is not None and activation_code(node.attrs.fused)[0] == NO_ACTIVATION):
            return None
        geo = geometry(conv_window(node.attrs, w_info.shape), x_info.shape[2:])
        batch, channels = int(x_info.shape[0]), int(x_info.shape[1])
        taps, positions = math.prod(geo.kernel), math.prod(geo.out)
        chunk = _im2col_chunk(batch, channels, taps, positions, 4)
        if not _compiled_columns(geo, x_info.dtype) or (chunk > 1 and batch % chunk == 1):
            return None  # (a last chunk of one image may take the bands)
        banded = channels * taps * positions * 4 >= BAND_MIN_COLUMN_BYTES and 4 * math.prod(w_info.shape) <= BAND_MAX_WEIGHT_BYTES
        if chunk == 1 and banded:
            return None  # one image at a time, in bands (``_banded``)
        if _batch_bands_take(geo, batch, 1, 4 * math.prod(w_info.shape), 4 * math.prod(w_info.shape[1:]), x_info.dtype):
            return None  # the kernel's bands take it (prepare_bands binds them where it can)
        target = out[0] if out is not None else None
        y_shape = (batch, int(w_info.shape[0]), *geo.out)
        if target is None or target.shape != y_shape or target.dtype != np.float32 or flat_images(target) is None:
            return None
        return cls(node, geo, chunk, target, channels * taps, fallback, workspace)

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return [self.fallback(self.node, arrays, self.out, self.workspace)]

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """Each chunk's columns, products and finishing pass as spin-pool jobs (``BoundCall``'s capture);
        None where an operand is not C-contiguous float32, the products do not fit CBLAS, or a residual
        lies in Y's memory where the products are written into Y."""
        x, w = arrays[0], arrays[1]
        bias = arrays[2] if len(arrays) > 2 else None
        residual = arrays[3] if self.node.attrs.residual else None
        target = self.out[0]
        if not all(a is None or (a.dtype == np.float32 and a.flags.c_contiguous) for a in (x, w, bias, residual)):
            return None
        if residual is not None and (residual.shape != target.shape or (not self.whole and np.shares_memory(residual, target))):
            return None
        weights = w.reshape(w.shape[0], self.depth)  # type: ignore[union-attr]
        jobs: list[Job] = []
        for first, last in self.chunks:
            found = self._chunk_jobs(x[first:last], weights, target[first:last])  # type: ignore[index]
            if found is None:
                return None
            products, strides, chunk_jobs = found
            chunk_y = flat_images(target[first:last])
            assert chunk_y is not None  # (Y's images are each C-contiguous: ``bind``)
            shape = (last - first, weights.shape[0], math.prod(self.geo.out))
            chunk_residual = None if residual is None else residual[first:last]
            jobs += [*chunk_jobs, gathered_planes_job(products, chunk_y, shape, chunk_residual, bias, strides,
                                                      self.code, self.constants, 2 * intra_op_threads())]  # fmt: skip
        return [target], jobs

    def _chunk_jobs(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, tuple[int, int], list[Job]] | None:
        """A chunk's columns and products as jobs, the products' memory and its (image, kernel) strides."""
        return self._whole_chunk_jobs(x, weights) if self.whole else self._per_image_jobs(x, weights, y)

    def _whole_chunk_jobs(self, x: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, tuple[int, int], list[Job]] | None:
        """Channel-major columns and one product ``[K, n * P]`` over the chunk (``_whole_chunk_gemm``)."""
        count, kernels, positions = x.shape[0], weights.shape[0], math.prod(self.geo.out)
        scratch = Scratch(self.workspace)
        columns = scratch.take((self.depth, count * positions), np.float32)
        products = scratch.take((kernels, count * positions), np.float32)
        parts = spin_product_parts(kernels * self.depth * count * positions, count * positions)
        product = product_job(weights, columns, products, parts)
        if product is None:
            return None
        return products, (positions, count * positions), [im2col_job(x, self.geo, columns, channel_major=True), product]

    def _per_image_jobs(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, tuple[int, int], list[Job]] | None:
        """Image-major columns and one product per image into Y itself, each split in column blocks over
        the threads (a stack of one single-threaded product per image left a chunk of one image to one
        thread: ZFNet at batch 16 1.26x)."""
        count, kernels, positions = x.shape[0], weights.shape[0], math.prod(self.geo.out)
        columns = Scratch(self.workspace).take((count, self.depth, positions), np.float32)
        views = as_view(y, (count, kernels, positions))
        parts = spin_product_parts(kernels * self.depth * positions, positions)
        products = [product_job(weights, columns[i], views[i], parts) for i in range(count)]
        found = flat_images(y)
        if found is None or any(job is None for job in products):
            return None
        flat_y, image_stride = found
        return flat_y, (image_stride, positions), [im2col_job(x, self.geo, columns), *products]  # type: ignore[list-item]


def _depthwise_scratch(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype
) -> list[tuple[tuple[int, ...], np.dtype]]:
    """2-D: nothing (the compiled kernel keeps one padded input plane per thread). Otherwise, stride 1:
    the padded input (one extra slab), the wide result when cropped, the products; strided: the padded
    input and the products."""
    geo = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
    batch, channels = int(x_shape[0]), int(x_shape[1])
    multiplier = int(w_shape[0]) // channels
    if _compiled(geo):
        return []
    if not all(a.stride == 1 for a in geo.axes):
        products = ((batch, channels, multiplier, *geo.out), dtype)
        return [*padding_scratch(geo, x_shape, dtype), products]
    first, rest = geo.axes[0], geo.axes[1:]
    inner = tuple(a.padded for a in rest)
    length = first.out * math.prod(inner)
    wide = ((batch, channels, multiplier, length), dtype)
    padded = ((batch, channels, first.padded + 1, *inner), dtype)
    cropped = [wide] if _flat_crops(geo) else []
    return [padded, *cropped, wide]


def _flat_crops(geo: Geometry) -> bool:
    """Whether the stride-1 flat method computes columns past the output (so its result is cropped)."""
    return any(a.padded != a.out for a in geo.axes[1:])


def _prepare_depthwise(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """The depthwise kernel bound to a float32 2-D node whose planes ``jit_depthwise_lanes`` runs into the
    planned Y, with the fused activation applied as it stores: a call as ``run_conv`` makes it, and the
    capture of its planes' job (what a captured run replays)."""
    x_info, w_info = inputs[0], inputs[1]
    target = out[0] if out is not None else None
    if x_info is None or w_info is None or target is None or node.attrs.residual:
        return None
    if x_info.dtype != np.float32 or w_info.dtype != np.float32 or target.dtype != np.float32:
        return None
    x_shape, w_shape = tuple(int(d) for d in x_info.shape), tuple(int(d) for d in w_info.shape)
    geo = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
    code, alpha, beta = activation_code(node.attrs.fused)
    flat = flat_images(target)
    if not _compiled(geo) or flat is None or target.shape != (x_shape[0], w_shape[0], *geo.out):
        return None
    rows, cols = geo.axes
    if (code == NO_ACTIVATION and node.attrs.fused is not None) or not jit_depthwise_lanes.applies(
        np.dtype(np.float32), x_shape[1], w_shape[0], cols.stride
    ):
        return None
    window = (*w_shape[2:], rows.stride, cols.stride, rows.dilation, cols.dilation, rows.pad_begin, cols.pad_begin)
    activation = jit_depthwise_lanes.activation_constants(code, alpha, beta)
    no_bias = np.zeros(w_shape[0], np.float32)

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return [run_conv(depthwise, node, arrays, out, workspace)]

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        x, w = arrays[0], arrays[1]
        if not (x.flags.c_contiguous and w.flags.c_contiguous):  # type: ignore[union-attr]
            return None
        b = arrays[2] if len(arrays) > 2 else None
        bias = no_bias if b is None else np.ascontiguousarray(b, np.float32)
        shares = spin_parts(x.shape[0] * x.shape[1], geo.out[0] * geo.out[1], (x,))  # type: ignore[union-attr]
        job = jit_depthwise_lanes.planes_job(x, w, bias, flat[0], flat[1], geo.out, window, activation,  # type: ignore[arg-type]
                                             node.attrs.shuffle_groups, shares)  # fmt: skip
        return [target], [job]

    return with_capture(call, capture)


@conv_kernel(
    DEPTHWISE, supports=_supports_depthwise, workspace=lambda *a: scratch_bytes(_depthwise_scratch(*a)),
    prepare=_prepare_depthwise,
)  # fmt: skip
def depthwise(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """Depthwise Conv (group == C, any channel multiplier): direct accumulation over the kernel taps.

    2-D layers run the compiled kernel (``jit_depthwise``); other ranks accumulate one numpy pass per tap.
    """
    y, _ = _depthwise(node, x, w, y, scratch, None, None)
    return y


def _depthwise_finishing(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """``depthwise`` with the bias added and the fused activation applied where the kernel can."""
    return _depthwise(node, x, w, y, scratch, bias, node.attrs.fused)


FINISHING[depthwise] = _depthwise_finishing


def _depthwise(
    node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch,
    bias: np.ndarray | None, fused: FusedActivation | None,
) -> tuple[np.ndarray, bool]:
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    batch, channels = x.shape[:2]
    multiplier = w.shape[0] // channels  # output channels per input channel
    y = target_y(y, (batch, channels * multiplier, *geo.out), x.dtype)
    groups = node.attrs.shuffle_groups
    if _compiled(geo):
        rows, cols = geo.axes
        activated = depthwise_2d(x, w, bias, y, (rows.stride, cols.stride), (rows.dilation, cols.dilation),
                                 (rows.pad_begin, cols.pad_begin), fused, groups)
        return y, activated
    if groups:
        x = shuffled_channels(x, groups)
    # Weights per tap as [C, multiplier, 1, ...] so they broadcast over the output positions.
    taps = w.reshape(channels, multiplier, -1)
    if all(a.stride == 1 for a in geo.axes):
        _accumulate_taps_flat(x, taps, geo, y, scratch)
    else:
        _accumulate_taps_strided(x, taps, geo, y, scratch)
    finish_channels(y, bias, fused)
    return y, True


def _compiled(geo: Geometry) -> bool:
    """Whether the compiled 2-D kernel runs this depthwise layer."""
    return len(geo.axes) == 2


def _accumulate_taps_strided(x: np.ndarray, taps: np.ndarray, geo: Geometry, y: np.ndarray, scratch: Scratch) -> None:
    """Depthwise accumulation with every tap a strided slice ``[N, C, 1, *out]`` of the padded input."""
    batch, channels, multiplier = x.shape[0], taps.shape[0], taps.shape[1]
    padded = pad_into(geo, x, scratch)[:, :, None]
    ones = (1,) * len(geo.out)
    shape = (batch, channels, multiplier, *geo.out)
    acc = as_view(y, shape)
    products = scratch.take(shape, x.dtype)
    for index, tap in enumerate(geo.taps()):
        source = padded[(..., *geo.tap_slices(tap))]
        weight = taps[:, :, index].reshape(channels, multiplier, *ones)
        _multiply_accumulate(acc, source, weight, products, first=index == 0)


def _accumulate_taps_flat(x: np.ndarray, taps: np.ndarray, geo: Geometry, y: np.ndarray, scratch: Scratch) -> None:
    """Stride-1 depthwise accumulation on the flattened padded input.

    Output row r and tap (i, j) read padded row r + i from column j: in the flattened padded image that
    is one contiguous run per tap, so each tap is a shifted 1-D view (long contiguous loops, about twice
    as fast as strided 2-D slices). Outputs are computed for every padded column and the columns past
    the real output width (wrapped-around garbage) are dropped at the end.
    """
    batch, channels, multiplier = x.shape[0], taps.shape[0], taps.shape[1]
    first, rest = geo.axes[0], geo.axes[1:]
    inner = tuple(a.padded for a in rest)
    # One extra slab along the first axis keeps the last taps' runs inside the buffer.
    padded = scratch.take((batch, channels, first.padded + 1, *inner), x.dtype)
    padded.fill(0)
    padded[(..., *(slice(a.pad_begin, a.pad_begin + a.size) for a in geo.axes))] = x
    flat = padded.reshape(batch, channels, 1, -1)
    length = first.out * math.prod(inner)
    shape = (batch, channels, multiplier, length)
    crops = _flat_crops(geo)
    acc = scratch.take(shape, x.dtype) if crops else as_view(y, shape)
    products = scratch.take(shape, x.dtype)
    buffer_shape = (first.padded + 1, *inner)
    for index, tap in enumerate(geo.taps()):
        start = tuple(t * a.dilation for t, a in zip(tap, geo.axes))
        offset = int(np.ravel_multi_index(start, buffer_shape))
        source = flat[..., offset : offset + length]
        _multiply_accumulate(acc, source, taps[:, :, index, None], products, first=index == 0)
    if crops:
        wide = acc.reshape(batch, channels, multiplier, first.out, *inner)
        np.copyto(as_view(y, (batch, channels, multiplier, *geo.out)), wide[(..., *(slice(0, a.out) for a in rest))])


def _multiply_accumulate(
    y: np.ndarray, source: np.ndarray, weight: np.ndarray, scratch: np.ndarray, first: bool
) -> None:
    """``y = source * weight`` on the first tap, ``y += source * weight`` after (numpy has no fma)."""
    if first:
        np.multiply(source, weight, out=y)
    else:
        np.multiply(source, weight, out=scratch)
        y += scratch
