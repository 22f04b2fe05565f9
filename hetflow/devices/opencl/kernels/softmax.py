"""OpenCL Softmax and LogSoftmax along any axis (or, for opset < 13 models, over the trailing axes
viewed as one): the input viewed as ``[outer, cols, inner]``, one work-item per row. X may be a host or
a device tensor; the result comes back the same way (``common.result``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import Tensor, device_inputs, on_device, result
from hetflow.graph import Node

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = Path(__file__).with_name("softmax.cl").read_text(encoding="utf-8")


def _supports(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None or inputs[0] is None:
        return None
    if inputs[0].dtype != np.float32:
        return f"OpenCL {node.op_type} runs float32 only, got {inputs[0].dtype}"
    return None


def softmax_view(shape: Sequence[int], axis: int, coerce_2d: bool) -> tuple[int, int, int]:
    """``(outer, cols, inner)``: the input viewed so that rows run along ``cols``."""
    rank = len(shape)
    if rank == 0:
        return 1, 1, 1
    axis = axis % rank
    if coerce_2d:
        return math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def run_softmax(device: OpenCLDevice, x: Tensor, view: tuple[int, int, int], log: bool = False) -> Tensor:
    """(Log)Softmax of ``x`` viewed as ``view`` = (outer, cols, inner) along cols; ``x``'s shape."""
    out = device.empty(tuple(x.shape))
    if x.size == 0:
        return result(device, out, x)
    outer, cols, inner = view
    rows = outer * inner
    kernel = device.kernel("softmax", SOURCE, (f"-DLOG={int(log)}",))
    x_buf = on_device(device, x)
    args = (np.int32(rows), np.int32(cols), np.int32(inner), x_buf.buffer, out.buffer)
    device.enqueue(kernel, (rows,), None, args)
    return result(device, out, x)


def register(device: OpenCLDevice) -> None:
    """Add Softmax and LogSoftmax to ``device``'s kernel table."""

    @device.kernels.register("Softmax", "LogSoftmax", supports=_supports)
    @device_inputs((0,))
    def softmax(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """(Log)Softmax, one work-item per row."""
        x = inputs[0]
        assert x is not None
        view = softmax_view(x.shape, node.attrs.axis, bool(node.attrs.coerce_2d))
        return [run_softmax(device, x, view, log=node.op_type == "LogSoftmax")]
