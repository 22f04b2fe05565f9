"""Keep numba's on-disk kernel caches in step with hetflow's sources.

numba keys a cached kernel on the source of the file that defines it, and on nothing else. hetflow's
kernels call compiled helpers and LLVM IR emitters from other files (``llvm_vectors``, ``row_sweep``,
``window_lanes``, ``spin_pool``), which numba compiles into the caller's machine code. After an edit
to one of those files (a ``git pull``, a new release installed over the old one) numba would keep
loading the callers' old code. So the CPU device stamps each cache folder with a digest of every
source file under ``hetflow/devices/cpu`` (and the numba version), and when the stamp differs it
deletes that folder's hetflow entries before any kernel is loaded: they are compiled again on first
use, as on a fresh install.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numba

#: The file in each cache folder that records the sources its entries were compiled from.
STAMP_NAME = "hetflow-sources.sha256"
#: numba's cache files: an index per function, its compiled overloads beside it.
CACHE_SUFFIXES = (".nbi", ".nbc")


def package_sources(root: Path) -> list[Path]:
    """Every Python source under ``root``."""
    return sorted(path for path in root.rglob("*.py") if "__pycache__" not in path.parts)


def source_digest(sources: Iterable[Path], root: Path) -> str:
    """A digest of the files' paths (relative to ``root``) and contents, and of the numba version."""
    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(sources):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_folder(source: Path) -> Path | None:
    """The folder numba caches the kernels of ``source`` (and of every module beside it) in, by numba's
    own rules (``NUMBA_CACHE_DIR``, else the ``__pycache__`` beside it when writable, else the user's
    cache); None when numba would cache nothing for it."""
    try:
        from numba.core.caching import CompileResultCacheImpl  # the one place that applies the rules

        namespace: dict[str, object] = {}
        exec(compile("def probe():\n    pass\n", str(source), "exec"), namespace)  # a function "in" source
        return Path(CompileResultCacheImpl(namespace["probe"]).locator.get_cache_path())
    except Exception:  # noqa: BLE001  (another numba, or no locator: its default folder if it exists)
        folder = source.parent / "__pycache__"
        return folder if folder.is_dir() else None


def clear_stale(root: Path) -> list[Path]:
    """Delete the numba cache entries of ``root``'s modules compiled from other sources than the ones
    there now; returns the deleted files. Each cache folder keeps a stamp of the sources it holds."""
    sources = package_sources(root)
    digest = source_digest(sources, root)
    modules_by_folder: dict[Path, set[str]] = {}
    for directory in sorted({source.parent for source in sources}):
        beside = [source for source in sources if source.parent == directory]
        folder = cache_folder(beside[0])  # numba's folder depends on the directory only
        if folder is not None:
            modules_by_folder.setdefault(folder, set()).update(source.stem for source in beside)
    deleted: list[Path] = []
    for folder, modules in modules_by_folder.items():
        stamp = folder / STAMP_NAME
        if _read(stamp) == digest:
            continue
        deleted += _delete_entries(folder, modules)
        write_atomically(stamp, (digest + "\n").encode("ascii"))
    return deleted


def _delete_entries(folder: Path, modules: set[str]) -> list[Path]:
    """numba's cache files in ``folder`` for functions of ``modules`` (named ``module.function-line...``)."""
    deleted = []
    for path in folder.iterdir():
        if path.suffix in CACHE_SUFFIXES and path.name.split(".", 1)[0] in modules:
            try:
                path.unlink()
                deleted.append(path)
            except FileNotFoundError:  # another process cleared it first
                pass
    return deleted


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees half of it (a read-only folder: skipped)."""
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".hetflow-")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as target:
            target.write(data)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)


def clear_stale_cpu_kernels() -> list[Path]:
    """``clear_stale`` over the CPU device's sources (the package this module is in)."""
    return clear_stale(Path(__file__).resolve().parent)


def kernel_cache_folder() -> Path | None:
    """The folder numba caches the CPU device's kernels in (``cache_folder``)."""
    return cache_folder(Path(__file__).resolve())
