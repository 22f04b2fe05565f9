"""The CPU's threads: the BLAS pool's size (through threadpoolctl) and a small pool for kernels that split
their own work (numpy's ufuncs are single-threaded but release the GIL on large arrays).

A session's thread count is the BLAS pool size while it runs; kernels that split work read the same
number back (``intra_op_threads``), so ``threads=1`` makes a whole run single-threaded. A run of a
convolutional network instead holds BLAS at one thread and splits its GEMMs itself (``own_threads``,
``split_matmul``): OpenBLAS's idle workers spin for ~0.1 s after each call, on the cores hetflow's own
splits need next. The splits run in numba's OpenMP pool (the GEMMs through ``jit_gemm``, the compiled
kernels through their ``prange`` drivers, sized by ``plane_parts``), whose workers spin between calls:
on a small VM a sleeping thread takes ~100 us to wake, longer than most of a small model's kernels.
``parallel_for`` (a Python pool) remains for the rest (the training splits, products without
``jit_gemm``). One example through a small network splits on ``spin_pool``'s threads instead
(``own_threads(spin=True)``): the products (``jit_gemm``'s jobs) and one image's direct Conv.

NOTE: the BLAS pool size (and ``own_threads``' count) is process-wide state. Two sessions asking for
different counts at the same time from two threads get correct results, but each may run with the
other's count while they overlap.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from hetflow.devices.cpu.spin_pool import SpinPool


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one, else cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class BlasThreads:
    """The thread count of every BLAS library loaded in the process (numpy's OpenBLAS, MKL...).

    threadpoolctl's ``threadpool_limits`` context rescans the loaded libraries on every entry (~0.5 ms
    here); the libraries are found once instead, and a run costs one ``get`` (~1 us) when the count
    already matches, plus two ``set`` calls (~2 us each) when it does not.
    """

    def __init__(self) -> None:
        self._libraries: list[Any] | None = None
        self._lock = threading.Lock()

    def _libs(self) -> list[Any]:
        if self._libraries is None:
            with self._lock:
                if self._libraries is None:
                    self._libraries = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return self._libraries

    def get(self) -> int | None:
        """The first BLAS library's current thread count (None when no BLAS is loaded)."""
        libraries = self._libs()
        return libraries[0].get_num_threads() if libraries else None

    def set(self, count: int) -> None:
        for library in self._libs():
            library.set_num_threads(count)

    def hold(self, count: int) -> int | None:
        """Set BLAS to ``count`` threads; returns the count to give back to ``restore`` (None: unchanged)."""
        current = self.get()
        if current is None or current == count:
            return None
        self.set(count)
        return current

    def restore(self, previous: int | None) -> None:
        if previous is not None:
            self.set(previous)


#: The process's BLAS libraries (found on first use, after numpy has loaded its BLAS).
BLAS = BlasThreads()


#: OpenBLAS kernel targets (threadpoolctl's ``architecture``) that multiply in 512-bit vectors.
WIDE_BLAS_TARGETS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


@functools.cache
def blas_is_narrow() -> bool:
    """Whether numpy's BLAS multiplies in narrower vectors than hetflow's compiled kernels: OpenBLAS built
    for a target without AVX-512 on a CPU that has it. There OpenBLAS's sgemm runs at about half the tile
    GEMM's rate: on the Zen 5 VM (2026-12-02, OpenBLAS 0.3.31 on its "Haswell" kernels) 55-60 GMAC/s a
    core against 105-110, and ResNet-50's 3x3 stride-2 layers at batch 16 took 2.2-2.5x ONNX Runtime's
    time with their products on BLAS. On the Xeon VM (OpenBLAS on its "SkylakeX" kernels) BLAS won some
    of them. Other BLAS libraries (MKL) are taken to be wide."""
    import llvmlite.binding as llvm

    if not llvm.get_host_cpu_features().get("avx512f", False):
        return False
    for library in ThreadpoolController().select(user_api="blas").lib_controllers:
        info = library.info()
        if info.get("internal_api") == "openblas" and str(info.get("architecture", "")).lower() not in WIDE_BLAS_TARGETS:
            return True
    return False


#: Set while a run splits its GEMMs itself (``own_threads``): the run's thread count; BLAS is at one.
_own_threads: int | None = None
#: Set while such a run splits in numba's OpenMP pool (``own_threads(numba_pool=True)``).
_numba_pool = False
#: Set while such a run splits on spinning threads (``own_threads(spin=True)``): their pool.
_spinning: SpinPool | None = None
_spin_pools: dict[int, SpinPool] = {}
_spin_pools_lock = threading.Lock()


def spin_pool(threads: int) -> SpinPool:
    """The process's spinning pool for runs of ``threads`` threads (``threads - 1`` workers)."""
    with _spin_pools_lock:
        pool = _spin_pools.get(threads)
        if pool is None:
            pool = _spin_pools[threads] = SpinPool(threads - 1)
        return pool


def owns_threads() -> bool:
    """Whether the running call splits its work over its own threads (``own_threads``), BLAS at one."""
    return _own_threads is not None


def spinning() -> SpinPool | None:
    """The spinning pool the running call splits on (``own_threads(spin=True)``), or None."""
    return _spinning

#: Whether runs of convolutional networks split in numba's pool (``jit_gemm``): opt in with
#: ``HETFLOW_NUMBA_POOL=1``. Off by default: alone in a process it measured 5-38% faster on the small
#: networks, but side by side with ONNX Runtime and OpenVINO on this VM several models ran 1.5-2x
#: slower (spinning workers stalled by the hypervisor; see BENCHMARKS.md).
NUMBA_POOL = os.environ.get("HETFLOW_NUMBA_POOL", "0") == "1"


#: ``count``: set in a thread while a run there holds BLAS at that count (``blas_threads``), so that
#: the kernels asking ``intra_op_threads`` several times a run do not each query the BLAS library (~5 us
#: a query). Per thread: two sessions running in two threads each see their own.
_held = threading.local()


def in_numba_pool() -> bool:
    """Whether the running call splits in numba's pool (``own_threads(numba_pool=True)``, with BLAS at
    one thread). Splits in that pool are only safe then: its regions give each thread fixed items, so an
    item whose thread is off its core (OpenBLAS's spinning workers on it, another process) holds up
    the call. mentee at batch 1 with OpenBLAS at two threads and a busy second core: 0.5 -> 76 ms
    median."""
    return _numba_pool


def replay_key() -> Hashable | None:
    """What a captured run depends on in the running thread arrangement (the spinning pool and the
    threads the kernels split over), or None where runs are not captured (``hetflow.runtime.replay``):
    they split on numba's or the Python pool, which no job can replay."""
    pool, threads = _spinning, intra_op_threads()
    if pool is None and threads > 1:
        return None
    return arrangement_key(pool, threads)


def arrangement_key(pool: SpinPool | None, threads: int) -> Hashable:
    """``replay_key`` inside an arrangement of ``threads`` threads on ``pool``."""
    return id(pool), threads


def intra_op_threads() -> int:
    """How many threads a kernel may split its own work over: the session's count (as ``own_threads``
    set it, or as BLAS holds it)."""
    return _own_threads or getattr(_held, "count", None) or BLAS.get() or 1


class blas_threads:  # noqa: N801  (a context manager, like threadpoolctl's)
    """While active: BLAS at ``count`` threads (the previous count restored on exit).

    ``deferred``: BLAS's count is set only when the run first needs BLAS (``hold_deferred_blas``), not on
    entry. Most replayed runs call no BLAS at all (no step from Python, no ``Job.calls_blas``),
    and setting OpenBLAS to one thread and back cost ~40 us a run there (MobileNet v2 at batch 1:
    ``set_num_threads(2)`` alone ~31 us after the run's jobs had left its code out of the caches).
    """

    def __init__(self, count: int, deferred: bool = False):
        self.count = count
        self.deferred = deferred
        self.previous: int | None = None
        self.waiting = False  # a deferred hold not yet made
        self.outer: int | None = None
        self.outer_pending: blas_threads | None = None

    def __enter__(self) -> blas_threads:
        self.waiting = self.deferred
        self.previous = None if self.deferred else BLAS.hold(self.count)
        self.outer, _held.count = getattr(_held, "count", None), self.count
        self.outer_pending, _held.pending = getattr(_held, "pending", None), self if self.deferred else None
        return self

    def hold_now(self) -> None:
        """Set BLAS's count now, once, where this hold was deferred."""
        if self.waiting:
            self.waiting = False
            self.previous = BLAS.hold(self.count)

    def __exit__(self, *exc: object) -> None:
        _held.count = self.outer
        _held.pending = self.outer_pending
        BLAS.restore(self.previous)


def hold_deferred_blas() -> None:
    """Set BLAS to the count the running thread's ``blas_threads`` holds, where that hold was deferred:
    a run calls it before any step that may call BLAS."""
    pending = getattr(_held, "pending", None)
    if pending is not None:
        pending.hold_now()
        _held.pending = None


class own_threads(blas_threads):  # noqa: N801
    """While active: BLAS at one thread and ``split_matmul`` splitting products over ``count`` threads.

    OpenBLAS's worker threads spin for about 0.1 s after each multi-threaded call, on the cores that
    hetflow's own splits (the compiled kernels' planes) need next; with BLAS at one thread they never
    wake. Measured at batch 16, 2 threads, one process, A/B: googlenet 903 -> 705 ms, shufflenet 274 ->
    199, mobilenetv2 418 -> 341, resnet50 1697 -> 1556. With the products split on the Python pool,
    batch 1 and small networks lost to its hand-offs (resnet50 at batch 1 136 -> 186 ms), so the
    executor uses this for large batches only (``OWN_THREADS_MIN_CONV_MACS``). With ``numba_pool`` the
    products and the compiled kernels split in numba's pool instead (``jit_gemm``, ``split_planes``);
    the executor does that for every run of a convolutional network when ``NUMBA_POOL`` is set.
    """

    def __init__(
        self, count: int, numba_pool: bool = False, spin: bool = False, hold_blas: bool = False,
        deferred: bool = False,
    ):
        self.pool = spin_pool(count) if spin and count > 1 and not numba_pool else None
        # NOTE: on spinning threads BLAS keeps its count unless ``hold_blas``: setting OpenBLAS to one
        # thread and back around each run cost LeNet ~20 us a run (its workers woke on the cores the
        # spinning threads use); OpenBLAS runs products under ~0.26 M multiply-adds on one thread
        # anyway, and larger ones fitting CBLAS split here. A large network's products would wake them.
        super().__init__(count if self.pool is not None and not hold_blas else 1, deferred)
        self.threads = count
        self.numba_pool = numba_pool

    def __enter__(self) -> own_threads:
        global _own_threads, _numba_pool, _spinning
        super().__enter__()
        _own_threads = self.threads
        _numba_pool = self.numba_pool
        if self.pool is not None:
            self.pool.spin()
            _spinning = self.pool
        return self

    def __exit__(self, *exc: object) -> None:
        global _own_threads, _numba_pool, _spinning
        _own_threads = None
        _numba_pool = False
        if self.pool is not None:
            _spinning = None
            self.pool.rest()
        super().__exit__(*exc)


#: Below this many multiply-adds a product is not worth a thread hand-off (~20 us).
MIN_MACS_PER_SPLIT = 2_000_000


def split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b, out=out)``; while ``own_threads`` is active, split over the run's threads: a
    stacked product (images, Winograd's tile elements) along ``out``'s leading axis, a single one (a
    fully connected layer, a whole-chunk im2col GEMM) along ``out``'s columns (row halves of a 16-row
    product measured slower: AlexNet's FC layers; in numba's or the spinning pool, by rows where A has more
    rows than B has columns). Each part is one single-threaded BLAS call, so the
    result does not depend on which thread runs which part. Products from ``MIN_MACS_PER_NATIVE_SPLIT``
    split in numba's pool where ``jit_gemm`` can read them, else on the Python pool from
    ``MIN_MACS_PER_SPLIT``."""
    threads = _own_threads or 1
    if threads > 1 and (_numba_pool or _spinning is not None) and _native_split(a, b, out, threads):
        return out
    if threads <= 1 or a.shape[-1] * out.size < MIN_MACS_PER_SPLIT:
        return np.matmul(a, b, out=out)
    stacked = out.ndim >= 3 and out.shape[0] > 1
    length = out.shape[0] if stacked else out.shape[-1]
    threads = min(threads, length)
    bounds = [length * part // threads for part in range(threads + 1)]

    def part(index: int) -> None:
        span = slice(bounds[index], bounds[index + 1])
        if stacked:
            np.matmul(a[span] if a.ndim == out.ndim else a, b[span] if b.ndim == out.ndim else b, out=out[span])
        else:
            np.matmul(a, b[..., span], out=out[..., span])

    parallel_for(part, threads, threads)
    return out


#: From this many multiply-adds a product is split in numba's pool (``jit_gemm``). Measured on the 2-core
#: VM, one thread -> two parts: 50x500x64 51 -> 28 us, 32x800x256 184 -> 112 us, 1x800x500 30 -> 24
#: us; 20x25x576 (0.3 M) 8.2 -> 9.6 us lost.
MIN_MACS_PER_NATIVE_SPLIT = 300_000


def matmul_for(macs: int) -> Callable[..., np.ndarray]:
    """The product function a kernel binds for one 2-D product of ``macs`` multiply-adds: ``np.matmul``
    where no thread arrangement splits a product that small (a call ~1 us cheaper), else ``split_matmul``."""
    return np.matmul if macs < min(MIN_MACS_PER_NATIVE_SPLIT, MIN_MACS_PER_SPLIT) else split_matmul


@functools.cache
def _jit_gemm() -> ModuleType:
    """``kernels.jit_gemm``, imported on first use (it imports the kernels, which import this module);
    an import statement in ``_native_split`` cost ~0.4 us a product."""
    from hetflow.devices.cpu.kernels import jit_gemm

    return jit_gemm


def spin_product_parts(macs: int, columns: int) -> int:
    """The column blocks a 2-D product of ``macs`` multiply-adds into ``columns`` columns splits into on a
    spinning run (``split_matmul``; 1 where it is not split, or the run does not spin)."""
    threads = _own_threads or 1
    if _spinning is None or threads <= 1 or macs < MIN_MACS_PER_NATIVE_SPLIT:
        return 1
    return _column_parts(threads, columns)


def _column_parts(threads: int, columns: int) -> int:
    """Blocks a single product's ``columns`` split into over ``threads`` threads: 16 columns each at least."""
    return min(threads, max(1, columns // 16))


def _native_split(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> bool:
    """A single product (2-D, or one image of a stack or of a grouped product) split in numba's pool or on
    the spinning one (by columns, or by rows where A outweighs B: ``jit_gemm.split_product``), where it
    fits."""
    jit_gemm = _jit_gemm()
    if out.ndim == 4 and out.shape[0] == 1 and b.ndim == 4 and a.ndim in (2, 3):
        # One image of a grouped product (``[1, groups, rows, columns]``): a stack over its groups.
        b, out = b[0], out[0]
    if out.ndim == 3 and out.shape[0] > 1:
        if a.shape[-1] * out.size < MIN_MACS_PER_NATIVE_SPLIT or not jit_gemm.available():
            return False
        return jit_gemm.split_stack(a, b, out, min(threads, out.shape[0]), _spinning)
    if out.ndim == 3 and out.shape[0] == 1 and a.ndim in (2, 3) and b.ndim == 3:
        a, b, out = (a[0] if a.ndim == 3 else a), b[0], out[0]
    if out.ndim != 2 or a.ndim != 2 or b.ndim != 2 or a.shape[1] * out.size < MIN_MACS_PER_NATIVE_SPLIT:
        return False
    parts = _column_parts(threads, out.shape[1])
    return parts > 1 and jit_gemm.available() and jit_gemm.split_product(a, b, out, parts, _spinning)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
#: ``parallel_for`` calls so far that handed items to the pool's threads (``pool_handoffs``).
_handoffs = 0


def _kernel_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max(available_cores() - 1, 1), thread_name_prefix="hetflow-op")
    return _pool


def parallel_for(body: Callable[[int], None], count: int, threads: int | None = None) -> None:
    """Run ``body(0) .. body(count - 1)`` on up to ``threads`` threads (default: ``intra_op_threads``).

    The calling thread takes items too and only waits for items another thread has started, so a call
    made from inside a pool thread (a parallel executor's branch) can never deadlock on a busy pool.
    The first exception any item raises is re-raised here, after every started item has finished.
    """
    threads = min(intra_op_threads() if threads is None else threads, count)
    if threads <= 1:
        for index in range(count):
            body(index)
        return
    global _handoffs
    _handoffs += 1  # NOTE: unlocked: a count for timing code, not an exact statistic under threads
    state = _Shared(body, count)
    for _ in range(threads - 1):
        _kernel_pool().submit(state.drain)
    state.drain()
    state.wait()


def pool_handoffs() -> int:
    """How many ``parallel_for`` calls have handed items to the Python pool's threads: timing code
    compares it before and after a call to learn whether the call splits there (``estimate.timing.timed_first_call``)."""
    return _handoffs


#: Below this many output elements a range of planes is not worth a thread hand-off (~20 us).
MIN_ELEMENTS_PER_THREAD = 32_768


def parallel_planes(body: Callable[[int, int], None], planes: int, elements_per_plane: int) -> None:
    """Run ``body(first, last)`` over contiguous ranges of ``planes`` output planes, one range per thread
    (``intra_op_threads``), with no more threads than ranges of at least ``MIN_ELEMENTS_PER_THREAD``
    output elements (for the compiled per-plane kernels, which release the GIL)."""
    threads = _ranges(planes, elements_per_plane, _python_pool_minimum())
    if threads == 1:
        body(0, planes)  # NOTE: without parallel_for's closures: ~1 us, a fifth of a small pool's loop
        return
    bounds = [planes * part // threads for part in range(threads + 1)]  # NOTE: np.linspace costs ~30 us
    parallel_for(lambda part: body(bounds[part], bounds[part + 1]), threads, threads)


#: The same while a run leaves BLAS its own threads (one example through a network too large to spin):
#: OpenBLAS's workers spin on the cores after each product, and a range handed to the Python pool
#: waits for them. Measured at batch 1, 2 threads, one process alternating thresholds (minimums):
#: 32 Ki -> 1 Mi elements, shufflenet 5.88 -> 5.42 ms, mobilenetv2 8.93 -> 8.22, squeezenet 6.50 ->
#: 6.27, resnet50 55.7 -> 53.0, googlenet 25.2 -> 24.4 (512 Ki and 2 Mi measured alike).
MIN_ELEMENTS_BESIDE_BLAS_THREADS = 1 << 20


def _python_pool_minimum() -> int:
    """Output elements below which a range of planes is not handed to the Python pool: the same beside a
    spinning pool's workers as beside BLAS's (they hold the cores). At batch 1, A/B in alternating
    processes (minimums): inception_v2 0.94x the time, alexnet 0.95, mobilenetv2, squeezenet and
    densenet121 0.96, resnet50 0.98, googlenet 1.02."""
    if _own_threads and _spinning is None:
        return MIN_ELEMENTS_PER_THREAD
    return MIN_ELEMENTS_BESIDE_BLAS_THREADS


#: Below this many output elements a range of planes is not worth a part of a compiled split
#: (``plane_parts``): a hand-off to numba's spinning workers costs a few microseconds (a 17 us loop
#: split in two ran in 12 us; depthwise 3x3 on 240x28x28 273 -> 158 us, 206 on the Python pool).
MIN_ELEMENTS_PER_PART = 8_192

#: Output elements from which a range of planes is worth a share of a spinning run's split
#: (``spin_plane_shares``; a small pool's 3x3/2 max on 32x32x32 gained from two shares of 2,048).
MIN_OUTPUTS_PER_SPIN_SHARE = 2048
#: Shares per thread of a spinning run's split (planes here, the tile GEMM's products in ``own_gemm``):
#: threads claim them one at a time, so a thread the hypervisor stalls leaves its later share to the
#: other. resnet50 at batch 1 (pointwise layers, in-run): 1 share a thread 23.8 ms, 2 22.6, 4 23.3.
SPIN_SHARES_PER_THREAD = 2


def spin_split(planes: int, outputs_per_plane: int, arrays: Sequence[np.ndarray]) -> tuple[SpinPool, int] | None:
    """(the spinning run's pool, the shares) where a compiled per-plane loop over ``arrays`` splits as a
    spin-pool job: a spinning run (``spinning``), float32 C-contiguous arrays (a job reads them by
    address and shape), and two shares' worth of planes at least (``spin_plane_shares``); else None."""
    pool = _spinning
    if pool is None or not all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays):
        return None
    shares = spin_plane_shares(planes, outputs_per_plane, intra_op_threads())
    return (pool, shares) if shares > 1 else None


def spin_parts(planes: int, outputs_per_plane: int, arrays: Sequence[np.ndarray]) -> int:
    """The chunks a per-plane loop's spin-pool job runs in, as ``spin_split`` splits it; 1 (the whole loop
    on the calling thread) where it does not split: what a captured run replays (``runtime.replay``)."""
    found = spin_split(planes, outputs_per_plane, arrays)
    return 1 if found is None else found[1]


def spin_plane_shares(planes: int, outputs_per_plane: int, threads: int) -> int:
    """How many ranges of ``planes`` output planes a compiled kernel splits into on a spinning run's
    pool (a spin-pool job's chunks): ``SPIN_SHARES_PER_THREAD`` per thread, none under
    ``MIN_OUTPUTS_PER_SPIN_SHARE`` outputs. 1 means: run them all on the calling thread.

    Why not the Python pool (``parallel_planes``): beside a spinning worker its thread has no core of
    its own; one image's depthwise Conv 96x112x112/2 took 384 us in mobilenetv2 there, 144 us here."""
    if threads <= 1:
        return 1
    return max(1, min(threads * SPIN_SHARES_PER_THREAD, planes, planes * outputs_per_plane // MIN_OUTPUTS_PER_SPIN_SHARE))


def split_planes(
    body: Callable[[int, int], None], driver: Callable[[int], None], planes: int, elements_per_plane: int
) -> None:
    """Run a compiled per-plane loop over ``planes`` output planes: ``driver(parts)`` (its numba
    ``prange`` over ``parts`` ranges) while a run uses numba's pool (``own_threads(numba_pool=True)``),
    else ``body(first, last)`` over ranges on the Python pool (``parallel_planes``)."""
    if not _numba_pool:
        parallel_planes(body, planes, elements_per_plane)
        return
    parts = plane_parts(planes, elements_per_plane)
    if parts == 1:
        body(0, planes)
    else:
        driver(parts)


def run_planes(
    loop: Callable[..., None],
    driver: Callable[..., None],
    head: tuple,
    tail: tuple,
    planes: int,
    per_plane: int,
) -> None:
    """A kernel's ``loop(*head, first, last, *tail)`` over ``planes`` output planes of ``per_plane``
    elements, split over the kernel threads (``split_planes``; ``driver(parts, *head, *tail)`` is
    its numba-pool form) where that pays."""
    if split_ranges(planes, per_plane) == 1:
        loop(*head, 0, planes, *tail)  # NOTE: no closures: ~1 us, a third of a 4x4 output's pool
        return
    split_planes(
        lambda first, last: loop(*head, first, last, *tail),
        lambda parts: driver(parts, *head, *tail),
        planes, per_plane,
    )  # fmt: skip


def plane_parts(planes: int, elements_per_plane: int) -> int:
    """How many contiguous ranges of ``planes`` output planes a compiled kernel's parallel driver (a
    numba ``prange`` over the ranges) splits them into: one per kernel thread (``intra_op_threads``),
    with no range under ``MIN_ELEMENTS_PER_PART`` output elements. 1 means: call the loop directly."""
    return _ranges(planes, elements_per_plane, MIN_ELEMENTS_PER_PART)


def split_ranges(planes: int, elements_per_plane: int) -> int:
    """How many ranges ``split_planes`` runs ``planes`` output planes in: 1 means the caller may run its
    loop over them all itself (a small kernel's closures for ``split_planes`` cost ~1 us)."""
    minimum = MIN_ELEMENTS_PER_PART if _numba_pool else _python_pool_minimum()
    return _ranges(planes, elements_per_plane, minimum)


def _ranges(planes: int, elements_per_plane: int, minimum: int) -> int:
    """One range of planes per kernel thread (``intra_op_threads``), none under ``minimum`` output
    elements, at least one."""
    return max(1, min(intra_op_threads(), planes, planes * elements_per_plane // minimum))


class _Shared:
    """Work items handed out one at a time to whichever thread asks next."""

    def __init__(self, body: Callable[[int], None], count: int):
        self.body = body
        self.count = count
        self.next = 0
        self.finished = 0
        self.error: BaseException | None = None
        self.done = threading.Condition()

    def drain(self) -> None:
        while True:
            with self.done:
                if self.next >= self.count or self.error is not None:
                    return
                index = self.next
                self.next += 1
            try:
                self.body(index)
            except BaseException as error:  # noqa: BLE001  (re-raised by the caller in wait)
                with self.done:
                    self.error = self.error or error
            with self.done:
                self.finished += 1
                self.done.notify_all()

    def wait(self) -> None:
        with self.done:
            # Items never handed out (after an error) count as finished.
            while self.finished < self.next:
                self.done.wait()
        if self.error is not None:
            raise self.error
