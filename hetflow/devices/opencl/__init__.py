"""The OpenCL device: discovery, context and queue, buffers and transfers, program builds.

Every OpenCL device of every platform gets an index in discovery order (platforms as the ICD loader
lists them, devices in platform order): ``"opencl:0"``, ``"opencl:1"``... PoCL, installed from PyPI with
``pocl-binary-distribution``, gives a CPU device on any machine, so this backend is built and tested
without a GPU.

Values stay on the device between OpenCL nodes: launchers take numpy arrays or ``DeviceArray`` values
and return a ``DeviceArray`` when any input was one (numpy in, numpy out for direct callers), and the
executor (``hetflow.runtime.executor``) moves a value to the host only where a CPU node reads it or it
is returned. Intermediate buffers come from a per-device pool (``empty``) and go back to it when the
executor releases them (``release``), so a steady-state run allocates no device memory. Weights (read-only
initializers) and what kernels derive from them (packed GEMM panels, Winograd transforms) stay on the
device, once per array (``resident.py``); the GEMM's configuration for each product comes from the
tuning cache by shape class (``tuning.py``), else the default.

Transfers: on host-unified-memory devices ``to_device`` wraps host memory (``USE_HOST_PTR``) and
``to_host`` maps, so nothing is copied; elsewhere each is a real copy. ``unified=False`` (or
``HETFLOW_OPENCL_UNIFIED=0``) forces the copy path on a unified device, to test a discrete GPU's path.
``transfers`` counts the bytes either way.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hetflow.devices import host_memory
from hetflow.devices.base import Device, KernelTable
from hetflow.devices.opencl.build import ProgramCache
from hetflow.errors import DeviceUnavailableError
from hetflow.options import opencl_unified_default


@dataclass(eq=False)
class Allocation:
    """One device buffer of the pool (``OpenCLDevice.empty``), shared by every view of it.

    Attributes:
        buffer: the ``pyopencl.Buffer``.
        host: on unified-memory devices, the host memory it wraps (``USE_HOST_PTR``), else None.
        nbytes: its size in bytes (the pool's key).
        escaped: a host view of it was handed out (``to_host`` on unified memory): the pool must not
            give it to another value, since the view may still be read.
    """

    buffer: Any
    host: np.ndarray | None
    nbytes: int
    escaped: bool = False


@dataclass(eq=False)
class DeviceArray:
    """A tensor in an OpenCL buffer (C-contiguous, from the buffer's start).

    Attributes:
        buffer: the ``pyopencl.Buffer``.
        shape: the tensor's shape.
        dtype: its numpy dtype.
        host: on host-unified-memory devices, the host array the buffer wraps (``USE_HOST_PTR``): reading
            the result back is a map, not a copy. None where the buffer lives in device memory.
        device: the device that owns the buffer (None for arrays made outside a device's methods).
        allocation: the pool allocation it lives in (shared by its reshaped views), or None.
    """

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    host: np.ndarray | None = None
    device: OpenCLDevice | None = None
    allocation: Allocation | None = None

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def reshape(self, *shape: int | Sequence[int]) -> DeviceArray:
        """The same buffer under another shape (one ``-1`` allowed), as numpy reshapes a contiguous
        array: no data moves."""
        dims = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        target = _resolve_shape(tuple(int(d) for d in dims), self.size)  # type: ignore[arg-type]
        return replace(self, shape=target)


def _resolve_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """``shape`` with its ``-1`` filled in so that it holds ``size`` elements."""
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(size // known if d == -1 and known else d for d in shape)
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape a device array of {size} elements into shape {shape}")
    return shape


class BufferPool:
    """Free device buffers by size, for intermediates: the executor gives a value's buffer back after
    its last reader (``OpenCLDevice.release``) and the next ``empty`` of that size takes it.

    Reuse needs no synchronisation: the queue is in order, so a kernel that writes a reused buffer runs
    after every kernel that read its previous value.
    """

    def __init__(self) -> None:
        self._free: dict[int, list[Allocation]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> Allocation | None:
        """A free allocation of exactly ``nbytes``, or None."""
        with self._lock:
            free = self._free.get(nbytes)
            return free.pop() if free else None

    def give(self, allocation: Allocation) -> None:
        with self._lock:
            self._free.setdefault(allocation.nbytes, []).append(allocation)

    @property
    def free_bytes(self) -> int:
        """Bytes held by free buffers."""
        with self._lock:
            return sum(nbytes * len(free) for nbytes, free in self._free.items())

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


@dataclass
class TransferStats:
    """Bytes moved between host and device, and bytes that were mapped instead of copied."""

    copied_in: int = 0
    copied_out: int = 0
    mapped: int = 0

    @property
    def copied(self) -> int:
        """Bytes copied either way."""
        return self.copied_in + self.copied_out


#: Alignment of host memory wrapped by buffers (``USE_HOST_PTR``): kernels read it with aligned vector
#: loads (up to float16 = 64 bytes), and OpenCL asks for the device's base-address alignment (128 bytes
#: on PoCL); numpy only guarantees 16.
HOST_ALIGNMENT = 128


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a ``HOST_ALIGNMENT`` boundary."""
    return host_memory.aligned_empty(shape, dtype, HOST_ALIGNMENT)


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


def _type_scalar_args(kernel: Any, args: Sequence[Any]) -> None:
    """Declare ``kernel``'s scalar argument types from one launch's arguments (numpy scalars; buffers
    and the rest untyped), once per kernel object.

    pyopencl then sets arguments through an invoker generated for those types: 25 arguments in 4 µs,
    against 290 µs through its untyped path (about 12 µs per numpy scalar, on PoCL and NVIDIA alike).
    A kernel's signature is fixed, so every later launch passes the same kinds at the same positions.
    """
    kernel.set_scalar_arg_dtypes([a.dtype if isinstance(a, np.generic) else None for a in args])
    kernel._hetflow_typed = True


@functools.cache
def _discover() -> tuple[list[tuple[Any, Any]], str | None]:
    """Every (platform, device) pair that builds kernels, in discovery order, and the reason when there is
    none. A device whose compiler fails on a one-line kernel is left out with a warning."""
    try:
        import pyopencl as cl
    except ImportError as error:
        return [], f"pyopencl is not installed ({error}); pip install pyopencl pocl-binary-distribution"
    try:
        platforms = cl.get_platforms()
    except cl.Error as error:
        return [], f"no OpenCL platform found ({error})"
    pairs, broken = [], []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue  # a platform with no devices (PoCL with no usable driver) is skipped
        for device in devices:
            failure = _build_failure(cl, device)
            if failure is None:
                pairs.append((platform, device))
            else:
                broken.append(f"{device.name.strip()} ({platform.version.strip()}): {failure}")
    for entry in broken:
        warnings.warn(f"OpenCL device left out, it cannot build kernels: {entry}", RuntimeWarning, stacklevel=2)
    if not pairs:
        names = ", ".join(p.name for p in platforms) or "none"
        if broken:
            return [], f"no OpenCL device builds kernels: {'; '.join(broken)}. {_NEWER_POCL}"
        return [], f"no OpenCL device found (platforms: {names})"
    return pairs, None


#: What to do where PoCL's compiler does not know the CPU: PyPI's PoCL 3.0 is built on LLVM 14, which
#: names an AMD Zen 5 (family 1Ah) "generic" and then refuses that name ("unknown target CPU
#: 'generic'", pocl/pocl#1049). Debian's PoCL 3.1 (LLVM 15) picks its skylake-avx512 variant there.
_NEWER_POCL = "Where PoCL does not know this CPU, a newer PoCL helps (Debian/Ubuntu: apt install pocl-opencl-icd)"

#: The kernel a device must build to be listed.
_PROBE_SOURCE = "__kernel void hetflow_probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"


def _build_failure(cl: Any, device: Any) -> str | None:
    """Why ``device`` cannot build a one-line kernel (the first line of its build log), or None."""
    try:
        cl.Program(cl.Context([device]), _PROBE_SOURCE).build(devices=[device], cache_dir=False)
    except cl.Error as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip().startswith("error")]
        return lines[0] if lines else str(error).splitlines()[0]
    return None


def device_count() -> int:
    """How many OpenCL devices this machine has (0 when OpenCL cannot start)."""
    return len(_discover()[0])


class OpenCLDevice(Device):
    """One OpenCL device with its own context, in-order queue, program cache and kernel table.

    Args:
        index: the device's position in discovery order (``"opencl:<index>"``).
        unified: False forces copies between host and device even where the device shares host memory
            (the discrete-GPU path); None: ``$HETFLOW_OPENCL_UNIFIED`` (``0`` forces copies), else what
            the device reports. True where the device does not share memory is ignored.

    Raises:
        DeviceUnavailableError: there is no OpenCL platform, or no device with that index.
    """

    kind = "opencl"

    def __init__(self, index: int = 0, unified: bool | None = None):
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
        self.pool = BufferPool()
        self._lock = threading.Lock()
        self._parked: list[object] = []
        self._constants: dict[Hashable, DeviceArray] = {}
        self._unified = bool(self.device.host_unified_memory)
        if unified is None:
            unified = opencl_unified_default()
        if unified is not None:
            self.unified_memory = unified
        self._kernel_cache: dict[tuple[str, str, tuple[str, ...]], Any] = {}
        self.kernels = KernelTable()
        from hetflow.devices.opencl.kernels import register_all
        from hetflow.devices.opencl.resident import Resident
        from hetflow.devices.opencl.tuning import GemmTuning

        self.gemm_tuning = GemmTuning(self)
        self.resident = Resident(self.park)

        register_all(self)

    @classmethod
    def is_available(cls) -> str | None:
        return _discover()[1]

    def name(self) -> str:
        return str(self.device.name).strip()

    @functools.cached_property
    def is_cpu(self) -> bool:
        """Whether the device is a CPU (PoCL, Intel's CPU runtime): kernels pick their defaults by it."""
        import pyopencl as cl

        return bool(self.device.type & cl.device_type.CPU)

    @functools.cached_property
    def compute_units(self) -> int:
        """The device's compute units (cores on a CPU, streaming multiprocessors on an NVIDIA GPU)."""
        return int(self.device.max_compute_units)

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
            if not getattr(kernel, "_hetflow_typed", False):
                _type_scalar_args(kernel, args)
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

    def device_inputs(self, kernel: Any, node: Any) -> tuple[int, ...]:
        """Positions of ``node``'s inputs that ``kernel`` takes as device buffers (declared by its launcher
        with ``kernels.common.device_inputs``); the executor hands the others over as host arrays."""
        declared = getattr(kernel.fn, "device_inputs", ())
        if declared == "all":
            return tuple(range(len(node.inputs)))
        return tuple(p for p in declared if p < len(node.inputs))

    def timed_call(
        self, kernel: Any, node: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None = None,
        weights: Collection[int] = (),
    ) -> Callable[[], None]:
        """One call of ``kernel`` as a run between OpenCL nodes makes it: the inputs it takes as device
        buffers uploaded once beforehand, the call waited for and its outputs left on the device (back
        to the pool). A discrete GPU would otherwise time a PCIe round trip per call (~0.5 ms on an
        H100 at batch 1, more than most of GoogLeNet's layers) instead of the algorithm. ``outputs``
        is not needed: each call takes its results from the device's pool, nor ``weights``: every input
        not uploaded is held as a run holds its weights."""
        on_device = self.device_inputs(kernel, node)
        staged: list[Any] = []
        for position, value in enumerate(inputs):
            if isinstance(value, np.ndarray) and position in on_device and value.dtype == np.float32:
                value = self.to_device(np.ascontiguousarray(value))
            elif isinstance(value, np.ndarray):
                # The rest are weights in a run: read-only initializers, kept resident after one upload.
                value = value.copy()
                value.flags.writeable = False
            staged.append(value)

        def call() -> None:
            outputs = kernel.fn(node, staged)
            self.synchronize()
            for output in outputs:
                if isinstance(output, DeviceArray):
                    self.release(output)

        return call

    def tuning_stats(self) -> dict[str, int]:
        """GEMM shape classes found in the tuning cache (hits), not found (misses), searched (tuned)."""
        return self.gemm_tuning.stats.as_dict()

    # -- memory ---------------------------------------------------------------------------------------

    @property
    def unified_memory(self) -> bool:
        """Whether transfers map host memory (True) or copy (False); see the ``unified`` argument."""
        return self._unified

    @unified_memory.setter
    def unified_memory(self, unified: bool) -> None:
        # NOTE: pooled buffers were made for the other path (host-backed or not): start the pool afresh.
        self._unified = bool(unified) and bool(self.device.host_unified_memory)
        self.pool.clear()

    def to_device(self, array: np.ndarray) -> DeviceArray:
        """A buffer holding ``array``: wrapping its memory on unified-memory devices, else a copy."""
        import pyopencl as cl

        flags = cl.mem_flags.READ_WRITE
        if self.unified_memory:
            host = _wrappable(array)
            buffer = cl.Buffer(self.context, flags | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
            self.transfers.mapped += array.nbytes
            return DeviceArray(buffer, tuple(array.shape), host.dtype, host, self)
        data = np.ascontiguousarray(array) if array.size else np.empty(1, array.dtype)
        buffer = cl.Buffer(self.context, flags | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
        self.transfers.copied_in += array.nbytes
        return DeviceArray(buffer, tuple(array.shape), array.dtype, None, self)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> DeviceArray:
        """An uninitialised device tensor (host-backed on unified-memory devices), from the pool when
        it holds a free buffer of that size."""
        dtype = np.dtype(dtype)
        nbytes = max(math.prod(shape), 1) * dtype.itemsize
        allocation = self.pool.take(nbytes) or self._allocate(nbytes)
        host = None if allocation.host is None else allocation.host.view(dtype)
        return DeviceArray(allocation.buffer, tuple(shape), dtype, host, self, allocation)

    def _allocate(self, nbytes: int) -> Allocation:
        import pyopencl as cl

        flags = cl.mem_flags.READ_WRITE
        if self.unified_memory:
            host = aligned_empty((nbytes,), np.uint8)
            buffer = cl.Buffer(self.context, flags | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
            return Allocation(buffer, host, nbytes)
        return Allocation(cl.Buffer(self.context, flags, nbytes), None, nbytes)

    def release(self, array: DeviceArray) -> None:
        """``array``'s buffer is no longer needed by the caller (every view of it is dead or done).

        A pool buffer goes back to the pool (unless a host view of it escaped); anything else is kept
        alive until the queue is next waited on, so kernels still queued never read freed host memory.
        """
        allocation = array.allocation
        if allocation is not None and not allocation.escaped:
            self.pool.give(allocation)
        else:
            self.park(array)

    def park(self, *objects: object) -> None:
        """Keep ``objects`` (buffers, host arrays they wrap) alive until the queue is next waited on.

        NOTE: a buffer wrapping host memory (``USE_HOST_PTR``) must outlive every queued kernel that
        uses it; dropping it earlier would free memory the device still reads.
        """
        with self._lock:
            self._parked.extend(objects)

    def copy(self, array: DeviceArray) -> DeviceArray:
        """A new device tensor with ``array``'s values (copied on the device)."""
        import pyopencl as cl

        out = self.empty(array.shape, array.dtype)
        if array.nbytes:
            cl.enqueue_copy(self.queue, out.buffer, array.buffer, byte_count=array.nbytes)
        return out

    def constant(self, key: Hashable, make: Callable[[], np.ndarray]) -> DeviceArray:
        """A small read-only device array made from ``make()`` once per ``key`` and kept (kernel metadata:
        broadcast strides, transpose shapes), so runs upload nothing for it."""
        found = self._constants.get(key)
        if found is None:
            found = self.to_device(np.array(make()))
            self._constants[key] = found
        return found

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> DeviceArray:
        """A device tensor filled with zeros (by a queued fill: a pooled buffer may still be read by
        kernels queued before, so the host must not write it)."""
        import pyopencl as cl

        out = self.empty(shape, dtype)
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
        count = buffer.size
        parked = self._unpark()
        if buffer.host is not None:
            mapped, _ = cl.enqueue_map_buffer(
                self.queue, buffer.buffer, cl.map_flags.READ, 0, buffer.host.shape, buffer.host.dtype
            )
            mapped.base.release()
            self.transfers.mapped += buffer.nbytes
            if buffer.allocation is not None:
                buffer.allocation.escaped = True  # the caller may keep reading this memory
            del parked  # the map waited for every kernel queued before it
            return buffer.host.reshape(-1)[:count].reshape(buffer.shape)
        out = np.empty(buffer.shape, buffer.dtype)
        if count:
            cl.enqueue_copy(self.queue, out, buffer.buffer)
        self.transfers.copied_out += out.nbytes
        del parked
        return out

    def _unpark(self) -> list[object]:
        """Take the parked objects: the caller drops them after its next wait on the queue."""
        with self._lock:
            parked, self._parked = self._parked, []
        return parked

    def synchronize(self) -> None:
        parked = self._unpark()
        self.queue.finish()
        del parked


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
