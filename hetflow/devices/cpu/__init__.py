"""The CPU device: numpy kernels, heavy ops through BLAS."""

from __future__ import annotations

import platform

import numpy as np

from hetflow.devices.base import Device, KernelTable
from hetflow.devices.cpu.compiled_cache import clear_stale_cpu_kernels

clear_stale_cpu_kernels()  # before any kernel is compiled or loaded from numba's cache

from hetflow.devices.cpu import kernels as _kernels  # noqa: E402, F401  (registers the kernels)
from hetflow.devices.cpu.table import CPU_KERNELS  # noqa: E402


class CPUDevice(Device):
    """The host processor. Always available; the planner's device of last resort."""

    id = "cpu"
    kind = "cpu"
    kernels: KernelTable = CPU_KERNELS

    def name(self) -> str:
        return platform.processor() or platform.machine() or "cpu"

    def fingerprint(self) -> dict[str, str]:
        return {
            "kind": "cpu",
            "machine": platform.machine(),
            "processor": _cpu_model_name(),
            "numpy": np.__version__,
        }


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
