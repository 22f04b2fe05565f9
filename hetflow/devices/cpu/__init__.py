"""The CPU device: numpy kernels, heavy ops through BLAS."""

from __future__ import annotations

import platform
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

import numpy as np

from hetflow.devices.base import BoundCall, Device, Kernel, KernelTable, aligned_inputs
from hetflow.devices.cpu.compiled_cache import clear_stale_cpu_kernels, kernel_cache_folder
from hetflow.devices.cpu.numba_footprint import cache_runtime, import_array_registry_without_scipy

clear_stale_cpu_kernels()  # before any kernel is compiled or loaded from numba's cache
# Both before numba's first dispatch, which loads its registries and its runtime.
import_array_registry_without_scipy()
cache_runtime(kernel_cache_folder())

from hetflow.devices.cpu import kernels as _kernels  # noqa: E402, F401  (registers the kernels)
from hetflow.devices.cpu.spin_pool import JobScript, replay_on  # noqa: E402
from hetflow.devices.cpu.table import CPU_KERNELS  # noqa: E402
from hetflow.devices.cpu.threads import replay_key, spinning  # noqa: E402
from hetflow.graph import Node  # noqa: E402
from hetflow_lite.package import processor_name  # noqa: E402


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
            "processor": processor_name(),
            "numpy": np.__version__,
        }


    def timed_call(
        self, kernel: Kernel, node: Node, inputs: Sequence[Any], outputs: Sequence[Any] | None = None,
        weights: Collection[int] = (),
    ) -> Callable[[], Sequence[Any]]:
        """``Device.timed_call``; a call that captures (``devices.base.CaptureFn``) is timed as a run
        replays it (``hetflow.runtime.replay``): its jobs run from compiled code, no Python around them."""
        inputs = aligned_inputs(inputs, weights)
        return replayed(kernel.steady_bound(node, inputs, outputs, weights), inputs)


def replayed(bound: BoundCall, inputs: Sequence[Any]) -> Callable[[], Sequence[Any]]:
    """``bound(inputs)`` as a captured run replays it where the calling thread arrangement replays runs
    (``threads.replay_key``), captured on the first call under each arrangement; else called as is.
    Returns the call's outputs either way."""
    capture = getattr(bound, "capture", None)
    captured: dict[Hashable, tuple[Sequence[Any], JobScript] | None] = {}

    def call() -> Sequence[Any]:
        key = replay_key() if capture is not None else None
        if key is None:
            return bound(inputs)
        if key not in captured:
            found = capture(inputs)  # type: ignore[misc]
            captured[key] = None if found is None else (found[0], JobScript(found[1]))
        replay = captured[key]
        if replay is None:
            return bound(inputs)
        replay_on(replay[1], spinning())
        return replay[0]

    return call
