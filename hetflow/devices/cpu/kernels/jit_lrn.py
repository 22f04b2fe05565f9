"""LRN across channels compiled with numba: one pass that reads X's window and writes Y once.

numpy's blocked form (``norm.lrn``) makes about ten passes over each block (the scaled squares, one add
per window offset, two square roots, a product, the division), each a whole array the size of the
block. Here a run of ``RUN`` positions of one image is taken channel by channel: the channel's window
sum of squares is accumulated over its ``size`` channels in a buffer of ``RUN`` floats (every row read
is in L1), then Y = X * (bias + alpha / size * sum) ** -beta is written, beta 0.75, 0.5 and 1 through
square roots. Measured on one core (minimums, float32, AlexNet's constants) against that numpy form:
GoogLeNet's 64x56x56 LRN 444 -> 137 us, its 192x56x56 1514 -> 440 us, AlexNet's 96x55x55 692 -> 218 us;
split on a spinning run's two threads 75, 292 and 115 us.

Work is split by runs of positions (``RUN``, all channels each): over the kernel threads as other
compiled loops are (``threads.run_planes``), or, float32, on a spinning run's pool as a job.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_3d
from hetflow.devices.cpu.threads import run_planes, spin_split

#: Positions taken together: long enough for the vector loops, short enough that the window's rows stay
#: in L1 (``size`` rows of ``RUN`` floats and the sum).
RUN = 256


def lrn(x: np.ndarray, y: np.ndarray, before: int, after: int, alpha: float, beta: float, bias: float) -> None:
    """``y`` = LRN of ``x`` (both ``[N, C, P]``, C-contiguous, one float dtype) over the channels ``c -
    before .. c + after`` (clipped to X's), with ONNX's ``alpha`` (divided by the window's size here),
    ``beta`` and ``bias``."""
    runs, per_run = _work(x)
    constants = _constants(x.dtype, before, after, alpha, beta, bias)
    found = spin_split(runs, per_run, (x, y))
    if found is not None:
        pool, shares = found
        _bound(x, y, before, after, constants, shares).run(pool)
        return
    run_planes(_runs, _split, (x, y), (before, after, constants), runs, per_run)


def lrn_job(x: np.ndarray, y: np.ndarray, before: int, after: int, alpha: float, beta: float, bias: float) -> Job:
    """``lrn`` on float32 arrays as a spin-pool job, what a captured run replays: in the shares a
    spinning run splits it into (``spin_split``), else one chunk."""
    runs, per_run = _work(x)
    found = spin_split(runs, per_run, (x, y))
    constants = _constants(x.dtype, before, after, alpha, beta, bias)
    return _bound(x, y, before, after, constants, 1 if found is None else found[1])


def _work(x: np.ndarray) -> tuple[int, int]:
    """(runs of ``RUN`` positions over the batch, the elements of one run) of ``x [N, C, P]``."""
    batch, channels, positions = x.shape
    return batch * -(-positions // RUN), channels * min(RUN, positions)


def _constants(dtype: np.dtype, before: int, after: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    return np.array([alpha / (before + after + 1), beta, bias, 1.0], dtype)


def _bound(x: np.ndarray, y: np.ndarray, before: int, after: int, constants: np.ndarray, shares: int) -> Job:
    block = argument_block(_BLOCK_SLOTS, (x, y, constants), (before, after))
    return Job(_job_address(), block, shares, (x, y, constants))


# NOTE: indices are unsigned sums on the flat arrays (numba tests a signed index for wraparound, and
# that test keeps the loops from vectorising; see jit_phases), and the error model is numpy's (Python's
# tests every division for zero, which kept the factor's loop scalar: 8 ns an element).
@numba.njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _runs(x, y, first, last, before, after, constants):  # noqa: ANN001, ANN202
    """Runs ``first .. last - 1`` of ``RUN`` positions (run r: image r // runs, its (r % runs)-th run)."""
    batch, channels, positions = x.shape
    runs = (positions + RUN - 1) // RUN
    scale, beta, bias, one = constants[0], constants[1], constants[2], constants[3]
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    total = np.empty(RUN, x.dtype)
    for item in range(first, last):
        image, start = item // runs, (item % runs) * RUN
        count = np.uint64(min(RUN, positions - start))
        for c in range(channels):
            for p in range(count):
                total[p] = 0.0
            for k in range(max(0, c - before), min(channels, c + after + 1)):
                row = np.uint64((image * channels + k) * positions + start)
                for p in range(count):
                    value = flat_x[row + p]
                    total[p] += value * value
            # The factor 1 / (bias + scale * sum) ** beta in place, one loop per exponent (a branch inside
            # the loop, or X and Y in it, kept it scalar), then Y = X * factor.
            if beta == 0.75:
                for p in range(count):
                    root = np.sqrt(bias + scale * total[p])
                    total[p] = one / (root * np.sqrt(root))
            elif beta == 0.5:
                for p in range(count):
                    total[p] = one / np.sqrt(bias + scale * total[p])
            elif beta == 1.0:
                for p in range(count):
                    total[p] = one / (bias + scale * total[p])
            else:
                for p in range(count):
                    total[p] = (bias + scale * total[p]) ** -beta
            at = np.uint64((image * channels + c) * positions + start)
            for p in range(count):
                flat_y[at + p] = flat_x[at + p] * total[p]


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, y, before, after, constants):  # noqa: ANN001, ANN202
    """``_runs`` over ``parts`` ranges of the runs, by numba's threads."""
    count = x.shape[0] * ((x.shape[2] + RUN - 1) // RUN)
    for part in numba.prange(parts):
        _runs(x, y, count * part // parts, count * (part + 1) // parts, before, after, constants)


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block: X, Y (3-D each), the constants (alpha / size, beta, bias, 1; 1-D),
#: then before and after.
_BLOCK_SLOTS = 4 + 4 + 2 + 2


def _job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of the runs through ``_runs``, as a spin-pool job."""
    x, y = float32_3d(args, 0), float32_3d(args, 4)
    constants = float32_1d(args, 8)
    count = x.shape[0] * ((x.shape[2] + RUN - 1) // RUN)
    _runs(x, y, count * chunk // chunks, count * (chunk + 1) // chunks, args[10], args[11], constants)


@functools.cache
def _job_address() -> int:
    return spin_pool.job(_job)
