"""OpDef: what an operator *is* (attributes, shapes, cost), independent of any device."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from hetflow.graph import Node, Value
from hetflow.graph.shapes import Shape, is_static
from hetflow.ops.attrs import NoAttrs


class TensorInfo(NamedTuple):
    """Static information about one tensor: shape (may hold symbols) and dtype."""

    shape: Shape
    dtype: np.dtype


class WeightInfo(TensorInfo):
    """The ``TensorInfo`` of an initializer, as a plan binds a kernel to it: the same array on every call,
    never written while the plan lives, so a kernel may keep a rearranged copy of it (packed, transformed).
    """

    __slots__ = ()


def planned_infos(
    node: Node, values: Mapping[str, Value], weights: Collection[str] = frozenset()
) -> list[TensorInfo | None] | None:
    """The node's inputs as a plan's graph knows them (None for an omitted one; None in all when any is
    unknown), those named in ``weights`` (the initializers a plan keeps resident) as ``WeightInfo``: what
    a kernel is bound to (``Kernel.bind``)."""
    infos: list[TensorInfo | None] = []
    for name in node.inputs:
        if not name:
            infos.append(None)
            continue
        value = values.get(name)
        if value is None or value.shape is None or value.dtype is None:
            return None
        info_type = WeightInfo if name in weights else TensorInfo
        infos.append(info_type(tuple(value.shape), np.dtype(value.dtype)))
    return infos


def array_infos(arrays: Sequence[Any], weights: Collection[int] = ()) -> list[TensorInfo | None]:
    """The TensorInfo of each concrete input array (None for an absent one); those at the positions in
    ``weights`` (a plan's resident initializers) as ``WeightInfo``, as ``planned_infos`` gives them."""
    return [
        None if x is None else (WeightInfo if position in weights else TensorInfo)(x.shape, x.dtype)
        for position, x in enumerate(arrays)
    ]


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
        loops: separate loop bodies a kernel runs one after another (the output planes of a kernel
            compiled per plane); 0 when the op's cost says nothing about it. The estimator charges a
            fixed cost per loop, as per GEMM call.
        streamed_bytes: bytes a kernel reads again at each of its GEMM's ``count`` products, beyond
            what the GEMM model prices (the recurrent weights an LSTM step streams through hetflow's
            own GEMM); the estimator charges them at the bandwidth of their size.
    """

    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    gemm: GemmDims | None = None
    workspace_bytes: int = 0
    loops: int = 0
    streamed_bytes: int = 0


def nbytes(info: TensorInfo | None) -> int:
    """Bytes of a tensor with a static shape (0 for an omitted or symbolic one)."""
    if info is None or not is_static(info.shape):
        return 0
    return int(np.prod(info.shape, dtype=np.int64)) * info.dtype.itemsize


def numel(info: TensorInfo | None) -> int:
    if info is None or not is_static(info.shape):
        return 0
    return int(np.prod(info.shape, dtype=np.int64))


#: One gradient per input of a node; ``None`` where an input is omitted, not differentiable, or unwanted.
Grads = list[np.ndarray | None]
#: Forward values or output gradients handed to a backward rule (``None`` for absent ones).
Arrays = Sequence[np.ndarray | None]
#: Per input, whether a backward rule should compute its gradient (None: every differentiable one).
Wanted = Sequence[bool] | None


def reduce_to_shape(grad: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting expanded, so that it has ``shape``.

    The gradient of a broadcast operand is the sum of the output gradient over every position that
    read the same input element: leading axes the operand lacks, and axes where it had length 1.
    """
    shape = tuple(shape)
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(axis for axis, dim in enumerate(shape) if dim == 1 and grad.shape[axis] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def shape_only(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A read-only array of ``shape`` and ``dtype`` that occupies no memory (zeros broadcast from one
    element): what a backward rule gets for a value it declared it does not read."""
    return np.broadcast_to(np.zeros((), dtype), tuple(shape))


def wants(wanted: Sequence[bool] | None, index: int) -> bool:
    """Whether a backward rule should compute the gradient of input ``index`` (see ``OpDef.backward``)."""
    return wanted is None or (index < len(wanted) and bool(wanted[index]))


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

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        """Positions of the inputs a gradient can flow into (default: every input).

        Ops override this to exclude shape vectors, indices, statistics and bounds, so that the trainer
        knows which initializers are learnable parameters without knowing the op.
        """
        return tuple(range(len(node.inputs)))

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """Which forward values ``backward`` reads: (input positions, output positions); None means all.

        The trainer keeps only these for the backward pass (liveness, like inference's memory plan);
        every other input and output reaches the rule as a zero-memory stand-in of the right shape and
        dtype (``np.broadcast_to``), enough for rules that only need shapes (Add, Reshape, pooling).
        """
        return None, None

    def backward_workspace(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo | None]
    ) -> int:
        """Scratch bytes ``backward`` allocates beyond the gradients it returns, for concrete shapes.

        The default, three arrays the size of the largest input or output, covers rules that build a
        mask, a product and a cast; rules with real workspace (Conv's columns, recurrent layers' saved
        gates) say so.
        """
        return 3 * max((nbytes(info) for info in (*inputs, *outputs)), default=0)

    @property
    def has_backward(self) -> bool:
        """Whether this op defines a backward rule (the trainer refuses graphs with ops that lack one)."""
        return type(self).backward is not OpDef.backward

    def backward(
        self,
        node: Node,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray | None],
        grad_outputs: Sequence[np.ndarray | None],
        wanted: Sequence[bool] | None = None,
    ) -> Grads:
        """Gradients of a scalar loss with respect to each input, from those of the outputs.

        Args:
            node: the node (read ``node.attrs``).
            inputs: the forward inputs (``None`` for omitted optional ones).
            outputs: the forward outputs, as the forward kernel returned them.
            grad_outputs: d(loss)/d(output) per output; ``None`` for an output the loss does not reach.
            wanted: per input, whether its gradient is needed (None: every differentiable one); rules
                skip the work for unwanted ones (the first layer's input, frozen weights).

        Returns:
            One entry per input: an array of the input's shape and dtype, or None.
        """
        raise NotImplementedError(f"{self.op_type} has no backward rule")

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
