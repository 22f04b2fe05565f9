"""Output and scratch buffers for CPU kernels that write into memory the runtime provides.

A kernel registered with ``writes_out=True`` is called as ``fn(node, inputs, out, workspace)`` (see
``hetflow.devices.base.Kernel``). ``output`` picks the provided view when it fits, and ``Scratch`` carves
a kernel's temporaries out of its workspace in a fixed order, so that the byte count the kernel declares
(``scratch_bytes`` of the same shapes) and what it takes always agree. Without a runtime (tests, tuning,
constant folding) both fall back to fresh arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
