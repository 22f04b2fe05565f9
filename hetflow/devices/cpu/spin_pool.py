"""A pool of threads that spin between a run's splits, so that a kernel of a few microseconds can split.

Why: on a small VM a sleeping thread takes ~100 us to wake (hetflow's Python pool, numba's pool when
its workers have gone to sleep), which is more than most of a small network's layers take at batch 1;
and numba's ``prange`` regions hand each thread fixed items, so one thread off its core (OpenBLAS's
spinning workers, another process) holds the whole call up. Here:

- the workers spin (with the CPU's pause hint) while a run is active (``spinning``) and for a short
  grace after it (``GRACE_SPINS``), then sleep until the next run wakes them;
- a job is cut into chunks that every thread, the caller included, claims one at a time (a
  compare-and-swap on one word that also holds the job's sequence number, so a late worker can never
  claim a chunk of a finished job): a worker that is not on a core simply gets no chunk, and the caller
  never waits for a thread that has not started;
- the caller claims chunks from the first on, the workers from the last one back, so that with two
  threads each keeps writing the same part of each output, run after run, and reads the part of its
  input it wrote itself wherever two jobs split alike. On this VM the two vCPUs sometimes sit on
  different L3 domains (``hetflow.estimate.spells``): a line the other core wrote then comes over the
  fabric (4 MB read in 150 us against 75), and a store to it waits for the other core to give it up.
  In one session, blocks of runs alternating between the two ways of claiming (2026-12-06, Zen 4 VM),
  median ratio back / front with the L3 shared and split: mobilenetv2 b1 0.971 / 0.912, shufflenet b1
  0.964 / 0.922, resnet50 b1 0.996 / 0.975, squeezenet b1 1.002 / 0.989;
- a job is a compiled function taking its argument block (an ``int64`` array: addresses, sizes) and a
  chunk, called by address (``numba.cfunc``), so workers run it without the GIL and the pool knows
  nothing about the kernels (``job`` compiles one; ``put_array`` and ``job_arguments`` fill its block).

One job runs at a time: a call made while the pool is busy (a second session in another thread) runs
its chunks on the calling thread alone.

Measured (LeNet's fc1, 800x500 GEMV, float32): one thread 21 us; split in two here 11 us.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import literal_unroll, types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow_lite import spinning

#: A job's compiled function: ``void(args, chunk, chunks)``, ``args`` the address of its argument block.
JOB_SIGNATURE = types.void(types.CPointer(types.int64), types.int64, types.int64)

# The shared state's layout, the job word and the workers' grace: one place for this pool and a compiled
# package's runtime (``hetflow_lite.spinning``).
_WORD, _DONE, _JOB, _ARGS, _CHUNKS = spinning.WORD, spinning.DONE, spinning.JOB, spinning.ARGS, spinning.CHUNKS
_SPIN, _STOP, _STATE_SLOTS = spinning.SPIN, spinning.STOP, spinning.STATE_SLOTS
_BACK_SHIFT, _SEQUENCE_SHIFT, _CHUNK_MASK = spinning.BACK_SHIFT, spinning.SEQUENCE_SHIFT, spinning.CHUNK_MASK
MAX_CHUNKS = spinning.MAX_CHUNKS
GRACE_SPINS = spinning.GRACE_SPINS


# -- atomics and calls by address, as numba intrinsics ------------------------------------------
def _slot_pointer(context, builder, array_type, array, index):  # noqa: ANN001, ANN202
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])


@intrinsic
def _load(typingctx, state, index):  # noqa: ANN001, ANN202
    """``state[index]``, an acquiring atomic load (never hoisted out of a spin loop)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(pointer, "acquire", 8)

    return types.int64(state, index), codegen


@intrinsic
def _store(typingctx, state, index, value):  # noqa: ANN001, ANN202
    """``state[index] = value``, a releasing atomic store."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], pointer, "release", 8)
        return context.get_dummy_value()

    return types.void(state, index, value), codegen


@intrinsic
def _add(typingctx, state, index, value):  # noqa: ANN001, ANN202
    """``state[index] += value`` atomically; returns the old value."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", pointer, args[2], "seq_cst")

    return types.int64(state, index, value), codegen


@intrinsic
def _swap_if(typingctx, state, index, expected, value):  # noqa: ANN001, ANN202
    """Compare-and-swap: ``state[index] = value`` if it holds ``expected``; returns whether it did."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        result = builder.cmpxchg(pointer, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(result, 1)

    return types.boolean(state, index, expected, value), codegen


_PAUSE = "llvm.x86.sse2.pause" if os.uname().machine in ("x86_64", "AMD64", "i686") else None


@intrinsic
def _pause(typingctx):  # noqa: ANN001, ANN202
    """The CPU's spin-wait hint (x86's ``pause``; nothing elsewhere)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        if _PAUSE is not None:
            builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), _PAUSE), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _call_job(typingctx, job, args, chunk, chunks):  # noqa: ANN001, ANN202
    """Call the job function at address ``job`` with the argument block at address ``args``."""

    def codegen(context, builder, signature, values):  # noqa: ANN001, ANN202
        integer = ir.IntType(64)
        function_type = ir.FunctionType(ir.VoidType(), [integer.as_pointer(), integer, integer])
        function = builder.inttoptr(values[0], function_type.as_pointer())
        builder.call(function, [builder.inttoptr(values[1], integer.as_pointer()), values[2], values[3]])
        return context.get_dummy_value()

    return types.void(job, args, chunk, chunks), codegen


# -- the claiming loop, shared by the caller and the workers ---------------------------------------
@numba.njit(nogil=True, cache=True)
def _work_on(state, word, from_back):  # noqa: ANN001, ANN202
    """Claim and run chunks of the job ``word`` announced until none is left or a newer job replaced it:
    the caller claims from the first chunk on, the workers from the last one back (``from_back``)."""
    sequence = word >> _SEQUENCE_SHIFT
    job, args, chunks = _load(state, _JOB), _load(state, _ARGS), _load(state, _CHUNKS)
    while True:
        front, back = word & _CHUNK_MASK, (word >> _BACK_SHIFT) & _CHUNK_MASK
        if word >> _SEQUENCE_SHIFT != sequence or front + back >= chunks:
            return
        if from_back:
            chunk, claimed = chunks - 1 - back, word + (1 << _BACK_SHIFT)
        else:
            chunk, claimed = front, word + 1
        if _swap_if(state, _WORD, word, claimed):
            _call_job(job, args, chunk, chunks)
            _add(state, _DONE, 1)
        word = _load(state, _WORD)


@numba.njit(nogil=True, cache=True)
def _serve(state, seen, grace):  # noqa: ANN001, ANN202
    """A worker's loop: run the chunks of every new job; return the last sequence seen once no run has
    been active for ``grace`` spins (or on stop)."""
    idle = 0
    while _load(state, _STOP) == 0:
        word = _load(state, _WORD)
        if word >> _SEQUENCE_SHIFT != seen:
            seen = word >> _SEQUENCE_SHIFT
            _work_on(state, word, True)
            idle = 0
        elif _load(state, _SPIN) == 0:
            idle += 1
            if idle > grace:
                break
        _pause()
    return seen


@numba.njit(nogil=True, cache=True)
def _dispatch(state, job, block, chunks):  # noqa: ANN001, ANN202
    """Announce a job on the argument block ``block``, claim its chunks beside the workers, and wait
    until every chunk is done."""
    _dispatch_at(state, job, block.ctypes.data, chunks)


@numba.njit(nogil=True, cache=True)
def _dispatch_at(state, job, args, chunks):  # noqa: ANN001, ANN202
    """``_dispatch`` with the argument block at address ``args``.

    The last job's word is closed (its chunk field set past any count) before this job's parameters are
    written: a worker late to the last job may read them with that job's word, and its claim must fail.
    Without it, jobs dispatched back to back from compiled code (a replayed run, an RNN's steps) ran a
    chunk of the next job twice, once with the last job's sequence."""
    last = _load(state, _WORD)
    _store(state, _WORD, last | _CHUNK_MASK)
    _store(state, _JOB, job)
    _store(state, _ARGS, args)
    _store(state, _CHUNKS, chunks)
    _store(state, _DONE, 0)
    word = ((last >> _SEQUENCE_SHIFT) + 1) << _SEQUENCE_SHIFT
    _store(state, _WORD, word)
    _work_on(state, word, False)
    while _load(state, _DONE) < chunks:
        _pause()


@numba.njit(nogil=True, cache=True)
def _run_alone(job, block, chunks):  # noqa: ANN001, ANN202
    args = block.ctypes.data
    for chunk in range(chunks):
        _call_job(job, args, chunk, chunks)


#: ``run_steps``' step slot for a job that reads no step index (``run``).
NO_STEP_SLOT = -1


@numba.njit(nogil=True, cache=True)
def _dispatch_steps(state, job, block, chunks, steps, step_slot, alone):  # noqa: ANN001, ANN202
    """``_dispatch`` (or ``_run_alone`` when ``alone``) ``steps`` times, the step's index written into
    ``block[step_slot]`` before each (unless ``NO_STEP_SLOT``): every chunk of a step has finished before
    the next step starts."""
    for step in range(steps):
        if step_slot != NO_STEP_SLOT:
            block[step_slot] = step
        if alone:
            _run_alone(job, block, chunks)
        else:
            _dispatch(state, job, block, chunks)


@numba.njit(nogil=True, cache=True)
def _replay(state, jobs, blocks, chunks, alone, stamps):  # noqa: ANN001, ANN202
    """Job ``i`` (at address ``jobs[i]``, its argument block at ``blocks[i]``) in ``chunks[i]`` chunks, for
    every ``i`` in order: on the workers beside the caller, or on the caller ``alone``; one chunk always
    on the caller. Every chunk of a job has finished before the next job starts. Where ``stamps`` has
    room (one more than there are jobs), the cycle counter is read into it before the first job and
    after each (``replay_stamped``)."""
    stamped = stamps.shape[0] > jobs.shape[0]
    if stamped:
        stamps[0] = _cycles()
    for index in range(jobs.shape[0]):
        count = chunks[index]
        if alone or count == 1:
            for chunk in range(count):
                _call_job(jobs[index], blocks[index], chunk, count)
        else:
            _dispatch_at(state, jobs[index], blocks[index], count)
        if stamped:
            stamps[index + 1] = _cycles()


@intrinsic
def _cycles(typingctx):  # noqa: ANN001, ANN202
    """The CPU's cycle counter (``llvm.readcyclecounter``: x86's ``rdtsc``, a constant rate on current
    CPUs; 0 where the target has none)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        counter = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                                 "llvm.readcyclecounter")  # fmt: skip
        return builder.call(counter, [])

    return types.int64(), codegen


#: ``_replay``'s stamps when a replay is not timed.
_NO_STAMPS = np.zeros(0, np.int64)


def replay_stamped(script: JobScript, pool: SpinPool | None) -> np.ndarray:
    """``replay_on``, timed: the cycles each of ``script``'s jobs took, in order (a profile of a replayed
    run with nothing around its jobs; ``cycles_per_second`` converts them)."""
    stamps = np.zeros(len(script) + 1, np.int64)
    if len(script) == 0:
        return stamps[1:]
    if pool is None:
        _replay(_NO_STATE, script.addresses, script.blocks, script.chunks, True, stamps)
    else:
        pool.replay(script, stamps)
    return np.diff(stamps)


@numba.njit(nogil=True, cache=True)
def _read_cycles():  # noqa: ANN202
    return _cycles()


def cycles_per_second(seconds: float = 0.05) -> float:
    """The cycle counter's rate (``replay_stamped``), measured against ``time.perf_counter``."""
    _read_cycles()  # compiled before the measurement
    start, cycles = time.perf_counter(), _read_cycles()
    while time.perf_counter() - start < seconds:
        pass
    return (_read_cycles() - cycles) / (time.perf_counter() - start)


# -- argument blocks --------------------------------------------------------------------------------
def _pointer_intrinsic(element: ir.Type, numba_type: types.Type):  # noqa: ANN202
    """An intrinsic turning an integer address into a pointer to ``element`` (numba's ``numba_type``)."""

    @intrinsic
    def pointer(typingctx, address):  # noqa: ANN001, ANN202
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            return builder.inttoptr(args[0], element.as_pointer())

        return types.CPointer(numba_type)(address), codegen

    return pointer


_float32_pointer = _pointer_intrinsic(ir.FloatType(), types.float32)
_int32_pointer = _pointer_intrinsic(ir.IntType(32), types.int32)
_int64_pointer = _pointer_intrinsic(ir.IntType(64), types.int64)


@numba.njit(nogil=True, cache=True, inline="always")
def float32_matrix(address, rows, columns):  # noqa: ANN001, ANN201
    """The C-contiguous ``rows x columns`` float32 matrix at ``address`` (an integer)."""
    return numba.carray(_float32_pointer(address), (rows, columns))


@numba.njit(nogil=True, cache=True, inline="always")
def float32_1d(args, slot):  # noqa: ANN001, ANN201
    """The float32 vector at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    return numba.carray(_float32_pointer(args[slot]), (args[slot + 1],))


@numba.njit(nogil=True, cache=True, inline="always")
def float32_2d(args, slot):  # noqa: ANN001, ANN201
    """The C-contiguous float32 matrix at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    return numba.carray(_float32_pointer(args[slot]), (args[slot + 1], args[slot + 2]))


@numba.njit(nogil=True, cache=True, inline="always")
def float32_3d(args, slot):  # noqa: ANN001, ANN201
    """The C-contiguous 3-D float32 array at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    return numba.carray(_float32_pointer(args[slot]), (args[slot + 1], args[slot + 2], args[slot + 3]))


@numba.njit(nogil=True, cache=True, inline="always")
def float32_4d(args, slot):  # noqa: ANN001, ANN201
    """The C-contiguous 4-D float32 array at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    shape = (args[slot + 1], args[slot + 2], args[slot + 3], args[slot + 4])
    return numba.carray(_float32_pointer(args[slot]), shape)


@numba.njit(nogil=True, cache=True, inline="always")
def int32_1d(args, slot):  # noqa: ANN001, ANN201
    """The int32 vector at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    return numba.carray(_int32_pointer(args[slot]), (args[slot + 1],))


@numba.njit(nogil=True, cache=True, inline="always")
def int64_1d(args, slot):  # noqa: ANN001, ANN201
    """The int64 vector at ``slot`` of an argument block (as ``put_array`` wrote it)."""
    return numba.carray(_int64_pointer(args[slot]), (args[slot + 1],))


@numba.njit(nogil=True, cache=True, inline="always")
def put_array(block, slot, array):  # noqa: ANN001, ANN201
    """Write a C-contiguous ``array`` at ``slot`` of the argument block ``block``: its address, then its
    dimensions (``float32_1d`` ... ``int64_1d`` read it back). Returns the next free slot."""
    block[slot] = array.ctypes.data
    for axis in range(array.ndim):
        block[slot + 1 + axis] = array.shape[axis]
    return slot + 1 + array.ndim


@numba.njit(nogil=True, cache=True)
def put_arrays(block, slot, arrays):  # noqa: ANN001, ANN201
    """``put_array`` each of the C-contiguous ``arrays`` (a tuple, of any dtypes and ranks) in turn from
    ``slot``; returns the next free slot."""
    for array in literal_unroll(arrays):
        slot = put_array(block, slot, array)
    return slot


@numba.njit(nogil=True, cache=True, inline="always")
def put_values(block, slot, values):  # noqa: ANN001, ANN201
    """Write the integers ``values`` (a tuple) from ``slot`` of the argument block ``block``; returns the
    next free slot."""
    for value in values:
        block[slot] = value
        slot += 1
    return slot


def argument_block(slots: int, arrays: tuple[np.ndarray, ...], numbers: tuple[int, ...]) -> np.ndarray:
    """A job's argument block of ``slots`` int64: ``arrays`` (C-contiguous; ``put_arrays``) then
    ``numbers``, filled in compiled code."""
    block = np.zeros(slots, np.int64)
    put_values(block, put_arrays(block, 0, arrays), numbers)
    return block


ArgumentItem = np.ndarray | int | bool


def job_arguments(items: Sequence[ArgumentItem]) -> np.ndarray:
    """The argument block of ``items``: an int for an int or bool; for an array (C-contiguous), its
    address then its dimensions (as ``put_array`` writes them). The caller keeps the arrays alive while
    the block is in use. ~1 us an array: hot paths fill their blocks in compiled code (``put_array``)."""
    block: list[int] = []
    for item in items:
        if isinstance(item, np.ndarray):
            if not item.flags.c_contiguous:
                raise ValueError("a job's arrays must be C-contiguous")
            block += [item.ctypes.data, *item.shape]
        else:
            block.append(int(item))
    return np.array(block, dtype=np.int64)


# -- jobs bound to their arrays, and scripts of them ------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One call of a compiled job (``job``) on its own argument block: what a captured run replays
    (``JobScript``). ``keep`` holds the arrays the block's addresses point into, alive as long as the job."""

    address: int
    block: np.ndarray
    chunks: int
    keep: tuple[object, ...] = ()
    #: Whether it calls BLAS from compiled code (``jit_gemm``'s CBLAS parts): a run that replays it holds
    #: BLAS at its arrangement's count (``executor.Program.run``), else OpenBLAS's own workers wake beside
    #: the spinning threads on every part.
    calls_blas: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.chunks <= MAX_CHUNKS:
            raise ValueError(f"a job has 1 to {MAX_CHUNKS} chunks, not {self.chunks}")

    def run(self, pool: SpinPool | None) -> None:
        """Run the job now: its chunks on ``pool`` beside the caller, or on the caller alone (None)."""
        if pool is None:
            _run_alone(self.address, self.block, self.chunks)
        else:
            pool.run(self.address, self.block, self.chunks)


class JobScript:
    """Jobs that one compiled call runs in order (``SpinPool.replay``, ``replay_alone``): layers of a
    captured run with no Python between them."""

    def __init__(self, jobs: Sequence[Job]):
        self.jobs = tuple(jobs)
        self.addresses = np.array([job.address for job in self.jobs], np.int64)
        self.blocks = np.array([job.block.ctypes.data for job in self.jobs], np.int64)
        self.chunks = np.array([job.chunks for job in self.jobs], np.int64)

    def __len__(self) -> int:
        return len(self.jobs)


def replay_alone(script: JobScript) -> None:
    """Every job of ``script`` in order, every chunk on the calling thread."""
    _replay(_NO_STATE, script.addresses, script.blocks, script.chunks, True, _NO_STAMPS)


def replay_on(script: JobScript, pool: SpinPool | None) -> None:
    """``script``'s jobs in order, split on ``pool`` beside the caller (``SpinPool.replay``), or with
    every chunk on the caller (None)."""
    if len(script) == 0:
        return
    if pool is None:
        replay_alone(script)
    else:
        pool.replay(script)


#: The state ``_replay`` is given when it runs alone (it never reads it then).
_NO_STATE = np.zeros(_STATE_SLOTS, dtype=np.int64)


# -- the pool ------------------------------------------------------------------------------------
class SpinPool(spinning.SpinningThreads):
    """``workers`` spinning threads beside the caller (``run``), started on first use."""

    def serve(self, seen: int) -> int:
        return _serve(self.state, seen, self.grace)

    def run(self, job: int, args: np.ndarray, chunks: int) -> None:
        """Run the job at address ``job`` (a ``JOB_SIGNATURE`` cfunc) on ``args`` in ``chunks`` chunks,
        the calling thread taking chunks too; returns when all are done."""
        self.run_steps(job, args, chunks, 1, NO_STEP_SLOT)

    def run_steps(self, job: int, args: np.ndarray, chunks: int, steps: int, step_slot: int) -> None:
        """``run`` the job ``steps`` times in a row, from compiled code, with the step's index in
        ``args[step_slot]`` (none written for ``NO_STEP_SLOT``): a recurrence whose step splits (an RNN's
        time steps) never returns to Python between its steps."""
        if chunks < 1 or steps < 1:
            return
        if chunks > MAX_CHUNKS:
            raise ValueError(f"a job has at most {MAX_CHUNKS} chunks, not {chunks}")
        if self.workers < 1 or chunks == 1 or not self._busy.acquire(blocking=False):
            # NOTE: the block's address is taken in compiled code: ``ctypes.data`` costs ~1 us here.
            _dispatch_steps(self.state, job, args, chunks, steps, step_slot, True)
            return
        try:
            self.start()
            _dispatch_steps(self.state, job, args, chunks, steps, step_slot, False)
        finally:
            self._busy.release()

    def replay(self, script: JobScript, stamps: np.ndarray = _NO_STAMPS) -> None:
        """Run ``script``'s jobs in order, each split over the workers and the caller, from one compiled
        call (on the caller alone while the pool is busy); ``stamps``: see ``_replay``."""
        alone = self.workers < 1 or not self._busy.acquire(blocking=False)
        if alone:
            _replay(_NO_STATE, script.addresses, script.blocks, script.chunks, True, stamps)
            return
        try:
            self.start()
            _replay(self.state, script.addresses, script.blocks, script.chunks, False, stamps)
        finally:
            self._busy.release()


#: Every job compiled in this process: its address -> its Python function, what a compiled package's
#: shared library is built from (``hetflow.devices.cpu.native_library``).
COMPILED_JOBS: dict[int, Callable[..., None]] = {}


def job(function: Callable[..., None]) -> int:
    """The address of ``function`` compiled as a job (``JOB_SIGNATURE``; cached on disk)."""
    address = numba.cfunc(JOB_SIGNATURE, nogil=True, cache=True)(function).address
    COMPILED_JOBS[address] = function
    return address


# -- entry points of a compiled package's shared library (``hetflow_lite``) -------------------------
_INT64_POINTER = types.CPointer(types.int64)
#: ``replay_entry``: void(state, jobs, blocks, chunks, count, alone), each array by its address.
REPLAY_ENTRY_SIGNATURE = types.void(_INT64_POINTER, _INT64_POINTER, _INT64_POINTER, _INT64_POINTER, types.int64,
                                    types.int64)  # fmt: skip
#: ``serve_entry``: int64(state, seen, grace).
SERVE_ENTRY_SIGNATURE = types.int64(_INT64_POINTER, types.int64, types.int64)


def replay_entry(state, jobs, blocks, chunks, count, alone):  # noqa: ANN001, ANN201
    """``_replay`` (untimed) on arrays given by address: a compiled package's whole run in one call."""
    jobs_array = numba.carray(jobs, (count,))
    _replay(numba.carray(state, (_STATE_SLOTS,)), jobs_array, numba.carray(blocks, (count,)),
            numba.carray(chunks, (count,)), alone != 0, jobs_array[:0])  # fmt: skip


def serve_entry(state, seen, grace):  # noqa: ANN001, ANN201
    """``_serve`` on the state at ``state``: a compiled package's worker loop."""
    return _serve(numba.carray(state, (_STATE_SLOTS,)), seen, grace)
