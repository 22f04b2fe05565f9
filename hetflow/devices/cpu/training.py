"""The CPU's training kernels: backward rules for the layers a CNN spends its training step in.

Registered through ``hetflow.train.device.TRAINING_REGISTRARS`` like an accelerator's, so the tape runs
them for every node placed on the CPU and the ops' numpy rules (``OpDef.backward``, the reference the
gradient checks test) for everything else. Each rule falls back to the op's numpy rule where its
compiled loops do not apply (other dtypes, ranks or windows), so its ``supports`` only states what is
known before the step runs.

* Conv (also with a fused Relu, the training graph's Conv + Relu): ``conv_train.conv_backward``, dW and
  dX a few images at a time with the columns in cache, the Relu's mask applied to each chunk of dY
  (float32 stride-1 layers: forward and dX by ``jit_direct``'s direct kernels, dW and dB by
  ``jit_direct_grad``);
* Gemm (2-D, no fused activation): ``gemm_train.gemm_backward``, its products split over the kernel
  threads with BLAS at one thread (so OpenBLAS's own workers never busy-wait beside the next layers);
* MaxPool (2-D): dY scattered by the Indices the training forward recorded
  (``jit_backward.max_pool_scatter_2d``), else ``jit_backward.max_pool_backward_2d`` (winners found
  again from X);
* Relu: ``jit_backward.relu_backward``, one pass;
* the SGD and Adam / AdamW updates: ``jit_optim``, one pass over each parameter and its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import Device, InputInfos
from hetflow.devices.cpu.kernels import conv_train, gemm_train, jit_backward, jit_optim
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.base import Arrays, Grads, Wanted, wants
from hetflow.ops.pool import has_indices, pool_window
from hetflow.ops.spatial import geometry

if TYPE_CHECKING:
    from hetflow.train.device import TrainingKernels

#: dtypes the CPU's training rules compute themselves (the numpy rules take the others).
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def register_training(device: Device, kernels: TrainingKernels) -> None:
    """Register the CPU's backward rules and optimizer updates into ``kernels`` (see
    ``hetflow.train.device``)."""
    table = kernels.backward
    table.register("Conv", algorithm="chunked", supports=_supports_conv)(conv_backward)
    table.register("Gemm", algorithm="split", supports=_supports_gemm)(gemm_backward)
    table.register("MaxPool", algorithm="compiled", supports=_supports_max_pool)(max_pool_backward)
    table.register("Relu", algorithm="compiled")(relu_backward)
    kernels.updates["sgd"] = jit_optim.sgd_update
    kernels.updates["adam"] = jit_optim.adam_update


def conv_backward(
    node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
) -> Grads:
    """Conv's gradients by ``conv_train`` (float32 / float64), else by the numpy rule."""
    x, w = inputs[0], inputs[1]
    dy = grad_outputs[0]
    # A fused Relu's output, whose mask conv_train applies to dY.
    fused = node.attrs.fused is not None
    y = outputs[0] if fused else None
    if dy is None or not _computes(x, w, dy) or (fused and not _computes(dy, y)):
        return _numpy_rule(node, inputs, outputs, grad_outputs, wanted)
    assert x is not None and w is not None
    has_bias = len(inputs) > 2 and inputs[2] is not None
    found = conv_train.conv_backward(
        np.ascontiguousarray(x),
        np.ascontiguousarray(w),
        np.ascontiguousarray(dy),
        node.attrs,
        want_x=wants(wanted, 0),
        want_w=wants(wanted, 1),
        want_b=has_bias and wants(wanted, 2),
        y=None if y is None else np.ascontiguousarray(y),
    )
    return [found.x, found.w, found.b] if len(inputs) > 2 else [found.x, found.w]


def gemm_backward(
    node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
) -> Grads:
    """Gemm's gradients by ``gemm_train`` (2-D float32 / float64 operands of one dtype), else by the numpy
    rule."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    dy = grad_outputs[0]
    if dy is None or not _computes(a, b, dy) or (c is not None and not _computes(dy, c)):
        return _numpy_rule(node, inputs, outputs, grad_outputs, wanted)
    assert a is not None and b is not None
    found = gemm_train.gemm_backward(
        a,
        b,
        None if c is None else c.shape,
        dy,
        node.attrs,
        (wants(wanted, 0), wants(wanted, 1), wants(wanted, 2)),
    )
    return [found.a, found.b, found.c] if len(inputs) > 2 else [found.a, found.b]


def max_pool_backward(
    node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
) -> Grads:
    """2-D MaxPool's dX by the compiled loops (float32 / float64): dY scattered by the node's Indices
    (row-major), else by the winners found again from X; other dtypes by the numpy rule."""
    x, dy = inputs[0], grad_outputs[0]
    if dy is None or not wants(wanted, 0) or x is None or x.ndim != 4 or not _computes(x, dy):
        return _numpy_rule(node, inputs, outputs, grad_outputs, wanted)
    indices = outputs[1] if has_indices(node) and node.attrs.storage_order == 0 else None
    if indices is not None and indices.dtype == np.int64 and indices.shape == dy.shape:
        dy = np.ascontiguousarray(dy)
        return [jit_backward.max_pool_scatter_2d(np.ascontiguousarray(indices), dy, x.shape)]
    geom = geometry(pool_window(node.attrs), x.shape[2:])
    return [jit_backward.max_pool_backward_2d(np.ascontiguousarray(x), np.ascontiguousarray(dy), geom)]


def relu_backward(
    node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
) -> Grads:
    """Relu's dX by the compiled loop (float32 / float64, same shapes), else by the numpy rule."""
    x, dy = inputs[0], grad_outputs[0]
    if dy is None or not wants(wanted, 0) or x is None or x.shape != dy.shape or not _computes(x, dy):
        return _numpy_rule(node, inputs, outputs, grad_outputs, wanted)
    return [jit_backward.relu_backward(np.ascontiguousarray(x), np.ascontiguousarray(dy))]


def _computes(*arrays: np.ndarray | None) -> bool:
    """Whether the arrays are present and of one float dtype the compiled rules handle."""
    first = arrays[0]
    if first is None or first.dtype not in FLOAT_DTYPES:
        return False
    return all(a is not None and a.dtype == first.dtype for a in arrays)


def _numpy_rule(node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted) -> Grads:
    return registry.get(node.op_type, node.domain).backward(node, inputs, outputs, grad_outputs, wanted)


def _supports_conv(node: Node, inputs: InputInfos) -> str | None:
    fused = node.attrs.fused
    if fused is not None and fused.op_type != "Relu":
        return f"a Conv with a fused {fused.op_type} has no backward rule (train the unoptimised graph)"
    return None


def _supports_gemm(node: Node, inputs: InputInfos) -> str | None:
    if node.attrs.fused is not None:
        return f"a Gemm with a fused {node.attrs.fused.op_type} has no backward rule (train the unoptimised graph)"
    return None


def _supports_max_pool(node: Node, inputs: InputInfos) -> str | None:
    if len(pool_window(node.attrs).kernel) != 2:
        return "the compiled MaxPool backward is 2-D"
    return None
