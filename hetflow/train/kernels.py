"""Training-side forward kernels: faster versions of CPU kernels for the shapes a training step runs.

A training step runs every layer over a whole batch (128 CIFAR images, say) where inference runs a few
images. The inference Conv kernel builds its columns a few images at a time and multiplies them with
numpy's stacked matmul (one BLAS call per image, a weight operand broadcast over the images); here one
channel-major column buffer (``hetflow.ops.conv.channel_columns``, the layout the backward rule uses)
feeds one 2-D GEMM per group over the whole batch. NOTE: measured side by side on the mentee at batch
128 on a loaded machine, both reach about the same best step, but the per-image route's median step
was several times its best and this one's stays close to it. The buffer's size is the Conv's costed
im2col workspace, so the step's memory bound (``Trainer.scratch_bytes``) still holds.

``training_kernel(node)`` returns the function to run instead of the CPU device's kernel, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetflow.graph import Node
from hetflow.ops.conv import channel_columns, conv_window
from hetflow.ops.spatial import geometry

#: ``fn(node, inputs) -> outputs``, as the CPU device's kernels are called.
ForwardFn = Callable[[Node, Sequence[np.ndarray | None]], list[np.ndarray]]


def conv_forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Conv (any rank, group, stride, padding, dilation; no fused activation) as one GEMM per group
    over the whole batch: ``W [K/G, C/G*taps] @ cols [C/G*taps, N*P]``, then bias and layout in one pass."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    group = node.attrs.group
    geom = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    batch, kernels = x.shape[0], w.shape[0]
    positions = int(np.prod(geom.out, dtype=np.int64))
    per_group = w.shape[1] * int(np.prod(geom.kernel, dtype=np.int64))
    cols = channel_columns(x, geom).reshape(group, per_group, batch * positions)
    weights = w.reshape(group, kernels // group, per_group)
    products = np.empty((group, kernels // group, batch * positions), np.result_type(x, w))
    for g in range(group):
        np.matmul(weights[g], cols[g], out=products[g])
    del cols
    # [K, N, P] -> [N, K, P]: the copy the layout needs anyway also adds the bias.
    y = np.empty((batch, kernels, positions), products.dtype)
    spread = np.moveaxis(products.reshape(kernels, batch, positions), 0, 1)
    if bias is None:
        np.copyto(y, spread)
    else:
        np.add(spread, bias.reshape(1, kernels, 1), out=y)
    return [y.reshape(batch, kernels, *geom.out)]


def _conv_supported(node: Node) -> bool:
    # NOTE: a fused activation only appears in optimised (inference) graphs; leave those to the device.
    return node.attrs.fused is None


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
