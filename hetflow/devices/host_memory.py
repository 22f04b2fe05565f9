"""Host arrays aligned beyond what numpy promises.

numpy aligns an array's data to 16 bytes. Kernels that read and write whole cache lines (the CPU's
AVX-512 vectors, OpenCL buffers wrapping host memory) want more: a buffer 16 bytes off a line splits
every vector load and store over two lines.
"""

from __future__ import annotations

import math

import numpy as np

#: A cache line, and AVX-512's vector width.
CACHE_LINE = 64
#: A page: an arena aligned to it lays its buffers on the same cache sets and pages in every session.
PAGE = 4096


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32, alignment: int = CACHE_LINE) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = max(count, 1) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes].view(dtype)[:count].reshape(shape)
