"""OpenCL backward rules for training (``backward.cl``), one per op, each computing what the op's numpy
rule (``OpDef.backward`` in ``hetflow/ops/``) computes, from the same arguments:
``rule(node, inputs, outputs, grad_outputs, wanted) -> grads``.

* Conv (1-D and 2-D, groups, strides, pads, dilations): dW per group through the tiled GEMM
  (``dW[g] = dY[g] . cols[g]^T``, both operands written into the GEMM's panels on the device, the
  reduction over images split into chunks when the layer alone would leave compute units idle), dX as
  ``col2im(W^T . dY)`` (one batched GEMM, then a gathering col2im), dB as a two-pass reduction;
* Gemm and MatMul through the same GEMM (``hetflow.devices.opencl.kernels.gemm.run_gemm``);
* MaxPool (winners found again from X, then gathered), AveragePool, GlobalAveragePool;
* Relu, LeakyRelu, Clip, Sigmoid, Tanh;
* and the fused softmax cross-entropy loss with integer labels.

Rules take and return host arrays, as the forward kernels do (on host-unified-memory devices the
buffers wrap them). ``register`` adds them to a training table; an op without a rule here, or a node a
rule's ``supports`` refuses, keeps its numpy rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.base import InputInfos, KernelTable
from hetflow.devices.opencl.kernels.common import float32_reason, i32, source
from hetflow.devices.opencl.kernels.gemm import GemmLayout, launch_packed, pack_a, run_gemm
from hetflow.graph import Node
from hetflow.ops.base import reduce_to_shape, wants
from hetflow.ops.conv import conv_window
from hetflow.ops.loss import LossResult
from hetflow.ops.loss import softmax_cross_entropy as host_softmax_cross_entropy
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import AxisGeometry, Geometry, geometry

if TYPE_CHECKING:
    from hetflow.devices.opencl import DeviceArray, OpenCLDevice

SOURCE = source("backward.cl")

Arrays = Sequence[np.ndarray | None]
Grads = list[np.ndarray | None]
#: ``rule(node, inputs, outputs, grad_outputs, wanted)``, as ``OpDef.backward`` is called.
BackwardFn = Callable[[Node, Arrays, Arrays, Arrays, Sequence[bool] | None], Grads]

#: Work-items a launch should give each compute unit before the weight gradient's reduction is split
#: (CPU devices run one work-group per thread; GPUs need many resident work-items per unit).
ITEMS_PER_UNIT_CPU = 8
ITEMS_PER_UNIT_GPU = 256
#: The shortest reduction a split of the weight gradient keeps: shorter ones cost more in partial
#: products to add up than their parallelism gains.
MIN_SPLIT_REDUCTION = 4096


# -- geometry --------------------------------------------------------------------------------------------
_TRIVIAL_AXIS = AxisGeometry(size=1, out=1, pad_begin=0, pad_end=0, overhang=0, kernel=1, stride=1, dilation=1)


@dataclass(frozen=True)
class Window2d:
    """A 1-D or 2-D window geometry as the 2-D kernels take it (a 1-D one over a height of 1)."""

    height: AxisGeometry
    width: AxisGeometry

    @classmethod
    def of(cls, geom: Geometry) -> Window2d:
        axes = geom.axes
        assert len(axes) in (1, 2), "supports() admits 1-D and 2-D windows only"
        return cls(*axes) if len(axes) == 2 else cls(_TRIVIAL_AXIS, axes[0])

    @property
    def positions(self) -> int:
        return self.height.out * self.width.out

    @property
    def taps(self) -> int:
        return self.height.kernel * self.width.kernel

    @property
    def conv_args(self) -> tuple[np.int32, ...]:
        """KH, KW, OH, OW, SH, SW, PH, PW, DH, DW."""
        h, w = self.height, self.width
        return i32(h.kernel, w.kernel, h.out, w.out, h.stride, w.stride, h.pad_begin, w.pad_begin,
                   h.dilation, w.dilation)  # fmt: skip

    @property
    def pool_args(self) -> tuple[np.int32, ...]:
        """H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW."""
        h, w = self.height, self.width
        return i32(h.size, w.size, h.out, w.out, h.kernel, w.kernel, h.stride, w.stride,
                   h.pad_begin, w.pad_begin, h.dilation, w.dilation)  # fmt: skip


# -- supports --------------------------------------------------------------------------------------------
def _rank_reason(node: Node, inputs: InputInfos, ranks: tuple[int, ...], index: int = 0) -> str | None:
    if inputs is None or index >= len(inputs) or inputs[index] is None:
        return f"OpenCL {node.op_type} backward needs the rank of input {index}"
    rank = len(inputs[index].shape)  # type: ignore[union-attr]
    if rank not in ranks:
        return f"OpenCL {node.op_type} backward runs ranks {ranks} only, got rank {rank}"
    return None


def _supports_conv(node: Node, inputs: InputInfos) -> str | None:
    if node.attrs.fused is not None:
        return "a fused activation has no backward rule"
    return float32_reason(node, inputs, (0, 1)) or _rank_reason(node, inputs, (3, 4))


def _supports_window(node: Node, inputs: InputInfos) -> str | None:
    return float32_reason(node, inputs, (0,)) or _rank_reason(node, inputs, (3, 4))


def _supports_global(node: Node, inputs: InputInfos) -> str | None:
    return float32_reason(node, inputs, (0,)) or _rank_reason(node, inputs, tuple(range(3, 9)))


def _supports_gemm(node: Node, inputs: InputInfos) -> str | None:
    if node.attrs.fused is not None:
        return "a fused activation has no backward rule"
    return float32_reason(node, inputs)


def _supports_matmul(node: Node, inputs: InputInfos) -> str | None:
    reason = float32_reason(node, inputs)
    if reason is None:
        # NOTE: 1-D operands (vector products) are rare in trained graphs; their numpy rule stays.
        reason = _rank_reason(node, inputs, tuple(range(2, 9)), 0)
        reason = reason or _rank_reason(node, inputs, tuple(range(2, 9)), 1)
    return reason


def _supports_activation(node: Node, inputs: InputInfos) -> str | None:
    return float32_reason(node, inputs)


# -- shared launches -------------------------------------------------------------------------------------
# NOTE: every uploaded operand is held in a local until the launcher's last to_host has waited for the
# queue: on unified memory a buffer wraps host memory that must outlive the kernels reading it.
def _contiguous(device: OpenCLDevice, array: np.ndarray) -> DeviceArray:
    return device.to_device(np.ascontiguousarray(array, np.float32))


def _recycle(device: OpenCLDevice, *scratch: DeviceArray) -> None:
    """Give scratch buffers (panels, partial sums) back to the device's pool once the queue has been
    waited on, so the next step's backward pass reuses them instead of allocating."""
    for array in scratch:
        device.release(array)


def channel_sums(device: OpenCLDevice, dy: DeviceArray, batch: int, channels: int, positions: int) -> np.ndarray:
    """``dy [N, C, P]`` summed over images and positions: ``[C]`` (a Conv's bias gradient)."""
    planes = device.empty((batch * channels,))
    device.enqueue(device.kernel("row_sums", SOURCE), (batch * channels,), None,
                   (dy.buffer, planes.buffer, np.int32(positions)))  # fmt: skip
    sums = _column_sums(device, planes, batch, channels, 1.0)
    _recycle(device, planes)
    return sums


def _column_sums(device: OpenCLDevice, matrix: DeviceArray, rows: int, cols: int, scale: float) -> np.ndarray:
    out = device.empty((cols,))
    device.enqueue(device.kernel("column_sums", SOURCE), (cols,), None,
                   (matrix.buffer, out.buffer, *i32(rows, cols), np.float32(scale)))  # fmt: skip
    return device.to_host(out)


def _parallel_target(device: OpenCLDevice) -> int:
    """Work-items one launch needs to keep ``device`` busy."""
    import pyopencl as cl

    per_unit = ITEMS_PER_UNIT_CPU if device.device.type & cl.device_type.CPU else ITEMS_PER_UNIT_GPU
    return per_unit * int(device.device.max_compute_units)


# -- Conv ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ConvShape:
    """A Conv's sizes: N, C, K, groups and the 2-D window."""

    n: int
    c: int
    k: int
    group: int
    window: Window2d

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def kg(self) -> int:
        return self.k // self.group

    @property
    def rows(self) -> int:
        """Length of one kernel's flattened weights: ``C/G * taps``."""
        return self.cg * self.window.taps


def _weight_splits(device: OpenCLDevice, conv: _ConvShape) -> int:
    """Into how many image chunks the weight gradient's reduction is split (1: none)."""
    positions = conv.window.positions
    config = device.gemm_config(conv.kg, conv.rows, conv.n * positions, conv.group)
    layout = GemmLayout.of(config, conv.kg, conv.rows, conv.n * positions)
    items = conv.group * (layout.mp // config.rm) * (layout.np_ // (config.rn * config.vw))
    wanted = -(-_parallel_target(device) // max(items, 1))
    longest = max(1, conv.n * positions // MIN_SPLIT_REDUCTION)
    return max(1, min(wanted, longest, conv.n))


def conv_weight_grad(device: OpenCLDevice, conv: _ConvShape, x: np.ndarray, dy: DeviceArray) -> np.ndarray:
    """dW ``[G, K/G, C/G * taps]``: one batched GEMM over (group, image chunk), then the chunks added."""
    splits = _weight_splits(device, conv)
    per_split = -(-conv.n // splits)
    splits = -(-conv.n // per_split)  # no empty chunk
    reduction = per_split * conv.window.positions
    batch = conv.group * splits
    config = device.gemm_config(conv.kg, conv.rows, reduction, batch)
    layout = GemmLayout.of(config, conv.kg, conv.rows, reduction)
    x_buf = _contiguous(device, x)
    a_panels = device.empty((batch * layout.a_elements,))
    b_panels = device.empty((batch * layout.b_elements,))
    win = conv.window
    device.enqueue(
        device.kernel("conv_dw_pack_dy", SOURCE), (layout.mp, layout.kp, batch), None,
        (dy.buffer, a_panels.buffer, *i32(conv.n, conv.k, win.positions, conv.kg, splits, per_split,
                                           layout.mp, layout.kp, layout.a_width)),
    )  # fmt: skip
    device.enqueue(
        device.kernel("conv_dw_pack_cols", SOURCE), (layout.np_, layout.kp, batch), None,
        (x_buf.buffer, b_panels.buffer,
         *i32(conv.n, conv.c, win.height.size, win.width.size, conv.cg), *win.conv_args,
         *i32(splits, per_split, conv.rows, layout.np_, layout.kp, layout.b_width)),
    )  # fmt: skip
    launch = launch_packed(device, config, layout, batch, a_panels, b_panels, a_mod=batch, b_mod=batch)
    launch.enqueue()
    if splits == 1:
        dw = launch.result()
        _recycle(device, a_panels, b_panels)
        return dw
    out = device.empty((conv.group, conv.kg, conv.rows))
    elements = conv.kg * conv.rows
    device.enqueue(device.kernel("split_sums", SOURCE), (elements, conv.group), None,
                   (launch.out.buffer, out.buffer, *i32(splits, elements)))  # fmt: skip
    dw = device.to_host(out)
    _recycle(device, a_panels, b_panels, launch.out)
    return dw


def conv_input_grad(device: OpenCLDevice, conv: _ConvShape, w: np.ndarray, dy: DeviceArray) -> np.ndarray:
    """dX ``[N, C, H, W]``: the columns ``W[g]^T . dY[n, g]`` of every (image, group) in one batched GEMM,
    then col2im gathers each input element's taps."""
    win = conv.window
    batch = conv.n * conv.group
    config = device.gemm_config(conv.rows, win.positions, conv.kg, batch)
    layout = GemmLayout.of(config, conv.rows, win.positions, conv.kg)
    # NOTE: the weights change every step, so W^T is packed on the host each time (it is small).
    transposed = np.asarray(w, np.float32).reshape(conv.group, conv.kg, conv.rows).transpose(0, 2, 1)
    a_panels = device.to_device(pack_a(transposed, layout))
    b_panels = device.empty((batch * layout.b_elements,))
    device.enqueue(
        device.kernel("conv_dx_pack_dy", SOURCE), (layout.np_, layout.kp, batch), None,
        (dy.buffer, b_panels.buffer,
         *i32(conv.k, win.positions, conv.group, conv.kg, layout.np_, layout.kp, layout.b_width)),
    )  # fmt: skip
    launch = launch_packed(device, config, layout, batch, a_panels, b_panels, a_mod=conv.group, b_mod=batch)
    launch.enqueue()
    dx = device.empty((conv.n, conv.c, win.height.size, win.width.size))
    device.enqueue(
        device.kernel("conv_col2im", SOURCE), (win.width.size, win.height.size, conv.n * conv.c), None,
        (launch.out.buffer, dx.buffer,
         *i32(conv.c, win.height.size, win.width.size, conv.group, conv.cg), *win.conv_args),
    )  # fmt: skip
    result = device.to_host(dx)
    _recycle(device, b_panels, launch.out)
    return result


def conv_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """dX, dW and dB of ``Y = W * X + B`` (see ``hetflow.ops.conv.Conv.backward``)."""
    x, w = inputs[0], inputs[1]
    dy = grad_outputs[0]
    assert x is not None and w is not None
    grads: Grads = [None] * len(inputs)
    if node.attrs.fused is not None:
        raise ValueError(f"Conv '{node.name}' has a fused activation; train the unoptimised graph")
    if dy is None:
        return grads
    window = Window2d.of(geometry(conv_window(node.attrs, w.shape), x.shape[2:]))
    conv = _ConvShape(int(x.shape[0]), int(x.shape[1]), int(w.shape[0]), int(node.attrs.group), window)
    dy_buf = _contiguous(device, dy)
    if len(inputs) > 2 and inputs[2] is not None and wants(wanted, 2):
        grads[2] = channel_sums(device, dy_buf, conv.n, conv.k, window.positions)
    if wants(wanted, 1):
        grads[1] = conv_weight_grad(device, conv, x, dy_buf).reshape(w.shape)
    if wants(wanted, 0):
        grads[0] = conv_input_grad(device, conv, w, dy_buf).reshape(x.shape)
    return grads


# -- Gemm and MatMul -------------------------------------------------------------------------------------
def _product(device: OpenCLDevice, a: np.ndarray, b: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """``alpha * a @ b`` of two matrices on the device (transposed views are packed as they are)."""
    return run_gemm(device, a[None], b[None], alpha=alpha)[0]


def _bias_grad(device: OpenCLDevice, dy: np.ndarray, shape: tuple[int, ...], beta: float) -> np.ndarray:
    """``beta * dY`` summed to the bias's broadcast shape: a column reduction for the usual ``[N]``."""
    if shape in ((dy.shape[1],), (1, dy.shape[1])):
        sums = _column_sums(device, _contiguous(device, dy), dy.shape[0], dy.shape[1], beta)
        return sums.reshape(shape)
    return reduce_to_shape(dy * beta, shape).astype(np.float32, copy=False)


def gemm_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """``dA' = alpha dY B'^T``, ``dB' = alpha A'^T dY`` (in the operands' own layouts) and
    ``dC = beta dY`` reduced to C's shape (see ``hetflow.ops.gemm.Gemm.backward``)."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    dy = grad_outputs[0]
    assert a is not None and b is not None
    attrs = node.attrs
    if attrs.fused is not None:
        raise ValueError(f"Gemm '{node.name}' has a fused activation; train the unoptimised graph")
    grads: Grads = [None] * len(inputs)
    if dy is None:
        return grads
    a2 = a.T if attrs.transA else a
    b2 = b.T if attrs.transB else b
    if wants(wanted, 0):
        grads[0] = _product(device, b2, dy.T, attrs.alpha) if attrs.transA else _product(device, dy, b2.T, attrs.alpha)
    if wants(wanted, 1):
        grads[1] = _product(device, dy.T, a2, attrs.alpha) if attrs.transB else _product(device, a2.T, dy, attrs.alpha)
    if c is not None and wants(wanted, 2):
        grads[2] = _bias_grad(device, dy, tuple(c.shape), attrs.beta)
    return grads


def matmul_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """``dA = dY B^T``, ``dB = A^T dY`` for operands of rank >= 2, summed over broadcast batch axes."""
    a, b = inputs[0], inputs[1]
    dy = grad_outputs[0]
    assert a is not None and b is not None
    grads: Grads = [None, None]
    if dy is None:
        return grads
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.ndim == 2:
        # A stack times one matrix is one tall product each way.
        rows, dy_rows = a.reshape(-1, k), dy.reshape(-1, n)
        if wants(wanted, 0):
            grads[0] = _product(device, dy_rows, b.T).reshape(a.shape)
        if wants(wanted, 1):
            grads[1] = _product(device, rows.T, dy_rows)
        return grads
    batch_shape = dy.shape[:-2]
    dy3 = dy.reshape(-1, m, n)
    if wants(wanted, 0):
        b3 = np.broadcast_to(b, (*batch_shape, k, n)).reshape(-1, k, n)
        da = run_gemm(device, dy3, b3.transpose(0, 2, 1)).reshape(*batch_shape, m, k)
        grads[0] = reduce_to_shape(da, a.shape).astype(np.float32, copy=False)
    if wants(wanted, 1):
        a3 = np.broadcast_to(a, (*batch_shape, m, k)).reshape(-1, m, k)
        db = run_gemm(device, a3.transpose(0, 2, 1), dy3).reshape(*batch_shape, k, n)
        grads[1] = reduce_to_shape(db, b.shape).astype(np.float32, copy=False)
    return grads


# -- pooling ---------------------------------------------------------------------------------------------
def maxpool_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """dY to the first maximum of each window, found again from X (see ``MaxPool.backward``)."""
    x, dy = inputs[0], grad_outputs[0]
    assert x is not None
    if dy is None or not wants(wanted, 0):
        return [None]
    win = Window2d.of(geometry(pool_window(node.attrs), x.shape[2:]))
    planes = int(x.shape[0] * x.shape[1])
    x_buf, dy_buf = _contiguous(device, x), _contiguous(device, dy)
    winners = device.empty((planes, win.positions), np.int32)
    device.enqueue(device.kernel("maxpool_winners", SOURCE), (win.width.out, win.height.out, planes), None,
                   (x_buf.buffer, winners.buffer, *win.pool_args))  # fmt: skip
    dx = device.empty(tuple(x.shape))
    device.enqueue(device.kernel("maxpool_scatter", SOURCE), (win.width.size, win.height.size, planes), None,
                   (dy_buf.buffer, winners.buffer, dx.buffer, *win.pool_args))  # fmt: skip
    result = device.to_host(dx)
    _recycle(device, winners)
    return [result]


def avgpool_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """Each window's dY over its divisor, spread over its taps (see ``AveragePool.backward``)."""
    x, dy = inputs[0], grad_outputs[0]
    assert x is not None
    if dy is None or not wants(wanted, 0):
        return [None]
    win = Window2d.of(geometry(pool_window(node.attrs), x.shape[2:]))
    planes = int(x.shape[0] * x.shape[1])
    dy_buf = _contiguous(device, dy)
    dx = device.empty(tuple(x.shape))
    include_pad = int(node.attrs.count_include_pad)
    device.enqueue(
        device.kernel("avgpool_scatter", SOURCE), (win.width.size, win.height.size, planes), None,
        (dy_buf.buffer, dx.buffer, *win.pool_args, *i32(win.height.pad_end, win.width.pad_end, include_pad)),
    )  # fmt: skip
    return [device.to_host(dx)]


def global_avgpool_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """dY over the number of positions, spread over every position of its plane."""
    x, dy = inputs[0], grad_outputs[0]
    assert x is not None
    if dy is None or not wants(wanted, 0):
        return [None]
    positions = int(np.prod(x.shape[2:], dtype=np.int64))
    dx = device.empty(tuple(x.shape))
    if dx.nbytes:
        dy_buf = _contiguous(device, dy)
        device.enqueue(device.kernel("spread_planes", SOURCE), (int(np.prod(x.shape)),), None,
                       (dy_buf.buffer, dx.buffer, np.int32(positions), np.float32(positions)))  # fmt: skip
    return [device.to_host(dx)]


# -- activations -----------------------------------------------------------------------------------------
#: op type -> (kernel, whether the rule reads the output Y rather than the input X).
ACTIVATION_GRADS = {
    "Relu": ("relu_grad", False),
    "LeakyRelu": ("leaky_relu_grad", False),
    "Clip": ("clip_grad", False),
    "Sigmoid": ("sigmoid_grad", True),
    "Tanh": ("tanh_grad", True),
}


def _activation_params(node: Node, inputs: Arrays) -> tuple[float, float]:
    """The kernels' ``p0``, ``p1``: LeakyRelu's slope, Clip's bounds (infinite when omitted)."""
    if node.op_type == "LeakyRelu":
        return float(node.attrs.alpha), 0.0
    if node.op_type == "Clip":
        low = inputs[1] if len(inputs) > 1 else None
        high = inputs[2] if len(inputs) > 2 else None
        return (
            float(np.asarray(low).reshape(())) if low is not None else -np.inf,
            float(np.asarray(high).reshape(())) if high is not None else np.inf,
        )
    return 0.0, 0.0


def activation_backward(
    device: OpenCLDevice, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays,
    wanted: Sequence[bool] | None = None,
) -> Grads:  # fmt: skip
    """dX of an elementwise activation from dY and X (or Y), one work-item per element."""
    dy = grad_outputs[0]
    grads: Grads = [None] * len(inputs)
    if dy is None or not wants(wanted, 0):
        return grads
    name, reads_output = ACTIVATION_GRADS[node.op_type]
    value = outputs[0] if reads_output else inputs[0]
    assert value is not None
    dx = device.empty(tuple(dy.shape))
    if dx.nbytes:
        p0, p1 = _activation_params(node, inputs)
        value_buf, dy_buf = _contiguous(device, value), _contiguous(device, dy)
        device.enqueue(device.kernel(name, SOURCE), (int(dy.size),), None,
                       (value_buf.buffer, dy_buf.buffer, dx.buffer, np.float32(p0), np.float32(p1)))  # fmt: skip
    grads[0] = device.to_host(dx)
    return grads


# -- loss ------------------------------------------------------------------------------------------------
def softmax_cross_entropy(device: OpenCLDevice, logits: np.ndarray, targets: np.ndarray) -> LossResult:
    """``hetflow.ops.loss.softmax_cross_entropy`` on the device for float32 logits ``[N, K]`` (or
    ``[N, K, 1, ...]``) and integer labels; target probabilities and other dtypes take the numpy loss."""
    flat_ok = logits.ndim == 2 or (logits.ndim > 2 and all(d == 1 for d in logits.shape[2:]))
    if logits.dtype != np.float32 or targets.ndim != 1 or not flat_ok or logits.size == 0:
        return host_softmax_cross_entropy(logits, targets)
    batch, classes = int(logits.shape[0]), int(logits.shape[1])
    labels = targets.astype(np.int64, copy=False)
    if labels.min(initial=0) < 0 or labels.max(initial=0) >= classes:
        raise ValueError(f"class labels must lie in [0, {classes}); got {labels.min()}..{labels.max()}")
    loss = device.empty((batch,))
    grad = device.empty((batch, classes))
    logits_buf = _contiguous(device, logits)
    labels_buf = device.to_device(labels.astype(np.int32))
    device.enqueue(
        device.kernel("softmax_xent", SOURCE), (batch,), None,
        (logits_buf.buffer, labels_buf.buffer, loss.buffer, grad.buffer, np.int32(classes), np.float32(batch)),
    )  # fmt: skip
    value = float(device.to_host(loss).mean())
    return LossResult(value, device.to_host(grad).reshape(logits.shape))


# -- registration ----------------------------------------------------------------------------------------
#: op types -> (rule, supports), in the order they are registered.
RULES: list[tuple[tuple[str, ...], Callable[..., Grads], Callable[[Node, InputInfos], str | None]]] = [
    (("Conv",), conv_backward, _supports_conv),
    (("Gemm",), gemm_backward, _supports_gemm),
    (("MatMul",), matmul_backward, _supports_matmul),
    (("MaxPool",), maxpool_backward, _supports_window),
    (("AveragePool",), avgpool_backward, _supports_window),
    (("GlobalAveragePool",), global_avgpool_backward, _supports_global),
    (tuple(ACTIVATION_GRADS), activation_backward, _supports_activation),
]


def register(device: OpenCLDevice, table: KernelTable, losses: dict[str, Any]) -> None:
    """Add every backward rule above to ``table`` (bound to ``device``) and the loss to ``losses``."""
    for op_types, rule, supports in RULES:
        table.register(*op_types, supports=supports)(functools.partial(rule, device))
    losses["cross_entropy"] = functools.partial(softmax_cross_entropy, device)
