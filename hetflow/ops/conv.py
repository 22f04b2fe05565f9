"""Convolution: Conv (1-D, 2-D, 3-D and beyond; grouped and depthwise)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape, is_static
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
    present_outputs_bytes,
    wants,
)
from hetflow.ops.registry import register_op
from hetflow.ops.spatial import Geometry, WindowSpec, geometry, output_dims, window_spec

#: How a convolution is computed; the cost model and the CPU kernel agree through ``conv_algorithm``.
POINTWISE = "pointwise"  # 1x1, stride 1, no padding: a plain GEMM over the input, no im2col
DEPTHWISE = "depthwise"  # one input channel per group: tap accumulation, no GEMM
IM2COL = "im2col"  # everything else: im2col buffer + one GEMM per group
WINOGRAD_F23 = "winograd_f23"  # 3x3 stride 1: 2x2 output tiles from 4x4 input tiles, 16 GEMMs
WINOGRAD_F43 = "winograd_f43"  # 3x3 stride 1: 4x4 output tiles from 6x6 input tiles, 36 GEMMs
#: 2-D stride 1, one group, float32: register-blocked vector FMAs straight on padded planes, no GEMM
DIRECT_FMA = "direct_fma"
#: Not an algorithm but a dispatcher: picks ``heuristic_conv_algorithm`` at run time (symbolic plans).
AUTO = "auto"
#: Output tile edge m of each Winograd F(m x m, 3 x 3) algorithm (its input tile edge is m + 2).
WINOGRAD_TILE = {WINOGRAD_F23: 2, WINOGRAD_F43: 4}
#: Every algorithm a CPU Conv kernel implements.
CONV_ALGORITHMS = (POINTWISE, DEPTHWISE, IM2COL, WINOGRAD_F23, WINOGRAD_F43, DIRECT_FMA)
#: What computes a layer on a device without the preferred algorithm's kernel (the direct FMA kernel,
#: the plain pointwise GEMM and F(4,3) are the CPU's only). F(2,3) for F(4,3): on OpenCL it ran GoogLeNet
#: at batch 1 12% faster than im2col in its three 3x3 layers that the cost model gives F(4,3) (PoCL).
ALGORITHM_FALLBACK = {DIRECT_FMA: IM2COL, POINTWISE: IM2COL, WINOGRAD_F43: WINOGRAD_F23}
#: dtypes the direct kernel computes in (float16 is computed in float32, as every CPU Conv does).
DIRECT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


@dataclass(frozen=True)
class ConvAttrs:
    """Conv's attributes (opset 22). Empty tuples mean "not given" (ONNX computes the default)."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    #: hetflow-internal, not an ONNX attribute: the activation fused into the epilogue.
    fused: FusedActivation | None = None
    #: hetflow-internal: X is read channel-shuffled in this many groups (ShuffleNet's Reshape ->
    #: Transpose -> Reshape, folded by ``passes.fold_channel_shuffle``): channel c of the input is X's
    #: channel ``(c % groups) * (C // groups) + c // groups``. 0: X as it is.
    shuffle_groups: int = 0
    #: hetflow-internal: a fourth input R of Y's shape is added to the output before the fused activation
    #: (``passes.fuse_residual``: a residual Add/Sum folded into the Conv that produces its other input).
    residual: bool = False
    #: hetflow-internal: the CPU may keep W packed for its lane GEMM (``jit_lane_gemm``), a copy beside
    #: the raw weights; a memory budget too small for such copies clears it (``runtime.budget``).
    packed_weights: bool = True


def conv_window(attrs: ConvAttrs, weight_shape: Sequence[Dim]) -> WindowSpec:
    """The window of a Conv with weights of ``weight_shape`` (memoised: kernels ask on every run)."""
    return _conv_window_cached(attrs, tuple(weight_shape))


@functools.lru_cache(maxsize=4096)
def _conv_window_cached(attrs: ConvAttrs, weight_shape: Sequence[Dim]) -> WindowSpec:
    """The window of a Conv with weights of ``weight_shape`` ``[K, C/group, *kernel]``.

    Raises:
        ValueError: ``kernel_shape`` disagrees with the weights, or other attributes are malformed.
    """
    spatial = tuple(weight_shape[2:])
    kernel = tuple(attrs.kernel_shape) or spatial
    if attrs.kernel_shape and is_static(spatial) and tuple(attrs.kernel_shape) != spatial:
        raise ValueError(
            f"kernel_shape {tuple(attrs.kernel_shape)} disagrees with W's spatial dims {spatial}"
        )
    if not is_static(kernel):
        raise ValueError(f"the kernel's spatial size {format_shape(kernel)} must be known")
    return window_spec(attrs, kernel)


def conv_algorithm(spec: WindowSpec, channels: int, group: int) -> str:
    """Which method computes a Conv: POINTWISE, DEPTHWISE or IM2COL.

    Args:
        spec: the resolved window.
        channels: input channels C.
        group: the ``group`` attribute.
    """
    unpadded = spec.auto_pad != "NOTSET" or not any(spec.pads)
    if all(k == 1 for k in spec.kernel) and all(s == 1 for s in spec.strides) and unpadded:
        # NOTE: SAME padding of a 1x1 stride-1 window is zero, so every auto_pad qualifies.
        return POINTWISE
    if group > 1 and group == channels:
        return DEPTHWISE
    return IM2COL


def winograd_unsupported(spec: WindowSpec, group: int) -> str | None:
    """Why Winograd F(m, 3) cannot compute this window (None when it can): 2-D 3x3, stride 1, no dilation,
    one group."""
    if spec.rank != 2 or spec.kernel != (3, 3):
        return f"winograd needs a 2-D 3x3 kernel; got {spec.kernel}"
    if spec.strides != (1, 1):
        return f"winograd needs stride 1; got strides {spec.strides}"
    if spec.dilations != (1, 1):
        return f"winograd needs dilation 1; got dilations {spec.dilations}"
    if group != 1:
        return f"winograd needs group 1; got group {group}"
    return None


#: Taps up to which one image's strided stem stays with im2col below ``DIRECT_STEM_MIN_KERNELS``: its
#: columns copy each input about taps / strides times, little for a 3x3/2 window, while the direct kernel
#: first fills the input's phase planes (each thread of a split all of them) and shares its blocks of 8
#: kernels out over the threads. One image, 2 threads, ``hetflow tune`` (2026-12-06, phase planes filled
#: by column pairs), direct / im2col ms: 3x3/2 3 -> 64 (SqueezeNet) 0.254 / 0.304, 3 -> 32 (MobileNet v2,
#: its Clip a job after) 0.203 / 0.207, 3 -> 24 (ShuffleNet, 3 blocks over 2 threads) 0.146 / 0.161;
#: whole runs, direct / im2col (``benchmarks/ab_choice.py --off _direct_takes_strided --runs 600``):
#: squeezenet 0.974-0.987, mobilenetv2 1.03-1.04, shufflenet 1.00-1.01. 7x7/2 3 -> 64: 1.23 / 0.84. With
#: MobileNet v2's Clip in the direct kernels' copy-out (2026-12-06, s51) its whole run tied (1.004, 1.001).
IM2COL_STEM_MAX_TAPS = 9
#: Kernels from which one image's 3x3 stem runs direct all the same (``IM2COL_STEM_MAX_TAPS``).
DIRECT_STEM_MIN_KERNELS = 64
#: The narrowest output side on which a batch's strided 3x3 layers run direct (``_direct_takes_strided``).
DIRECT_STRIDED_MIN_SIDE_BATCH = 14
#: Channel counts (input or output) up to which a Conv's GEMM operand is thin and the direct kernel wins.
THIN_CHANNELS = 32
#: Up to this many multiply-adds, one image's Conv (3x3 or 5x5, stride 1) is fastest direct, whatever
#: its channels. Measured with ``hetflow tune`` at batch 1 (2 threads, 2026-11-24) on the zoo's layers,
#: direct against the best other algorithm: every layer up to 29.7 M won or tied (0.49-0.97: 48 -> 192 and
#: 64 -> 256 at 13x13, 64 -> 96 to 128 -> 128 at 14x14, 64 -> 64 at 28x28, 160 -> 224 to 224 -> 224 at
#: 7x7, 160 -> 320 and 192 -> 384 at 6x6, mentee's 64 -> 64 at 16x16 and 64 -> 128 at 8x8), every one
#: from 36 M lost (1.07-1.50: 128 -> 160 at 14x14, 112 -> 224 at 13x13, 64 -> 96 at 28x28, 512 -> 512 at
#: 7x7), and GoogLeNet's 96 -> 208 at 13x13 (30.4 M) tied. Since runs replay the direct kernel's job
#: with no Python around it (``hetflow.runtime.replay``; Winograd and im2col are still called), the
#: crossover moved up: one image, 2 threads, spinning, each timed as a run replays it (2026-12-02):
#: direct against the best other, 96 -> 208 at 14x14 (35 M) 0.278 / 0.309 ms, 128 -> 160 at 14x14 (36 M)
#: 0.284 / 0.319, 64 -> 96 at 28x28 (43 M) 0.326 / 0.351, 112 -> 224 at 14x14 (44 M) 0.343 / 0.374; 128 ->
#: 256 at 14x14 (58 M) tied, 96 -> 96 at 28x28 (65 M) 0.504 / 0.444 and 160 -> 320 at 14x14 (90 M) 0.679 /
#: 0.615 lost.
DIRECT_MAX_MACS_ONE_IMAGE = 50_000_000
#: A batch's 3x3 layer with few input and output channels takes the direct kernel over Winograd F(4,3)
#: where the harmonic mean of its channel counts, 2CK / (C + K), is below this and its maps are at most
#: ``DIRECT_OVER_F43_MAX_SIDE`` wide: F(4,3)'s input and output transforms cost per channel, its products
#: per pair of channels, so on few channels the transforms outweigh the saved multiply-adds. Single
#: layers at batch 16 on a batch run's own threads (2 threads, Zen 5 VM, 2026-11-25), F(4,3) / direct
#: time: 64 -> 64 at 56x56 1.23-1.31, at 28x28 1.10-1.22, at 112x112 1.11; 96 -> 64 at 28x28 1.08-1.17;
#: 64 -> 96 at 28x28 1.01-1.16, at 56x56 1.12; 64 -> 128 at 28x28 and 56x56 1.04-1.06; but 80 -> 96 at
#: 28x28 0.95, 96 -> 96 0.98, 96 -> 128 0.90, 64 -> 192 at 56x56 0.94, and 64 -> 64 at 224x224 0.94.
DIRECT_OVER_F43_MAX_MEAN = 86
#: The widest maps on which ``DIRECT_OVER_F43_MAX_MEAN`` applies.
DIRECT_OVER_F43_MAX_SIDE = 112


#: Input channels up to which a strided Conv is an image's stem, whose im2col GEMM is only 3 channels x
#: taps deep (``_direct_takes_strided``).
STEM_MAX_CHANNELS = 4


def direct_unsupported(spec: WindowSpec, group: int, dtype: np.dtype | None) -> str | None:
    """Why the direct kernel cannot compute this window (None when it can): 2-D, one group, float32 (or
    float16, computed in float32); strided windows run on the input's phase planes
    (``hetflow.devices.cpu.kernels.jit_direct_phases``)."""
    if dtype is not None and np.dtype(dtype) not in DIRECT_DTYPES:
        return f"the direct Conv computes float32; got {np.dtype(dtype)}"
    if spec.rank != 2:
        return f"the direct Conv is 2-D; got a {spec.rank}-D window"
    if group != 1:
        return f"the direct Conv needs group 1; got group {group}"
    return None


def _direct_takes_strided(spec: WindowSpec, x_shape: Sequence[int], kernels: int) -> bool:
    """Whether the cost model gives a strided window to the direct kernel (on the input's phase planes):
    an image's stem (``STEM_MAX_CHANNELS``), one image's but for a 3x3 one of few kernels
    (``IM2COL_STEM_MAX_TAPS``, ``DIRECT_STEM_MIN_KERNELS``).

    A batch's 3x3 layers whose output is ``DIRECT_STRIDED_MIN_SIDE_BATCH`` or wider run direct too: their
    whole-chunk columns (9/4 of X, 3.6 MB an image for ResNet-50's 128 -> 128 at 56x56) are written and
    read back through L3 for each chunk, where the direct kernel reads each image's phase planes once per
    block of kernels. ResNet-50 at batch 16 (``layer_gap.py``, in its run, 2 threads, Zen 4 VM,
    2026-12-06), im2col -> direct ms: 128 -> 128 at 56x56 26.8 -> 22.2, 256 -> 256 at 28x28 24.7 -> 21.7
    (ONNX Runtime 18.7, 19.5); at 14x14 (7x7 out) they tie (``hetflow tune``: 25.2 / 25.1) and stay. Two
    trees alternating (``ab.py``, 4 x 10 runs): inception_v2 0.96, resnet50 0.98.

    Deeper strided layers of one image stay with im2col (``hetflow tune`` measures the direct kernel on
    them). Timed one at a time in a run's threads (2 threads, Zen 4 VM, 2026-12-06), direct / im2col ms:
    Inception v2's 3x3/2 128 -> 192 at 14x14 0.17 / 0.18-0.30, 256 -> 256 at 14x14 0.42 / 0.58, 128 -> 160
    and 96 -> 96 at 28x28 alike; ResNet-50's 3x3/2 layers 1.32-1.50 / 1.21-1.27 and its 1x1/2 ones 2.2-3.3
    / 1.0-1.1. Inception v2's four direct made its whole run no faster (blocks of runs alternating in one
    process: 1.005, 1.008)."""
    channels, batched, taps = int(x_shape[1]), int(x_shape[0]) > 1, math.prod(spec.kernel)
    wide = taps > IM2COL_STEM_MAX_TAPS or kernels >= DIRECT_STEM_MIN_KERNELS or _in_place_stem(spec)
    if batched and spec.kernel == (3, 3) and min(geometry(spec, x_shape[2:]).out) >= DIRECT_STRIDED_MIN_SIDE_BATCH:
        return True
    return channels <= STEM_MAX_CHANNELS and (batched or wide)


def _in_place_stem(spec: WindowSpec) -> bool:
    """Whether a stem's window is one the direct kernel reads from X where it lies (3x3 at stride 2, no
    dilation: ``hetflow.devices.cpu.kernels.jit_direct_stems``), with no phase planes to fill: it runs
    direct whatever its kernels. One image, two spinning threads, in-run: MobileNet v2's 3 -> 32 stem
    0.247 ms on im2col, 0.125 here alone (2026-12-07)."""
    return spec.kernel == (3, 3) and spec.strides == (2, 2) and spec.dilations == (1, 1)


#: A batch's 3x3 layers from this many input and output channels take F(4,3) from maps of
#: ``F43_MIN_SIDE_DEEP_BATCH`` (elsewhere from 24x24). Batch 16, 2 threads, spinning, each timed as a run
#: replays it (2026-12-02), F(4,3) / F(2,3): 256 -> 256 at 14x14 8.35 / 11.28 ms, 128 -> 128 at 14x14
#: 3.11 / 3.58; but 112 -> 224 at 14x14 4.98 / 4.69.
F43_MIN_CHANNELS_DEEP_BATCH = 128
F43_MIN_SIDE_DEEP_BATCH = 14
#: ... and up to this many (the larger of the two counts) below 24x24 maps: F(4,3)'s transformed weights
#: are 4x the raw (F(2,3)'s 1.8x), which a layer keeps for the session. VGG-19's four 512 -> 512 layers at
#: 14x14 held 151 MB of them, and its peak RSS at batch 16 went from 1519 to 1655 MiB (ONNX Runtime's:
#: 1564) for 8.5 ms a layer (35.2 / 43.7 ms alone, F(4,3) / F(2,3)) of a 1.47 s run.
F43_MAX_CHANNELS_DEEP_BATCH = 256


#: The most bytes of X (one image) a 1x1 Conv may read to run direct rather than on the tile GEMM
#: (``_direct_pointwise``): the direct kernel reads X once per block of 8 kernels, from L2 while it fits.
POINTWISE_DIRECT_MAX_X_BYTES = 1 << 20
#: The least share of a 1x1 Conv's vectors of 16 positions that its positions fill for it to run direct:
#: below (7x7 maps: 49 of 64) the direct kernel takes the lanes variant, slower than the tile GEMM there.
POINTWISE_DIRECT_MIN_FILL = 0.9
#: Positions a direct kernel's vector holds (16 float32 lanes of AVX-512).
_VECTOR_POSITIONS = 16


def _direct_pointwise(
    spec: WindowSpec, x_shape: Sequence[int], group: int, dtype: np.dtype | None, residual: bool,
    activation: str | None,
) -> bool:
    """Whether one image's 1x1 Conv runs on the direct kernel (``jit_direct_same`` reads X and stores Y
    where they lie, with the bias and a Relu; no packing of X's columns) rather than the tile GEMM.

    Measured in MobileNet v2's replayed run at batch 1 (2 threads, Zen 4 VM, 2026-12-06; tile GEMM ->
    direct, in-run ms): 144 -> 32 at 28x28 0.043 -> 0.038, 192 -> 64 at 14x14 0.032 -> 0.025, 384 -> 96
    at 14x14 0.086 -> 0.072; but 96 -> 24 at 56x56 (X 1.2 MB) 0.074 -> 0.098, 576 -> 160 at 7x7 0.058 ->
    0.079, 960 -> 320 at 7x7 0.19 -> 0.20. A folded residual or an activation other than Relu would run
    after the direct kernel, outside a replayed run's jobs, so those stay on the tile GEMM."""
    if int(x_shape[0]) != 1 or residual or activation not in (None, "Relu") or dtype is None:
        return False
    if direct_unsupported(spec, group, dtype) is not None:
        return False
    positions = math.prod(int(d) for d in x_shape[2:])
    fill = positions / (-(-positions // _VECTOR_POSITIONS) * _VECTOR_POSITIONS)
    x_bytes = int(x_shape[1]) * positions * np.dtype(dtype).itemsize
    return x_bytes <= POINTWISE_DIRECT_MAX_X_BYTES and fill >= POINTWISE_DIRECT_MIN_FILL


def fused_epilogue(node: Node) -> tuple[bool, str | None]:
    """What a Conv node applies after its products (``heuristic_conv_algorithm``'s ``residual`` and
    ``activation``): whether it adds a folded residual, and its fused activation's op type (None)."""
    fused = node.attrs.fused
    return bool(node.attrs.residual), None if fused is None else fused.op_type


def heuristic_conv_algorithm(
    spec: WindowSpec, x_shape: Sequence[int], kernels: int, group: int, dtype: np.dtype | None = None,
    residual: bool = False, activation: str | None = None,
) -> str:
    """The cost model's algorithm when no measurement exists (see ``hetflow.tuning``); ``dtype``: X's
    (the direct kernel is considered only when it is given and computed there).

    Winograd's transforms are compiled single passes (``jit_winograd``), so it wins wherever its tiles
    fill the vector loops and there are enough input channels to share each transformed tile. Measured
    with ``hetflow tune`` on the zoo's 3x3 stride-1 layers (2-core AVX-512 reference machine, 2 threads,
    batch 1 and 16, 2026-11-23): F(4,3) is fastest from 24x24 maps up with C >= 64 (1.1-2.8x over
    im2col; with C = 16 or 32, SqueezeNet's expand layers, it ties or loses at batch 16); F(2,3) at 12x12
    to 23x23 with C >= 112 (up to 1.4x; GoogLeNet's C = 96 and SqueezeNet's C = 48, 64 lose by 10-40%);
    im2col at 7x7 and below, where a row holds two tiles.

    The direct kernel (``DIRECT_FMA``, ``hetflow.devices.cpu.kernels.direct``) wherever a GEMM's operand
    would be thin -- 32 or fewer input or output channels -- and for the other windows (5x5, dilated) at
    batch 2 and up, or thin. Measured through a session against the algorithm this heuristic picked
    before (2 threads, same VM): 5x5 16 -> 32 at 28x28 1.7x (batch 1) / 1.9x (batch 16) faster, 5x5 64
    -> 192 at 27x27 1.5x faster at batch 16 but 1.5x slower at batch 1 (im2col's one GEMM reuses W
    across the image), 3x3 128 -> 32 at 7x7..56x56 1.1-2x, 3x3 3 -> 64 at 224x224 1.7x / 2.6x; while 3x3
    48 -> 192 at 13x13 and 128 -> 192 at 28x28 stay with im2col and Winograd (1.2-1.4x slower direct).
    One image is different: there the direct kernel takes every layer up to ``DIRECT_MAX_MACS_ONE_IMAGE``
    whatever its channels, and a thin layer above that only where Winograd cannot run (DenseNet's 128
    -> 32 at 56x56 ran 1.13x slower direct than F(4,3)). A batch takes the direct kernel where im2col
    was left: timed at batch 16 in a run's thread arrangement (products on the tile GEMM; 2 threads,
    2026-11-24), direct against im2col 96 -> 128 at 14x14 1.64 / 2.19 ms, 224 -> 224 at 7x7 1.86 /
    2.35, 48 -> 192 at 13x13 1.12 / 1.26, 512 -> 512 at 7x7 9.4 / 11.2. (F(4,3) was faster still
    alone on the deep ones, 7.0 ms on the last, but lost in ResNet-50's run: its transformed weights,
    4x the raw, come from memory there; A/B 1.05.)

    One image's stem (3 channels, any stride) is direct too, but for a 3x3 one of under 64 kernels
    (``_direct_takes_strided``), and so are one image's 1x1 layers whose X fits L2 (``_direct_pointwise``;
    ``residual`` and ``activation``, the node's ``fused_epilogue``, keep some on the tile GEMM).
    It had been left to im2col's bands since an A/B in which the stems ran faster direct alone yet
    GoogLeNet, ResNet-50 and Inception v2 took 2-3% longer; since runs replay the direct kernel's job
    (im2col is still called from Python between the replayed stretches), it is the other way round: A/B
    at batch 1, alternating processes (2026-12-02, minimums, direct / im2col): inception_v2 0.97,
    googlenet 0.98, resnet50 0.95, alexnet 0.94, zfnet512 0.96; the 7x7/2 64-kernel stem alone 0.84 /
    1.23 ms.
    """
    structural = conv_algorithm(spec, int(x_shape[1]), group)
    if structural == POINTWISE and _direct_pointwise(spec, x_shape, group, dtype, residual, activation):
        return DIRECT_FMA
    if structural != IM2COL:
        return structural
    channels = int(x_shape[1])
    batched = int(x_shape[0]) > 1
    thin = channels <= THIN_CHANNELS or kernels <= THIN_CHANNELS
    winograd_fits = winograd_unsupported(spec, group) is None
    direct_runs = dtype is not None and direct_unsupported(spec, group, dtype) is None
    if any(stride != 1 for stride in spec.strides):
        direct_runs = direct_runs and _direct_takes_strided(spec, x_shape, kernels)
    if winograd_fits and _winograd_in_lanes(dtype):
        found = lanes_winograd(geometry(spec, x_shape[2:]).out, int(x_shape[0]), channels, kernels)
        if found is not None:
            return found
    if direct_runs:
        if not batched:
            macs = kernels * channels * math.prod(spec.kernel) * math.prod(geometry(spec, x_shape[2:]).out)
            if macs <= DIRECT_MAX_MACS_ONE_IMAGE or (thin and not winograd_fits):
                return DIRECT_FMA
        elif thin or not winograd_fits:
            return DIRECT_FMA
    if not winograd_fits:
        return IM2COL
    height, width = int(x_shape[2]), int(x_shape[3])
    side = min(height, width)
    deep_batch = (
        batched and side >= F43_MIN_SIDE_DEEP_BATCH
        and F43_MIN_CHANNELS_DEEP_BATCH <= min(channels, kernels) <= max(channels, kernels) <= F43_MAX_CHANNELS_DEEP_BATCH
    )  # fmt: skip
    if (kernels >= 32 and channels >= 64 and side >= 24) or deep_batch:
        few_channels = 2 * channels * kernels < DIRECT_OVER_F43_MAX_MEAN * (channels + kernels)
        if batched and direct_runs and few_channels and side <= DIRECT_OVER_F43_MAX_SIDE:
            return DIRECT_FMA
        return WINOGRAD_F43
    if kernels >= 32 and channels >= 112 and side >= 12:
        return WINOGRAD_F23
    return DIRECT_FMA if batched and direct_runs else IM2COL


#: Winograd's transforms with the tiles in the vector lanes (``jit_winograd_lanes``) made it the fastest
#: 3x3 stride-1 algorithm wherever its products fill the tile GEMM's vectors of 16 tiles and both channel
#: counts reach this. ``hetflow tune`` (2 threads, Zen 4 VM, 2026-12-07), best Winograd / best other ms:
#: one image, SqueezeNet's 16 -> 64 at 55x55 0.395 / 0.491, 32 -> 128 at 27x27 0.293 / 0.471, 64 -> 256 at
#: 13x13 0.167 / 0.231; MentorNet's 64 -> 64 at 16x16 0.057 / 0.085; Inception v2's 64 -> 96 at 14x14
#: 0.064 / 0.103, 160 -> 224 at 7x7 (F(2,3)) 0.109 / 0.191; DenseNet's 128 -> 32 at 14x14 0.061 / 0.070;
#: ResNet-50's 256 -> 256 at 14x14 0.719 / 1.147, 512 -> 512 at 7x7 (F(2,3)) 1.035 / 1.265; batch 16,
#: ResNet-50's 64 -> 64 at 56x56 11.9 / 16.9, MentorNet's 64 -> 128 at 8x8 0.51 / 0.69. Where the
#: products leave lanes idle Winograd lost: one image's 64 -> 128 at 8x8 (4 tiles of F(4,3)), GoogLeNet's
#: 160 -> 320 at 6x6 (9 of F(2,3)) 0.208 / 0.178 direct.
LANES_WINOGRAD_MIN_CHANNELS = 16
#: ... and F(2,3) on a map too small for F(4,3)'s vectors (one image's 7x7) only from this many channels
#: (MentorNet's 64 -> 128 at 8x8 ran faster direct, DenseNet's 128 -> 32 at 7x7 tied).
LANES_F23_MIN_CHANNELS = 128
#: The tiles a Winograd layer's products need (one vector of the tile GEMM's 16 positions).
LANES_MIN_TILES = 16


def _winograd_in_lanes(dtype: np.dtype | None) -> bool:
    """Whether Winograd's transforms run with the tiles in the vector lanes for X of ``dtype``."""
    if dtype is None:
        return False
    from hetflow.devices.cpu.kernels import jit_winograd_lanes  # the CPU's kernels: imported when planning

    return jit_winograd_lanes.applies(np.dtype(dtype))


def lanes_winograd(out: Sequence[int], batch: int, channels: int, kernels: int) -> str | None:
    """The Winograd algorithm for a 3x3 stride-1 layer of ``out`` (OH, OW) outputs over ``batch`` images
    when its transforms run in the vector lanes, or None where another algorithm should: F(4,3) or F(2,3),
    whichever multiplies fewer vectors of 16 tiles (36 or 16 elements each, a partial vector counted
    whole; F(2,3) on a tie, its transforms cheaper), given ``LANES_MIN_TILES`` tiles and
    ``LANES_WINOGRAD_MIN_CHANNELS`` channels. F(4,3)'s transformed weights (4x the raw, kept for the
    session) are held to ``F43_MAX_CHANNELS_DEEP_BATCH`` channels below 24x24 maps, as before."""
    fewest = min(channels, kernels)
    if fewest < LANES_WINOGRAD_MIN_CHANNELS:
        return None
    tiles = {m: batch * math.ceil(out[0] / m) * math.ceil(out[1] / m) for m in (2, 4)}
    vectors = {m: (m + 2) ** 2 * math.ceil(tiles[m] / LANES_MIN_TILES) for m in (2, 4)}
    if tiles[4] >= LANES_MIN_TILES and vectors[4] < vectors[2]:
        heavy = max(channels, kernels) > F43_MAX_CHANNELS_DEEP_BATCH and min(out) < 24
        return WINOGRAD_F23 if heavy else WINOGRAD_F43
    if tiles[2] >= LANES_MIN_TILES and (fewest >= LANES_F23_MIN_CHANNELS or batch > 1):
        return WINOGRAD_F23
    return None


def conv_workspace_bytes(
    algorithm: str,
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    y_shape: Sequence[int],
    itemsize: int,
) -> int:
    """Scratch memory ``algorithm`` needs beyond X, W and Y.

    im2col: the column buffer ``[N, C*taps, P]``. Winograd F(m, 3) with a = m + 2: the transformed weights
    ``[a*a, K, C]`` (kept for the session: 1.8x the raw 3x3 weights for F(2,3), 4x for F(4,3)), the
    transformed input tiles ``[a*a, C, T]`` and the products ``[a*a, K, T]``, with T the number of m x m
    output tiles. The direct kernel: one image's padded planes and products per thread. Pointwise and
    depthwise need none.
    """
    batch, channels = int(x_shape[0]), int(x_shape[1])
    kernels = int(w_shape[0])
    if algorithm == IM2COL:
        taps = int(np.prod(w_shape[2:], dtype=np.int64))
        positions = int(np.prod(y_shape[2:], dtype=np.int64))
        return batch * channels * taps * positions * itemsize
    if algorithm in WINOGRAD_TILE:
        tile = WINOGRAD_TILE[algorithm]
        elems = (tile + 2) ** 2
        tiles = batch * -(-int(y_shape[2]) // tile) * -(-int(y_shape[3]) // tile)
        return elems * (kernels * channels + channels * tiles + kernels * tiles) * itemsize
    if algorithm == DIRECT_FMA:
        # One image's zero-bordered planes and products per thread, for two threads (the CPU kernel's
        # own size, for its core count and variant, is ``direct.workspace_bytes``). A strided window's
        # planes hold the whole padded input, its products only the output's rows.
        sides = list(zip(x_shape[2:], y_shape[2:], w_shape[2:]))
        products = int(np.prod([int(o) + int(k) - 1 for _, o, k in sides], dtype=np.int64))
        planes = int(np.prod([max(int(o) + int(k) - 1, int(x)) for x, o, k in sides], dtype=np.int64))
        return 2 * (channels * planes + kernels * products) * 4
    return 0


def _static(shape: Shape, what: str) -> tuple[int, ...]:
    if not is_static(shape):
        raise ValueError(f"{what} shape {format_shape(shape)} is symbolic; bind the batch before costing")
    return tuple(int(d) for d in shape)


@register_op
class Conv(OpDef):
    """N-d convolution with groups: ``Y[n, k] = sum_c W[k, c] * X[n, c] + B[k]`` over sliding windows.

    Inputs: X ``[N, C, D1..Dr]``, W ``[K, C/group, k1..kr]``, optional B ``[K]``.
    Output: Y ``[N, K, O1..Or]`` with O from ``hetflow.ops.spatial`` (pads, strides, dilations,
    auto_pad). Cost follows Augur's im2col convention: per image and group a GEMM with n = K/group,
    m = prod(O), k = (C/group) * prod(kernel). The workspace is that of the cost model's algorithm
    (``heuristic_conv_algorithm``): the im2col buffer, Winograd's transformed weights and tiles, or
    nothing for 1x1 stride-1 unpadded convolutions (a GEMM straight on X) and depthwise ones.
    """

    op_type = "Conv"
    Attrs = ConvAttrs
    num_inputs = (2, 4)  # the fourth: a folded residual (``ConvAttrs.residual``), never in ONNX

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x, w = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        assert x is not None and w is not None
        attrs: ConvAttrs = node.attrs
        if (len(inputs) > 3) != attrs.residual:
            raise ValueError("Conv takes X, W and an optional B (a fourth input only as a folded residual)")
        if len(x.shape) < 3:
            raise ValueError(f"X must be [N, C, D1, ...]; got rank {len(x.shape)}")
        if len(w.shape) != len(x.shape):
            raise ValueError(f"W has rank {len(w.shape)}; X has rank {len(x.shape)} and they must match")
        if attrs.group < 1:
            raise ValueError(f"group must be >= 1; got {attrs.group}")
        if w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
            raise ValueError("X, W and B must share one dtype")
        _check_channels(x.shape[1], w.shape, attrs.group)
        if bias is not None and (len(bias.shape) != 1 or _known_differ(bias.shape[0], w.shape[0])):
            raise ValueError(
                f"B must be [{w.shape[0]}] (one bias per output channel); got {format_shape(bias.shape)}"
            )
        spec = conv_window(attrs, w.shape)
        out = output_dims(spec, x.shape[2:])
        return [TensorInfo((x.shape[0], w.shape[0], *out), x.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """MACs, bias additions, bytes, the im2col GEMM and its workspace.

        Raises:
            ValueError: a shape is symbolic (bind the batch first: a GEMM needs concrete sizes).
        """
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        x_shape, w_shape = _static(x.shape, "X"), _static(w.shape, "W")
        y_shape = _static(outputs[0].shape, "Y")
        group = node.attrs.group
        batch, channels, kernels = x_shape[0], x_shape[1], w_shape[0]
        spec = conv_window(node.attrs, w_shape)
        positions = int(np.prod(y_shape[2:], dtype=np.int64))
        reduction = channels // group * spec.taps
        gemm = GemmDims(n=kernels // group, m=positions, k=reduction, count=batch * group)
        has_bias = len(inputs) > 2 and inputs[2] is not None
        # NOTE: the planner may pick another algorithm per layer; its workspace is conv_workspace_bytes().
        algorithm = heuristic_conv_algorithm(spec, x_shape, kernels, group)
        workspace = conv_workspace_bytes(algorithm, x_shape, w_shape, y_shape, x.dtype.itemsize)
        return Cost(
            macs=batch * kernels * positions * reduction,
            flops=batch * kernels * positions if has_bias else 0,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
            gemm=gemm,
            workspace_bytes=workspace,
        )

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        # A fused Relu's gradient mask is read from Y (Y > 0 exactly where the Conv's sum is).
        return (0, 1), ((0,) if _fused_relu(node.attrs) else ())

    def backward_workspace(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo | None]
    ) -> int:
        """The columns for dW (``N*C*taps*P``) and for dX (the same, or ``N*K*taps*D`` over dY's padded
        positions when dX is the correlation of dY with the flipped weights), dY's GEMM layout, the
        padded input or dY twice (the copy columns are read from, col2im's accumulator), and two more
        arrays of Y's size plus two of X's for numpy's temporaries (the correlation's product and its
        transposed copy; tracemalloc measured about one Y beyond the rest)."""
        x, w, y = inputs[0], inputs[1], outputs[0]
        assert x is not None and w is not None and y is not None
        x_shape, w_shape, y_shape = _static(x.shape, "X"), _static(w.shape, "W"), _static(y.shape, "Y")
        geom = geometry(conv_window(node.attrs, w_shape), x_shape[2:])
        columns = conv_workspace_bytes(IM2COL, x_shape, w_shape, y_shape, x.dtype.itemsize)
        padded = int(np.prod(x_shape[:2], dtype=np.int64)) * int(
            np.prod([a.padded for a in geom.axes], dtype=np.int64)
        )
        full = _full_correlation_attrs(node.attrs, geom, x_shape[1], w_shape[0])
        if full is not None:
            flipped_shape = (x_shape[1], w_shape[0] // node.attrs.group, *w_shape[2:])
            full_geom = geometry(conv_window(full, flipped_shape), y_shape[2:])
            dy_columns = conv_workspace_bytes(IM2COL, y_shape, flipped_shape, x_shape, x.dtype.itemsize)
            columns = max(columns, dy_columns)
            padded = max(padded, int(np.prod(y_shape[:2], dtype=np.int64)) * int(
                np.prod([a.padded for a in full_geom.axes], dtype=np.int64)
            ))
        masked = nbytes(y) if _fused_relu(node.attrs) else 0  # dY * (Y > 0)
        return 2 * columns + 3 * nbytes(y) + 2 * nbytes(x) + 2 * padded * x.dtype.itemsize + masked

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dX, dW and dB of ``Y = W * X + B`` through the same channel-major im2col columns as the
        training forward pass (``hetflow.train.kernels``).

        dW is one GEMM per group over every image and position (``cols @ dY^T``). dX, for a stride-1
        undilated Conv with no more kernels than channels, is the correlation of dY with the flipped
        weights (one GEMM over dY's columns); otherwise the transposed GEMM (``W^T @ dY``) into column
        form followed by col2im: one strided add per window tap, so Python loops over the kernel's taps,
        never over pixels.

        A fused Relu (the training graph's Conv + Relu, see ``hetflow.train.graph.fuse_conv_relu``) is
        differentiated first: ``dY * (Y > 0)``, Y being the fused output. Other fused activations raise.
        """
        x, w = inputs[0], inputs[1]
        dy = grad_outputs[0]
        assert x is not None and w is not None
        grads: Grads = [None] * len(inputs)
        if (node.attrs.fused is not None and not _fused_relu(node.attrs)) or node.attrs.residual:
            raise ValueError(f"Conv '{node.name}' has a fused epilogue; train the unoptimised graph")
        if dy is None:
            return grads
        if node.attrs.fused is not None:
            y = outputs[0]
            assert y is not None
            dy = dy * (y > 0)
        if len(inputs) > 2 and inputs[2] is not None and wants(wanted, 2):
            grads[2] = dy.sum(axis=(0, *range(2, dy.ndim))).astype(inputs[2].dtype, copy=False)
        want_x, want_w = wants(wanted, 0), wants(wanted, 1)
        if not (want_x or want_w):
            return grads
        group = node.attrs.group
        geom = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
        batch, kernels = x.shape[0], w.shape[0]
        positions = int(np.prod(geom.out, dtype=np.int64))
        per_group = w.shape[1] * int(np.prod(geom.kernel, dtype=np.int64))
        # dY laid out [G, K/G, N*P] (one copy): every GEMM below is one 2-D BLAS call per group over the
        # whole batch (numpy's stacked matmul leaves BLAS for transposed or broadcast operands).
        dy_flat = np.ascontiguousarray(np.moveaxis(dy.reshape(batch, kernels, positions), 0, 1))
        dy_flat = dy_flat.reshape(group, kernels // group, batch * positions)
        if want_w:
            cols = channel_columns(x, geom).reshape(group, per_group, batch * positions)
            dw = np.empty((group, per_group, kernels // group), w.dtype)
            for g in range(group):
                # NOTE: computed as (cols @ dY^T)^T: OpenBLAS's sgemm with few rows, a long reduction and
                # a transposed right operand (dY @ cols^T) measured 10-40x slower on these shapes.
                np.matmul(cols[g], dy_flat[g].T, out=dw[g])
            del cols
            grads[1] = np.ascontiguousarray(dw.transpose(0, 2, 1)).reshape(w.shape)
        if want_x:
            full = _full_correlation_attrs(node.attrs, geom, x.shape[1], kernels)
            if full is not None:
                grads[0] = _input_grad_by_correlation(dy, w, full, group).astype(x.dtype, copy=False)
                return grads
            w_groups = w.reshape(group, kernels // group, per_group)
            dcols = np.empty((group, per_group, batch * positions), dy.dtype)
            for g in range(group):
                np.matmul(w_groups[g].T, dy_flat[g], out=dcols[g])
            grads[0] = channel_col2im(dcols, geom, x.shape).astype(x.dtype, copy=False)
        return grads


def _fused_relu(attrs: ConvAttrs) -> bool:
    """Whether ``attrs`` carry a fused Relu (the one fused activation Conv's backward handles)."""
    return attrs.fused is not None and attrs.fused.op_type == "Relu"


def _full_correlation_attrs(
    attrs: ConvAttrs, geom: Geometry, channels: int, kernels: int
) -> ConvAttrs | None:
    """For a stride-1, undilated Conv whose padding is at most ``kernel - 1`` per side and with no more
    output than input channels: the attributes of the Conv that maps dY to dX (dY padded by
    ``kernel - 1 - pad``, flipped transposed weights); else None (dX goes through col2im).

    NOTE: that GEMM reduces over ``K/G*taps`` where the col2im route's reduces over ``K/G`` only, which
    OpenBLAS runs markedly faster, and no column-sized buffer is read back by strided adds; but its
    columns hold K rows per tap where im2col's hold C: with more kernels than channels, building them
    costs more than it saves (measured on the mentee's layers).
    """
    if kernels > channels or any(a.stride != 1 or a.dilation != 1 or a.overhang for a in geom.axes):
        return None
    begins = tuple(a.kernel - 1 - a.pad_begin for a in geom.axes)
    ends = tuple(a.kernel - 1 - a.pad_end for a in geom.axes)
    if min(begins + ends) < 0:
        return None
    return ConvAttrs(group=attrs.group, kernel_shape=geom.kernel, pads=begins + ends)


def _input_grad_by_correlation(dy: np.ndarray, w: np.ndarray, full: ConvAttrs, group: int) -> np.ndarray:
    """dX of a stride-1 Conv as the correlation of dY with W flipped and transposed per group: one GEMM
    per group ``W' [C/G, K/G*taps] @ cols(dY) [K/G*taps, N*P]``."""
    kernels, per_group_channels = w.shape[:2]
    rank = w.ndim - 2
    flipped = w[(slice(None), slice(None), *(slice(None, None, -1),) * rank)]
    # [G, K/G, C/G, *kernel] -> [G, C/G, K/G, *kernel]: rows of W', columns ordered like cols(dY)'s rows.
    flipped = flipped.reshape(group, kernels // group, per_group_channels, *w.shape[2:]).swapaxes(1, 2)
    transposed = np.ascontiguousarray(flipped).reshape(group, per_group_channels, -1)
    geom = geometry(conv_window(full, (per_group_channels * group, kernels // group, *w.shape[2:])),
                    dy.shape[2:])
    batch = dy.shape[0]
    positions = int(np.prod(geom.out, dtype=np.int64))
    cols = channel_columns(dy, geom).reshape(group, transposed.shape[2], batch * positions)
    products = np.empty((group, per_group_channels, batch * positions), np.result_type(dy, w))
    for g in range(group):
        np.matmul(transposed[g], cols[g], out=products[g])
    del cols
    spread = products.reshape(group * per_group_channels, batch, *geom.out)
    return np.ascontiguousarray(np.moveaxis(spread, 1, 0))


def channel_columns(
    x: np.ndarray, geom: Geometry, out: np.ndarray | None = None, padded: np.ndarray | None = None
) -> np.ndarray:
    """im2col in channel-major order: ``[C, taps, N, *out]`` (as ``[C*taps, N*P]`` it is the right operand
    of one GEMM over the whole batch, rows ordered like W's flattening).

    Built by one strided copy per kernel tap from the padded input laid out ``[C, N, *padded]``, so each
    copy moves whole output rows (the 6-D windows view copied at once is several times slower).
    ``out`` (the columns) and ``padded`` (``[C, N, *padded]``, used only when padding is needed) are
    buffers to fill instead of allocating: their contents on entry do not matter.
    """
    batch, channels = x.shape[:2]
    interior = tuple(slice(a.pad_begin, a.pad_begin + a.size) for a in geom.axes)
    source = np.moveaxis(x, 1, 0)
    if geom.needs_padding:
        if padded is None:
            padded = np.zeros((channels, batch, *(a.padded for a in geom.axes)), x.dtype)
        else:
            _zero_borders(padded, geom)
        padded[(slice(None), slice(None), *interior)] = source
        source = padded
    taps = int(np.prod(geom.kernel, dtype=np.int64))
    cols = np.empty((channels, taps, batch, *geom.out), x.dtype) if out is None else out
    for index, tap in enumerate(geom.taps()):
        cols[:, index] = source[(slice(None), slice(None), *geom.tap_slices(tap))]
    return cols


def _zero_borders(padded: np.ndarray, geom: Geometry) -> None:
    """Zero the padding of a reused ``[C, N, *padded]`` buffer (its interior is overwritten anyway)."""
    for axis, a in enumerate(geom.axes, start=2):
        lead = (slice(None),) * axis
        padded[(*lead, slice(0, a.pad_begin))] = 0
        padded[(*lead, slice(a.pad_begin + a.size, None))] = 0


def channel_col2im(dcols: np.ndarray, geom: Geometry, x_shape: Sequence[int]) -> np.ndarray:
    """The adjoint of ``channel_columns``: sum columns (any shape holding ``[C, taps, N, *out]``) back
    into an ``[N, C, *spatial]`` array, one strided add per kernel tap, the padding cropped at the end."""
    batch, channels = int(x_shape[0]), int(x_shape[1])
    taps = int(np.prod(geom.kernel, dtype=np.int64))
    dcols = dcols.reshape(channels, taps, batch, *geom.out)
    padded = np.zeros((channels, batch, *(a.padded for a in geom.axes)), dcols.dtype)
    for index, tap in enumerate(geom.taps()):
        padded[(slice(None), slice(None), *geom.tap_slices(tap))] += dcols[:, index]
    interior = tuple(slice(a.pad_begin, a.pad_begin + a.size) for a in geom.axes)
    return np.ascontiguousarray(np.moveaxis(padded[(slice(None), slice(None), *interior)], 0, 1))


def _known_differ(a: Dim, b: Dim) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _check_channels(channels: Dim, w_shape: Shape, group: int) -> None:
    kernels, per_group = w_shape[0], w_shape[1]
    if isinstance(kernels, int) and kernels % group:
        raise ValueError(f"W has {kernels} output channels, not divisible by group={group}")
    if isinstance(channels, int) and isinstance(per_group, int) and channels != per_group * group:
        raise ValueError(
            f"X has {channels} channels but W expects {per_group} per group x group={group} "
            f"= {per_group * group}"
        )

