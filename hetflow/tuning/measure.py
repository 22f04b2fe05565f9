"""How a candidate kernel is timed, written down once.

Protocol (AutoTVM's, adapted to a shared, noisy CPU):

1. Inputs are seeded random normal arrays of the workload's shapes and dtype (values do not change a
   dense kernel's time); the node itself (attributes, fused activation) is the layer's.
2. Every candidate runs ``warmup`` times untimed: first-touch page faults, BLAS thread start-up and
   per-weight caches (Winograd's transformed weights) are paid here, as they are once per session.
3. The warm-up outputs are validated against the reference candidate (the first one, normally an exact
   GEMM method) with a tolerance of ``1e4 * eps(dtype)`` of the reference's largest magnitude; a
   candidate that raises or disagrees is recorded with its error kind and never chosen.
4. Timed rounds follow; each round times every valid candidate once (``perf_counter`` around one
   call), starting from a different candidate each round, so that load from other processes falls on
   all of them alike. At least ``repeats`` rounds run, and more (up to ``max_repeats``) until every
   candidate has been timed for ``min_seconds`` in total: a short kernel gets many chances at one
   undisturbed run, since a scheduler time slice lost to another process costs more than it does.
5. A timed call is the device's ``timed_call``: on the CPU the kernel writing into outputs and a
   workspace allocated once, as the run's arena hands them (``Kernel.steady_call``); on OpenCL the inputs a
   run passes between device nodes are staged on the device first, weights stay resident, and the call
   waits for the queue, so a discrete GPU times the algorithm and not a PCIe round trip per call.
6. A candidate's time is the minimum over its rounds: the least-disturbed run estimates what the kernel
   costs, and minimums are what stay stable on a shared machine.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.devices.base import Device, Kernel, aligned_inputs
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo


@dataclass(frozen=True)
class MeasureOptions:
    """How hard to measure: untimed warm-up calls, then timed rounds (see the protocol above)."""

    warmup: int = 1
    repeats: int = 5
    min_seconds: float = 0.05
    max_repeats: int = 50


#: ``hetflow tune --effort``: fast for a first fill, full for numbers worth keeping.
EFFORTS = {
    "fast": MeasureOptions(warmup=1, repeats=3, min_seconds=0.03, max_repeats=20),
    "full": MeasureOptions(warmup=2, repeats=10, min_seconds=0.2, max_repeats=100),
}


class ErrorKind(str, enum.Enum):
    """Why a candidate has no time."""

    RUNTIME_ERROR = "runtime_error"
    WRONG_RESULT = "wrong_result"


@dataclass(frozen=True)
class MeasureResult:
    """One candidate's outcome: its minimum time in seconds, or the error that disqualified it."""

    algorithm: str
    seconds: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.seconds is not None


def random_inputs(inputs: Sequence[TensorInfo | None], seed: int = 0) -> list[np.ndarray | None]:
    """Seeded random arrays with the shapes and dtypes of ``inputs`` (None stays None)."""
    rng = np.random.default_rng(seed)
    arrays: list[np.ndarray | None] = []
    for info in inputs:
        if info is None:
            arrays.append(None)
        elif info.dtype.kind == "f":
            arrays.append(rng.standard_normal([int(d) for d in info.shape]).astype(info.dtype))
        else:
            arrays.append(rng.integers(0, 4, size=[int(d) for d in info.shape]).astype(info.dtype))
    return arrays


def measure(
    kernels: Sequence[Kernel],
    node: Node,
    inputs: Sequence[TensorInfo | None],
    options: MeasureOptions | None = None,
    device: Device | None = None,
) -> list[MeasureResult]:
    """Time every kernel on ``node`` with random inputs of the given shapes, by the protocol above.

    With ``device`` (the kernels' own) each timed call is ``device.timed_call``: inputs staged where a
    run would have them, the call waited for. Results are checked with host inputs either way.
    """
    options = options or MeasureOptions()
    # On cache lines once here, as a run's arena gives them: else every candidate's timed call would
    # align its own copy of each misaligned input, weights included (``aligned_inputs``).
    arrays = aligned_inputs(random_inputs(inputs))
    errors: dict[str, str] = {}
    reference: np.ndarray | None = None
    for kernel in kernels:
        try:
            for _ in range(max(1, options.warmup)):
                output = kernel.fn(node, arrays)[0]
        except Exception as error:  # noqa: BLE001  (a failing candidate is data, not a crash)
            errors[kernel.algorithm] = f"{ErrorKind.RUNTIME_ERROR.value}: {type(error).__name__}: {error}"
            continue
        assert output is not None
        if reference is None:
            reference = np.asarray(output)
        elif not _agrees(np.asarray(output), reference):
            errors[kernel.algorithm] = f"{ErrorKind.WRONG_RESULT.value}: differs from {kernels[0].algorithm}"
    valid = [k for k in kernels if k.algorithm not in errors]
    calls = {
        k.algorithm: device.timed_call(k, node, arrays) if device is not None else k.steady_call(node, arrays)
        for k in valid
    }
    best: dict[str, float] = {k.algorithm: float("inf") for k in valid}
    spent = dict.fromkeys(best, 0.0)
    round_index = 0
    while valid and (
        round_index < max(1, options.repeats)
        or (round_index < options.max_repeats and min(spent.values()) < options.min_seconds)
    ):
        shift = round_index % len(valid)
        for kernel in valid[shift:] + valid[:shift]:
            started = time.perf_counter()
            calls[kernel.algorithm]()
            elapsed = time.perf_counter() - started
            best[kernel.algorithm] = min(best[kernel.algorithm], elapsed)
            spent[kernel.algorithm] += elapsed
        round_index += 1
    return [
        MeasureResult(k.algorithm, None, errors[k.algorithm])
        if k.algorithm in errors
        else MeasureResult(k.algorithm, best[k.algorithm])
        for k in kernels
    ]


def _agrees(output: np.ndarray, reference: np.ndarray) -> bool:
    if output.shape != reference.shape or output.dtype != reference.dtype:
        return False
    if output.dtype.kind != "f":
        return bool(np.array_equal(output, reference))
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    tolerance = 1e4 * float(np.finfo(output.dtype).eps) * max(scale, 1e-30)
    return bool(np.all(np.abs(output.astype(np.float64) - reference) <= tolerance))
