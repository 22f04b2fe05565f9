"""Training-side forward kernels: faster versions of CPU kernels for the shapes a training step runs.

A training step runs every layer over a whole batch (128 CIFAR images, say) where inference runs a few
images. The training Conv (``hetflow.devices.cpu.kernels.conv_train``) builds its im2col columns a few
images at a time, in the channel-major layout the CPU's backward rule rebuilds them in, and multiplies
each chunk while its columns are in cache: whole-batch columns (the route before, 150 MB for the
mentee's second layer at batch 128) ran the GEMM at half its in-cache rate. Its temporaries are a chunk's
columns and products, well inside the Conv's costed im2col workspace, so the step's memory bound
(``Trainer.scratch_bytes``) still holds.

``training_kernel(node)`` returns the function to run instead of the CPU device's kernel, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.cpu.kernels import conv_train
from hetflow.graph import Node

#: ``fn(node, inputs) -> outputs``, as the CPU device's kernels are called.
ForwardFn = Callable[[Node, Sequence[np.ndarray | None]], list[np.ndarray]]


def conv_forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Conv (any rank, group, stride, padding, dilation; a fused Relu or none) a chunk of images at a
    time: ``W [K/G, C/G*taps] @ cols [C/G*taps, n*P]`` per group, bias added as Y is laid out and the
    Relu applied while the chunk is in cache."""
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


#: op type -> (constraint, forward function).
_KERNELS: dict[str, tuple[Callable[[Node], bool], ForwardFn]] = {
    "Conv": (_conv_supported, conv_forward),
}


def training_kernel(node: Node) -> ForwardFn | None:
    """The training-side forward function for ``node``, or None to run the CPU device's kernel."""
    entry = _KERNELS.get(node.op_type)
    if entry is None or node.domain not in ("", "ai.onnx"):
        return None
    supported, fn = entry
    return fn if supported(node) else None
