"""Training-side forward kernels: faster versions of CPU kernels for the shapes a training step runs.

A training step runs every layer over a whole batch (128 CIFAR images, say) where inference runs a few
images. float32 2-D Convs of stride 1 and one group run ``jit_direct``'s direct kernel, which builds no
columns; its temporaries are one image's zero-bordered planes and products per thread. Other Convs go
through the training Conv (``hetflow.devices.cpu.kernels.conv_train``), which builds its im2col columns a
few images at a time, in the channel-major layout the CPU's backward rule rebuilds them in, and
multiplies each chunk while its columns are in cache: whole-batch columns (the route before, 150 MB for
the mentee's second layer at batch 128) ran the GEMM at half its in-cache rate. Its temporaries are a
chunk's columns and products, well inside the Conv's costed im2col workspace, so the step's memory bound
(``Trainer.scratch_bytes``) still holds; the direct kernel's (``K`` + ``C`` padded planes of one image per
thread) are a few hundred KB at the mentee's sizes.

The training MaxPool (2-D, with the Indices output ``hetflow.train.graph.record_pool_indices`` adds)
finds each window's winner once, in the forward pass (``jit_backward.max_pool_indices_2d``): the CPU's
MaxPool backward rule then only scatters dY by the Indices instead of searching every window again.

The training Gemm (``hetflow.devices.cpu.kernels.gemm_train``) splits its product's rows over the
kernel threads with BLAS at one thread, as its backward rule does: a GEMM left to OpenBLAS's threads
leaves its workers busy-waiting beside the next layers' split.

``training_kernel(node)`` returns the function to run instead of the CPU device's kernel, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.cpu.kernels import conv_train, gemm_train, jit_backward
from hetflow.devices.cpu.kernels.gemm import gemm as gemm_kernel
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.pool import max_pool as max_pool_kernel
from hetflow.graph import Node
from hetflow.ops.pool import has_indices, pool_window
from hetflow.ops.spatial import geometry

#: ``fn(node, inputs) -> outputs``, as the CPU device's kernels are called.
ForwardFn = Callable[[Node, Sequence[np.ndarray | None]], list[np.ndarray]]


def conv_forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Conv (any rank, group, stride, padding, dilation; a fused Relu or none) by
    ``conv_train.conv_forward``: the direct kernel where it applies, else a chunk of images at a time,
    ``W [K/G, C/G*taps] @ cols [C/G*taps, n*P]`` per group, bias added as Y is laid out and the Relu
    applied while the chunk is in cache."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    dtype = np.result_type(x, w)
    x = np.ascontiguousarray(x, dtype)
    w = np.ascontiguousarray(w, dtype)
    return [conv_train.conv_forward(x, w, bias, node.attrs)]


def _conv_supported(node: Node) -> bool:
    # NOTE: the training graph fuses only Relu (``hetflow.train.graph.fuse_conv_relu``); other fused
    # activations come from optimised (inference) graphs: leave those to the device.
    return node.attrs.fused is None or node.attrs.fused.op_type == "Relu"


def gemm_forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Gemm of 2-D float32 / float64 operands of one dtype by ``gemm_train`` (the product's rows split
    over the kernel threads); other operands by the CPU device's kernel."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    operands = [a, b] if c is None else [a, b, c]
    if any(o.dtype not in _SPLIT_DTYPES or o.dtype != a.dtype for o in operands) or a.ndim != 2:
        return gemm_kernel(node, inputs)
    return [gemm_train.gemm_forward(a, b, c, node.attrs)]


#: dtypes the training Gemm splits (others run the CPU device's kernel).
_SPLIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _gemm_supported(node: Node) -> bool:
    return node.attrs.fused is None


def max_pool_forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Y and Indices of a 2-D MaxPool (float32 / float64) in one compiled pass over X; other dtypes by
    the CPU device's kernel."""
    x = inputs[0]
    assert x is not None
    if x.dtype not in COMPILED_DTYPES or x.ndim != 4:
        return max_pool_kernel(node, inputs)
    geom = geometry(pool_window(node.attrs), x.shape[2:])
    y, indices = jit_backward.max_pool_indices_2d(np.ascontiguousarray(x), geom)
    return [y, indices]


def computes_pool_indices(node: Node) -> bool:
    """Whether the training MaxPool computes this MaxPool's Indices: a 2-D window, row-major Indices."""
    return len(pool_window(node.attrs).kernel) == 2 and node.attrs.storage_order == 0


def _max_pool_supported(node: Node) -> bool:
    # NOTE: without Indices, the device's MaxPool (no winners to record) is the faster forward.
    return has_indices(node) and computes_pool_indices(node)


#: op type -> (constraint, forward function).
_KERNELS: dict[str, tuple[Callable[[Node], bool], ForwardFn]] = {
    "Conv": (_conv_supported, conv_forward),
    "Gemm": (_gemm_supported, gemm_forward),
    "MaxPool": (_max_pool_supported, max_pool_forward),
}


def training_kernel(node: Node) -> ForwardFn | None:
    """The training-side forward function for ``node``, or None to run the CPU device's kernel."""
    entry = _KERNELS.get(node.op_type)
    if entry is None or node.domain not in ("", "ai.onnx"):
        return None
    supported, fn = entry
    return fn if supported(node) else None
