"""A compiled package's files and manifest: what ``hetflow compile`` writes and ``CompiledSession`` reads.

A package is a folder:

- ``manifest.json``: the format and version, the target it was built for, the inputs and outputs (where
  each lives in memory), the memory regions, and the script of jobs (kernel, argument block, chunks,
  node) in run order;
- ``kernels.so``: the jobs' machine code and the replay and worker loops
  (``hetflow.devices.cpu.native_library``);
- ``regions.bin``: each region's bytes as the capture left them (weights, derived weights, argument
  blocks, the arena), one after the other;
- ``relocations.npy``: every address the regions hold, as (region, byte offset, target, target offset);
  a target from 0 up is a region, -1 - k is the library's kernel k.

A region is a stretch of memory some job reads or writes: the union of the arrays the captured jobs
keep. Each lies in ``regions.bin`` at an offset with the same remainder modulo the page as its memory
had, so that loading can map the file copy-on-write (every array keeps its alignment, the weights stay
shared pages of the file) and then writes the new addresses where the relocations say.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = "hetflow-compiled-package"
#: 2: regions at their page offsets in ``IMAGES``, for mapping.
VERSION = 2
MANIFEST = "manifest.json"
LIBRARY = "kernels.so"
IMAGES = "regions.bin"
RELOCATIONS = "relocations.npy"
#: Regions keep their original offset within a page of this size, in memory and in ``IMAGES``.
PAGE = 4096


class PackageError(Exception):
    """A compiled package that cannot be loaded here: missing, damaged, of another version or target."""


@dataclass(frozen=True)
class Region:
    """A stretch of memory: its size, its offset within a page, and where its bytes start in ``IMAGES``."""

    size: int
    page_offset: int
    file_offset: int


@dataclass(frozen=True)
class Tensor:
    """An input or output: its name, dtype (numpy's name), shape, and where it lives (region, offset)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    region: int
    offset: int


@dataclass(frozen=True)
class ScriptJob:
    """One job of the run: its kernel (index into ``Manifest.kernels``), its argument block (region,
    offset), its chunk count and the node it computes."""

    kernel: int
    block_region: int
    block_offset: int
    chunks: int
    node: str


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` holds (see the module docstring)."""

    model: str
    hetflow_version: str
    target: dict[str, str]
    threads: int
    kernels: tuple[str, ...]
    regions: tuple[Region, ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    script: tuple[ScriptJob, ...]

    def write(self, folder: Path) -> None:
        document = {"format": FORMAT, "version": VERSION, **asdict(self)}
        (folder / MANIFEST).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")

    @staticmethod
    def read(folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PackageError(f"{folder} is not a compiled package: no {MANIFEST}") from None
        except (OSError, ValueError) as error:
            raise PackageError(f"{path} cannot be read: {error}") from error
        if document.get("format") != FORMAT:
            raise PackageError(f"{path} is not a hetflow compiled package's manifest")
        if document.get("version") != VERSION:
            raise PackageError(f"{folder} is a version {document.get('version')} package; this runtime reads "
                               f"version {VERSION}: compile the model again")  # fmt: skip
        try:
            return Manifest(
                model=document["model"],
                hetflow_version=document["hetflow_version"],
                target=dict(document["target"]),
                threads=int(document["threads"]),
                kernels=tuple(document["kernels"]),
                regions=tuple(Region(**region) for region in document["regions"]),
                inputs=tuple(_tensor(item) for item in document["inputs"]),
                outputs=tuple(_tensor(item) for item in document["outputs"]),
                script=tuple(ScriptJob(**job) for job in document["script"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise PackageError(f"{path} is damaged: {error!r}") from error


def _tensor(item: dict) -> Tensor:
    return Tensor(item["name"], item["dtype"], tuple(int(d) for d in item["shape"]), int(item["region"]),
                  int(item["offset"]))  # fmt: skip


def processor_name() -> str:
    """This machine's CPU model (``/proc/cpuinfo``), which a package must have been compiled on."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
