"""CPU kernels: conv."""

from hetflow.devices.cpu.table import cpu_kernel  # noqa: F401
