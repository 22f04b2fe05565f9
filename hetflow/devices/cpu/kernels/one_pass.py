"""Binding a step that is one compiled pass over its input (a Relu, an LRN, a global mean) to the Y the
memory plan placed, so that a captured run replays it as one job (``hetflow.runtime.replay``).

In a run, a step called from Python after compiled ones costs far more than alone: its interpreter state
and data were evicted by the layers before it (GoogLeNet's final 7x7 pool, 8 us alone, took 85 in its
run). These helpers keep the three such prepares to what differs between them: the shape of Y and the job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels.buffers import Out
from hetflow.devices.cpu.spin_pool import Job
from hetflow.ops.base import TensorInfo


def float32_target(x_info: TensorInfo | None, out: Out, shape: Sequence[int] | None = None) -> np.ndarray | None:
    """The planned Y (``out[0]``) of a float32 step, where one compiled pass can write it: None unless X is
    float32 with known dimensions and Y a C-contiguous float32 array of ``shape`` (X's by default)."""
    target = out[0] if out is not None else None
    if x_info is None or target is None or x_info.dtype != np.float32 or target.dtype != np.float32:
        return None
    if not all(isinstance(d, int) for d in x_info.shape):
        return None
    wanted = tuple(x_info.shape) if shape is None else tuple(shape)
    return target if target.shape == wanted and target.flags.c_contiguous else None


def captured_as_one_job(
    call: Callable[[Sequence[np.ndarray | None]], list[np.ndarray]], target: np.ndarray,
    job_for: Callable[[np.ndarray], Job],
) -> BoundCall:  # fmt: skip
    """``call`` carrying a capture that writes ``target`` by ``job_for(x)`` (X C-contiguous; else no capture)."""

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        x = arrays[0]
        if x is None or not x.flags.c_contiguous:
            return None
        return [target], [job_for(x)]

    return with_capture(call, capture)
