"""Caffe layer types -> hetflow Graph nodes: one converter function per type, in one table.

A converter reads its layer's parameters (defaults are Caffe's, from ``caffe.proto``), adds nodes with the
builder and returns one value name per top. ``LAYERS`` is the single place that says which Caffe types
hetflow reads; a type with a ``check`` may still be refused for some parameter settings (stochastic
pooling, within-channel LRN), and the importer lists every refused layer at once before converting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetflow.frontends.caffe.builder import FLOAT, GraphBuilder, Layer
from hetflow.frontends.caffe.prototxt import Message
from hetflow.graph.shapes import Dim, Shape, is_static

Converter = Callable[[GraphBuilder, Layer], list[str]]
Check = Callable[[Layer], str | None]


@dataclass(frozen=True)
class LayerRule:
    """How one Caffe layer type converts, and (optionally) which parameter settings it cannot take."""

    convert: Converter
    check: Check | None = None


LAYERS: dict[str, LayerRule] = {}

#: Types that only make sense while training (or read a database): a deploy prototxt has none.
TRAINING_ONLY = frozenset({
    "Data", "ImageData", "HDF5Data", "HDF5Output", "MemoryData", "WindowData", "DummyData",
    "AnnotatedData", "Python", "Accuracy", "SoftmaxWithLoss", "EuclideanLoss", "HingeLoss",
    "InfogainLoss", "MultinomialLogisticLoss", "SigmoidCrossEntropyLoss", "ContrastiveLoss",
})


def layer_type(*types: str, check: Check | None = None) -> Callable[[Converter], Converter]:
    """Register a converter for one or more Caffe type strings."""

    def decorate(fn: Converter) -> Converter:
        for name in types:
            LAYERS[name] = LayerRule(fn, check)
        return fn

    return decorate


def unsupported_reason(layer: Layer) -> str | None:
    """Why the importer cannot take this layer, or None when it can."""
    if layer.type in TRAINING_ONLY:
        return "a training/data layer; import the deploy prototxt (Input layer or net-level input)"
    rule = LAYERS.get(layer.type)
    if rule is None:
        return "hetflow has no converter for this Caffe layer type"
    return rule.check(layer) if rule.check is not None else None


# -- parameter helpers -----------------------------------------------------------------------------
def _int(p: Message, name: str, default: int) -> int:
    return int(p.get(name, default))


def _float(p: Message, name: str, default: float) -> float:
    return float(p.get(name, default))


def _bool(p: Message, name: str, default: bool) -> bool:
    value = p.get(name, default)
    if isinstance(value, str):
        return value.lower() in ("true", "t", "1")
    return bool(value)


def _enum(p: Message, name: str, names: tuple[str, ...], default: str) -> str:
    """An enum field given by name (``MAX``) or number (``0``), as its name."""
    value = p.get(name, default)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return str(value)


def _axis(layer: Layer, axis: int, rank: int, allow_end: bool = False) -> int:
    """A Caffe axis (negative counts from the end) in ``[0, rank)`` (``[0, rank]`` with allow_end)."""
    limit = rank + 1 if allow_end else rank
    normalised = axis + limit if axis < 0 else axis
    if not 0 <= normalised < limit:
        raise layer.error(f"axis {axis} is out of range for a blob of rank {rank}")
    return normalised


def _static(layer: Layer, dims: Shape, what: str) -> int:
    if not is_static(dims):
        raise layer.error(f"{what} {tuple(dims)} must not depend on the batch")
    return int(np.prod(dims, dtype=np.int64))


def _spatial(
    layer: Layer, p: Message, name: str, rank: int, default: int | None, hw: tuple[str, str] | None
) -> tuple[int, ...]:
    """A per-spatial-axis setting: ``name`` (one value for every axis, or one per axis) or ``*_h``/``*_w``."""
    values = [int(v) for v in p.all(name)]
    if hw is not None and (hw[0] in p or hw[1] in p):
        if values:
            raise layer.error(f"give either {name} or {hw[0]}/{hw[1]}, not both")
        if rank != 2:
            raise layer.error(f"{hw[0]}/{hw[1]} only apply to 2-D blobs; this one has {rank} spatial axes")
        if default is None and not (hw[0] in p and hw[1] in p):
            raise layer.error(f"{hw[0]} and {hw[1]} must be given together")
        return (_int(p, hw[0], default or 0), _int(p, hw[1], default or 0))
    if not values:
        if default is None:
            raise layer.error(f"{name} is required")
        return (default,) * rank
    if len(values) == 1:
        return (values[0],) * rank
    if len(values) != rank:
        raise layer.error(f"{name} has {len(values)} values; the blob has {rank} spatial axes")
    return tuple(values)


def _channels(b: GraphBuilder, layer: Layer, value: str) -> int:
    shape = b.shape(value)
    if len(shape) < 2 or not isinstance(shape[1], int):
        raise layer.error(f"needs a bottom with a static channel axis; got {tuple(shape)}")
    return shape[1]


def _broadcast_shape(dims: Shape, trailing: int) -> tuple[int, ...]:
    """A parameter over some middle axes, padded with 1s so it broadcasts against the whole blob."""
    return tuple(int(d) for d in dims) + (1,) * trailing


# -- inputs ----------------------------------------------------------------------------------------
@layer_type("Input")
def _input(b: GraphBuilder, layer: Layer) -> list[str]:
    shapes = [tuple(int(d) for d in s.all("dim")) for s in layer.params("input_param").all("shape")]
    if not shapes:
        raise layer.error("input_param has no shape")
    if len(shapes) not in (1, len(layer.tops)):
        raise layer.error(f"{len(shapes)} shapes for {len(layer.tops)} tops; give one, or one per top")
    return [b.add_input(top, shapes[min(i, len(shapes) - 1)]) for i, top in enumerate(layer.tops)]


# -- aliases: no computation at inference --------------------------------------------------------
@layer_type("Split", "Dropout")
def _alias(b: GraphBuilder, layer: Layer) -> list[str]:
    """Split fans one blob out to several names; Dropout is the identity at inference (Caffe scales
    while training). Both become plain aliases of their bottom."""
    source = b.bottom(layer)
    return [source] * len(layer.tops)


@layer_type("Silence")
def _silence(b: GraphBuilder, layer: Layer) -> list[str]:
    return []


# -- convolution and inner product -----------------------------------------------------------------
@layer_type("Convolution")
def _convolution(b: GraphBuilder, layer: Layer) -> list[str]:
    p = layer.params("convolution_param")
    x = b.bottom(layer)
    rank = len(b.shape(x)) - 2
    if rank < 1:
        raise layer.error(f"needs a bottom with spatial axes; got {tuple(b.shape(x))}")
    if _int(p, "axis", 1) != 1:
        raise layer.error("only axis 1 (channels) is supported")
    kernel = _spatial(layer, p, "kernel_size", rank, None, ("kernel_h", "kernel_w"))
    stride = _spatial(layer, p, "stride", rank, 1, ("stride_h", "stride_w"))
    pad = _spatial(layer, p, "pad", rank, 0, ("pad_h", "pad_w"))
    dilation = _spatial(layer, p, "dilation", rank, 1, None)
    group = _int(p, "group", 1)
    if "num_output" not in p:
        raise layer.error("convolution_param.num_output is required")
    num_output = _int(p, "num_output", 0)
    channels = _channels(b, layer, x)
    if group < 1 or channels % group or num_output % group:
        raise layer.error(f"group {group} must divide the input channels {channels} and num_output {num_output}")
    inputs = [x, b.param(layer, 0, (num_output, channels // group, *kernel))]
    if _bool(p, "bias_term", True):
        inputs.append(b.param(layer, 1, (num_output,)))
    return b.add(
        layer, "Conv", inputs, [b.top(layer)], kernel_shape=kernel, strides=stride, pads=pad + pad,
        dilations=dilation, group=group,
    )


@layer_type("InnerProduct")
def _inner_product(b: GraphBuilder, layer: Layer) -> list[str]:
    """Caffe flattens the axes from ``axis`` on into K features: ``y = x W^T + b`` with W ``[N, K]``
    (``[K, N]`` with ``transpose``). For the usual ``axis=1`` that is Flatten + Gemm(transB=1); for a
    later axis (per-position FC on a sequence) a MatMul on the trailing axis, then Add."""
    p = layer.params("inner_product_param")
    if "num_output" not in p:
        raise layer.error("inner_product_param.num_output is required")
    num_output = _int(p, "num_output", 0)
    transpose = _bool(p, "transpose", False)
    bias = _bool(p, "bias_term", True)
    x = b.bottom(layer)
    shape = b.shape(x)
    axis = _axis(layer, _int(p, "axis", 1), len(shape))
    if axis == 0:
        raise layer.error("axis 0 would fold the batch into the features; hetflow needs axis >= 1")
    features = _static(layer, shape[axis:], "the flattened features")
    weights = b.param_array(layer, 0, (features, num_output) if transpose else (num_output, features))
    out = b.top(layer)
    if axis == 1:
        weight = b.constant(f"{layer.name}/W", weights)
        bias_name = b.param(layer, 1, (num_output,)) if bias else None
        if len(shape) != 2:
            (x,) = b.add(layer, "Flatten", [x], name=f"{layer.name}/flatten", axis=1)
        inputs = [x, weight] + ([bias_name] if bias_name else [])
        return b.add(layer, "Gemm", inputs, [out], transB=0 if transpose else 1)
    # MatMul wants [K, N]: transpose stored [N, K] weights once, at import.
    weight = b.constant(f"{layer.name}/W", weights if transpose else np.ascontiguousarray(weights.T))
    bias_name = b.param(layer, 1, (num_output,)) if bias else None
    if axis != len(shape) - 1:
        target = np.array([0] * axis + [features], np.int64)
        (x,) = b.add(layer, "Reshape", [x, b.constant(f"{layer.name}/shape", target)],
                     name=f"{layer.name}/flatten")
    if bias_name is None:
        return b.add(layer, "MatMul", [x, weight], [out])
    (product,) = b.add(layer, "MatMul", [x, weight])
    return b.add(layer, "Add", [product, bias_name], [out], name=f"{layer.name}/bias")


# -- pooling ---------------------------------------------------------------------------------------
_POOL_METHODS = ("MAX", "AVE", "STOCHASTIC")


def _check_pooling(layer: Layer) -> str | None:
    method = _enum(layer.params("pooling_param"), "pool", _POOL_METHODS, "MAX")
    if method not in ("MAX", "AVE"):
        return f"pooling method {method} is not supported (MAX and AVE are)"
    return None


def caffe_pooled_size(size: int, kernel: int, stride: int, pad: int, ceil: bool = True) -> int:
    """Caffe's ``PoolingLayer::Reshape`` output length: rounded up (or down with round_mode FLOOR),
    then, when there is padding, the last window is dropped if it would start in the padding."""
    span = size + 2 * pad - kernel
    pooled = (-(-span // stride) if ceil else span // stride) + 1
    if pad and (pooled - 1) * stride >= size + pad:
        pooled -= 1
    return pooled


@layer_type("Pooling", check=_check_pooling)
def _pooling(b: GraphBuilder, layer: Layer) -> list[str]:
    """MAX / AVE pooling with Caffe's geometry, as ONNX ``ceil_mode=1`` pools.

    Output size: Caffe rounds up and, when there is padding, drops a last window that would start in
    the end padding. hetflow's ``ceil_mode=1`` (``ops.spatial``) applies the same rule, and so do ONNX
    Runtime's kernels and the ONNX spec's shape inference from opset 22; the spec's shape inference for
    opsets < 22 keeps that window (e.g. size 6, kernel 3, stride 3, pad 2: Caffe 3, old ONNX 4), which
    is the one place "ceil_mode" alone does not say Caffe. With no padding the rule can only fire for
    kernel < stride, where Caffe would pool an empty window past the input: such a layer is refused.

    AVE divisor: Caffe counts the padding but not the overhang past it (``pool_size`` is taken with
    ``hend = min(hstart + kernel, height + pad)``, before clipping to the input): ONNX
    ``count_include_pad=1``, whose divisor hetflow and ONNX Runtime likewise stop at the end padding.
    The tests check both against a numpy transcription of ``pooling_layer.cpp``, clipped windows included.

    ``round_mode: FLOOR`` maps to ``ceil_mode=0``; ``global_pooling`` to GlobalMaxPool /
    GlobalAveragePool.
    """
    p = layer.params("pooling_param")
    method = _enum(p, "pool", _POOL_METHODS, "MAX")
    x = b.bottom(layer)
    shape = b.shape(x)
    if len(shape) != 4:
        raise layer.error(f"Caffe pools 4-D blobs; got {tuple(shape)}")
    if _bool(p, "global_pooling", False):
        op = "GlobalMaxPool" if method == "MAX" else "GlobalAveragePool"
        return b.add(layer, op, [x], [b.top(layer)])
    kernel = _spatial(layer, p, "kernel_size", 2, None, ("kernel_h", "kernel_w"))
    stride = _spatial(layer, p, "stride", 2, 1, ("stride_h", "stride_w"))
    pad = _spatial(layer, p, "pad", 2, 0, ("pad_h", "pad_w"))
    ceil = _enum(p, "round_mode", ("CEIL", "FLOOR"), "CEIL") == "CEIL"
    expected = []
    for axis, (size, k, s, q) in enumerate(zip(shape[2:], kernel, stride, pad)):
        if q >= k:
            raise layer.error(f"pad {q} must be smaller than the kernel {k} (Caffe's own check)")
        pooled = caffe_pooled_size(int(size), k, s, q, ceil)
        if (pooled - 1) * s >= int(size) + q:
            raise layer.error(
                f"the last window on spatial axis {axis} would start past the input (size {size}, "
                f"kernel {k}, stride {s}); Caffe would pool an empty window"
            )
        expected.append(pooled)
    attrs = {"kernel_shape": kernel, "strides": stride, "pads": pad + pad, "ceil_mode": int(ceil)}
    if method == "MAX":
        outs = b.add(layer, "MaxPool", [x], [b.top(layer)], **attrs)
    else:
        outs = b.add(layer, "AveragePool", [x], [b.top(layer)], count_include_pad=1, **attrs)
    got = b.shape(outs[0])[2:]
    assert tuple(got) == tuple(expected), (got, expected)
    return outs


# -- activations and normalisation ----------------------------------------------------------------
@layer_type("ReLU")
def _relu(b: GraphBuilder, layer: Layer) -> list[str]:
    slope = _float(layer.params("relu_param"), "negative_slope", 0.0)
    if slope == 0.0:
        return b.add(layer, "Relu", [b.bottom(layer)], [b.top(layer)])
    return b.add(layer, "LeakyRelu", [b.bottom(layer)], [b.top(layer)], alpha=slope)


@layer_type("Sigmoid")
def _sigmoid(b: GraphBuilder, layer: Layer) -> list[str]:
    return b.add(layer, "Sigmoid", [b.bottom(layer)], [b.top(layer)])


@layer_type("TanH")
def _tanh(b: GraphBuilder, layer: Layer) -> list[str]:
    return b.add(layer, "Tanh", [b.bottom(layer)], [b.top(layer)])


@layer_type("PReLU")
def _prelu(b: GraphBuilder, layer: Layer) -> list[str]:
    """One learned slope per channel (or one for all with ``channel_shared``); Caffe's default 0.25."""
    x = b.bottom(layer)
    rank = len(b.shape(x))
    channels = 1 if _bool(layer.params("prelu_param"), "channel_shared", False) else _channels(b, layer, x)
    slope = b.param(layer, 0, _broadcast_shape((channels,), rank - 2), fill=0.25, role="slope")
    return b.add(layer, "PRelu", [x, slope], [b.top(layer)])


def _check_lrn(layer: Layer) -> str | None:
    region = _enum(layer.params("lrn_param"), "norm_region", ("ACROSS_CHANNELS", "WITHIN_CHANNEL"),
                   "ACROSS_CHANNELS")
    if region != "ACROSS_CHANNELS":
        return f"LRN norm_region {region} is not supported (ACROSS_CHANNELS is)"
    return None


@layer_type("LRN", check=_check_lrn)
def _lrn(b: GraphBuilder, layer: Layer) -> list[str]:
    """Caffe's ACROSS_CHANNELS LRN is ONNX's: ``x / (k + alpha / size * sum(x^2 over size channels))^beta``
    with the window centred on the channel (Caffe divides alpha by local_size too, and requires an odd
    local_size, so the two windows coincide)."""
    p = layer.params("lrn_param")
    size = _int(p, "local_size", 5)
    if size < 1 or size % 2 == 0:
        raise layer.error(f"local_size {size} must be odd (Caffe's own check)")
    return b.add(
        layer, "LRN", [b.bottom(layer)], [b.top(layer)], size=size, alpha=_float(p, "alpha", 1.0),
        beta=_float(p, "beta", 0.75), bias=_float(p, "k", 1.0),
    )


@layer_type("BatchNorm")
def _batch_norm(b: GraphBuilder, layer: Layer) -> list[str]:
    return convert_batchnorm(b, layer, None)


def convert_batchnorm(b: GraphBuilder, layer: Layer, scale: Layer | None) -> list[str]:
    """BatchNorm (optionally with the Scale layer that follows it) -> one BatchNormalization.

    Caffe's BatchNorm stores three blobs: the running mean and variance *sums* and the factor they were
    accumulated with (``mean = blob0 / blob2``, the same for the variance; a zero factor means zeros).
    It has no affine part: ResNet-style nets follow it with a Scale layer (gamma, and beta with
    ``bias_term``), which ``scale`` folds in; alone, gamma = 1 and beta = 0. ``use_global_stats``
    defaults to true at inference; false normalises with the batch's statistics (training mode).
    """
    p = layer.params("batch_norm_param")
    x = b.bottom(layer)
    channels = _channels(b, layer, x)
    mean = b.param_array(layer, 0, (channels,))
    variance = b.param_array(layer, 1, (channels,), fill=1.0)
    factor = float(b.param_array(layer, 2, (1,), fill=1.0)[0])
    factor = 0.0 if factor == 0.0 else 1.0 / factor
    if factor != 1.0:
        mean, variance = (mean * factor).astype(FLOAT), (variance * factor).astype(FLOAT)
    gamma = np.ones(channels, FLOAT)
    beta = np.zeros(channels, FLOAT)
    out_layer = layer
    if scale is not None:
        sp = scale.params("scale_param")
        gamma = b.param_array(scale, 0, (channels,), fill=1.0)
        if _bool(sp, "bias_term", False):
            beta = b.param_array(scale, 1, (channels,))
        out_layer = scale
    inputs = [
        x,
        b.constant(f"{out_layer.name}/scale", gamma),
        b.constant(f"{out_layer.name}/bias", beta),
        b.constant(f"{layer.name}/mean", mean),
        b.constant(f"{layer.name}/var", variance),
    ]
    training = 0 if _bool(p, "use_global_stats", True) else 1
    return b.add(layer, "BatchNormalization", inputs, [b.top(out_layer)],
                 epsilon=_float(p, "eps", 1e-5), training_mode=training)


def scale_fuses_into_batchnorm(batchnorm: Layer, scale: Layer) -> bool:
    """Whether ``scale`` is the plain per-channel affine a BatchNorm can absorb."""
    p = scale.params("scale_param")
    return (
        scale.type == "Scale"
        and len(scale.bottoms) == 1
        and len(batchnorm.tops) == 1
        and scale.bottoms[0] == batchnorm.tops[0]
        and _int(p, "axis", 1) == 1
        and _int(p, "num_axes", 1) == 1
    )


@layer_type("Scale", "Bias")
def _scale(b: GraphBuilder, layer: Layer) -> list[str]:
    """Scale (``y = x * s [+ bias]``) or Bias (``y = x + bias``) over axes ``axis .. axis+num_axes``.

    With one bottom the factor is a learned blob; with two, the second bottom (its shape fixes the
    axes). Parameters are reshaped with trailing 1s so that ONNX broadcasting lines them up.
    """
    p = layer.params("scale_param" if layer.type == "Scale" else "bias_param")
    x = b.bottom(layer)
    rank = len(b.shape(x))
    axis = _axis(layer, _int(p, "axis", 1), rank, allow_end=True)
    if len(layer.bottoms) > 1:
        operand = b.bottom(layer, 1)
        operand_shape = b.shape(operand)
        trailing = rank - axis - len(operand_shape)
        if trailing < 0 or tuple(b.shape(x)[axis:axis + len(operand_shape)]) != tuple(operand_shape):
            raise layer.error(f"bottom 1 of shape {tuple(operand_shape)} does not match bottom 0 "
                              f"{tuple(b.shape(x))} from axis {axis}")
        dims: Shape = operand_shape
        if trailing:
            # NOTE: Reshape's 0 copies the operand's own dimension at that index: the batch stays symbolic.
            target = np.array([0 if isinstance(d, str) else d for d in operand_shape] + [1] * trailing,
                              np.int64)
            (operand,) = b.add(layer, "Reshape", [operand, b.constant(f"{layer.name}/shape", target)],
                               name=f"{layer.name}/broadcast")
        next_blob = 0
    else:
        num_axes = _int(p, "num_axes", 1)
        end = rank if num_axes == -1 else axis + num_axes
        if not axis <= end <= rank:
            raise layer.error(f"num_axes {num_axes} from axis {axis} does not fit a blob of rank {rank}")
        dims = b.shape(x)[axis:end]
        _static(layer, dims, "the scaled axes")
        trailing = rank - end
        if layer.type == "Scale":
            operand = b.param(layer, 0, _broadcast_shape(dims, trailing), fill=1.0, role="scale")
        next_blob = 1
    out = b.top(layer)
    if layer.type == "Bias":
        bias = operand if len(layer.bottoms) > 1 else b.param(layer, 0, _broadcast_shape(dims, trailing),
                                                               role="bias")
        return b.add(layer, "Add", [x, bias], [out])
    if not _bool(p, "bias_term", False):
        return b.add(layer, "Mul", [x, operand], [out])
    _static(layer, dims, "the learned bias's shape")
    (scaled,) = b.add(layer, "Mul", [x, operand])
    bias = b.param(layer, next_blob, _broadcast_shape(dims, trailing), role="bias")
    return b.add(layer, "Add", [scaled, bias], [out], name=f"{layer.name}/bias")


# -- combining and reshaping -----------------------------------------------------------------------
_ELTWISE_OPS = ("PROD", "SUM", "MAX")


def _check_eltwise(layer: Layer) -> str | None:
    op = _enum(layer.params("eltwise_param"), "operation", _ELTWISE_OPS, "SUM")
    return None if op in _ELTWISE_OPS else f"Eltwise operation {op} is not supported"


@layer_type("Eltwise", check=_check_eltwise)
def _eltwise(b: GraphBuilder, layer: Layer) -> list[str]:
    """SUM (each bottom times its ``coeff``, default 1) -> Add / Sum; PROD -> Mul; MAX -> Max."""
    p = layer.params("eltwise_param")
    op = _enum(p, "operation", _ELTWISE_OPS, "SUM")
    coeffs = [float(c) for c in p.all("coeff")]
    inputs = [b.bottom(layer, i) for i in range(len(layer.bottoms))]
    if len(inputs) < 2:
        raise layer.error("Eltwise needs at least two bottoms")
    if coeffs and op != "SUM":
        raise layer.error("coeff only applies to the SUM operation")
    if coeffs and len(coeffs) != len(inputs):
        raise layer.error(f"{len(coeffs)} coeff values for {len(inputs)} bottoms")
    shapes = {tuple(b.shape(i)) for i in inputs}
    if len(shapes) > 1:
        raise layer.error(f"bottoms must have one shape; got {sorted(map(str, shapes))}")
    out = b.top(layer)
    if op == "MAX":
        return b.add(layer, "Max", inputs, [out])
    if op == "PROD":
        return _chain(b, layer, "Mul", inputs, out)
    terms = []
    for index, (value, coeff) in enumerate(zip(inputs, coeffs or [1.0] * len(inputs))):
        if coeff != 1.0:
            factor = b.constant(f"{layer.name}/coeff{index}", np.array(coeff, FLOAT))
            (value,) = b.add(layer, "Mul", [value, factor], name=f"{layer.name}/coeff{index}")
        terms.append(value)
    if len(terms) == 2:
        return b.add(layer, "Add", terms, [out])
    return b.add(layer, "Sum", terms, [out])


def _chain(b: GraphBuilder, layer: Layer, op: str, inputs: list[str], out: str) -> list[str]:
    """A binary op folded over several inputs: ``((a op b) op c) ...``."""
    acc = inputs[0]
    for index, value in enumerate(inputs[1:], start=1):
        last = index == len(inputs) - 1
        (acc,) = b.add(layer, op, [acc, value], [out] if last else None,
                       name=layer.name if last else f"{layer.name}/{index}")
    return [acc]


@layer_type("Concat")
def _concat(b: GraphBuilder, layer: Layer) -> list[str]:
    p = layer.params("concat_param")
    if "axis" in p and "concat_dim" in p:
        raise layer.error("give either axis or concat_dim, not both")
    inputs = [b.bottom(layer, i) for i in range(len(layer.bottoms))]
    if not inputs:
        raise layer.error("Concat needs at least one bottom")
    rank = len(b.shape(inputs[0]))
    axis = _axis(layer, _int(p, "axis", _int(p, "concat_dim", 1)), rank)
    return b.add(layer, "Concat", inputs, [b.top(layer)], axis=axis)


@layer_type("Softmax")
def _softmax(b: GraphBuilder, layer: Layer) -> list[str]:
    """Caffe normalises along ``axis`` (default 1) independently at every other position: ONNX
    Softmax (opset >= 13) with the same axis."""
    x = b.bottom(layer)
    axis = _axis(layer, _int(layer.params("softmax_param"), "axis", 1), len(b.shape(x)))
    return b.add(layer, "Softmax", [x], [b.top(layer)], axis=axis)


@layer_type("Flatten")
def _flatten(b: GraphBuilder, layer: Layer) -> list[str]:
    """Merge axes ``axis .. end_axis`` into one (default 1 .. -1: ONNX Flatten(1)); other ranges keep
    the surrounding axes, as a Reshape."""
    p = layer.params("flatten_param")
    x = b.bottom(layer)
    shape = b.shape(x)
    start = _axis(layer, _int(p, "axis", 1), len(shape))
    end = _axis(layer, _int(p, "end_axis", -1), len(shape))
    if end < start:
        raise layer.error(f"end_axis {end} comes before axis {start}")
    if start == 1 and end == len(shape) - 1:
        return b.add(layer, "Flatten", [x], [b.top(layer)], axis=1)
    merged = _static(layer, shape[start:end + 1], "the flattened axes")
    _static(layer, shape[end + 1:], "the axes after the flattened ones")
    target = np.array([0] * start + [merged] + [int(d) for d in shape[end + 1:]], np.int64)
    return b.add(layer, "Reshape", [x, b.constant(f"{layer.name}/shape", target)], [b.top(layer)])


@layer_type("Reshape")
def _reshape(b: GraphBuilder, layer: Layer) -> list[str]:
    """Caffe's ``reshape_param``: ``dim: 0`` copies, ``-1`` infers, over axes ``axis .. axis+num_axes``.

    A Caffe copy (0) at position i of the range reads input axis ``axis + i``, which is the output
    index it lands on, so ONNX Reshape's copy means the same; the axes outside the range are spelled
    out (copies before it, explicit sizes after it).
    """
    p = layer.params("reshape_param")
    x = b.bottom(layer)
    shape = b.shape(x)
    dims = [int(d) for d in p.message("shape").all("dim")]
    start = _axis(layer, _int(p, "axis", 0), len(shape), allow_end=True)
    num_axes = _int(p, "num_axes", -1)
    end = len(shape) if num_axes == -1 else start + num_axes
    if not start <= end <= len(shape):
        raise layer.error(f"num_axes {num_axes} from axis {start} does not fit a blob of rank {len(shape)}")
    after: list[Dim] = list(shape[end:])
    _static(layer, after, "the axes after the reshaped ones")
    target = np.array([0] * start + dims + [int(d) for d in after], np.int64)
    return b.add(layer, "Reshape", [x, b.constant(f"{layer.name}/shape", target)], [b.top(layer)])
