"""OpDef: what an operator *is* (attributes, shapes, cost), independent of any device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Shape, is_static
from hetflow.ops.attrs import NoAttrs


class TensorInfo(NamedTuple):
    """Static information about one tensor: shape (may hold symbols) and dtype."""

    shape: Shape
    dtype: np.dtype


@dataclass(frozen=True)
class GemmDims:
    """The matrix multiplication an op reduces to, in Augur's convention.

    ``n`` output channels (kernels), ``m`` output positions (Ow*Oh, times the batch where it is folded
    in), ``k`` reduction length (Kw*Kh*C/group). ``count`` is how many such GEMMs run (groups x batch).
    """

    n: int
    m: int
    k: int
    count: int = 1


@dataclass(frozen=True)
class Cost:
    """The work one node does, for concrete shapes.

    Attributes:
        macs: multiply-accumulates.
        flops: other arithmetic operations (elementwise, reductions, transcendental ops count 1).
        bytes_read: bytes of every input read once.
        bytes_written: bytes of every output written once.
        gemm: the im2col GEMM the op reduces to, if any.
        workspace_bytes: scratch memory beyond inputs and outputs (e.g. the im2col buffer).
    """

    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    gemm: GemmDims | None = None
    workspace_bytes: int = 0


def nbytes(info: TensorInfo | None) -> int:
    """Bytes of a tensor with a static shape (0 for an omitted or symbolic one)."""
    if info is None or not is_static(info.shape):
        return 0
    return int(np.prod(info.shape, dtype=np.int64)) * info.dtype.itemsize


def numel(info: TensorInfo | None) -> int:
    if info is None or not is_static(info.shape):
        return 0
    return int(np.prod(info.shape, dtype=np.int64))


def present_outputs_bytes(node: Node, outputs: Sequence[TensorInfo]) -> int:
    """Bytes of the outputs ``node`` actually has (an optional output it omits costs nothing)."""
    return sum(nbytes(info) for name, info in zip(node.outputs, outputs) if name)


class OpDef:
    """Base of every operator definition.

    Subclasses set ``op_type``, ``Attrs`` (a frozen dataclass; see ``hetflow.ops.attrs``), the accepted
    input/output counts, and override ``infer``; ``cost`` defaults to "read every input, write every
    output" and ops with real arithmetic override it.

    Traits (strings) tell passes and planners what they may do without knowing the op:
    ``"elementwise"`` (output element i depends on input element i), ``"fusable"`` (an activation that a
    producer's epilogue can apply), ``"shape"`` (cheap host-side shape arithmetic), ``"noop"``
    (inference-time identity), ``"view"`` (the output can alias the input's memory: a reshape).
    """

    op_type: ClassVar[str]
    domain: ClassVar[str] = ""
    Attrs: ClassVar[type] = NoAttrs
    num_inputs: ClassVar[tuple[int, int]] = (1, 1)  # (min, max); max -1 = variadic
    num_outputs: ClassVar[tuple[int, int]] = (1, 1)
    traits: ClassVar[frozenset[str]] = frozenset()

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        """Output shapes and dtypes from input ones.

        Args:
            node: the node (read ``node.attrs``; ``node.outputs`` tells which optional outputs exist).
            inputs: one entry per ``node.inputs``; ``None`` for an omitted optional input.
            consts: the value of each input when it is a constant (initializer), else ``None``.

        Returns:
            One TensorInfo per output the op defines (optional outputs included).

        Raises:
            ValueError: with a readable reason when the inputs are inconsistent.
        """
        raise NotImplementedError(f"{self.op_type} has no shape inference")

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """Work for concrete shapes. The default reads inputs and writes outputs once."""
        flops = sum(numel(o) for o in outputs) if "elementwise" in self.traits else 0
        return Cost(
            flops=flops,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=sum(nbytes(o) for o in outputs),
        )
