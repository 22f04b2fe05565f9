"""The CPU device's kernel table; kernel modules register into it."""

from hetflow.devices.base import KernelTable

CPU_KERNELS = KernelTable()
cpu_kernel = CPU_KERNELS.register
