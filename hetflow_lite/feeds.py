"""A graph input that compiled jobs read where the caller's array lies, instead of from a copy.

Why: a captured run's jobs (a replay in ``hetflow``, a compiled package here) hold the address of the
buffer each input was captured in. Copying the caller's array into that buffer cost 30-45 us for one
224x224 image at batch 1 (the caller's array is cold by then: 2-3% of MobileNet v2's or SqueezeNet's
run), ~0.7 ms for a batch of 16. Writing the caller's address into the few argument slots that hold
the buffer's costs a microsecond or two, and nothing at all when the same array comes back.

The jobs' loads assume no alignment beyond an element's, so any C-contiguous array of the captured
dtype and shape can be read in place; any other is copied into the buffer, and the slots pointed back
at it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

#: Per integer array: the indices of its elements that hold an address inside the buffer, and each
#: address's offset from the buffer's start.
Pointers = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def address_of(array: np.ndarray) -> int:
    """The address of ``array``'s first element (``__array_interface__``: ~0.3 us, ``ctypes.data`` ~1)."""
    return array.__array_interface__["data"][0]


def pointers_into(buffer: np.ndarray, arrays: Iterable[np.ndarray]) -> Pointers:
    """Every element of the C-contiguous int64 ``arrays`` that holds an address inside ``buffer`` (one
    past its end included)."""
    start = address_of(buffer)
    found: Pointers = []
    seen: set[int] = set()
    for array in arrays:
        if array.dtype != np.int64 or not array.flags.c_contiguous or id(array) in seen:
            continue
        seen.add(id(array))
        flat = array.reshape(-1)
        indices = np.flatnonzero((flat >= start) & (flat <= start + buffer.nbytes))
        if indices.size:
            found.append((flat, indices, flat[indices] - start))
    return found


class InPlaceFeed:
    """One input's buffer and the places that hold its address (``pointers``)."""

    def __init__(self, buffer: np.ndarray, pointers: Pointers):
        self.buffer = buffer
        self.pointers = pointers
        #: Where the pointers now hold the input: the buffer, or the last caller array read in place.
        self.pointed = address_of(buffer)
        #: The last caller array read in place (weakly: the caller owns it), its dtype and shape then.
        self._last: tuple[weakref.ref[np.ndarray], np.dtype, tuple[int, ...]] | None = None

    def take(self, value: Any) -> np.ndarray:
        """The array the jobs read this run: ``value`` itself where its layout is the buffer's, else the
        buffer with ``value`` copied in.

        The same array as last time (a caller looping over one input array) is recognised by identity:
        after a large network's run every check on an array's layout reads memory that has left the
        caches (~30 us for MobileNet v2's input at batch 1). An ndarray's data never moves while a
        reference to it is alive, and its dtype and shape are compared as they were.
        """
        last = self._last
        if last is not None and last[0]() is value and value.dtype is last[1] and value.shape == last[2]:
            return value
        buffer = self.buffer
        if (type(value) is np.ndarray and value.dtype == buffer.dtype and value.shape == buffer.shape
                and value.flags.c_contiguous and self.pointers):  # fmt: skip
            address = address_of(value)
            if address % buffer.itemsize == 0:
                self._point_at(address)
                self._last = (weakref.ref(value), value.dtype, value.shape)
                return value
        np.copyto(buffer, value)
        self.rest()
        return buffer

    def rest(self) -> None:
        """Point the jobs back at the buffer (where a compiled package's jobs must point when saved)."""
        self._last = None
        self._point_at(address_of(self.buffer))

    def _point_at(self, address: int) -> None:
        if address != self.pointed:
            for array, indices, offsets in self.pointers:
                array[indices] = offsets + address
            self.pointed = address
