"""Load numba's array registries without SciPy's BLAS and LAPACK bindings.

numba's first dispatch of a compiled kernel, cached or not, loads every registry of its CPU target
(``BaseContext.refresh``). One of them, ``numba.np.arraymath``, asks at import whether a BLAS is there
for ``np.dot`` by importing ``scipy.linalg.cython_blas`` (all of ``scipy.linalg``, where SciPy is
installed): 17-19 MiB of a process's resident memory (``import numba.np.arraymath`` with and without
SciPy, Zen 4 VM, 2026-12-07), which hetflow never uses: its kernels call numpy's own OpenBLAS by symbol
(``kernels.jit_gemm``) and no compiled kernel calls ``np.dot``. So that module is imported here first,
with the two SciPy modules hidden for the length of the import; its answer is then "no BLAS", which
only makes numba's compiled ``np.dot`` of two 1-D arrays loop instead of calling BLAS. numba's
``np.dot`` on matrices and ``np.linalg`` still import SciPy when they are compiled, as before.
"""

from __future__ import annotations

import importlib
import sys

#: The SciPy modules numba imports to find a BLAS and a LAPACK.
SCIPY_BINDINGS = ("scipy.linalg.cython_blas", "scipy.linalg.cython_lapack")
#: The numba module whose import asks for them.
ARRAY_REGISTRY = "numba.np.arraymath"


def import_array_registry_without_scipy() -> None:
    """Import ``numba.np.arraymath`` with SciPy's bindings hidden, unless it or they are loaded already."""
    if ARRAY_REGISTRY in sys.modules or any(name in sys.modules for name in SCIPY_BINDINGS):
        return
    hidden = dict.fromkeys(SCIPY_BINDINGS)
    sys.modules.update(hidden)  # a None entry makes ``import`` raise ImportError
    try:
        importlib.import_module(ARRAY_REGISTRY)
    finally:
        for name in SCIPY_BINDINGS:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
