"""numpy's OpenBLAS, found by its CBLAS symbols: what the GEMM jobs call (``hetflow_sgemm`` & co)."""

from __future__ import annotations

import ctypes

#: (prefix, suffix) of the 64-bit-integer CBLAS builds numpy ships or links: numpy's wheels bundle
#: scipy-openblas with prefixed and suffixed names.
NAMINGS = (("scipy_cblas_", "64_"), ("cblas_", "64_"))
#: The routines the jobs call, in the order ``hetflow_bind_blas`` takes them.
ROUTINES = ("sgemm", "dgemm", "sgemv", "dgemv")


def openblas_routines() -> tuple[int, ...] | None:
    """The addresses of ``ROUTINES`` in the OpenBLAS numpy loaded (Linux: read off the process's
    mappings), or None where none is loaded or it names them otherwise."""
    import numpy  # noqa: F401  (loads its BLAS)

    for path in _loaded_openblas_paths():
        library = ctypes.CDLL(path)
        for prefix, suffix in NAMINGS:
            try:
                functions = [getattr(library, f"{prefix}{name}{suffix}") for name in ROUTINES]
            except AttributeError:
                continue
            return tuple(ctypes.cast(function, ctypes.c_void_p).value or 0 for function in functions)
    return None


def _loaded_openblas_paths() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return []
    return sorted(paths)
