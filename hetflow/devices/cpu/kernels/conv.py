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
* ``auto`` (every Conv, registered first so that a lookup without shapes finds it): dispatches at run
  time on the concrete shapes with the cost model's heuristic; plans made for a symbolic batch use it.

Every method writes Y as ``[N, group, K/group, P]``, which *is* NCHW-contiguous ``[N, K, *out]``, and ends
with the shared epilogue (bias, fused activation). float32 and float64 are computed in their own
precision; float16 is computed in float32 (numpy has no float16 BLAS) and rounded back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.cpu.kernels.epilogue import finish_channels
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.conv import (
    AUTO,
    DEPTHWISE,
    IM2COL,
    POINTWISE,
    ConvAttrs,
    conv_algorithm,
    conv_window,
    heuristic_conv_algorithm,
)
from hetflow.ops.spatial import Geometry, WindowSpec, geometry

#: An algorithm's core: (node, X, W) in the compute dtype -> Y ``[N, K, *out]`` before the epilogue.
ConvBody = Callable[[Node, np.ndarray, np.ndarray], np.ndarray]

#: Algorithm name -> its body, for the ``auto`` dispatcher (winograd.py adds its own).
BODIES: dict[str, ConvBody] = {}


def conv_kernel(
    algorithm: str, supports: Callable[[Node, InputInfos], str | None] | None
) -> Callable[[ConvBody], ConvBody]:
    """Register ``body`` as the CPU Conv kernel ``algorithm``, wrapped in the shared prologue/epilogue."""

    def decorate(body: ConvBody) -> ConvBody:
        def kernel(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return [run_conv(body, node, inputs)]

        functools.update_wrapper(kernel, body)  # __wrapped__ lets tuning hash the body's source
        cpu_kernel("Conv", algorithm=algorithm, supports=supports)(kernel)
        BODIES[algorithm] = body
        return body

    return decorate


def run_conv(body: ConvBody, node: Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """Convert X and W to the compute dtype, run ``body``, apply bias + fused activation, cast back."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    dtype = x.dtype
    compute = np.float32 if dtype == np.float16 else dtype
    # NOTE: for float32/float64 these return the arrays themselves, so W keeps its identity (Winograd
    # caches its transformed weights per W array).
    x = np.ascontiguousarray(x, dtype=compute)
    w = np.ascontiguousarray(w, dtype=compute)
    y = body(node, x, w)
    finish_channels(y, bias, node.attrs.fused)
    return y.astype(dtype, copy=False)


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
@conv_kernel(AUTO, supports=None)
def _auto(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Any Conv: the cost model's algorithm for the concrete shapes, chosen at run time."""
    spec = conv_window(node.attrs, w.shape)
    return BODIES[heuristic_conv_algorithm(spec, x.shape, w.shape[0], node.attrs.group)](node, x, w)


@conv_kernel(POINTWISE, supports=_supports_pointwise)
def pointwise(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """1x1 stride-1 unpadded Conv (any group) as one GEMM on X as it lies: no im2col."""
    group = node.attrs.group
    batch, channels, *spatial = x.shape
    kernels = w.shape[0]
    positions = int(np.prod(spatial, dtype=np.int64))
    if group == 1:
        y = np.matmul(w.reshape(kernels, channels), x.reshape(batch, channels, positions))
    else:
        weights = w.reshape(group, kernels // group, channels // group)
        y = np.matmul(weights, x.reshape(batch, group, channels // group, positions))
    return y.reshape(batch, kernels, *spatial)


@conv_kernel(IM2COL, supports=None)
def im2col(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Any Conv (N-d, strides, dilations, groups): im2col buffer + one batched GEMM."""
    group = node.attrs.group
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    batch, channels = x.shape[:2]
    kernels = w.shape[0]
    taps = int(np.prod(geo.kernel, dtype=np.int64))
    positions = int(np.prod(geo.out, dtype=np.int64))
    windows = geo.windows(geo.pad(x))  # [N, C, *kernel, *out], a view
    reduction = channels // group * taps
    if group == 1:
        # NOTE: this reshape is the im2col copy; rows ordered (c, taps...) like W's flattening.
        columns = windows.reshape(batch, reduction, positions)
        y = np.matmul(w.reshape(kernels, reduction), columns)
    else:
        columns = windows.reshape(batch, group, reduction, positions)
        y = np.matmul(w.reshape(group, kernels // group, reduction), columns)
    return y.reshape(batch, kernels, *geo.out)


@conv_kernel(DEPTHWISE, supports=_supports_depthwise)
def depthwise(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Depthwise Conv (group == C, any channel multiplier): direct accumulation over the kernel taps."""
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    batch, channels = x.shape[:2]
    multiplier = w.shape[0] // channels  # output channels per input channel
    # Weights per tap as [C, multiplier, 1, ...] so they broadcast over the output positions.
    taps = w.reshape(channels, multiplier, -1)
    if all(a.stride == 1 for a in geo.axes):
        y = _accumulate_taps_flat(x, taps, geo)
    else:
        y = _accumulate_taps_strided(x, taps, geo)
    return y.reshape(batch, channels * multiplier, *geo.out)


def _accumulate_taps_strided(x: np.ndarray, taps: np.ndarray, geo: Geometry) -> np.ndarray:
    """Depthwise accumulation with every tap a strided slice ``[N, C, 1, *out]`` of the padded input."""
    batch, channels, multiplier = x.shape[0], taps.shape[0], taps.shape[1]
    padded = geo.pad(x)[:, :, None]
    ones = (1,) * len(geo.out)
    y = np.empty((batch, channels, multiplier, *geo.out), dtype=x.dtype)
    scratch = np.empty_like(y)
    for index, tap in enumerate(geo.taps()):
        source = padded[(..., *geo.tap_slices(tap))]
        weight = taps[:, :, index].reshape(channels, multiplier, *ones)
        _multiply_accumulate(y, source, weight, scratch, first=index == 0)
    return y


def _accumulate_taps_flat(x: np.ndarray, taps: np.ndarray, geo: Geometry) -> np.ndarray:
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
    padded = np.zeros((batch, channels, first.padded + 1, *inner), dtype=x.dtype)
    padded[(..., *(slice(a.pad_begin, a.pad_begin + a.size) for a in geo.axes))] = x
    flat = padded.reshape(batch, channels, 1, -1)
    length = first.out * int(np.prod(inner, dtype=np.int64))
    y = np.empty((batch, channels, multiplier, length), dtype=x.dtype)
    scratch = np.empty_like(y)
    buffer_shape = (first.padded + 1, *inner)
    for index, tap in enumerate(geo.taps()):
        start = tuple(t * a.dilation for t, a in zip(tap, geo.axes))
        offset = int(np.ravel_multi_index(start, buffer_shape))
        source = flat[..., offset : offset + length]
        _multiply_accumulate(y, source, taps[:, :, index, None], scratch, first=index == 0)
    wide = y.reshape(batch, channels, multiplier, first.out, *inner)
    return np.ascontiguousarray(wide[(..., *(slice(0, a.out) for a in rest))])


def _multiply_accumulate(
    y: np.ndarray, source: np.ndarray, weight: np.ndarray, scratch: np.ndarray, first: bool
) -> None:
    """``y = source * weight`` on the first tap, ``y += source * weight`` after (numpy has no fma)."""
    if first:
        np.multiply(source, weight, out=y)
    else:
        np.multiply(source, weight, out=scratch)
        y += scratch
