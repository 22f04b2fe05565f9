"""Convolution: Conv (1-D, 2-D, 3-D and beyond; grouped and depthwise)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape, is_static
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import Cost, GemmDims, OpDef, TensorInfo, nbytes, present_outputs_bytes
from hetflow.ops.registry import register_op
from hetflow.ops.spatial import WindowSpec, output_dims, window_spec

#: How a convolution is computed; the cost model and the CPU kernel agree through ``conv_algorithm``.
POINTWISE = "pointwise"  # 1x1, stride 1, no padding: a plain GEMM over the input, no im2col
DEPTHWISE = "depthwise"  # one input channel per group: tap accumulation, no GEMM
IM2COL = "im2col"  # everything else: im2col buffer + one GEMM per group


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


def conv_window(attrs: ConvAttrs, weight_shape: Sequence[Dim]) -> WindowSpec:
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
    m = prod(O), k = (C/group) * prod(kernel); the im2col buffer is the workspace, except for 1x1
    stride-1 unpadded convolutions (a GEMM straight on X) and depthwise ones (tap accumulation).
    """

    op_type = "Conv"
    Attrs = ConvAttrs
    num_inputs = (2, 3)

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
        algorithm = conv_algorithm(spec, channels, group)
        workspace = 0 if algorithm != IM2COL else batch * channels * spec.taps * positions * x.dtype.itemsize
        return Cost(
            macs=batch * kernels * positions * reduction,
            flops=batch * kernels * positions if has_bias else 0,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
            gemm=gemm,
            workspace_bytes=workspace,
        )


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

