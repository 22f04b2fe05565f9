"""CPU kernels: Softmax and LogSoftmax (one numerically stable implementation for both)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numba
import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, output, scratch_bytes
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.spin_pool import Job, float32_2d, put_arrays
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.softmax import normalised_axes


def _prepare_softmax(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: object
) -> BoundCall | None:
    """``softmax`` bound to a float32/float64 node whose rows are X's trailing axes (``Kernel.prepare``):
    one compiled pass per row instead of five numpy passes (a classifier's 10 classes took 8 us)."""
    x_info = inputs[0]
    if x_info is None or x_info.dtype not in COMPILED_DTYPES or not x_info.shape:
        return None
    shape, dtype = tuple(int(d) for d in x_info.shape), np.dtype(x_info.dtype)
    axes = normalised_axes(shape, node.attrs)
    if axes != tuple(range(axes[0], len(shape))) or math.prod(shape) == 0:
        return None
    rows = (math.prod(shape[: axes[0]]), math.prod(shape[axes[0]:]))
    target = out[0] if out is not None else None
    if target is not None and not (target.shape == shape and target.dtype == dtype and target.flags.c_contiguous):
        target = None

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        x = arrays[0]
        y = np.empty(shape, dtype) if target is None else target
        _softmax_rows(x.reshape(rows), y.reshape(rows))  # type: ignore[union-attr]
        return [y]

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        x = arrays[0]
        if dtype != np.float32 or not x.flags.c_contiguous:  # type: ignore[union-attr]
            return None
        y = np.empty(shape, dtype) if target is None else target
        return [y], [_rows_job(x.reshape(rows), y.reshape(rows))]  # type: ignore[union-attr]

    return with_capture(call, capture)


def _rows_job(x: np.ndarray, y: np.ndarray) -> Job:
    """``_softmax_rows`` on float32 C-contiguous 2-D arrays as a spin-pool job of one chunk."""
    block = np.zeros(6, np.int64)
    put_arrays(block, 0, (x, y))
    return Job(_rows_address(), block, 1, (x, y))


def _softmax_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    _softmax_rows(float32_2d(args, 0), float32_2d(args, 3))


@functools.cache
def _rows_address() -> int:
    return spin_pool.job(_softmax_job)


@numba.njit(nogil=True, cache=True)
def _softmax_rows(x, y):  # noqa: ANN001, ANN202
    """Softmax of each row of ``x`` into ``y`` (both 2-D; ``y`` may be ``x``). The row's maximum is
    subtracted first (exp() <= 1); a NaN or a +inf in a row makes the row NaN, as numpy's does."""
    for row in range(x.shape[0]):
        top = x[row, 0]
        for value in x[row]:
            top = value if value > top else top
        total = 0.0
        for column in range(x.shape[1]):
            e = np.exp(x[row, column] - top)
            y[row, column] = e
            total += e
        scale = y.dtype.type(1.0 / total)
        for column in range(x.shape[1]):
            y[row, column] *= scale


@cpu_kernel("Softmax", writes_out=True, inplace=True, prepare=_prepare_softmax)
def softmax(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """Softmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved; may run
    in place."""
    (x,) = inputs
    assert x is not None
    return [_softmax(x, normalised_axes(x.shape, node.attrs), output(out, 0, x.shape, x.dtype), None)]


def _exp_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    x = inputs[0]
    return 0 if x is None else scratch_bytes([(tuple(x.shape), x.dtype)])


@cpu_kernel("LogSoftmax", writes_out=True, inplace=True, workspace=_exp_workspace)
def log_softmax(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """LogSoftmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved; may
    run in place."""
    (x,) = inputs
    assert x is not None
    y = output(out, 0, x.shape, x.dtype)
    return [_softmax(x, normalised_axes(x.shape, node.attrs), y, Scratch(workspace))]


def _softmax(x: np.ndarray, axes: tuple[int, ...], y: np.ndarray, log: Scratch | None) -> np.ndarray:
    """Softmax (LogSoftmax when ``log`` gives the scratch for the exponentials) of ``x`` into ``y``."""
    if x.size == 0:
        return y
    # NOTE: subtracting the row maximum keeps exp() <= 1, so large inputs neither overflow nor lose
    # the result; reducing over a tuple of axes covers the old-opset "flatten to 2-D" form without a copy.
    np.subtract(x, np.max(x, axis=axes, keepdims=True), out=y)
    if log is not None:
        exp = log.take(x.shape, x.dtype)
        np.exp(y, out=exp)
        y -= np.log(np.sum(exp, axis=axes, keepdims=True))
        return y
    np.exp(y, out=y)
    y /= np.sum(y, axis=axes, keepdims=True)
    return y
