"""The on-disk tuning cache: an append-only JSON-lines log of measurements, best-on-load.

One line per measured workload (``TuningRecord.to_json``)::

    {"version": 1, "fingerprint": {...}, "device": "cpu", "op": "Conv", "kernels": "3f2a...",
     "hetflow": "0.1.0", "workload": {"x": [1, 64, 56, 56], ..., "threads": "spin:2+blas1"},
     "candidates": {"im2col": 0.0031,
     "winograd_f43": 0.0024, ...}, "errors": {}, "chosen": "winograd_f43", "protocol": {...},
     "date": "2026-11-21T14:20:00+00:00"}

Times are seconds (minimum over the protocol's rounds, see ``measure.py``). A CPU workload names the
thread arrangement it was timed in (``threads``: ``executor.ThreadArrangement.label``). Lines are only
ever appended, so concurrent writers and interrupted runs cannot damage earlier records. On load, records are kept only
when their format version, machine fingerprint and kernel source hash match this process (a timing from
another machine or from older kernels says nothing here); lines that do not parse are skipped with one
warning. Several records of one workload are merged: each candidate keeps its minimum time and the
fastest of them is the choice (best-on-load).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetflow.devices.base import Kernel
from hetflow.options import home_dir
from hetflow.tuning.space import Workload

FORMAT_VERSION = 1
RECORDS_FILE = "records.jsonl"


def cache_path() -> Path:
    """Where the default cache lives: ``$HETFLOW_HOME/tuning/records.jsonl``."""
    return home_dir() / "tuning" / RECORDS_FILE


def kernels_hash(kernels: Iterable[Kernel]) -> str:
    """A short hash of the source files defining ``kernels`` (wrapped bodies and the device sources a
    kernel lists in its ``kernel_sources`` attribute included).

    A record measured with other kernel code is stale: editing a kernel invalidates its timings.
    """
    return _source_hash(tuple(kernels))


@functools.cache
def _source_hash(kernels: tuple[Kernel, ...]) -> str:
    files: set[str] = set()
    for kernel in kernels:
        fn: Any = kernel.fn
        while fn is not None:
            source = inspect.getsourcefile(fn)
            if source:
                files.add(source)
            # Device kernels compiled from other files (OpenCL's .cl sources) name them here.
            files.update(getattr(fn, "kernel_sources", ()))
            fn = getattr(fn, "__wrapped__", None)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class TuningRecord:
    """One measurement of every candidate algorithm of one workload on one machine.

    Attributes:
        fingerprint: the device's ``fingerprint()`` (cpu model, numpy version ...).
        device: the device kind.
        workload: op and shape signature.
        kernels: ``kernels_hash`` of the candidates' sources.
        candidates: algorithm -> seconds (minimum over rounds) for every candidate that ran correctly.
        errors: algorithm -> error (``ErrorKind: message``) for the candidates that did not.
        chosen: the fastest candidate.
        protocol: the measurement options (warm-up, repeats).
        hetflow: hetflow's version.
        date: ISO-8601 time of the measurement.
        version: the record format version.
    """

    fingerprint: Mapping[str, str]
    device: str
    workload: Workload
    kernels: str
    candidates: Mapping[str, float]
    chosen: str
    errors: Mapping[str, str] = field(default_factory=dict)
    protocol: Mapping[str, Any] = field(default_factory=dict)
    hetflow: str = ""
    date: str = ""
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "fingerprint": dict(self.fingerprint),
                "device": self.device,
                "op": self.workload.op,
                "kernels": self.kernels,
                "hetflow": self.hetflow,
                "workload": dict(self.workload.params),
                "candidates": dict(self.candidates),
                "errors": dict(self.errors),
                "chosen": self.chosen,
                "protocol": dict(self.protocol),
                "date": self.date,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, line: str) -> TuningRecord:
        """Parse one line; raises ValueError (or KeyError/TypeError) when it is not a record."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        candidates = {str(k): float(v) for k, v in data["candidates"].items()}
        chosen = str(data["chosen"])
        if chosen not in candidates:
            raise ValueError(f"chosen '{chosen}' is not among the candidates")
        return cls(
            fingerprint={str(k): str(v) for k, v in data["fingerprint"].items()},
            device=str(data["device"]),
            workload=Workload(str(data["op"]), dict(data["workload"])),
            kernels=str(data["kernels"]),
            candidates=candidates,
            chosen=chosen,
            errors={str(k): str(v) for k, v in data.get("errors", {}).items()},
            protocol=dict(data.get("protocol", {})),
            hetflow=str(data.get("hetflow", "")),
            date=str(data.get("date", "")),
            version=int(data["version"]),
        )

    def merged(self, other: TuningRecord) -> TuningRecord:
        """Both measurements as one: each candidate's minimum time; the fastest is chosen."""
        times = dict(self.candidates)
        for algorithm, seconds in other.candidates.items():
            times[algorithm] = min(seconds, times.get(algorithm, seconds))
        chosen = min(times, key=times.__getitem__)
        latest = max(self, other, key=lambda r: r.date)
        errors = {k: v for k, v in {**self.errors, **other.errors}.items() if k not in times}
        return TuningRecord(
            self.fingerprint, self.device, self.workload, self.kernels, times, chosen, errors,
            latest.protocol, latest.hetflow, latest.date, self.version,
        )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class TuningCache:
    """The records that apply to one device of this machine, by (workload, kernel source hash).

    Args:
        path: the JSON-lines file; read at construction when it exists, appended to by ``add``.
        fingerprint: the device's fingerprint; records of other machines are ignored.
    """

    def __init__(self, path: Path, fingerprint: Mapping[str, str]):
        self.path = path
        self.fingerprint = dict(fingerprint)
        self._best: dict[tuple[Workload, str], TuningRecord] = {}
        self.ignored = 0  # records of another machine or format
        self.corrupt = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as log:
            for line in log:
                if not line.strip():
                    continue
                try:
                    record = TuningRecord.from_json(line)
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.corrupt += 1
                    continue
                if self._applies(record):
                    self._keep(record)
                else:
                    self.ignored += 1
        if self.corrupt:
            warnings.warn(
                f"tuning cache {self.path}: skipped {self.corrupt} line(s) that are not valid records",
                stacklevel=3,
            )

    def _applies(self, record: TuningRecord) -> bool:
        return record.version == FORMAT_VERSION and dict(record.fingerprint) == self.fingerprint

    def _keep(self, record: TuningRecord) -> None:
        key = (record.workload, record.kernels)
        known = self._best.get(key)
        self._best[key] = record if known is None else known.merged(record)

    def lookup(self, workload: Workload, kernels: str) -> TuningRecord | None:
        """The merged record of ``workload`` measured with kernel sources ``kernels``, or None."""
        return self._best.get((workload, kernels))

    def add(self, record: TuningRecord) -> None:
        """Append ``record`` to the file (created with its directory) and use it from now on."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as log:
            log.write(record.to_json() + "\n")
        self._keep(record)

    def records(self) -> Sequence[TuningRecord]:
        return list(self._best.values())

    def __len__(self) -> int:
        return len(self._best)
