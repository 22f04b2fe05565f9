"""CPU kernels: activations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node


@cpu_kernel("Relu")
def relu(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    return [np.maximum(x, x.dtype.type(0))]
