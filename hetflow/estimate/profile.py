"""DeviceProfile: what calibration measured on one device, saved as JSON, read by the predictor.

A profile holds these groups of fitted terms:

* ``gemm``: the matrix-multiplication model — a peak rate, a cost per element of each operand and
  of the result, a fixed cost, and the residuals of an (n, m, k) grid: the small- and thin-matrix
  inefficiency that a linear-in-FLOPs model (Augur's) cannot capture; ``gemm_one_thread`` the same
  with BLAS at one thread, for runs that split their products over their own threads;
* ``memory``: copy bandwidth as a function of the working set (cache levels, then DRAM), and the rate of
  simple elementwise arithmetic;
* ``dispatch_s`` / ``run_overhead_s``: the executor's cost per node and per ``run`` call;
  ``replayed_step_s`` / ``direct_run_s`` / ``direct_run_bytes``: a step replayed from compiled code
  against its layer timed alone, and a run replayed whole around its jobs (time and Python objects);
* ``last_level_cache_bytes``: the cache a layer timed alone works from and a whole run keeps
  overflowing (``hetflow.estimate.cache``: what layers lose inside a run);
* ``transfer``: host-to-device and device-to-host copies as latency plus bytes over bandwidth (zero on
  the CPU; on host-unified-memory devices a map, which is what the bandwidth then measures);
* ``ops``: one linear model per (op type, algorithm) over physical features (GEMM seconds, bytes over
  bandwidth, elementwise work, a fixed overhead) and the kernel's transient memory; a layer that runs
  differently inside some runs has a key of its own (``Conv/direct_fma@spin``: shared out on the
  spinning pool in batch-1 runs of small networks; ``LSTM/sequence``: every step in one compiled loop).

Every number is plain JSON, so a profile for a device you do not have is a file you can copy or edit
(a what-if: halve ``gemm.peak_gflops`` and see what a slower chip would do).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetflow.errors import HetflowError
from hetflow.options import home_dir

#: ``format`` field of every profile file; ``version`` is bumped when the schema changes.
PROFILE_FORMAT = "hetflow.device-profile"
PROFILE_VERSION = 3

#: Order of the per-op feature vector (see ``hetflow.estimate.predict.features``).
FEATURES = ("overhead", "gemm", "calls", "io", "workspace", "strided_workspace", "flops")


class ProfileError(HetflowError):
    """A profile file is missing, unreadable or not a hetflow device profile."""


@dataclass
class GemmModel:
    """Time of one ``[n x k] @ [k x m]`` product.

    ``t = (overhead_s + n*m*k / peak + m*k*columns_s + n*k*weights_s + n*m*output_s) * exp(r)``: a fixed
    cost, the multiply-adds at the peak rate, and a cost per element of each operand and of the
    result (packing and traffic: what makes thin and small matrices slow), times the factor ``exp(r)``
    that the grid's measurements add, ``r`` interpolated in log n, log m, log k between the ``knots``
    (``residual[i][j][l]`` at knots ``n[i], m[j], k[l]``).
    """

    peak_gflops: float = 100.0
    overhead_s: float = 1e-6
    columns_s: float = 0.0
    weights_s: float = 0.0
    output_s: float = 0.0
    knots: dict[str, list[float]] = field(default_factory=lambda: {"n": [1.0], "m": [1.0], "k": [1.0]})
    residual: list[list[list[float]]] = field(default_factory=lambda: [[[0.0]]])
    fit_mape: float = 0.0


@dataclass
class MemoryModel:
    """Copy bandwidth by working set (bytes read + written), the elementwise arithmetic rate, and the
    rate of reading data again after a footprint of other reads (how much of a run the last-level cache
    keeps: ``hetflow.estimate.cache.HitCurve``; empty in profiles calibrated before it)."""

    working_set_bytes: list[float] = field(default_factory=lambda: [1e6])
    bandwidth_gbs: list[float] = field(default_factory=lambda: [10.0])
    elementwise_gflops: float = 1.0
    reread_bytes: list[float] = field(default_factory=list)
    reread_gbs: list[float] = field(default_factory=list)


@dataclass
class TransferModel:
    """Seconds to move ``b`` bytes each way: ``latency_s + b / (gbs * 1e9)``.

    A bandwidth of 0 means nothing is copied that way (the host's own memory): the time is 0.
    """

    latency_s: float = 0.0
    to_device_gbs: float = 0.0
    to_host_gbs: float = 0.0

    def to_device_seconds(self, nbytes: int) -> float:
        return _transfer_seconds(self.latency_s, self.to_device_gbs, nbytes)

    def to_host_seconds(self, nbytes: int) -> float:
        return _transfer_seconds(self.latency_s, self.to_host_gbs, nbytes)


def _transfer_seconds(latency_s: float, gbs: float, nbytes: int) -> float:
    return 0.0 if gbs <= 0 or nbytes <= 0 else latency_s + nbytes / (gbs * 1e9)


@dataclass
class OpModel:
    """Time and transient memory of one (op type, algorithm) as linear models over features.

    Attributes:
        coef: seconds per unit of each feature in ``FEATURES`` order.
        transient: bytes allocated during a call per byte of activation inputs, outputs, workspace and
            padded input (``hetflow.estimate.predict.memory_terms``).
        retained: fraction of the output bytes a call leaves allocated (0 for views of an input).
        samples: calibration points the fit used; fit_mape: their mean absolute relative error.
        curve_knots, curve_values: the residual curve over the linear model's time (log seconds ->
            log(measured / linear); ``hetflow.estimate.models.fit_curve``); empty: none.
        neighbours: per calibration sample, where it lies and what the model above left unexplained
            (``hetflow.estimate.models.neighbour_factor``); empty: no correction.
    """

    coef: list[float]
    transient: list[float] = field(default_factory=lambda: [0.0, 1.0, 1.0, 1.0])
    retained: float = 1.0
    samples: int = 0
    fit_mape: float = 0.0
    curve_knots: list[float] = field(default_factory=list)
    curve_values: list[float] = field(default_factory=list)
    neighbours: list[list[float]] = field(default_factory=list)

    def seconds(self, features: np.ndarray) -> float:
        """Predicted seconds of one call with these feature values: the linear model times its curve,
        times the correction of the nearest calibration samples."""
        from hetflow.estimate.models import neighbour_factor

        return self.smooth_seconds(features) * neighbour_factor(self.neighbours, features)

    def smooth_seconds(self, features: np.ndarray) -> float:
        """The linear model times its size curve (what the nearest-sample correction is fitted over)."""
        from hetflow.estimate.models import curve_factor

        base = float(np.dot(self.coef, features))
        return base * curve_factor(self.curve_knots, self.curve_values, base)


@dataclass
class DeviceProfile:
    """Everything the predictor needs to know about one device.

    Attributes:
        device: the device id it was calibrated on (``"cpu"``), or any name for a hand-made profile.
        name: human-readable device name.
        fingerprint: what identifies the device (``Device.fingerprint()``).
        created: ISO date and time of the calibration.
        hetflow_version: version that wrote it.
        threads: worker threads the calibration ran with.
        quick: True for a reduced calibration (tests, first use); less accurate.
    """

    device: str
    name: str = ""
    fingerprint: dict[str, str] = field(default_factory=dict)
    created: str = ""
    hetflow_version: str = ""
    threads: int = 1
    quick: bool = False
    gemm: GemmModel = field(default_factory=GemmModel)
    #: the GEMM model with BLAS at one thread: what each part costs when a run splits its products over
    #: its own threads (``hetflow.runtime.executor.splits_gemms``); None: calibrated with one thread.
    gemm_one_thread: GemmModel | None = None
    memory: MemoryModel = field(default_factory=MemoryModel)
    dispatch_s: float = 5e-6
    run_overhead_s: float = 2e-5
    #: what a step replayed from compiled code saves against its layer timed alone (called from Python),
    #: and what a run replayed whole adds around its jobs, in seconds and in bytes allocated beyond its
    #: outputs' data (``calibrate.DirectRuns``; 0 in profiles written before they were measured).
    replayed_step_s: float = 0.0
    direct_run_s: float = 0.0
    direct_run_bytes: int = 0
    #: the last-level cache in bytes (0: unknown, no in-run cold-data term; ``hetflow.estimate.cache``).
    last_level_cache_bytes: int = 0
    transfer: TransferModel = field(default_factory=TransferModel)
    ops: dict[str, OpModel] = field(default_factory=dict)

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "features": list(FEATURES), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceProfile:
        """Build a profile from parsed JSON; raises ProfileError when it is not one."""
        if data.get("format") != PROFILE_FORMAT:
            raise ProfileError(f"not a hetflow device profile (format is {data.get('format')!r})")
        if data.get("version") != PROFILE_VERSION:
            raise ProfileError(
                f"device profile version {data.get('version')} is not supported (expected "
                f"{PROFILE_VERSION}); run `hetflow calibrate` again"
            )
        try:
            return cls(
                device=str(data["device"]),
                name=str(data.get("name", "")),
                fingerprint={str(k): str(v) for k, v in data.get("fingerprint", {}).items()},
                created=str(data.get("created", "")),
                hetflow_version=str(data.get("hetflow_version", "")),
                threads=int(data.get("threads", 1)),
                quick=bool(data.get("quick", False)),
                gemm=GemmModel(**data["gemm"]),
                gemm_one_thread=GemmModel(**data["gemm_one_thread"]) if data.get("gemm_one_thread") else None,
                memory=MemoryModel(**data["memory"]),
                dispatch_s=float(data.get("dispatch_s", 5e-6)),
                run_overhead_s=float(data.get("run_overhead_s", 2e-5)),
                replayed_step_s=float(data.get("replayed_step_s", 0.0)),
                direct_run_s=float(data.get("direct_run_s", 0.0)),
                direct_run_bytes=int(data.get("direct_run_bytes", 0)),
                last_level_cache_bytes=int(data.get("last_level_cache_bytes", 0)),
                # NOTE: profiles written before the transfer model existed are host profiles: no copies.
                transfer=TransferModel(**data.get("transfer", {})),
                ops={key: OpModel(**value) for key, value in data.get("ops", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProfileError(f"malformed device profile: {type(error).__name__}: {error}") from error

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON (atomically: a temporary file renamed into place)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, target)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DeviceProfile:
        """Read a profile written by ``save`` (or by hand); raises ProfileError."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ProfileError(f"cannot read device profile {os.fspath(path)}: {error}") from error
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ProfileError(f"device profile {os.fspath(path)} is not JSON: {error}") from error
        if not isinstance(data, dict):
            raise ProfileError(f"device profile {os.fspath(path)} is not a JSON object")
        return cls.from_dict(data)

    def describe(self) -> str:
        """One line: device, date, quick or full."""
        kind = "quick calibration" if self.quick else "calibrated"
        when = self.created[:16].replace("T", " ") if self.created else "unknown date"
        return f"{self.device} ({self.name or 'unnamed'}; {kind} {when}, {self.threads} thread(s))"


def now_iso() -> str:
    """The current local time as ISO 8601 with seconds."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def fingerprint_key(fingerprint: dict[str, str]) -> str:
    """A short stable hash of a device fingerprint (file names of default profiles)."""
    canonical = json.dumps(fingerprint, sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def profiles_dir() -> Path:
    """Where default profiles live: ``<hetflow home>/profiles``."""
    return home_dir() / "profiles"


def default_profile_path(device_id: str, fingerprint: dict[str, str]) -> Path:
    """The default profile file of ``device_id`` with this fingerprint (one file per machine)."""
    safe = "".join(c if c.isalnum() else "-" for c in device_id)
    return profiles_dir() / f"{safe}-{fingerprint_key(fingerprint)}.json"
