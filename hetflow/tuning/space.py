"""What can be chosen for a node: its workload signature and the candidate kernels.

A *workload* is everything that decides which kernel is fastest: the op, the concrete input shapes and
dtype, and the attributes that change the arithmetic (for Conv: strides, dilations, resolved pads,
group). Two layers with equal workloads share one measurement. The *space* of a node is the set of its
device's kernels that support it; kernels named ``auto`` dispatch at run time and are never candidates.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetflow.devices.base import Device, Kernel
from hetflow.graph import Node
from hetflow.graph.shapes import is_static
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import AUTO, conv_window
from hetflow.ops.spatial import geometry


@dataclass(frozen=True)
class Workload:
    """An op applied to concrete shapes; ``key`` is its stable text form (cache key, table label).

    Attributes:
        op: the op type.
        params: JSON-compatible description (shapes, dtype, attributes that matter).
    """

    op: str
    params: Mapping[str, Any]

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        # Cached: workloads are dict keys on every run's kernel lookups (OpenCL's GEMM configuration
        # per product), and each hash or comparison would serialise again (~15 us each).
        return json.dumps({"op": self.op, **self.params}, sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        """Short human-readable form for tables."""
        return " ".join(f"{k}={_short(v)}" for k, v in self.params.items())

    def __hash__(self) -> int:
        return hash(self.key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and self.key() == other.key()


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return str(value)


def _conv_workload(node: Node, inputs: Sequence[TensorInfo | None]) -> dict[str, Any]:
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    spec = conv_window(node.attrs, w.shape)
    geo = geometry(spec, [int(d) for d in x.shape[2:]])
    return {
        "x": [int(d) for d in x.shape],
        "w": [int(d) for d in w.shape],
        "dtype": str(x.dtype),
        "strides": list(spec.strides),
        "dilations": list(spec.dilations),
        "pads": [a.pad_begin for a in geo.axes] + [a.padded - a.pad_begin - a.size for a in geo.axes],
        "group": int(node.attrs.group),
    }


#: Op type -> workload description, for the ops whose kernels are chosen per layer.
WORKLOADS: dict[str, Callable[[Node, Sequence[TensorInfo | None]], dict[str, Any]]] = {
    "Conv": _conv_workload,
}


def workload_of(node: Node, inputs: Sequence[TensorInfo | None] | None) -> Workload | None:
    """The node's workload, or None when its op is not tuned or a shape is still symbolic."""
    describe = WORKLOADS.get(node.op_type)
    if describe is None or inputs is None:
        return None
    if any(info is not None and not is_static(info.shape) for info in inputs):
        return None
    return Workload(node.op_type, describe(node, inputs))


def tunable_kernels(device: Device, node: Node, inputs: Sequence[TensorInfo | None]) -> list[Kernel]:
    """The device's kernels that can run ``node`` with these inputs, dispatchers left out."""
    return [k for k in device.kernels.candidates(node, inputs) if k.algorithm != AUTO]
