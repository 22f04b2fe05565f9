"""Test helpers for the Caffe frontend: a caffemodel *writer* and a numpy forward pass with Caffe's semantics.

The writer emits the protobuf wire format of the ``NetParameter`` subset the importer reads (plus a few
fields it must skip), so tests can make ``.caffemodel`` files with known weights. The reference runs a
parsed prototxt layer by layer the way Caffe's CPU layers compute (``conv_layer``, ``pooling_layer.cpp``,
``lrn_layer``, ``batch_norm_layer``...), written independently of hetflow's ops.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from hetflow.frontends.caffe.caffemodel import V1_LAYER_TYPES
from hetflow.frontends.caffe.prototxt import Message

# -- wire-format writer ----------------------------------------------------------------------------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are 10-byte two's complement varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def string(number: int, text: str) -> bytes:
    return length_delimited(number, text.encode())


def blob_proto(array: np.ndarray, legacy_dims: bool = False, packed: bool = True) -> bytes:
    """A BlobProto: shape (or the legacy num/channels/height/width) and float data."""
    array = np.asarray(array, np.float32)
    out = bytearray()
    if legacy_dims:
        dims = (1,) * (4 - array.ndim) + array.shape
        for number, dim in zip((1, 2, 3, 4), dims):
            out += key(number, 0) + varint(dim)
    else:
        out += length_delimited(7, length_delimited(1, b"".join(varint(d) for d in array.shape)))
    if packed:
        out += length_delimited(5, array.astype("<f4").tobytes())
    else:
        out += b"".join(key(5, 5) + struct.pack("<f", v) for v in array.ravel())
    # A diff blob the reader must ignore.
    out += length_delimited(6, np.full(min(array.size, 3), 7.0, "<f4").tobytes())
    return bytes(out)


def caffemodel_bytes(
    layers: Sequence[tuple[str, str, Sequence[np.ndarray]]],
    name: str = "net",
    v1: bool = False,
    legacy_dims: bool = False,
    packed: bool = True,
) -> bytes:
    """A serialized NetParameter with one layer per ``(name, type, blobs)``.

    Args:
        v1: write legacy ``layers`` (field 2, V1LayerParameter with an enum type) instead of ``layer``.
        legacy_dims: store blob shapes as 4-D num/channels/height/width.
        packed: store floats packed (Caffe's way) or one fixed32 field per value.
    """
    enums = {type_name: number for number, (_, type_name) in V1_LAYER_TYPES.items()}
    out = bytearray(string(1, name))
    for layer_name, layer_type, blobs in layers:
        if v1:
            body = string(4, layer_name) + key(5, 0) + varint(enums[layer_type])
            body += b"".join(length_delimited(6, blob_proto(b, legacy_dims, packed)) for b in blobs)
            body += string(2, "bottom") + string(3, "top") + key(7, 5) + struct.pack("<f", 1.0)
            out += length_delimited(2, body)
        else:
            body = string(1, layer_name) + string(2, layer_type) + string(3, "bottom") + string(4, "top")
            body += key(10, 0) + varint(1)  # phase: TEST
            body += b"".join(length_delimited(7, blob_proto(b, legacy_dims, packed)) for b in blobs)
            # A layer parameter message with nested fields the reader must skip.
            body += length_delimited(106, key(1, 0) + varint(20) + length_delimited(7, string(1, "xavier")))
            out += length_delimited(100, body)
    return bytes(out)


# -- numpy reference -------------------------------------------------------------------------------


def _get(p: Message, name: str, default):
    return p.get(name, default)


def _hw(p: Message, name: str, default):
    if f"{name}_h" in p:
        return int(p.get(f"{name}_h")), int(p.get(f"{name}_w"))
    values = p.all(name if name != "kernel" else "kernel_size") or ([default] if default is not None else [])
    values = [int(v) for v in values]
    return (values[0], values[-1])


def conv_ref(x, w, b, stride, pad, dilation, group):
    n, c, h, wd = x.shape
    out_c, cg, kh, kw = w.shape
    oh = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    y = np.zeros((n, out_c, oh, ow), np.float64)
    per_group = out_c // group
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * per_group:(g + 1) * per_group]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation[0]: i * dilation[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dilation[1]: j * dilation[1] + stride[1] * (ow - 1) + 1: stride[1]]
                y[:, g * per_group:(g + 1) * per_group] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def pool_ref(x, method, kernel, stride, pad, ceil=True):
    """Caffe's PoolingLayer::Forward_cpu, loop for loop (MAX and AVE)."""
    n, c, h, w = x.shape
    sizes = []
    for size, k, s, p in zip((h, w), kernel, stride, pad):
        span = size + 2 * p - k
        pooled = (-(-span // s) if ceil else span // s) + 1
        if p and (pooled - 1) * s >= size + p:
            pooled -= 1
        sizes.append(pooled)
    y = np.zeros((n, c, *sizes), np.float64)
    for ph in range(sizes[0]):
        for pw in range(sizes[1]):
            hstart, wstart = ph * stride[0] - pad[0], pw * stride[1] - pad[1]
            if method == "MAX":
                hend, wend = min(hstart + kernel[0], h), min(wstart + kernel[1], w)
                hstart, wstart = max(hstart, 0), max(wstart, 0)
                y[:, :, ph, pw] = x[:, :, hstart:hend, wstart:wend].max(axis=(2, 3))
            else:
                hend, wend = min(hstart + kernel[0], h + pad[0]), min(wstart + kernel[1], w + pad[1])
                pool_size = (hend - hstart) * (wend - wstart)
                hstart, wstart = max(hstart, 0), max(wstart, 0)
                hend, wend = min(hend, h), min(wend, w)
                y[:, :, ph, pw] = x[:, :, hstart:hend, wstart:wend].sum(axis=(2, 3)) / pool_size
    return y


def lrn_ref(x, size, alpha, beta, k):
    squares = np.pad(x ** 2, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    window = sum(squares[:, i:i + x.shape[1]] for i in range(size))
    return x / (k + alpha / size * window) ** beta


def forward_ref(net: Message, weights: dict[str, list[np.ndarray]], feeds: dict[str, np.ndarray]):
    """Run a parsed deploy prototxt in float64 with Caffe's layer semantics; returns every blob."""
    blobs = {k: v.astype(np.float64) for k, v in feeds.items()}
    for layer in net.all("layer"):
        kind, name = layer.get("type"), layer.get("name")
        bottoms = [blobs[b] for b in layer.all("bottom")]
        tops = layer.all("top")
        params = [a.astype(np.float64) for a in weights.get(name, [])]
        x = bottoms[0] if bottoms else None
        if kind == "Input":
            continue
        if kind == "Convolution":
            p = layer.message("convolution_param")
            b = params[1] if p.get("bias_term", True) else None
            y = conv_ref(x, params[0], b, _hw(p, "stride", 1), _hw(p, "pad", 0), _hw(p, "dilation", 1),
                         int(p.get("group", 1)))
        elif kind == "Pooling":
            p = layer.message("pooling_param")
            method = p.get("pool", "MAX")
            if p.get("global_pooling", False):
                y = (x.max if method == "MAX" else x.mean)(axis=(2, 3), keepdims=True)
            else:
                y = pool_ref(x, method, _hw(p, "kernel", None), _hw(p, "stride", 1), _hw(p, "pad", 0),
                             p.get("round_mode", "CEIL") == "CEIL")
        elif kind == "InnerProduct":
            p = layer.message("inner_product_param")
            axis = int(p.get("axis", 1))
            flat = x.reshape(*x.shape[:axis], -1)
            out = int(p.get("num_output"))
            w = params[0].reshape(-1, out) if p.get("transpose", False) else params[0].reshape(out, -1).T
            y = flat @ w
            if p.get("bias_term", True):
                y = y + params[1].ravel()
        elif kind == "ReLU":
            slope = float(layer.message("relu_param").get("negative_slope", 0.0))
            y = np.where(x > 0, x, slope * x)
        elif kind == "PReLU":
            slope = params[0].reshape(-1, 1, 1)
            y = np.where(x > 0, x, slope * x)
        elif kind == "Sigmoid":
            y = 1 / (1 + np.exp(-x))
        elif kind == "TanH":
            y = np.tanh(x)
        elif kind == "LRN":
            p = layer.message("lrn_param")
            y = lrn_ref(x, int(p.get("local_size", 5)), float(p.get("alpha", 1.0)), float(p.get("beta", 0.75)),
                        float(p.get("k", 1.0)))
        elif kind == "BatchNorm":
            p = layer.message("batch_norm_param")
            eps = float(p.get("eps", 1e-5))
            if p.get("use_global_stats", True):
                factor = 0.0 if params[2][0] == 0 else 1.0 / params[2][0]
                mean, var = params[0] * factor, params[1] * factor
            else:  # the batch's own statistics (biased variance)
                mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
            y = (x - mean.reshape(1, -1, 1, 1)) / np.sqrt(var.reshape(1, -1, 1, 1) + eps)
        elif kind in ("Scale", "Bias"):
            p = layer.message("scale_param" if kind == "Scale" else "bias_param")
            axis = int(p.get("axis", 1))
            if len(bottoms) > 1:
                operand = bottoms[1]
            else:
                operand = params[0]
                num_axes = int(p.get("num_axes", 1))
                operand = operand.reshape(x.shape[axis:x.ndim if num_axes == -1 else axis + num_axes])
            operand = operand.reshape(operand.shape + (1,) * (x.ndim - axis - operand.ndim))
            if kind == "Bias":
                y = x + operand
            else:
                y = x * operand
                if p.get("bias_term", False):
                    y = y + params[0 if len(bottoms) > 1 else 1].reshape(operand.shape)
        elif kind == "Eltwise":
            p = layer.message("eltwise_param")
            op = p.get("operation", "SUM")
            if op == "SUM":
                coeffs = [float(c) for c in p.all("coeff")] or [1.0] * len(bottoms)
                y = sum(c * b for c, b in zip(coeffs, bottoms))
            elif op == "PROD":
                y = np.prod(bottoms, axis=0)
            else:
                y = np.max(bottoms, axis=0)
        elif kind == "Concat":
            p = layer.message("concat_param")
            y = np.concatenate(bottoms, axis=int(p.get("axis", p.get("concat_dim", 1))))
        elif kind == "Softmax":
            axis = int(layer.message("softmax_param").get("axis", 1))
            e = np.exp(x - x.max(axis=axis, keepdims=True))
            y = e / e.sum(axis=axis, keepdims=True)
        elif kind in ("Dropout", "Split"):
            y = x
        elif kind == "Reshape":
            dims = [int(d) for d in layer.message("reshape_param").message("shape").all("dim")]
            y = x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(dims)])
        elif kind == "Flatten":
            p = layer.message("flatten_param")
            start, end = int(p.get("axis", 1)), int(p.get("end_axis", -1)) % x.ndim
            y = x.reshape(*x.shape[:start], -1, *x.shape[end + 1:])
        else:
            raise NotImplementedError(kind)
        for top in tops:
            blobs[top] = y
    return blobs
