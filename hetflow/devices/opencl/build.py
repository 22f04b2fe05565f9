"""OpenCL program builds with an on-disk binary cache.

A build from source costs about half a second on PoCL (clang + LLVM per program), so every built
program's binary is stored under ``$HETFLOW_HOME/opencl/programs/`` keyed by a hash of (source, build
options, device fingerprint): a changed kernel, a changed knob or a new driver never reuses a stale
binary. Built programs are also kept in memory per context, so a process builds each variant once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetflow.errors import KernelBuildError
from hetflow.options import home_dir

#: Bump when the layout of the cache changes, so old entries are ignored rather than misread.
CACHE_VERSION = "1"


def default_cache_dir() -> Path:
    """``$HETFLOW_HOME/opencl/programs`` (created by the first write)."""
    return home_dir() / "opencl" / "programs"


def build_key(source: str, options: tuple[str, ...], fingerprint: dict[str, str]) -> str:
    """The cache key of one build: a SHA-256 over the source, the options and the device fingerprint."""
    blob = json.dumps(
        {"v": CACHE_VERSION, "source": source, "options": list(options), "device": fingerprint},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class BuildStats:
    """Counters of one ProgramCache: builds from source, binaries loaded from disk, memory hits."""

    compiled: int = 0
    disk_hits: int = 0
    memory_hits: int = 0
    seconds: float = 0.0


@dataclass
class ProgramCache:
    """Builds programs for one context and device, reusing binaries from memory and from disk.

    Attributes:
        directory: where binaries are stored; None: ``default_cache_dir()`` at the time of each build
            (so a test that points ``HETFLOW_HOME`` elsewhere is honoured).
        use_disk: read and write binaries on disk at all.
    """

    directory: Path | None = None
    use_disk: bool = True
    stats: BuildStats = field(default_factory=BuildStats)
    _memory: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear_memory(self) -> None:
        """Forget the programs built in this process (the disk cache stays)."""
        with self._lock:
            self._memory.clear()

    def build(
        self,
        context: Any,
        device: Any,
        source: str,
        options: tuple[str, ...],
        fingerprint: dict[str, str],
        name: str = "program",
    ) -> Any:
        """The ``pyopencl.Program`` for ``source`` built with ``options`` on ``device``.

        Raises:
            KernelBuildError: the source does not compile; ``.log`` holds the compiler's build log.
        """
        key = build_key(source, options, fingerprint)
        with self._lock:
            program = self._memory.get(key)
            if program is not None:
                self.stats.memory_hits += 1
                return program
            start = time.perf_counter()
            program = self._load_binary(context, device, key, options) if self.use_disk else None
            if program is not None:
                self.stats.disk_hits += 1
            else:
                program = _build_from_source(context, device, source, options, name)
                self.stats.compiled += 1
                if self.use_disk:
                    self._store_binary(program, key)
            self.stats.seconds += time.perf_counter() - start
            self._memory[key] = program
            return program

    def _path(self, key: str) -> Path:
        return (self.directory or default_cache_dir()) / f"{key}.bin"

    def _load_binary(self, context: Any, device: Any, key: str, options: tuple[str, ...]) -> Any:
        import pyopencl as cl

        path = self._path(key)
        try:
            binary = path.read_bytes()
        except OSError:
            return None
        try:
            program = cl.Program(context, [device], [binary])
            program.build(options=list(options), devices=[device], cache_dir=False)
        except cl.Error:
            # NOTE: a truncated or foreign binary is not an error: rebuild from source and overwrite it.
            return None
        return program

    def _store_binary(self, program: Any, key: str) -> None:
        import pyopencl as cl

        binaries = program.get_info(cl.program_info.BINARIES)
        if not binaries or not binaries[0]:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written under a private name and renamed, so a concurrent reader never sees half a file.
            partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            partial.write_bytes(bytes(binaries[0]))
            os.replace(partial, path)
        except OSError:
            pass  # a read-only home only costs the next process a rebuild


def _build_from_source(context: Any, device: Any, source: str, options: tuple[str, ...], name: str) -> Any:
    import pyopencl as cl

    program = cl.Program(context, source)
    try:
        program.build(options=list(options), devices=[device], cache_dir=False)
    except cl.Error as error:
        log = _build_log(program, device) or str(error)
        raise KernelBuildError(
            f"OpenCL program '{name}' failed to build (options: {' '.join(options) or 'none'})", log
        ) from error
    return program


def _build_log(program: Any, device: Any) -> str:
    import pyopencl as cl

    try:
        return str(program._get_prg().get_build_info(device, cl.program_build_info.LOG)).strip()
    except (cl.Error, AttributeError):
        return ""
