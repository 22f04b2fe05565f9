"""Make numba's fixed cost to a process smaller: two things its first dispatch loads that hetflow never uses.

numba's first dispatch of a compiled kernel, cached or not, loads every registry of its CPU target
(``BaseContext.refresh``), and two parts of that cost resident memory for nothing here (Zen 4 VM,
2026-12-07, ``/proc/self/status`` around each step):

* ``numba.np.arraymath`` asks at import whether a BLAS is there for ``np.dot`` by importing
  ``scipy.linalg.cython_blas`` (all of ``scipy.linalg``, where SciPy is installed): 17-19 MiB. hetflow's
  kernels call numpy's own OpenBLAS by symbol (``kernels.jit_gemm``) and none calls ``np.dot``, so that
  module is imported first with the two SciPy modules hidden (``import_array_registry_without_scipy``);
  its answer is then "no BLAS", which only makes numba's compiled ``np.dot`` of two 1-D arrays loop
  instead of calling BLAS (on matrices, and ``np.linalg``, still import SciPy when compiled).
* numba's runtime (NRT: reference counts, allocation) is a small LLVM module compiled afresh in every
  process, which pages in LLVM's optimiser and code generator: 28 MiB of the shared library's pages,
  where loading a cached kernel pages in almost none. ``cache_runtime`` keeps that module's object code
  in the kernels' cache folder, keyed as numba keys its own caches (numba's and llvmlite's versions, the
  target triple, the CPU and its features), and later processes load it like a cached kernel. Anything
  unexpected (another numba's internals, an unreadable file) falls back to numba's own compile.
"""

from __future__ import annotations

import hashlib
import importlib
import pickle
import sys
from pathlib import Path
from typing import Any

#: The SciPy modules numba imports to find a BLAS and a LAPACK.
SCIPY_BINDINGS = ("scipy.linalg.cython_blas", "scipy.linalg.cython_lapack")
#: The numba module whose import asks for them.
ARRAY_REGISTRY = "numba.np.arraymath"
#: Where the runtime's object code is kept, beside numba's own cache files (``runtime_path``).
RUNTIME_PREFIX = "hetflow-numba-runtime-"


def import_array_registry_without_scipy() -> None:
    """Import ``numba.np.arraymath`` with SciPy's bindings hidden, unless it or they are loaded already."""
    if ARRAY_REGISTRY in sys.modules or any(name in sys.modules for name in SCIPY_BINDINGS):
        return
    sys.modules.update(dict.fromkeys(SCIPY_BINDINGS))  # a None entry makes ``import`` raise ImportError
    try:
        importlib.import_module(ARRAY_REGISTRY)
    finally:
        for name in SCIPY_BINDINGS:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def runtime_path(folder: Path, codegen: Any) -> Path:
    """The file in ``folder`` for numba's runtime compiled by ``codegen`` (numba's ``JITCPUCodegen``)."""
    import llvmlite
    import numba

    key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
    return folder / f"{RUNTIME_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:16]}.nbo"


def cache_runtime(folder: Path | None) -> None:
    """From now on numba's runtime is loaded from ``folder`` where an earlier process left it, and left
    there when compiled (no ``folder``: numba compiles it as usual)."""
    if folder is None:
        return
    try:
        from numba.core.runtime import nrtdynmod
    except ImportError:
        return
    original = nrtdynmod.compile_nrt_functions
    if getattr(original, "hetflow_folder", None) is not None:
        return

    def compile_or_load(ctx: Any) -> Any:
        try:
            path = runtime_path(folder, ctx.codegen())
        except Exception:  # noqa: BLE001  (another numba: its own compile)
            return original(ctx)
        return _load(ctx, path) or _compile_and_keep(ctx, path) or original(ctx)

    compile_or_load.hetflow_folder = folder  # type: ignore[attr-defined]
    nrtdynmod.compile_nrt_functions = compile_or_load


def _load(ctx: Any, path: Path) -> Any:
    """The runtime's library from ``path``, or None where there is none to load."""
    try:
        state = pickle.loads(path.read_bytes())
        return ctx.codegen().unserialize_library(state)
    except Exception:  # noqa: BLE001  (missing, truncated, or from another numba)
        return None


def _compile_and_keep(ctx: Any, path: Path) -> Any:
    """numba's runtime compiled as ``nrtdynmod.compile_nrt_functions`` does, its object code kept too
    (None where it could not be compiled so: numba's own compile then runs)."""
    from numba.core.runtime import nrtdynmod

    from hetflow.devices.cpu.compiled_cache import write_atomically

    try:
        module, library = nrtdynmod.create_nrt_module(ctx)
        library.enable_object_caching()
        library.add_ir_module(module)
    except Exception:  # noqa: BLE001  (another numba's internals)
        return None
    # NOTE: finalised outside the try: its symbols are then in numba's engine, and compiling the runtime
    # a second time would define them twice.
    library.finalize()
    try:
        write_atomically(path, pickle.dumps(library.serialize_using_object_code()))
    except Exception:  # noqa: BLE001  (kept next time, perhaps)
        pass
    return library
