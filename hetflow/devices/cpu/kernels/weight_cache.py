"""Weights rearranged once per weight array for the kernels that read them in another layout
(Winograd's transformed weights, the direct Conv's blocked weights)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np


class WeightCache:
    """``transform(w, parameter)`` per (weight array, parameter), dropped with the array.

    Keyed by ``id(w)``; a ``weakref.finalize`` on the array records its id when it is collected, and the
    next call drops its entries before looking anything up, so an id reused by a later array never
    finds a stale entry. Weights are assumed immutable while they are cached (initializers are; a trainer
    updating weights in place must call ``clear``).

    The finalizer takes no lock: the garbage collector runs finalizers at any allocation, also inside
    this cache's own locked section on the same thread, where taking the lock again deadlocked (a test
    run hung in ``get``).
    """

    def __init__(self, transform: Callable[[np.ndarray, int], np.ndarray]) -> None:
        self._transform = transform
        self._entries: dict[tuple[int, int], np.ndarray] = {}
        self._watched: set[int] = set()  # ids of the arrays with a finalizer registered
        self._dead: list[int] = []  # ids of collected arrays whose entries are still to drop
        self._lock = threading.Lock()

    def get(self, w: np.ndarray, parameter: int) -> np.ndarray:
        """``w`` rearranged for ``parameter`` (computed on the first call for this array)."""
        if self._dead:
            with self._lock:
                self._drop_dead()
        key = (id(w), parameter)
        found = self._entries.get(key)
        if found is not None:
            return found
        return self._keep(w, key, self._transform(w, parameter))

    def put(self, w: np.ndarray, parameter: int, transformed: np.ndarray) -> None:
        """Keep ``transformed`` as ``w`` rearranged for ``parameter`` (made elsewhere, e.g. read from a
        file a block at a time); a later ``get`` returns it."""
        if self._dead:
            with self._lock:
                self._drop_dead()
        self._keep(w, (id(w), parameter), transformed)

    def _keep(self, w: np.ndarray, key: tuple[int, int], transformed: np.ndarray) -> np.ndarray:
        """Enter ``transformed`` under ``key`` unless another thread was first; the entry kept."""
        with self._lock:
            self._entries.setdefault(key, transformed)
            watch = key[0] not in self._watched
            self._watched.add(key[0])
        if watch:
            weakref.finalize(w, self._dead.append, key[0])
        return self._entries.get(key, transformed)

    def _drop_dead(self) -> None:
        """Drop the entries of the collected arrays (the caller holds the lock)."""
        while self._dead:
            array_id = self._dead.pop()
            self._watched.discard(array_id)
            for key in [k for k in self._entries if k[0] == array_id]:
                del self._entries[key]

    def clear(self) -> None:
        """Drop every entry (for weights changed in place)."""
        with self._lock:
            self._drop_dead()
            self._entries.clear()

    def nbytes(self) -> int:
        """Memory held by the cached arrays (those of collected arrays dropped first)."""
        with self._lock:
            self._drop_dead()
            return sum(u.nbytes for u in self._entries.values())
