"""CPU kernels: convolution through BLAS.

Three methods, chosen per node by ``hetflow.ops.conv.conv_algorithm`` (the same choice the cost model
makes):

* pointwise (1x1, stride 1, unpadded): X viewed as ``[N, group, C/group, P]`` is already the GEMM's
  right operand, so one ``matmul`` per group and image and no copy of X;
* depthwise (one input channel per group): a loop over the kh*kw taps, each a strided slice of the
  padded input multiplied by one weight per channel and accumulated, vectorised over everything else;
* im2col (the rest): the padded input is viewed through ``as_strided`` as ``[N, C, *kernel, *out]``,
  reshaped (the one copy: the im2col buffer ``[N, group, C/group*taps, P]``) and multiplied by the
  weights ``[group, K/group, C/group*taps]`` in one batched ``matmul``.

Every method writes Y as ``[N, group, K/group, P]``, which *is* NCHW-contiguous ``[N, K, *out]``.
float32 and float64 are computed in their own precision; float16 is computed in float32 (numpy has no
float16 BLAS) and rounded back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.epilogue import finish_channels
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.conv import DEPTHWISE, POINTWISE, conv_algorithm, conv_window
from hetflow.ops.spatial import Geometry, geometry


@cpu_kernel("Conv")
def conv(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Conv on NCHW (N-d) arrays; dtype in = dtype out."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    dtype = x.dtype
    compute = np.float32 if dtype == np.float16 else dtype
    x = np.ascontiguousarray(x, dtype=compute)
    w = np.ascontiguousarray(w, dtype=compute)
    group = node.attrs.group
    spec = conv_window(node.attrs, w.shape)
    algorithm = conv_algorithm(spec, x.shape[1], group)
    if algorithm == POINTWISE:
        y = _pointwise(x, w, group)
    else:
        geo = geometry(spec, x.shape[2:])
        y = _depthwise(x, w, geo) if algorithm == DEPTHWISE else _im2col(x, w, geo, group)
    finish_channels(y, bias, node.attrs.fused)
    return [y.astype(dtype, copy=False)]


def _pointwise(x: np.ndarray, w: np.ndarray, group: int) -> np.ndarray:
    batch, channels, *spatial = x.shape
    kernels = w.shape[0]
    positions = int(np.prod(spatial, dtype=np.int64))
    if group == 1:
        y = np.matmul(w.reshape(kernels, channels), x.reshape(batch, channels, positions))
    else:
        weights = w.reshape(group, kernels // group, channels // group)
        y = np.matmul(weights, x.reshape(batch, group, channels // group, positions))
    return y.reshape(batch, kernels, *spatial)


def _im2col(x: np.ndarray, w: np.ndarray, geo: Geometry, group: int) -> np.ndarray:
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


def _depthwise(x: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
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
