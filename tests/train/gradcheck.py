"""Finite-difference gradient checking of the ops' backward rules (float64, central differences)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.cpu.table import CPU_KERNELS
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.attrs import parse_attrs
from hetflow.ops.base import shape_only

#: Central-difference step: float64 round-off (1e-16 / h) and truncation (h^2) both stay near 1e-10.
STEP = 1e-6
TOLERANCE = 1e-5


@dataclass
class Case:
    """One gradient check: an op, its attributes, and its inputs.

    Attributes:
        op_type: the op.
        inputs: per input, a shape (random float64 data, checked), an array (a constant, not checked),
            or None (an omitted optional input).
        attrs: raw attribute values.
        outputs: how many outputs the node names.
        away_from: push random inputs at least this far from these kink points (Relu's 0, Clip's bounds).
        check: which inputs to check (default: every random one).
        prepare: maps the random inputs before use (e.g. a positive variance).
        loss_outputs: which outputs the loss reads (default: every float one; BatchNormalization's
            running statistics are state, not differentiable outputs).
        label: test id suffix.
    """

    op_type: str
    inputs: Sequence[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    away_from: Sequence[float] = ()
    check: Sequence[int] | None = None
    prepare: Callable[[list[np.ndarray | None]], list[np.ndarray | None]] | None = None
    loss_outputs: Sequence[int] | None = None
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.op_type}-{self.label}" if self.label else self.op_type


def make_node(case: Case) -> Node:
    opdef = registry.get(case.op_type)
    attrs = parse_attrs(opdef.Attrs, dict(case.attrs), op_type=case.op_type, node_name="n")
    names = [f"in{i}" if spec is not None else "" for i, spec in enumerate(case.inputs)]
    return Node(case.op_type, "n", names, [f"out{i}" for i in range(case.outputs)], attrs)


def make_inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray | None]:
    arrays: list[np.ndarray | None] = []
    for spec in case.inputs:
        if spec is None or isinstance(spec, np.ndarray):
            arrays.append(spec)
            continue
        x = rng.standard_normal(spec)
        for point in case.away_from:
            near = np.abs(x - point) < 0.05
            x[near] += np.where(x[near] >= point, 0.1, -0.1)
        arrays.append(x)
    return case.prepare(arrays) if case.prepare else arrays


def forward(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    kernel = CPU_KERNELS.lookup(node)
    assert kernel is not None, f"no CPU kernel for {node.op_type}"
    return list(kernel.fn(node, inputs))


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(analytic)), float(np.linalg.norm(numeric)), 1e-12)
    return float(np.linalg.norm(analytic - numeric)) / scale


def check_gradients(case: Case, seed: int = 0) -> dict[int, float]:
    """Relative error of every checked input's gradient; also asserts shapes and dtypes."""
    rng = np.random.default_rng(seed)
    node = make_node(case)
    inputs = make_inputs(case, rng)
    outputs = forward(node, inputs)
    # The loss is sum(g * y) over the float outputs, with fixed random weights g.
    read = case.loss_outputs if case.loss_outputs is not None else range(len(outputs))
    weights = [
        rng.standard_normal(y.shape) if y is not None and y.dtype.kind == "f" and i in read else None
        for i, y in enumerate(outputs)
    ]

    def loss(arrays: Sequence[np.ndarray | None]) -> float:
        results = forward(node, arrays)
        return sum(float(np.sum(g * y)) for g, y in zip(weights, results) if g is not None)

    opdef = registry.get(case.op_type)
    checked = case.check
    if checked is None:
        checked = [
            i for i, spec in enumerate(case.inputs) if spec is not None and not isinstance(spec, np.ndarray)
        ]
    wanted = [i in checked for i in range(len(inputs))]
    # Values the rule says it does not read are passed as zero-memory stand-ins, as the trainer does,
    # so a wrong ``backward_reads`` declaration fails here.
    read_inputs, read_outputs = opdef.backward_reads(node)
    given_inputs = [
        x if x is None or read_inputs is None or i in read_inputs else shape_only(x.shape, x.dtype)
        for i, x in enumerate(inputs)
    ]
    given_outputs = [
        y if y is None or read_outputs is None or i in read_outputs else shape_only(y.shape, y.dtype)
        for i, y in enumerate(outputs)
    ]
    grads = opdef.backward(node, given_inputs, given_outputs, weights, wanted)
    assert len(grads) == len(inputs)
    errors: dict[int, float] = {}
    for index in checked:
        x = inputs[index]
        analytic = grads[index]
        assert x is not None and analytic is not None, f"no gradient for input {index}"
        assert analytic.shape == x.shape and analytic.dtype == x.dtype
        numeric = np.zeros_like(x)
        for flat in range(x.size):
            position = np.unravel_index(flat, x.shape)
            original = x[position]
            x[position] = original + STEP
            plus = loss(inputs)
            x[position] = original - STEP
            minus = loss(inputs)
            x[position] = original
            numeric[position] = (plus - minus) / (2 * STEP)
        errors[index] = relative_error(analytic, numeric)
    return errors
