"""OpenCL MaxPool, AveragePool (2-D windows: kernel, strides, pads, dilations, ceil_mode,
count_include_pad) and GlobalAveragePool / GlobalMaxPool on NCHW float32 (``pool.cl``).

The window geometry (output sizes, padding, ceil_mode's overhang) comes from ``hetflow.ops.spatial``,
the same code the CPU kernels and shape inference use. MaxPool's optional Indices output stays on the
CPU. X may be a host or a device tensor; Y comes back the same way (``common.result``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    device_inputs,
    float32_reason,
    i32,
    on_device,
    result,
    source,
)
from hetflow.graph import Node
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import geometry

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("pool.cl")


def _supports_window(node: Node, inputs: InputInfos) -> str | None:
    if len(node.attrs.kernel_shape) not in (1, 2):
        return f"OpenCL {node.op_type} runs 1-D and 2-D windows only, got {len(node.attrs.kernel_shape)}-D"
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        return "OpenCL MaxPool does not compute Indices"
    return float32_reason(node, inputs)


def _supports_global(node: Node, inputs: InputInfos) -> str | None:
    if inputs is not None and inputs[0] is not None and len(inputs[0].shape) < 3:
        return f"OpenCL {node.op_type} needs [N, C, ...], got rank {len(inputs[0].shape)}"
    return float32_reason(node, inputs)


def run_pool(device: OpenCLDevice, node: Node, x: Tensor) -> Tensor:
    """A MaxPool or AveragePool node on ``x`` ``[N, C, H, W]`` (or ``[N, C, W]``)."""
    spec = pool_window(node.attrs)
    geo = geometry(spec, x.shape[2:])
    axes = geo.axes if len(geo.axes) == 2 else (None, geo.axes[0])
    height = axes[0]
    width = axes[1]
    assert width is not None
    h, oh, kh, sh, ph, dh, peh = (
        (1, 1, 1, 1, 0, 1, 0) if height is None
        else (height.size, height.out, height.kernel, height.stride, height.pad_begin, height.dilation,
              height.pad_end)
    )  # fmt: skip
    is_max = node.op_type == "MaxPool"
    include_pad = 0 if is_max else int(node.attrs.count_include_pad)
    kernel = device.kernel("pool2d", SOURCE, (f"-DMAX={int(is_max)}",))
    x_buf = on_device(device, x)
    planes = x.shape[0] * x.shape[1]
    y = device.empty((*x.shape[:2], *geo.out))
    args = (
        x_buf.buffer, y.buffer,
        *i32(h, width.size, oh, width.out, kh, width.kernel, sh, width.stride, ph, width.pad_begin,
             dh, width.dilation, peh, width.pad_end, include_pad),
    )  # fmt: skip
    device.enqueue(kernel, (width.out, oh, planes), None, args)
    return result(device, y, x)


def run_global_pool(device: OpenCLDevice, x: Tensor, is_max: bool) -> Tensor:
    """Mean (or maximum) over the spatial axes of ``x`` ``[N, C, ...]``, keeping them as 1s."""
    planes = x.shape[0] * x.shape[1]
    positions = int(np.prod(x.shape[2:], dtype=np.int64))
    kernel = device.kernel("global_pool", SOURCE, (f"-DMAX={int(is_max)}",))
    x_buf = on_device(device, x)
    y = device.empty((*x.shape[:2], *(1,) * (x.ndim - 2)))
    device.enqueue(kernel, (planes,), None, (x_buf.buffer, y.buffer, np.int32(positions)))
    return result(device, y, x)


def register(device: OpenCLDevice) -> None:
    """Add the pooling ops to ``device``'s kernel table."""

    @device.kernels.register("MaxPool", "AveragePool", supports=_supports_window)
    @device_inputs((0,))
    def pool(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor | None]:
        """Windowed pooling, one work-item per output element."""
        x = inputs[0]
        assert x is not None
        y = run_pool(device, node, x)
        return [y, None] if len(node.outputs) > 1 else [y]

    @device.kernels.register("GlobalAveragePool", "GlobalMaxPool", supports=_supports_global)
    @device_inputs((0,))
    def global_pool(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Global pooling, one work-item per (image, channel)."""
        x = inputs[0]
        assert x is not None
        return [run_global_pool(device, x, node.op_type == "GlobalMaxPool")]
