"""OpenCL kernels: each launcher module sits beside its ``.cl`` source and registers into a device's
kernel table (kernels are bound to one device's context and queue, so each device has its own table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice


def register_all(device: OpenCLDevice) -> None:
    """Register every OpenCL kernel family into ``device.kernels``."""
    from hetflow.devices.opencl.kernels import (
        conv,
        elementwise,
        gemm,
        lstm,
        norm,
        pool,
        softmax,
        tensor,
    )

    for module in (gemm, conv, elementwise, softmax, pool, norm, tensor, lstm):
        module.register(device)
