"""Pieces every OpenCL launcher uses: reading ``.cl`` sources, the fused-activation epilogue's build
option and arguments, float32 checks for ``supports``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation

HERE = Path(__file__).parent

#: ``ACT`` codes of epilogue.cl (and gemm.cl).
ACTIVATION_CODES = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "Tanh": 5}


def source(*names: str) -> str:
    """The ``.cl`` files ``names`` (beside this module) joined into one program source."""
    return "\n".join((HERE / name).read_text(encoding="utf-8") for name in names)


def source_paths(*names: str) -> tuple[str, ...]:
    """Absolute paths of ``.cl`` files (tuning hashes them with the launcher's own source)."""
    return tuple(str(HERE / name) for name in names)


def act_options(fused: FusedActivation | None) -> tuple[str, ...]:
    """Build options selecting the fused activation of epilogue.cl."""
    return (f"-DACT={ACTIVATION_CODES[fused.op_type if fused is not None else None]}",)


def act_args(fused: FusedActivation | None) -> tuple[np.float32, np.float32]:
    """The epilogue's ``act_a``, ``act_b`` kernel arguments."""
    if fused is None:
        return np.float32(0), np.float32(0)
    return np.float32(fused.alpha), np.float32(fused.beta)


def float32_reason(node: Node, inputs: InputInfos, indices: Sequence[int] | None = None) -> str | None:
    """A reason when any of the (selected) known inputs is not float32."""
    if inputs is None:
        return None
    chosen = range(len(inputs)) if indices is None else indices
    for index in chosen:
        info = inputs[index] if index < len(inputs) else None
        if info is not None and info.dtype != np.float32:
            return f"OpenCL {node.op_type} runs float32 only, got {info.dtype}"
    return None


def rank_reason(node: Node, inputs: InputInfos, rank: int) -> str | None:
    """A reason when the first input's rank is known and is not ``rank``."""
    if inputs is None or inputs[0] is None:
        return None
    if len(inputs[0].shape) != rank:
        return f"OpenCL {node.op_type} runs rank-{rank} inputs only, got rank {len(inputs[0].shape)}"
    return None


def i32(*values: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(v) for v in values)
