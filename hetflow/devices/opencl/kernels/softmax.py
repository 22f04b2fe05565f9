"""OpenCL Softmax over the last axis (or, for opset < 13 models, over the trailing axes viewed as one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.graph import Node

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = Path(__file__).with_name("softmax.cl").read_text(encoding="utf-8")


def _supports(node: Node, inputs: InputInfos) -> str | None:
    axis, coerce_2d = node.attrs.axis, node.attrs.coerce_2d
    if inputs is None:
        return None if axis == -1 or coerce_2d else "OpenCL Softmax needs the input's rank to check axis"
    x = inputs[0]
    assert x is not None
    if x.dtype != np.float32:
        return f"OpenCL Softmax runs float32 only, got {x.dtype}"
    rank = len(x.shape)
    if not coerce_2d and axis % max(rank, 1) != rank - 1:
        return f"OpenCL Softmax normalises the last axis only, got axis {axis} of rank {rank}"
    return None


def run_softmax(device: OpenCLDevice, x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Softmax of ``x`` viewed as ``[rows, cols]`` along its columns; the result has ``x``'s shape."""
    x = np.asarray(x, np.float32)
    if x.size == 0:
        return np.empty(x.shape, np.float32)
    kernel = device.kernel("softmax", SOURCE)
    x_buf = device.to_device(x)
    out = device.empty(x.shape, np.float32)
    device.enqueue(kernel, (rows,), None, (np.int32(rows), np.int32(cols), x_buf.buffer, out.buffer))
    return device.to_host(out)


def register(device: OpenCLDevice) -> None:
    """Add Softmax to ``device``'s kernel table."""

    @device.kernels.register("Softmax", supports=_supports)
    def softmax(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Softmax, one work-item per row."""
        x = inputs[0]
        assert x is not None
        axis = node.attrs.axis % max(x.ndim, 1) if x.ndim else 0
        cols = int(np.prod(x.shape[axis:], dtype=np.int64)) if node.attrs.coerce_2d else x.shape[-1]
        rows = x.size // cols if cols else 0
        return [run_softmax(device, x, rows, cols)]
