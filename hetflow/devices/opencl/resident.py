"""Device copies of host arrays that do not change between runs (weights and what is derived from them:
packed GEMM panels, Winograd-transformed kernels), kept for as long as the host array lives.

Kernels take numpy arrays, so a layer's weights arrive as the same initializer array on every run: keyed
by the array's identity (and what was derived from it), the packed copy is made once per session. A
weak reference drops the entry when the array goes away. A view of a read-only array (a 1-D Conv's W
seen as 2-D, made afresh on every call) is keyed by the array it views and where it looks in it, so it
hits the entry its previous calls made.

Only read-only arrays are cached: a graph's initializers are (the loader freezes them), while
activations are writable and may be rewritten in place between runs (the runtime's memory arena hands
the same memory to later values), so anything writable is derived afresh on every call; what is derived
for it is handed to ``park`` (the device keeps it alive until its queue is next waited on, since kernels
queued with it may not have run when the caller drops it).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np


class Resident:
    """``get(array, key, make)``: ``make()``'s result for ``(array, key)``, made once while a read-only
    ``array`` lives (every call for a writable one)."""

    def __init__(self, park: Callable[[Any], None] | None = None) -> None:
        self._entries: dict[tuple[Hashable, ...], tuple[weakref.ref, Any]] = {}
        self._lock = threading.Lock()
        self._park = park

    def get(self, array: np.ndarray, key: Hashable, make: Callable[[], Any]) -> Any:
        if array.flags.writeable:
            value = make()
            if self._park is not None:
                self._park(value)
            return value
        owner, view = _owner(array)
        slot = (id(owner), key) if view is None else (id(owner), key, view)
        with self._lock:
            entry = self._entries.get(slot)
        if entry is not None and entry[0]() is owner:
            return entry[1]
        value = make()
        entries = self._entries

        def forget(_ref: weakref.ref, slot: tuple[Hashable, ...] = slot) -> None:
            entries.pop(slot, None)

        try:
            ref = weakref.ref(owner, forget)
        except TypeError:  # an object that cannot be weakly referenced is simply not cached
            return value
        with self._lock:
            self._entries[slot] = (ref, value)
        return value

    def device_copy(self, device: Any, array: np.ndarray, key: Hashable = "copy") -> Any:
        """A private float32 copy of ``array`` on ``device``, made once while ``array`` lives.

        NOTE: never ``device.to_device(array)`` itself here: on unified memory that wraps the array's
        own memory, the entry would then hold the array and its weak reference would never die.
        """

        def make() -> Any:
            from hetflow.devices.opencl import aligned_empty

            private = aligned_empty(array.shape, np.float32)
            private[...] = array
            return device.to_device(private)

        return self.get(array, key, make)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _owner(array: np.ndarray) -> tuple[np.ndarray, Hashable | None]:
    """The array whose lifetime an entry for read-only ``array`` follows, and how ``array`` views it
    (None: ``array`` itself).

    NOTE: only a read-only base stands in for its view; a read-only view of a writable array may see
    its data change, so it is keyed by itself as before.
    """
    base = array.base
    if not isinstance(base, np.ndarray):
        return array, None
    while isinstance(base.base, np.ndarray):
        base = base.base
    if base.flags.writeable:
        return array, None
    offset = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return base, (offset, array.shape, array.strides, array.dtype.str)
