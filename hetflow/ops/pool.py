"""Pooling: MaxPool, AveragePool (windowed, N-d) and GlobalAveragePool, GlobalMaxPool."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import format_shape, is_static
from hetflow.ops.attrs import required
from hetflow.ops.base import (
    Arrays,
    Cost,
    Grads,
    OpDef,
    TensorInfo,
    Wanted,
    nbytes,
    numel,
    present_outputs_bytes,
    wants,
)
from hetflow.ops.registry import register_op
from hetflow.ops.spatial import Geometry, WindowSpec, geometry, output_dims, window_spec


@dataclass(frozen=True)
class MaxPoolAttrs:
    """MaxPool's attributes (opset 22). Empty tuples mean "not given" (ONNX computes the default)."""

    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    dilations: tuple[int, ...] = ()
    kernel_shape: tuple[int, ...] = required()
    pads: tuple[int, ...] = ()
    storage_order: int = 0
    strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class AveragePoolAttrs:
    """AveragePool's attributes (opset 22). Empty tuples mean "not given"."""

    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    count_include_pad: int = 0
    dilations: tuple[int, ...] = ()
    kernel_shape: tuple[int, ...] = required()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()


@functools.lru_cache(maxsize=4096)
def pool_window(attrs: MaxPoolAttrs | AveragePoolAttrs) -> WindowSpec:
    """The resolved window of a MaxPool / AveragePool node (used by definitions and kernels)."""
    return window_spec(attrs, attrs.kernel_shape, ceil_mode=bool(attrs.ceil_mode))


def _check_input(x: TensorInfo, dtypes: str) -> None:
    if len(x.shape) < 3:
        raise ValueError(f"X must be [N, C, D1, ...]; got {format_shape(x.shape)}")
    if x.dtype.kind not in dtypes:
        raise ValueError(f"dtype {x.dtype} is not supported")


class WindowPool(OpDef):
    """Family base: pooling over sliding windows; Y is ``[N, C, *out]`` with out from the window."""

    #: numpy dtype kinds the op accepts.
    dtype_kinds: ClassVar[str] = "f"

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        _check_input(x, self.dtype_kinds)
        spec = pool_window(node.attrs)
        if spec.rank != len(x.shape) - 2:
            raise ValueError(
                f"kernel_shape {spec.kernel} has {spec.rank} axes; X has {len(x.shape) - 2} spatial axes"
            )
        shape = (x.shape[0], x.shape[1], *output_dims(spec, x.shape[2:]))
        return [TensorInfo(shape, x.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """One comparison (max) or addition (average) per window tap and output element."""
        taps = pool_window(node.attrs).taps
        return Cost(
            flops=numel(outputs[0]) * taps,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
        )


def _scatter_taps(geom: Geometry, x_shape: Sequence[int], per_tap, dtype: np.dtype) -> np.ndarray:
    """Sum, over the window taps, ``per_tap(index, tap)`` (an ``[N, C, *out]`` array) into the padded
    input at the slice that tap read, and crop the padding: the adjoint of reading windows."""
    padded = np.zeros(tuple(x_shape[:2]) + tuple(a.padded for a in geom.axes), dtype)
    for index, tap in enumerate(geom.taps()):
        padded[(slice(None), slice(None), *geom.tap_slices(tap))] += per_tap(index, tap)
    interior = tuple(slice(a.pad_begin, a.pad_begin + a.size) for a in geom.axes)
    return padded[(slice(None), slice(None), *interior)]


def has_indices(node: Node) -> bool:
    """Whether a MaxPool node has its optional Indices output."""
    return len(node.outputs) > 1 and bool(node.outputs[1])


@register_op
class MaxPool(WindowPool):
    """Maximum over each window; padding never wins. N-d (1-D, 2-D, 3-D...).

    The optional second output, Indices (int64, same shape as Y), holds the flat index of each maximum
    in X ignoring padding: ``(n * C + c) * prod(D) + offset`` where offset is the row-major spatial
    offset, or the column-major one with ``storage_order=1``. Ties go to the first tap in row-major order.
    """

    op_type = "MaxPool"
    Attrs = MaxPoolAttrs
    num_outputs = (1, 2)
    dtype_kinds = "fiu"

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        if node.attrs.storage_order not in (0, 1):
            raise ValueError(f"storage_order must be 0 or 1; got {node.attrs.storage_order}")
        (y,) = super().infer(node, inputs, consts)
        return [y, TensorInfo(y.shape, np.dtype(np.int64))]

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """X; and the Indices when the node has them (the CPU's rule scatters dY by them instead of
        finding the winners again: ``hetflow.devices.cpu.training``; this rule ignores them)."""
        return (0,), ((1,) if has_indices(node) else ())

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY goes to the first maximum of each window (row-major tap order, as the forward picks it),
        found again from X through the windows view: one vectorised pass per tap."""
        x, dy = inputs[0], grad_outputs[0]
        assert x is not None
        if dy is None or not wants(wanted, 0):
            return [None]
        geom = geometry(pool_window(node.attrs), x.shape[2:])
        lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        windows = geom.windows(geom.pad(x, lowest))
        taps = int(np.prod(geom.kernel, dtype=np.int64))
        winner = windows.reshape(*x.shape[:2], taps, *geom.out).argmax(axis=2)
        dx = _scatter_taps(geom, x.shape, lambda index, tap: np.where(winner == index, dy, 0), dy.dtype)
        return [dx.astype(x.dtype, copy=False)]


@register_op
class AveragePool(WindowPool):
    """Mean over each window. N-d (1-D, 2-D, 3-D...).

    The divisor counts the taps on real input (``count_include_pad=0``) or on input and explicit/auto
    padding (``count_include_pad=1``); the extra overhang ``ceil_mode`` adds is never counted, and windows
    that would start in the end padding are dropped.
    """

    op_type = "AveragePool"
    Attrs = AveragePoolAttrs

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """Each window's dY divided by its divisor, spread over the window's taps (padding dropped)."""
        x, dy = inputs[0], grad_outputs[0]
        assert x is not None
        if dy is None or not wants(wanted, 0):
            return [None]
        geom = geometry(pool_window(node.attrs), x.shape[2:])
        share = dy / geom.window_counts(bool(node.attrs.count_include_pad))
        dx = _scatter_taps(geom, x.shape, lambda index, tap: share, dy.dtype)
        return [dx.astype(x.dtype, copy=False)]


class GlobalPool(OpDef):
    """Family base: reduce every spatial axis to 1; Y is ``[N, C, 1, ..., 1]``."""

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        _check_input(x, "f")
        return [TensorInfo((x.shape[0], x.shape[1], *(1,) * (len(x.shape) - 2)), x.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """One addition / comparison per input element."""
        x = inputs[0]
        return Cost(
            flops=numel(x) if x is not None and is_static(x.shape) else 0,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
        )


@register_op
class GlobalAveragePool(GlobalPool):
    """Mean over all spatial positions of each channel."""

    op_type = "GlobalAveragePool"

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        x, dy = inputs[0], grad_outputs[0]
        assert x is not None
        if dy is None or not wants(wanted, 0):
            return [None]
        positions = int(np.prod(x.shape[2:], dtype=np.int64))
        return [np.broadcast_to(dy / positions, x.shape).astype(x.dtype)]


@register_op
class GlobalMaxPool(GlobalPool):
    """Maximum over all spatial positions of each channel."""

    op_type = "GlobalMaxPool"

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (0,), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY goes to the first maximum of each channel."""
        x, dy = inputs[0], grad_outputs[0]
        assert x is not None
        if dy is None or not wants(wanted, 0):
            return [None]
        flat = x.reshape(*x.shape[:2], -1)
        dx = np.zeros(flat.shape, x.dtype)
        np.put_along_axis(dx, flat.argmax(axis=2)[..., None], dy.reshape(*x.shape[:2], 1), axis=2)
        return [dx.reshape(x.shape)]
