"""Fold per-channel affine nodes (inference BatchNormalization, Mul/Add by per-channel constants) into
the node that produces their input.

An inference BatchNormalization is ``y = x * s + t`` per channel with ``s = scale / sqrt(var + eps)``
and ``t = B - mean * s``; a Mul (Add, Sub, Div) by a constant that only varies along the channel axis
is the same with ``t = 0`` (``s = 1``). Such a node folds into its input's producer when that producer
has no other reader and is

- a Conv: each output channel's weights are scaled by ``s`` and the bias becomes ``b * s + t`` (a bias
  is created when the Conv had none and ``t`` is not zero);
- a Gemm: the columns of ``B'`` are scaled and ``C`` becomes ``beta * C * s + t`` (``beta`` = 1);
- an inference BatchNormalization: ``scale * s`` and ``B * s + t`` — the scale/shift pair some models
  put after a BatchNormalization that follows a Concat (DenseNet-121) folds this way.

The producer then writes the folded node's output name, so graph outputs keep their names. Channels
are axis 1 of the producer's output (NCHW feature maps, and Gemm's ``[M, N]`` columns). Nothing is
folded into a producer with a fused activation, and anything else is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetflow.graph import Graph, Node
from hetflow.ops.attrs import replace
from hetflow.passes.rewrite import Rewriter


@dataclass(frozen=True)
class ChannelAffine:
    """``y = x * scale + shift`` along axis 1 of ``x`` (float64 vectors; None = 1 or 0)."""

    source: str
    scale: np.ndarray | None
    shift: np.ndarray | None


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold BatchNormalization and per-channel Mul/Add into the producing Conv/Gemm (in place)."""
    rewriter = Rewriter(graph)
    for node in list(graph.nodes):
        affine = channel_affine(rewriter, node)
        if affine is None:
            continue
        producer = rewriter.producers.get(affine.source)
        if producer is None or not rewriter.only_reader_is(affine.source, node):
            continue
        folder = _FOLDERS.get(producer.op_type)
        if folder is not None and folder(rewriter, producer, affine):
            rewriter.take_over_output(producer, affine.source, node)
    return rewriter.finish()


# -- recognising per-channel affine nodes ---------------------------------------------------------
def channel_affine(rewriter: Rewriter, node: Node) -> ChannelAffine | None:
    """``node`` as a per-channel ``x * s + t``, or None when it is not one."""
    if node.op_type == "BatchNormalization":
        return _batchnorm_affine(rewriter, node)
    if node.op_type in _ARITHMETIC:
        return _arithmetic_affine(rewriter, node)
    return None


def _batchnorm_params(rewriter: Rewriter, node: Node) -> list[np.ndarray] | None:
    """scale, B, mean, var of an inference, per-channel BatchNormalization with constant parameters."""
    if node.domain or node.attrs.training_mode or not node.attrs.spatial:
        return None
    if len(node.present_outputs()) != 1 or not node.outputs[0]:
        return None
    params = [rewriter.constant(name) for name in node.inputs[1:5]]
    if any(p is None or p.dtype.kind != "f" or p.ndim != 1 for p in params):
        return None
    return params  # type: ignore[return-value]


def _batchnorm_affine(rewriter: Rewriter, node: Node) -> ChannelAffine | None:
    params = _batchnorm_params(rewriter, node)
    if params is None:
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    factor = scale / np.sqrt(var + np.float64(np.float32(node.attrs.epsilon)))
    return ChannelAffine(node.inputs[0], factor, bias - mean * factor)


def _arithmetic_affine(rewriter: Rewriter, node: Node) -> ChannelAffine | None:
    if node.domain or len(node.inputs) != 2:
        return None
    first, second = node.inputs
    commutative = node.op_type in ("Mul", "Add")
    if rewriter.constant(second) is not None and rewriter.constant(first) is None:
        source, constant_name = first, second
    elif commutative and rewriter.constant(first) is not None and rewriter.constant(second) is None:
        source, constant_name = second, first
    else:
        return None
    constant = rewriter.constant(constant_name)
    assert constant is not None
    per_channel = _per_channel(rewriter, source, constant)
    if per_channel is None:
        return None
    if node.op_type == "Mul":
        return ChannelAffine(source, per_channel, None)
    if node.op_type == "Div":
        return ChannelAffine(source, 1.0 / per_channel, None)
    if node.op_type == "Add":
        return ChannelAffine(source, None, per_channel)
    return ChannelAffine(source, None, -per_channel)  # Sub


_ARITHMETIC = frozenset({"Mul", "Add", "Sub", "Div"})


def _per_channel(rewriter: Rewriter, source: str, constant: np.ndarray) -> np.ndarray | None:
    """``constant`` as one float64 value per channel of ``source``, or None when it varies otherwise.

    The constant must not widen ``source`` by broadcasting: its rank is at most that of ``source``
    and every axis but the channel axis (1) is 1.
    """
    value = rewriter.graph.values.get(source)
    if value is None or value.shape is None or len(value.shape) < 2:
        return None
    channels = value.shape[1]
    if not isinstance(channels, int) or constant.dtype != value.dtype or constant.dtype.kind != "f":
        return None
    rank = len(value.shape)
    if constant.ndim > rank:
        return None
    padded = (1,) * (rank - constant.ndim) + constant.shape
    if any(size != 1 for axis, size in enumerate(padded) if axis != 1) or padded[1] not in (1, channels):
        return None
    vector = constant.reshape(-1).astype(np.float64)
    return np.broadcast_to(vector, (channels,)).copy()


# -- folding into producers ----------------------------------------------------------------------
def _fold_into_conv(rewriter: Rewriter, conv: Node, affine: ChannelAffine) -> bool:
    weight = rewriter.constant(conv.inputs[1])
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    bias = rewriter.constant(bias_name)
    if conv.attrs.fused is not None or weight is None or weight.dtype.kind != "f":
        return False
    if (bias_name and bias is None) or _channels(affine) not in (None, weight.shape[0]):
        return False
    if affine.scale is not None:
        factor = affine.scale.astype(weight.dtype).reshape(-1, *(1,) * (weight.ndim - 1))
        rewriter.set_constant(conv, 1, weight * factor, "W")
    new_bias = _affine_bias(bias, affine, weight.shape[0], weight.dtype)
    if new_bias is not None:
        rewriter.set_constant(conv, 2, new_bias, "B")
    return True


def _fold_into_gemm(rewriter: Rewriter, gemm: Node, affine: ChannelAffine) -> bool:
    b = rewriter.constant(gemm.inputs[1])
    c_name = gemm.inputs[2] if len(gemm.inputs) > 2 else ""
    c = rewriter.constant(c_name)
    if gemm.attrs.fused is not None or b is None or b.dtype.kind != "f" or b.ndim != 2:
        return False
    columns = b.shape[0] if gemm.attrs.transB else b.shape[1]
    if (c_name and c is None) or _channels(affine) not in (None, columns):
        return False
    if affine.scale is not None:
        factor = affine.scale.astype(b.dtype)
        # Column j of B' = B (or B.T with transB) scales with s[j].
        rewriter.set_constant(gemm, 1, b * (factor[:, None] if gemm.attrs.transB else factor), "B")
    if c is None or gemm.attrs.beta == 0:
        new_c = _affine_bias(None, affine, columns, b.dtype)
    else:
        scaled = c.astype(np.float64) * gemm.attrs.beta
        if affine.scale is not None:
            scaled = scaled * affine.scale
        new_c = (scaled if affine.shift is None else scaled + affine.shift).astype(b.dtype)
    if new_c is not None:
        rewriter.set_constant(gemm, 2, new_c, "C")
        gemm.attrs = replace(gemm.attrs, beta=1.0)
    return True


def _fold_into_batchnorm(rewriter: Rewriter, norm: Node, affine: ChannelAffine) -> bool:
    params = _batchnorm_params(rewriter, norm)
    if params is None or _channels(affine) not in (None, params[0].shape[0]):
        return False
    scale, bias = params[0], params[1]
    if affine.scale is not None:
        rewriter.set_constant(norm, 1, (scale.astype(np.float64) * affine.scale).astype(scale.dtype), "scale")
    new_bias = _affine_bias(bias, affine, bias.shape[0], bias.dtype)
    assert new_bias is not None
    rewriter.set_constant(norm, 2, new_bias, "B")
    return True


def _channels(affine: ChannelAffine) -> int | None:
    vector = affine.scale if affine.scale is not None else affine.shift
    return None if vector is None else vector.shape[0]


def _affine_bias(
    bias: np.ndarray | None, affine: ChannelAffine, channels: int, dtype: np.dtype
) -> np.ndarray | None:
    """``bias * s + t`` per channel (None when there was no bias and there is no shift)."""
    if bias is None and affine.shift is None:
        return None
    result = np.zeros(channels) if bias is None else bias.astype(np.float64)
    if affine.scale is not None:
        result = result * affine.scale
    if affine.shift is not None:
        result = result + affine.shift
    return result.astype(dtype)


_FOLDERS = {
    "Conv": _fold_into_conv,
    "Gemm": _fold_into_gemm,
    "BatchNormalization": _fold_into_batchnorm,
}
