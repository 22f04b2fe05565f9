"""Rows of one float32 array copied into another as a spin-pool job: what a captured run replays for a
Split (each piece a run of rows of X, ``hetflow.runtime.replay``); and planes transposed into another
(``transpose_planes_job``: an LSTM batch's time-major X into the columns its steps read, its states back).

Why: a step called from Python between replayed ones costs its interpreter and cache misses (~20-80 us
at batch 1), and a run that calls any step cannot become a compiled package (``hetflow compile``).
AlexNet's grouped convolutions split their input in two (the ONNX file's Split nodes) three times.
"""

from __future__ import annotations

import functools

import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, float32_1d

#: Slots of ``copy_rows_job``'s block: X and Y (1-D each), rows, start, stride, length.
_BLOCK_SLOTS = 8


def copy_rows_job(x: np.ndarray, y: np.ndarray, rows: int, start: int, stride: int, chunks: int = 1) -> Job:
    """``y``'s ``rows`` rows (each ``y.size // rows`` elements, contiguous) copied from ``x`` (flat,
    C-contiguous) at ``start + row * stride``, as a job of ``chunks`` runs of rows."""
    length = y.size // rows
    if rows * length != y.size or start + (rows - 1) * stride + length > x.size:
        raise ValueError("the rows do not fit X or Y")
    block = np.zeros(_BLOCK_SLOTS, np.int64)
    block[:] = [x.ctypes.data, x.size, y.ctypes.data, y.size, rows, start, stride, length]
    return Job(_copy_rows_address(), block, max(1, min(chunks, rows)), (x, y))


def _copy_rows_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``copy_rows_job``'s copy of chunk ``chunk``'s rows."""
    x, y = float32_1d(args, 0), float32_1d(args, 2)
    rows, start, stride, length = args[4], args[5], args[6], args[7]
    for row in range(rows * chunk // chunks, rows * (chunk + 1) // chunks):
        source = start + row * stride
        y[row * length : (row + 1) * length] = x[source : source + length]


@functools.cache
def _copy_rows_address() -> int:
    return spin_pool.job(_copy_rows_job)


#: Slots of ``transpose_planes_job``'s block: X and Y (1-D each), planes, rows, columns, inner.
_TRANSPOSE_SLOTS = 8


def transpose_planes_job(
    x: np.ndarray, y: np.ndarray, planes: int, rows: int, columns: int, chunks: int = 1, inner: int = 1
) -> Job:
    """``y[p] = x[p].T`` for ``planes`` planes of X ``[planes, rows, columns]`` into Y ``[planes, columns,
    rows]``, each element ``inner`` consecutive floats (both C-contiguous, given flat or shaped), as a job
    of ``chunks`` runs of planes."""
    if x.size != planes * rows * columns * inner or y.size != x.size:
        raise ValueError("X and Y are not planes x rows x columns x inner")
    block = np.array([x.ctypes.data, x.size, y.ctypes.data, y.size, planes, rows, columns, inner], np.int64)
    return Job(_transpose_planes_address(), block, max(1, min(chunks, planes)), (x, y))


def _transpose_planes_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``transpose_planes_job``'s transposes of chunk ``chunk``'s planes."""
    x, y = float32_1d(args, 0), float32_1d(args, 2)
    planes, rows, columns, inner = args[4], args[5], args[6], args[7]
    size = rows * columns * inner
    for plane in range(planes * chunk // chunks, planes * (chunk + 1) // chunks):
        start = plane * size
        for row in range(rows):
            for column in range(columns):
                source = start + (row * columns + column) * inner
                target = start + (column * rows + row) * inner
                y[target : target + inner] = x[source : source + inner]


@functools.cache
def _transpose_planes_address() -> int:
    return spin_pool.job(_transpose_planes_job)
