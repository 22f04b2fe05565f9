"""CPU kernels: reductions (numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.reduce import resolve_axes


@cpu_kernel("ReduceMean")
def reduce_mean(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Mean over ``axes``; float types accumulate in at least float32, integer types in 64 bits.

    Integer means truncate toward zero (as ONNX Runtime's integer division does). A mean over zero
    elements is NaN for float types and 0 for integer ones.
    """
    data = inputs[0]
    assert data is not None
    axes_input = inputs[1] if len(inputs) > 1 else None
    axes = resolve_axes(data.ndim, axes_input, node.attrs.noop_with_empty_axes)
    if axes is None:
        return [data.copy()]
    keepdims = bool(node.attrs.keepdims)
    count = int(np.prod([data.shape[a] for a in axes], dtype=np.int64))
    if data.dtype.kind == "f":
        accumulator = np.float32 if data.dtype.itemsize < 4 else data.dtype
        total = np.asarray(np.sum(data, axis=axes, keepdims=keepdims, dtype=accumulator))
        with np.errstate(invalid="ignore", divide="ignore"):
            total /= total.dtype.type(count)
        return [total.astype(data.dtype, copy=False)]
    accumulator = np.uint64 if data.dtype.kind == "u" else np.int64
    total = np.asarray(np.sum(data, axis=axes, keepdims=keepdims, dtype=accumulator))
    return [np.asarray(_divide_toward_zero(total, count), dtype=data.dtype)]


def _divide_toward_zero(total: np.ndarray, count: int) -> np.ndarray:
    """Exact integer ``total / count`` rounded toward zero (numpy's ``//`` floors)."""
    if count == 0:
        return np.zeros_like(total)
    quotient = total // count
    if total.dtype.kind == "i":
        quotient += ((total % count) != 0) & (total < 0)
    return quotient
