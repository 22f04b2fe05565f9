"""``hetflow compile``: a model's captured run saved as a compiled package, which ``hetflow_lite`` runs.

Why: a process that imports hetflow loads a compiler (numba, llvmlite) and ONNX before its first run:
~100 MiB at batch 1 that a small network's run does not otherwise need (``BENCHMARKS.md``, "Peak
memory"). Once a run is captured (``hetflow.runtime.replay``) it is jobs reached by address, argument
blocks of integers, and the memory they point into; saved with its machine code, it runs in a process
that has numpy and ctypes only, as TVM's exported libraries and ONNX Runtime's minimal builds do.

What is saved (``hetflow_lite.package`` describes the files): the session runs the model on seeded
inputs (a capture), on other inputs (a replay, whose outputs the package is checked against) and on the
seeded ones again; then every array the captured jobs keep (weights and the kernels' copies of them,
argument blocks, the arena, the feeds' and outputs' buffers) is merged into regions of memory and saved
byte for byte, and each address the argument blocks and address tables (every ``int64`` array kept)
hold becomes a relocation: the region it points into and the offset there, or the kernel it calls. An
address that points anywhere else stops the compile: the package would read memory it does not carry.
Last, the package is loaded and run here on the replay's inputs, and its outputs must equal the
session's (on the last run's inputs its saved arena would already hold them).

A package runs only what was captured: a model whose run still calls a step from Python (a step with
no compiled job), or that is budgeted, or that runs on another device, cannot be compiled. Its inputs
have the shapes it was compiled with.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import hetflow
from hetflow.devices.cpu import native_library, spin_pool
from hetflow.devices.cpu.spin_pool import Job
from hetflow.errors import HetflowError
from hetflow.runtime.executor import Program
from hetflow.runtime.placement import random_feeds
from hetflow.runtime.replay import Replay, kept_arrays
from hetflow.runtime.session import InferenceSession
from hetflow_lite import package
from hetflow_lite.package import Manifest, Region, ScriptJob, Tensor

#: Integers at or above this are taken for addresses (Linux puts no mapping of a process's arrays below
#: 4 GiB on 64-bit targets); below it they are sizes, counts and codes.
MIN_ADDRESS = 1 << 32
#: ... and below this (x86-64's and AArch64's 48-bit user space).
MAX_ADDRESS = 1 << 48
#: The session's images per run: more than any batch, so that a batch runs whole (a package holds one
#: run; ``hetflow.runtime.sub_batch``).
_WHOLE_BATCH = 1 << 30


@dataclass(frozen=True)
class CompiledPackage:
    """What ``compile_package`` wrote: the folder, its manifest, and the package's outputs on the check's
    inputs (equal to the session's)."""

    folder: Path
    manifest: Manifest
    outputs: list[np.ndarray]


def compile_package(
    model: Any, folder: str | os.PathLike[str], *, batch: int = 1, threads: int = 2,
    feeds: Mapping[str, np.ndarray] | None = None, progress: native_library.Progress | None = None,
) -> CompiledPackage:  # fmt: skip
    """Compile ``model`` (anything ``InferenceSession`` takes) at ``batch`` (its symbolic dimensions)
    into the package folder ``folder`` (replaced if it holds a package), for runs on ``threads`` threads.

    Args:
        feeds: the inputs the session captures and checks on; None: seeded normal floats (zeros for
            integer inputs) of the model's input shapes.
        progress: told of each kernel as it is compiled (index, count, name; a few seconds each).

    Raises:
        HetflowError: the run is not wholly captured, a job reads memory the package cannot carry, no C
            compiler, or the package's outputs differ from the session's.
    """
    with warnings.catch_warnings():
        # A graph whose images are not computed apart runs every batch whole anyway, and says so.
        warnings.filterwarnings("ignore", message="sub_batch is ignored")
        session = InferenceSession(model, threads=threads, execution_mode="sequential", sub_batch=_WHOLE_BATCH)
    feed = dict(feeds) if feeds is not None else random_feeds(session.graph, batch=batch)
    session.run(None, feed)  # captures
    # The package is checked on other inputs than the last run's: its saved arena holds that run's
    # outputs, so a job that did nothing would go unseen on them.
    check_feed = _other_feeds(feed)
    expected = session.run(None, check_feed)
    session.run(None, feed)
    program, replay = _the_captured_run(session, feed)
    output_names = [arg.name for arg in session.get_outputs()]
    target = Path(folder)
    if target.exists() and not (target / package.MANIFEST).exists() and any(target.iterdir()):
        raise HetflowError(f"{target} exists and is not a compiled package: not overwritten")
    # Written beside the target and moved in place once checked: a failed compile leaves no package.
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        manifest = _write_package(model, program, replay, output_names, threads, partial, progress)
        outputs = _check_package(partial, threads, check_feed, dict(zip(output_names, expected)))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return CompiledPackage(target, manifest, outputs)


def _check_package(
    folder: Path, threads: int, feed: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """The package's outputs on ``feed``, loaded and run here; raises where they differ from ``expected``."""
    from hetflow_lite import CompiledSession

    lite = CompiledSession(folder, threads=threads)
    try:
        outputs = lite.run(list(expected), feed)
    finally:
        lite.close()
    for (name, want), got in zip(expected.items(), outputs):
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            gap = np.max(np.abs(got - want)) if got.shape == want.shape else f"shape {got.shape}"
            raise HetflowError(f"the compiled package's {name!r} differs from the session's ({gap}): not kept")
    return outputs


def _other_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs unlike ``feeds`` for the check: each float feed scaled, shifted and rolled (integer feeds,
    often indices or shapes, kept)."""
    return {
        name: (np.roll(value * -0.75 + 0.25, 1).astype(value.dtype) if np.issubdtype(value.dtype, np.floating) else value)
        for name, value in feeds.items()
    }


def _the_captured_run(session: InferenceSession, feeds: Mapping[str, np.ndarray]) -> tuple[Program, Replay]:
    runs = session.captured_runs()
    if not runs:
        raise HetflowError("the model's runs were not captured (a memory budget, another device, "
                           "HETFLOW_REPLAY=0, or a network that splits on BLAS's or the Python pool's "
                           "threads, not the spinning pool's: try threads=1): nothing to compile")  # fmt: skip
    # The run of the feeds' batch (a session may hold runs of other batches, or of other arrangements).
    shapes = {name: value.shape for name, value in feeds.items()}
    matching = [(program, replay) for program, replay in runs if _fed_alike(program, replay, shapes)]
    if not matching:
        raise HetflowError("no captured run took inputs of the feeds' shapes: nothing to compile")
    program, replay = matching[0]
    called = replay.called_nodes
    if called:
        listed = ", ".join(called[:5]) + (" ..." if len(called) > 5 else "")
        raise HetflowError(f"{len(called)} steps of the run still run from Python, with no compiled job "
                           f"({listed}): a compiled package needs every step captured")  # fmt: skip
    return program, replay


def _write_package(
    model: Any, program: Program, replay: Replay, output_names: list[str], threads: int, folder: Path,
    progress: native_library.Progress | None,
) -> Manifest:  # fmt: skip
    replay.rest()  # the jobs read the feeds' buffers, which the package carries, not a caller's arrays
    jobs = [job for script, _ in replay.scripts for job in script.jobs]
    owners = [owner for _, names in replay.scripts for owner in names]
    made = replay.made
    inputs = {name: _value_of(made, program.slots[name], name, "input") for name in _input_names(program)}
    outputs = {name: _value_of(made, program.slots[name], name, "output") for name in output_names}
    memory = _Memory([*kept_arrays(jobs), *inputs.values(), *outputs.values()])
    kernels = _Kernels()
    relocations = memory.relocations(jobs, owners, kernels)
    script = tuple(
        ScriptJob(kernels.index(job.address, owner), *memory.locate(job.block.ctypes.data), job.chunks, owner)
        for job, owner in zip(jobs, owners)
    )
    memory.write_images(folder / package.IMAGES)
    np.save(folder / package.RELOCATIONS, np.array(relocations, np.int64).reshape(-1, 4))
    native_library.build_library(native_library.job_entries(kernels.functions), folder / package.LIBRARY, progress)
    manifest = Manifest(
        model=str(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__,
        hetflow_version=hetflow.__version__,
        target={**native_library.target_description(), "processor": package.processor_name()},
        threads=threads,
        kernels=tuple(native_library.job_symbol(index) for index in range(len(kernels.functions))),
        regions=memory.regions,
        inputs=tuple(memory.tensor(name, array) for name, array in inputs.items()),
        outputs=tuple(memory.tensor(name, array) for name, array in outputs.items()),
        script=script,
    )
    manifest.write(folder)
    return manifest


def _fed_alike(program: Program, replay: Replay, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether ``replay``'s feed buffers (of the inputs its captured steps read) have ``shapes``."""
    feeds = {slot: buffer.shape for slot, buffer in replay.feeds}
    return all(feeds.get(program.slots.get(name), shape) == shape for name, shape in shapes.items())


def _input_names(program: Program) -> list[str]:
    by_slot = {slot: name for name, slot in program.slots.items()}
    return [by_slot[slot] for slot in program.input_slots]


def _value_of(made: dict[int, np.ndarray], slot: int, name: str, kind: str) -> np.ndarray:
    value = made.get(slot)
    if value is None:
        raise HetflowError(f"the {kind} {name!r} is not a buffer of the captured run: it cannot be compiled")
    if not value.flags.c_contiguous:
        raise HetflowError(f"the {kind} {name!r} is not C-contiguous in the captured run")
    return value


class _Kernels:
    """The distinct job functions of a run, in first-use order."""

    def __init__(self) -> None:
        self.functions: list[Callable[..., None]] = []
        self._indices: dict[int, int] = {}

    def index(self, address: int, owner: str) -> int:
        if address not in self._indices:
            function = spin_pool.COMPILED_JOBS.get(address)
            if function is None:
                raise HetflowError(f"a job of {owner!r} was not compiled by spin_pool.job: it cannot be compiled")
            self._indices[address] = len(self.functions)
            self.functions.append(function)
        return self._indices[address]

    def __contains__(self, address: int) -> bool:
        return address in spin_pool.COMPILED_JOBS


class _Memory:
    """The kept arrays merged into regions: stretches of memory, each saved whole."""

    def __init__(self, arrays: list[np.ndarray]):
        self._arrays = arrays
        #: Addresses of kept arrays with no elements: never read, so left as they are in the blocks.
        self._empty = {array.ctypes.data for array in arrays if array.nbytes == 0}
        bounds = sorted(_byte_bounds(array) for array in arrays if array.nbytes)
        merged: list[list[int]] = []
        for low, high in bounds:
            if merged and low <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        self._starts = [low for low, _ in merged]
        self._ends = [high for _, high in merged]
        self.regions = tuple(_file_layout(merged))

    def find(self, address: int) -> int | None:
        """The region holding ``address`` (its end included: a pointer one past an array), or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        return index if index >= 0 and address <= self._ends[index] else None

    def locate(self, address: int) -> tuple[int, int]:
        region = self.find(address)
        if region is None:
            raise HetflowError(f"address {address:#x} is in no region of the package")
        return region, address - self._starts[region]

    def tensor(self, name: str, array: np.ndarray) -> Tensor:
        region, offset = self.locate(array.ctypes.data)
        return Tensor(name, array.dtype.name, tuple(int(d) for d in array.shape), region, offset)

    def relocations(self, jobs: list[Job], owners: list[str], kernels: _Kernels) -> list[tuple[int, int, int, int]]:
        """(region, offset, target, target offset) of every address the kept ``int64`` arrays hold."""
        owner_of = {job.block.ctypes.data: owner for job, owner in zip(jobs, owners)}
        found: dict[int, tuple[int, int, int, int]] = {}
        for array in self._arrays:
            if array.dtype not in (np.int64, np.uint64) or not array.flags.c_contiguous or array.size == 0:
                continue
            start = array.ctypes.data
            for index in np.flatnonzero((array >= MIN_ADDRESS) & (array < MAX_ADDRESS)).tolist():
                value = int(array.flat[index])
                slot_region, slot_offset = self.locate(start + 8 * index)
                target = self.find(value)
                if target is not None:
                    found[start + 8 * index] = (slot_region, slot_offset, target, value - self._starts[target])
                elif value in self._empty:
                    continue
                elif value in kernels:
                    kernel = kernels.index(value, owner_of.get(start, "a job"))
                    found[start + 8 * index] = (slot_region, slot_offset, -1 - kernel, 0)
                else:
                    owner = owner_of.get(start, "a job")
                    raise HetflowError(f"{owner!r}'s job points at {value:#x}, outside every array its jobs keep: "
                                       "the package could not carry that memory")  # fmt: skip
        return list(found.values())

    def write_images(self, path: Path) -> None:
        """Each region's bytes at its file offset (the gaps between them zeros)."""
        with open(path, "wb") as images:
            for region, start, end in zip(self.regions, self._starts, self._ends):
                images.seek(region.file_offset)
                images.write(ctypes.string_at(start, end - start))


def _file_layout(stretches: list[list[int]]) -> Iterator[Region]:
    """The regions of ``stretches`` ([low, high) addresses), each placed in the images file at an offset
    with the same remainder modulo the page as its memory had, so that a mapping of the file puts every
    array at its old alignment (``hetflow_lite`` maps the file rather than reading it)."""
    cursor = 0
    for low, high in stretches:
        offset = cursor + (low - cursor) % package.PAGE
        yield Region(high - low, low % package.PAGE, offset)
        cursor = offset + high - low


def _byte_bounds(array: np.ndarray) -> tuple[int, int]:
    try:
        from numpy.lib.array_utils import byte_bounds
    except ImportError:  # numpy < 2
        byte_bounds = np.byte_bounds
    low, high = byte_bounds(array)
    return int(low), int(high)
