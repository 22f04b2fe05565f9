"""Weights rearranged once per weight array for the kernels that read them in another layout
(Winograd's transformed weights, the direct Conv's blocked weights)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np


class WeightCache:
    """``transform(w, parameter)`` per (weight array, parameter), dropped with the array.

    Keyed by ``id(w)``; a ``weakref.finalize`` on the array removes its entries when it is collected,
    so an id reused by a later array never finds a stale entry. Weights are assumed immutable while
    they are cached (initializers are; a trainer updating weights in place must call ``clear``).
    """

    def __init__(self, transform: Callable[[np.ndarray, int], np.ndarray]) -> None:
        self._transform = transform
        self._entries: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def get(self, w: np.ndarray, parameter: int) -> np.ndarray:
        """``w`` rearranged for ``parameter`` (computed on the first call for this array)."""
        key = (id(w), parameter)
        found = self._entries.get(key)
        if found is not None:
            return found
        transformed = self._transform(w, parameter)
        with self._lock:
            if key not in self._entries:
                if not any(k[0] == key[0] for k in self._entries):
                    weakref.finalize(w, self._forget, key[0])
                self._entries[key] = transformed
        return transformed

    def _forget(self, array_id: int) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == array_id]:
                del self._entries[key]

    def clear(self) -> None:
        """Drop every entry (for weights changed in place)."""
        with self._lock:
            self._entries.clear()

    def nbytes(self) -> int:
        """Memory held by the cached arrays."""
        return sum(u.nbytes for u in self._entries.values())
