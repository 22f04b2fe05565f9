"""OpenCL kernels: each launcher module sits beside its ``.cl`` source and registers into a device's
kernel table (kernels are bound to one device's context and queue, so each device has its own table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice
    from hetflow.train.device import TrainingKernels


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


def register_training(device: OpenCLDevice, kernels: TrainingKernels) -> None:
    """Register the OpenCL backward rules, loss and optimizer updates into ``kernels`` (a trainer's
    table for ``device``; see ``hetflow.train.device``)."""
    from hetflow.devices.opencl import aligned_empty
    from hetflow.devices.opencl.kernels import backward, optim

    backward.register(device, kernels.backward, kernels.losses)
    optim.register(device, kernels.updates)
    # NOTE: parameters and optimizer state in aligned memory are wrapped in place on host-unified-memory
    # devices, so an update writes them without a copy (see optim.py).
    kernels.host_empty = aligned_empty
