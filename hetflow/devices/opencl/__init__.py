"""The OpenCL device: discovery, context and queue, buffers and transfers, program builds.

Every OpenCL device of every platform gets an index in discovery order (platforms as the ICD loader
lists them, devices in platform order): ``"opencl:0"``, ``"opencl:1"``... PoCL, installed from PyPI with
``pocl-binary-distribution``, gives a CPU device on any machine, so this backend is built and tested
without a GPU.

Kernels take and return numpy arrays for now (the executor hands every kernel host arrays): a launcher
copies its inputs in, runs, and copies the result out. Keeping values resident on the device between
consecutive OpenCL nodes needs the executor to pass ``DeviceArray`` values through; that comes next.
Weights (read-only initializers) and what kernels derive from them (packed GEMM panels, Winograd
transforms) do stay on the device, once per array (``resident.py``); the GEMM's configuration for
each product comes from the tuning cache by shape class (``tuning.py``), else the default.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.base import Device, KernelTable
from hetflow.devices.opencl.build import ProgramCache
from hetflow.errors import DeviceUnavailableError


@dataclass
class DeviceArray:
    """A tensor in an OpenCL buffer.

    Attributes:
        buffer: the ``pyopencl.Buffer``.
        shape: the tensor's shape.
        dtype: its numpy dtype.
        host: on host-unified-memory devices, the host array the buffer wraps (``USE_HOST_PTR``): reading
            the result back is a map, not a copy. None where the buffer lives in device memory.
    """

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    host: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass
class TransferStats:
    """Bytes moved between host and device, and bytes that were mapped instead of copied."""

    copied_in: int = 0
    copied_out: int = 0
    mapped: int = 0


#: Alignment of host memory wrapped by buffers (``USE_HOST_PTR``): kernels read it with aligned vector
#: loads (up to float16 = 64 bytes), and OpenCL asks for the device's base-address alignment (128 bytes
#: on PoCL); numpy only guarantees 16.
HOST_ALIGNMENT = 128


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a ``HOST_ALIGNMENT`` boundary."""
    dtype = np.dtype(dtype)
    nbytes = max(int(np.prod(shape, dtype=np.int64)), 1) * dtype.itemsize
    raw = np.empty(nbytes + HOST_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % HOST_ALIGNMENT
    flat = raw[start : start + nbytes].view(dtype)
    return flat[: int(np.prod(shape, dtype=np.int64))].reshape(shape)


def _wrappable(array: np.ndarray) -> np.ndarray:
    """``array`` itself when a buffer may wrap it (contiguous, writable, aligned, not empty), else an
    aligned copy."""
    ok = (
        array.flags.c_contiguous
        and array.flags.writeable
        and array.size > 0
        and array.ctypes.data % HOST_ALIGNMENT == 0
    )
    if ok:
        return array
    host = aligned_empty(array.shape if array.size else (1,), array.dtype)
    if array.size:
        host[...] = array
    return host


@functools.cache
def _discover() -> tuple[list[tuple[Any, Any]], str | None]:
    """Every (platform, device) pair in discovery order, and the reason when there is none."""
    try:
        import pyopencl as cl
    except ImportError as error:
        return [], f"pyopencl is not installed ({error}); pip install pyopencl pocl-binary-distribution"
    try:
        platforms = cl.get_platforms()
    except cl.Error as error:
        return [], f"no OpenCL platform found ({error})"
    pairs = []
    for platform in platforms:
        try:
            pairs.extend((platform, device) for device in platform.get_devices())
        except cl.Error:
            continue  # a platform with no devices (PoCL with no usable driver) is skipped
    if not pairs:
        names = ", ".join(p.name for p in platforms) or "none"
        return [], f"no OpenCL device found (platforms: {names})"
    return pairs, None


def device_count() -> int:
    """How many OpenCL devices this machine has (0 when OpenCL cannot start)."""
    return len(_discover()[0])


class OpenCLDevice(Device):
    """One OpenCL device with its own context, in-order queue, program cache and kernel table.

    Args:
        index: the device's position in discovery order (``"opencl:<index>"``).

    Raises:
        DeviceUnavailableError: there is no OpenCL platform, or no device with that index.
    """

    kind = "opencl"

    def __init__(self, index: int = 0):
        pairs, reason = _discover()
        if reason is not None:
            raise DeviceUnavailableError(f"device 'opencl:{index}': {reason}")
        if not 0 <= index < len(pairs):
            raise DeviceUnavailableError(
                f"device 'opencl:{index}' does not exist: this machine has {len(pairs)} OpenCL device(s) "
                f"(opencl:0 .. opencl:{len(pairs) - 1})"
            )
        import pyopencl as cl

        self.index = index
        self.id = f"opencl:{index}"
        self.platform, self.device = pairs[index]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context, self.device)
        self.programs = ProgramCache()
        self.transfers = TransferStats()
        self.unified_memory = bool(self.device.host_unified_memory)
        self._lock = threading.Lock()
        self._kernel_cache: dict[tuple[str, str, tuple[str, ...]], Any] = {}
        self.kernels = KernelTable()
        from hetflow.devices.opencl.kernels import register_all
        from hetflow.devices.opencl.resident import Resident
        from hetflow.devices.opencl.tuning import GemmTuning

        self.gemm_tuning = GemmTuning(self)
        self.resident = Resident()

        register_all(self)

    @classmethod
    def is_available(cls) -> str | None:
        return _discover()[1]

    def name(self) -> str:
        return str(self.device.name).strip()

    def fingerprint(self) -> dict[str, str]:
        return {
            "kind": "opencl",
            "platform": f"{self.platform.name.strip()} {self.platform.version.strip()}",
            "device": self.name(),
            "vendor": str(self.device.vendor).strip(),
            "driver": str(self.device.driver_version).strip(),
        }

    def info(self) -> dict[str, Any]:
        """What ``hetflow devices`` shows: identity, compute units, clock, memories, versions."""
        d = self.device
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name(),
            "vendor": str(d.vendor).strip(),
            "platform": str(self.platform.name).strip(),
            "compute_units": int(d.max_compute_units),
            "max_clock_mhz": int(d.max_clock_frequency),
            "global_memory_bytes": int(d.global_mem_size),
            "local_memory_bytes": int(d.local_mem_size),
            "host_unified_memory": self.unified_memory,
            "opencl_version": str(d.version).strip(),
            "driver_version": str(d.driver_version).strip(),
        }

    # -- programs -------------------------------------------------------------------------------------

    def kernel(self, name: str, source: str, options: tuple[str, ...] = ()) -> Any:
        """The ``pyopencl.Kernel`` ``name`` of ``source`` built with ``options`` (built once per process,
        binaries cached on disk)."""
        import pyopencl as cl

        key = (name, source, options)
        with self._lock:
            found = self._kernel_cache.get(key)
        if found is None:
            program = self.programs.build(
                self.context, self.device, source, options, self.fingerprint(), name
            )
            found = cl.Kernel(program, name)
            with self._lock:
                self._kernel_cache[key] = found
        return found

    def enqueue(
        self,
        kernel: Any,
        global_size: tuple[int, ...],
        local_size: tuple[int, ...] | None,
        args: tuple[Any, ...],
    ) -> None:
        """Set ``kernel``'s arguments and enqueue it, as one step.

        Kernel objects are shared (one per program variant and device), and OpenCL captures the
        arguments at enqueue time: setting and enqueueing under one lock keeps two threads, or a
        prepared launch and a later one, from running with each other's buffers.
        """
        import pyopencl as cl

        with self._lock:
            kernel.set_args(*args)
            cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, local_size)

    def gemm_config(self, m: int, n: int, k: int, batch: int = 1) -> Any:
        """The GEMM configuration for an ``M x K @ K x N`` product (``batch`` of them): the tuned one of
        its shape class from the tuning cache, else the default (see ``tuning.py``)."""
        return self.gemm_tuning.config(m, n, k, batch)

    def prepare_node(self, node: Any, inputs: Any, tuner: Any) -> None:
        """The planner's hook (``hetflow.tuning.select.Tuner.choose``): with ``tuner.tune``, search the
        GEMM configurations this node's kernels need and the tuning cache lacks; otherwise nothing
        (configurations are looked up when the kernels run)."""
        if not getattr(tuner, "tune", False) or inputs is None:
            return
        from hetflow.devices.opencl.tuning import effort_of, tune_node

        tune_node(self, node, inputs, effort_of(tuner))

    def tuning_stats(self) -> dict[str, int]:
        """GEMM shape classes found in the tuning cache (hits), not found (misses), searched (tuned)."""
        return self.gemm_tuning.stats.as_dict()

    # -- memory ---------------------------------------------------------------------------------------

    def to_device(self, array: np.ndarray) -> DeviceArray:
        """A buffer holding ``array``: wrapping its memory on unified-memory devices, else a copy."""
        import pyopencl as cl

        flags = cl.mem_flags.READ_WRITE
        if self.unified_memory:
            host = _wrappable(array)
            buffer = cl.Buffer(self.context, flags | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
            self.transfers.mapped += host.nbytes
            return DeviceArray(buffer, tuple(array.shape), host.dtype, host)
        data = np.ascontiguousarray(array) if array.size else np.empty(1, array.dtype)
        buffer = cl.Buffer(self.context, flags | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
        self.transfers.copied_in += array.nbytes
        return DeviceArray(buffer, tuple(array.shape), array.dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> DeviceArray:
        """An uninitialised device tensor (host-backed on unified-memory devices)."""
        import pyopencl as cl

        dtype = np.dtype(dtype)
        count = max(int(np.prod(shape, dtype=np.int64)), 1)
        flags = cl.mem_flags.READ_WRITE
        if self.unified_memory:
            host = aligned_empty((count,), dtype)
            buffer = cl.Buffer(self.context, flags | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
            return DeviceArray(buffer, tuple(shape), dtype, host)
        return DeviceArray(cl.Buffer(self.context, flags, count * dtype.itemsize), tuple(shape), dtype)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> DeviceArray:
        """A device tensor filled with zeros."""
        import pyopencl as cl

        out = self.empty(shape, dtype)
        if out.host is not None:
            out.host[...] = 0
        else:
            cl.enqueue_fill_buffer(self.queue, out.buffer, np.zeros(1, out.dtype), 0, out.buffer.size)
        return out

    def to_host(self, buffer: object) -> np.ndarray:
        """The tensor's values as a host array (waits for the queue).

        On unified-memory devices the buffer is mapped for reading and unmapped: the map is the
        synchronisation point after which the wrapped host array holds the device's writes, so no
        bytes are copied.
        """
        import pyopencl as cl

        assert isinstance(buffer, DeviceArray)
        count = int(np.prod(buffer.shape, dtype=np.int64))
        if buffer.host is not None:
            mapped, _ = cl.enqueue_map_buffer(
                self.queue, buffer.buffer, cl.map_flags.READ, 0, buffer.host.shape, buffer.dtype
            )
            mapped.base.release()
            self.transfers.mapped += buffer.nbytes
            return buffer.host.reshape(-1)[:count].reshape(buffer.shape)
        out = np.empty(buffer.shape, buffer.dtype)
        if count:
            cl.enqueue_copy(self.queue, out, buffer.buffer)
        self.transfers.copied_out += out.nbytes
        return out

    def synchronize(self) -> None:
        self.queue.finish()


@dataclass
class _Registry:
    """One OpenCLDevice per index per process, so contexts and built programs are shared by sessions."""

    devices: dict[int, OpenCLDevice] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_DEVICES = _Registry()


def get_opencl_device(index: int) -> OpenCLDevice:
    """The process-wide OpenCLDevice ``index`` (created on first use)."""
    with _DEVICES.lock:
        device = _DEVICES.devices.get(index)
        if device is None:
            device = OpenCLDevice(index)
            _DEVICES.devices[index] = device
        return device


def list_opencl_devices() -> list[OpenCLDevice]:
    """Every OpenCL device of this machine (empty when OpenCL cannot start)."""
    return [get_opencl_device(i) for i in range(device_count())]
