"""Output and scratch buffers for CPU kernels that write into memory the runtime provides.

A kernel registered with ``writes_out=True`` is called as ``fn(node, inputs, out, workspace)`` (see
``hetflow.devices.base.Kernel``). ``output`` picks the provided view when it fits, and ``Scratch`` carves
a kernel's temporaries out of its workspace in a fixed order, so that the byte count the kernel declares
(``scratch_bytes`` of the same shapes) and what it takes always agree. Without a runtime (tests, tuning,
constant folding) both fall back to fresh arrays.

``StepBuffers`` keeps a training step's large outputs from one step to the next (``step_empty``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

#: Alignment of every temporary inside a workspace (the runtime aligns the workspace itself).
ALIGNMENT = 64

#: What ``out`` is: one array (or None) per node output, or None as a whole.
Out = Sequence[np.ndarray | None] | None


def output(out: Out, index: int, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """``out[index]`` when it is an array of ``shape`` and ``dtype``, else a new uninitialised array."""
    if out is not None:
        target = out[index]
        if target is not None and target.shape == tuple(shape) and target.dtype == dtype:
            return target
    return np.empty(shape, dtype)


def deliver(out: Out, index: int, result: np.ndarray) -> np.ndarray:
    """``result`` copied into ``out[index]`` when that is a fitting buffer other than ``result``."""
    if out is None:
        return result
    target = out[index]
    if target is None or target is result or target.shape != result.shape or target.dtype != result.dtype:
        return result
    np.copyto(target, result)
    return target


def image_contiguous(y: np.ndarray) -> bool:
    """Whether each image ``y[n]`` is C-contiguous (the images may lie apart: a Concat slice)."""
    step = y.itemsize
    for size, stride in zip(reversed(y.shape[1:]), reversed(y.strides[1:])):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def flat_images(y: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``y``'s memory as one flat array from its first element to its last, and the distance between
    its images in elements; None unless each image is C-contiguous (``image_contiguous``).

    Compiled loops store a plane's rows through it at unsigned flat offsets: indexing ``y[n, c, r, j]``
    keeps numba's wraparound test on the signed indices in the store loop, which then does not
    vectorise. When the images lie apart (a Concat slice) the flat array spans the memory between them
    too: the loops write only at their own images' offsets.
    """
    if y.size == 0:
        return None
    if y.flags.c_contiguous:
        # NOTE: as_strided below costs ~4 us, as much as a small pool's whole loop.
        return y.reshape(-1), math.prod(y.shape[1:])
    if not image_contiguous(y):
        return None
    if y.shape[0] > 1 and (y.strides[0] <= 0 or y.strides[0] % y.itemsize):
        return None
    image = math.prod(y.shape[1:])
    stride = y.strides[0] // y.itemsize if y.shape[0] > 1 else image
    length = (y.shape[0] - 1) * stride + image
    return np.lib.stride_tricks.as_strided(y, shape=(length,), strides=(y.itemsize,)), stride


def flat_target(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(target, flat, image_stride): ``y`` and its ``flat_images``, or, when ``y`` has none, a new
    contiguous array standing in for it (the caller copies it into ``y`` afterwards: ``target is not y``)."""
    flat = flat_images(y)
    if flat is not None:
        return y, *flat
    target = np.empty(y.shape, y.dtype)
    return target, target.reshape(-1), math.prod(y.shape[1:])


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def scratch_bytes(requests: Sequence[tuple[Sequence[int], np.dtype]]) -> int:
    """Workspace bytes for ``Scratch.take`` calls of these (shape, dtype) pairs, in that order."""
    return sum(aligned(math.prod(shape) * np.dtype(dtype).itemsize) for shape, dtype in requests)


#: How often a kernel outgrew the workspace it declared (and allocated instead): tests keep it at 0.
OVERFLOWS = [0]


class Scratch:
    """Temporaries carved in order from a workspace (or allocated when there is none or it is full)."""

    def __init__(self, workspace: np.ndarray | None):
        self.workspace = workspace
        self.used = 0

    def take(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        start = self.used
        workspace = self.workspace
        if workspace is None or start + nbytes > workspace.size:
            if self.workspace is not None:
                OVERFLOWS[0] += 1
            return np.empty(shape, dtype)
        self.used = start + aligned(nbytes)
        return workspace[start : start + nbytes].view(dtype).reshape(shape)

    def region(self, nbytes: int) -> Scratch:
        """A sub-scratch of ``nbytes`` (aligned) whose temporaries can be given back with ``reset``."""
        nbytes = aligned(nbytes)
        if self.workspace is None or self.used + nbytes > self.workspace.nbytes:
            if self.workspace is not None:
                OVERFLOWS[0] += 1
            return Scratch(None)
        region = Scratch(self.workspace[self.used : self.used + nbytes])
        self.used += nbytes
        return region

    def reset(self) -> None:
        """Start carving from the beginning again (earlier temporaries must be dead)."""
        self.used = 0


#: Arrays below this size come from the allocator's heap without page faults: not worth pooling.
MIN_POOLED_BYTES = 1 << 16


class StepBuffers:
    """Large arrays a training step's kernels allocate, kept from step to step and handed out again.

    Every step allocates the same activations and gradients; fresh ones are paged in again each time
    (the mentee at batch 128: ~6,000 page faults and 20-30 ms of system time a step). With the training
    kernels' outputs taken from here (Conv's Y and dX, MaxPool's Y, Indices and dX, Relu's dX, Gemm's
    products) a steady-state step faults no pages: measured on the mentee at batch 128, one core, A/B in
    one process (minimum of 12 steps), step 539 -> 484 ms, forward 214 -> 170 ms; the pool holds 144 MB.

    An array here is free again once this pool holds the only reference to it: the tape has dropped it
    and no view of it is alive (``sys.getrefcount``), so nothing anyone still reads is ever handed out.
    One step at a time.
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        # The reference count of an array only the pool holds, as ``empty``'s loop sees it.
        probe = [np.empty(0)]
        self._unreferenced = next(sys.getrefcount(array) for array in probe)

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array: a free one of this shape and dtype, else a new one the pool keeps."""
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) * dtype.itemsize < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        bucket = self._buckets.setdefault((shape, dtype), [])
        for array in bucket:
            if sys.getrefcount(array) == self._unreferenced:
                return array
        array = np.empty(shape, dtype)
        bucket.append(array)
        return array

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds (free or handed out)."""
        return sum(array.nbytes for bucket in self._buckets.values() for array in bucket)


_STEP_BUFFERS: ContextVar[StepBuffers | None] = ContextVar("hetflow_step_buffers", default=None)


def step_empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array for a kernel's output: from the active ``StepBuffers`` (``step_buffers``),
    else new."""
    pool = _STEP_BUFFERS.get()
    return np.empty(shape, dtype) if pool is None else pool.empty(shape, dtype)


@contextmanager
def step_buffers(pool: StepBuffers | None) -> Iterator[None]:
    """While active (in this thread): ``step_empty`` takes from ``pool`` (None: fresh arrays)."""
    token = _STEP_BUFFERS.set(pool)
    try:
        yield
    finally:
        _STEP_BUFFERS.reset(token)
