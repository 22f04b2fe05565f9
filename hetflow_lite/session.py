"""``CompiledSession``: a compiled package's run, with numpy, ctypes and the package's library only."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np

from hetflow_lite import blas, package, spinning
from hetflow_lite.feeds import InPlaceFeed
from hetflow_lite.package import Manifest, PackageError, Tensor

__all__ = ["CompiledSession", "PackageError", "TensorInfo"]


@dataclass(frozen=True)
class TensorInfo:
    """An input or output as ONNX Runtime describes it: name, shape, type (``tensor(float)``...)."""

    name: str
    shape: list[int]
    type: str


_ONNX_TYPES = {"float32": "tensor(float)", "float64": "tensor(double)", "int64": "tensor(int64)",
               "int32": "tensor(int32)", "bool": "tensor(bool)", "float16": "tensor(float16)"}  # fmt: skip


class _LibraryThreads(spinning.SpinningThreads):
    """The spinning workers, each running the library's worker loop (``hetflow_serve``) through ctypes,
    which lets go of the GIL for the call."""

    def __init__(self, workers: int, serve: ctypes._CFuncPtr):
        super().__init__(workers)
        self._serve_entry = serve

    def serve(self, seen: int) -> int:
        return self._serve_entry(self.state.ctypes.data, seen, self.grace)


class CompiledSession:
    """Run a compiled package (``hetflow compile``): ``run`` takes and returns arrays like
    ``hetflow.InferenceSession.run``. Runs take turns (one arena); sessions in threads of their own may
    run at once, each on its own pool."""

    def __init__(self, path: str | PathLike[str], threads: int | None = None, check_processor: bool = True):
        """Load the package at ``path``.

        Args:
            threads: threads a run splits its jobs over (the caller and ``threads - 1`` spinning
                workers); None: as many as the package was compiled for. Any count computes the same
                outputs: a job's chunks are claimed one at a time.
            check_processor: refuse a package compiled on another CPU model (its kernels use the
                instructions of the CPU they were built on).

        Raises:
            PackageError: no package at ``path``, a damaged one, another version's, or another CPU's.
        """
        folder = Path(path)
        self.manifest = manifest = Manifest.read(folder)
        if check_processor and manifest.target.get("processor") != package.processor_name():
            raise PackageError(f"{folder} was compiled for {manifest.target.get('processor')!r}, not this "
                               f"machine's {package.processor_name()!r}: compile the model here")  # fmt: skip
        self._images, self._regions = _map_regions(folder, manifest)
        self._library = _load_library(folder / package.LIBRARY)
        kernels = np.array([_symbol_address(self._library, name) for name in manifest.kernels], np.int64)
        table = _relocate(folder, self._regions, kernels)
        script = manifest.script
        self._jobs = np.array([kernels[job.kernel] for job in script], np.int64)
        self._blocks = np.array([self._address(job.block_region, job.block_offset) for job in script], np.int64)
        self._chunks = np.array([job.chunks for job in script], np.int64)
        self._inputs = [(tensor, self._input(tensor, table)) for tensor in manifest.inputs]
        self._outputs = {tensor.name: self._view(tensor) for tensor in manifest.outputs}
        # hetflow_replay(state, jobs, blocks, chunks, count, alone); hetflow_serve(state, seen, grace) -> seen
        self._replay = _entry(self._library, "hetflow_replay", None, [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2)
        serve = _entry(self._library, "hetflow_serve", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64])
        count = manifest.threads if threads is None else threads
        if count < 1:
            raise ValueError(f"threads must be at least 1, not {count}")
        self._pool = _LibraryThreads(count - 1, serve)
        self._lock = threading.Lock()

    def get_inputs(self) -> list[TensorInfo]:
        return [_info(tensor) for tensor in self.manifest.inputs]

    def get_outputs(self) -> list[TensorInfo]:
        return [_info(tensor) for tensor in self.manifest.outputs]

    @property
    def nodes(self) -> tuple[str, ...]:
        """The node each job of a run computes, in run order."""
        return tuple(job.node for job in self.manifest.script)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Compute ``output_names`` (all outputs when None) from ``input_feed``; each a new array.

        Raises:
            ValueError: a feed is missing, unknown, or has another dtype or shape than compiled for; an
                unknown output name.
        """
        names = list(self._outputs) if output_names is None else list(output_names)
        unknown = [name for name in names if name not in self._outputs]
        if unknown:
            raise ValueError(f"unknown outputs {unknown}; the package computes {list(self._outputs)}")
        extra = set(input_feed) - {tensor.name for tensor, _ in self._inputs}
        if extra:
            raise ValueError(f"unknown inputs {sorted(extra)}; the package takes {[t.name for t, _ in self._inputs]}")
        with self._lock:
            for tensor, feed in self._inputs:
                feed.take(_checked_feed(tensor, input_feed))  # read in place where it can be
            self._run_script()
            return [self._outputs[name].copy() for name in names]

    def close(self) -> None:
        """Stop the spinning workers (a later run starts them again)."""
        self._pool.close()

    def _run_script(self) -> None:
        pool = self._pool
        pool.spin()
        try:
            pool.start()
            self._replay(pool.state.ctypes.data, self._jobs.ctypes.data, self._blocks.ctypes.data,
                         self._chunks.ctypes.data, len(self._jobs), int(pool.workers < 1))  # fmt: skip
        finally:
            pool.rest()

    def _address(self, region: int, offset: int) -> int:
        return self._regions[region].ctypes.data + offset

    def _input(self, tensor: Tensor, relocations: np.ndarray) -> InPlaceFeed:
        """An input's buffer, with the relocated slots that hold an address inside it (``feeds``)."""
        view = self._view(tensor)
        targets, offsets = relocations[:, 2], relocations[:, 3]
        inside = (targets == tensor.region) & (offsets >= tensor.offset) & (offsets <= tensor.offset + view.nbytes)
        pointers = [
            (self._regions[region][offset : offset + 8].view(np.int64), np.zeros(1, np.intp),
             np.array([target_offset - tensor.offset], np.int64))
            for region, offset, _, target_offset in relocations[inside].tolist()
        ]  # fmt: skip
        return InPlaceFeed(view, pointers)

    def _view(self, tensor: Tensor) -> np.ndarray:
        dtype = np.dtype(tensor.dtype)
        count = int(np.prod(tensor.shape, dtype=np.int64))
        region = self._regions[tensor.region]
        if tensor.offset < 0 or tensor.offset + count * dtype.itemsize > region.size:
            raise PackageError(f"{tensor.name} lies outside its region: the package is damaged")
        return region[tensor.offset : tensor.offset + count * dtype.itemsize].view(dtype).reshape(tensor.shape)


def _info(tensor: Tensor) -> TensorInfo:
    return TensorInfo(tensor.name, list(tensor.shape), _ONNX_TYPES.get(tensor.dtype, f"tensor({tensor.dtype})"))


def _checked_feed(tensor: Tensor, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    if tensor.name not in feeds:
        raise ValueError(f"missing input {tensor.name!r}")
    value = np.asarray(feeds[tensor.name])
    if value.dtype != np.dtype(tensor.dtype) or tuple(value.shape) != tensor.shape:
        raise ValueError(f"input {tensor.name!r} must be {tensor.dtype} {list(tensor.shape)} as compiled, not "
                         f"{value.dtype} {list(value.shape)}")  # fmt: skip
    return value


def _map_regions(folder: Path, manifest: Manifest) -> tuple[mmap.mmap | None, list[np.ndarray]]:
    """The images file mapped copy-on-write, and each region as a view of it: the weights stay pages of
    the file (shared by every process that runs the package, read as the jobs first touch them); what
    a run writes (the arena, the argument blocks' addresses) becomes the process's own."""
    path = folder / package.IMAGES
    try:
        with open(path, "rb") as images:
            size = os.fstat(images.fileno()).st_size
            for region in manifest.regions:
                if region.file_offset + region.size > size:
                    raise PackageError(f"{path} is shorter than its manifest says")
                if region.file_offset % package.PAGE != region.page_offset:
                    raise PackageError(f"{path}: a region lies at another page offset than its manifest says")
            if size == 0:
                return None, []
            mapped = mmap.mmap(images.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as error:
        raise PackageError(f"{path} cannot be mapped: {error}") from error
    regions = [np.frombuffer(mapped, np.uint8, count=r.size, offset=r.file_offset) for r in manifest.regions]
    return mapped, regions


def _load_library(path: Path) -> ctypes.CDLL:
    try:
        library = ctypes.CDLL(str(path.resolve()))
    except OSError as error:
        raise PackageError(f"{path} cannot be loaded: {error}") from error
    routines = blas.openblas_routines()
    if routines is not None:
        library.hetflow_bind_blas(*(ctypes.c_void_p(address) for address in routines))
    return library


def _entry(library: ctypes.CDLL, name: str, result: type | None, arguments: list[type]) -> ctypes._CFuncPtr:
    """The library's function ``name`` with its C signature set (ctypes lets go of the GIL in the call)."""
    function = getattr(library, name)
    function.restype = result
    function.argtypes = arguments
    return function


def _symbol_address(library: ctypes.CDLL, name: str) -> int:
    try:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
    except AttributeError:
        raise PackageError(f"the package's library has no {name}: it is damaged") from None


def _relocate(folder: Path, regions: list[np.ndarray], kernels: np.ndarray) -> np.ndarray:
    """Write the new addresses where ``RELOCATIONS`` says: a region's base plus an offset, or a kernel's.
    Returns the table (region, offset, target, target offset), one row a relocation."""
    try:
        table = np.load(folder / package.RELOCATIONS, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise PackageError(f"{folder / package.RELOCATIONS} cannot be read: {error}") from error
    bases = np.array([region.ctypes.data for region in regions], np.int64)
    for region, offset, target, target_offset in table.reshape(-1, 4).tolist():
        if not (0 <= region < len(regions) and 0 <= offset <= regions[region].size - 8 and target < len(regions)):
            raise PackageError(f"{folder / package.RELOCATIONS} points outside the package's regions")
        address = int(bases[target]) + target_offset if target >= 0 else int(kernels[-1 - target])
        ctypes.c_int64.from_address(int(bases[region]) + offset).value = address
    return table.reshape(-1, 4)
