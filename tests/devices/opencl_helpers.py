"""Helpers of the OpenCL kernel tests: run one node on the OpenCL device and on the CPU device (the
reference) with the same inputs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu import CPUDevice
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.registry import lookup

CPU = CPUDevice()


def random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def make_node(op_type: str, inputs: Sequence[np.ndarray | None], outputs: int = 1, **attrs: object) -> Node:
    """A node of ``op_type`` with its attrs object built from ``attrs`` (schema defaults elsewhere);
    omitted inputs (None) get an empty name, as ONNX writes them."""
    definition = lookup(op_type)
    attrs_type = getattr(definition, "Attrs", None)
    built = attrs_type(**attrs) if attrs_type is not None else None
    names = ["" if x is None else f"in{i}" for i, x in enumerate(inputs)]
    return Node(op_type, f"{op_type.lower()}0", names, [f"out{i}" for i in range(outputs)], attrs=built)


def infos(inputs: Sequence[np.ndarray | None]) -> list[TensorInfo | None]:
    return [None if x is None else TensorInfo(x.shape, x.dtype) for x in inputs]


def run_both(
    device: object, node: Node, inputs: Sequence[np.ndarray | None], algorithm: str | None = None
) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """(OpenCL outputs, CPU outputs) of ``node``; ``algorithm`` picks one OpenCL kernel by name."""
    known = infos(inputs)
    candidates = device.kernels.candidates(node, known)
    if algorithm is not None:
        candidates = [k for k in candidates if k.algorithm == algorithm]
    assert candidates, device.kernels.reason_unsupported(node, known)
    got = list(candidates[0].fn(node, list(inputs)))
    reference = CPU.kernels.lookup(node, known)
    assert reference is not None
    expected = list(reference.fn(node, [None if x is None else x.copy() for x in inputs]))
    return got, expected


def assert_close(got: np.ndarray | None, expected: np.ndarray | None, rtol: float = 1e-5) -> None:
    """``max|got - expected| <= rtol * max|expected|`` (and equal shapes and dtypes)."""
    assert got is not None and expected is not None
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape)
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-6)
    error = float(np.abs(got.astype(np.float64) - expected).max(initial=0.0))
    assert error <= rtol * scale, f"max error {error:.3g} > {rtol:g} * {scale:.3g}"
