"""Data movement and shape ops: Concat, Split, Slice, Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
Pad, Dropout, Identity, Shape, Gather, ConstantOfShape, Cast.

Shape inference keeps a symbolic batch (``"N"``) where the op passes it through, infers Reshape's
``-1`` and Flatten's products with ``Monomial`` algebra, and — when a shape-carrying input (Reshape's
``shape``, Slice's ``starts``...) is not a constant — names the dimensions it cannot know
``f"{node.name}_d{i}"`` so that later passes (constant folding, then a second inference) can resolve
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetflow.graph import Node, dtypes
from hetflow.graph.shapes import Dim, Monomial, is_static, normalize_axis
from hetflow.graph.shapes import Shape as Dims
from hetflow.ops.attrs import required
from hetflow.ops.base import Arrays, Cost, Grads, OpDef, TensorInfo, Wanted, nbytes, wants
from hetflow.ops.registry import register_op

#: ONNX's "to the end" sentinels for Slice.
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

PAD_MODES = ("constant", "reflect", "edge", "wrap")

Inputs = Sequence[TensorInfo | None]
Consts = Sequence[np.ndarray | None]


# -- helpers shared by the family ----------------------------------------------------------------
def fresh_dim(node: Node, axis: int) -> str:
    """The name of a dimension shape inference cannot know statically (unique per node and axis)."""
    return f"{node.name}_d{axis}"


def const_ints(consts: Consts, index: int) -> tuple[int, ...] | None:
    """The integer values of input ``index`` when it is a constant, else None."""
    if index >= len(consts) or consts[index] is None:
        return None
    return tuple(int(v) for v in np.asarray(consts[index]).reshape(-1))


def present(inputs: Inputs, index: int) -> bool:
    """Whether optional input ``index`` is given."""
    return index < len(inputs) and inputs[index] is not None


def vector_length(info: TensorInfo | None, what: str) -> int:
    """The static length of a 1-D (or scalar) int tensor such as a shape or an axes list."""
    assert info is not None
    if len(info.shape) > 1:
        raise ValueError(f"{what} must be a 1-D tensor, got shape {list(info.shape)}")
    length = info.shape[0] if info.shape else 1
    if not isinstance(length, int):
        raise ValueError(f"{what} has a symbolic length {length!r}; the output rank cannot be inferred")
    return length


def normalize_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Axes mapped into ``[0, rank)``; duplicates raise ValueError."""
    normalized = [normalize_axis(a, rank) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{what} {list(axes)} repeat an axis")
    return normalized


def product_dim(dims: Sequence[Dim], fallback: str) -> Dim:
    """The product of ``dims`` as one dimension (``N*1*1 -> N``), or ``fallback`` when symbols multiply."""
    try:
        return Monomial.of(dims).divide(Monomial())
    except ValueError:
        return fallback


def slice_length(dim: int, start: int, end: int, step: int) -> int:
    """Elements ONNX Slice keeps on an axis of length ``dim`` (Python slicing semantics, with clamping)."""
    return len(range(*slice(start, end, step).indices(dim)))


def unify_dims(a: Dim, b: Dim, what: str) -> Dim:
    """Two dimensions that must agree: integers must be equal; a symbol yields to an integer."""
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ValueError(f"{what}: dimensions {a} and {b} differ")
        return a
    return a if isinstance(a, int) else b


def reshape_target(in_shape: Sequence[Dim], target: Sequence[int], allowzero: int, fallback: str) -> Dims:
    """Reshape's output shape: ``0`` copies the input dimension (unless ``allowzero``), ``-1`` is inferred.

    Raises:
        ValueError: more than one -1, a dimension < -1, ``0`` beyond the input's rank, or a static
            element count that does not match.
    """
    if list(target).count(-1) > 1:
        raise ValueError(f"shape {list(target)} has more than one -1")
    if any(d < -1 for d in target):
        raise ValueError(f"shape {list(target)} has a dimension below -1")
    if allowzero and -1 in target and 0 in target:
        raise ValueError(f"shape {list(target)} has both 0 and -1 while allowzero is set")
    dims: list[Dim] = []
    for axis, d in enumerate(target):
        if d == 0 and not allowzero:
            if axis >= len(in_shape):
                raise ValueError(f"shape {list(target)} copies axis {axis} (0) beyond the input's rank")
            dims.append(in_shape[axis])
        else:
            dims.append(d)
    total = Monomial.of(in_shape)
    if -1 in dims:
        axis = dims.index(-1)
        known = Monomial.of(d for d in dims if d != -1)
        try:
            dims[axis] = total.divide(known)
        except ValueError:
            if is_static(in_shape) and is_static(dims):
                raise ValueError(
                    f"cannot reshape {list(in_shape)} into {list(target)}: sizes do not divide"
                ) from None
            dims[axis] = fallback
    elif is_static(in_shape) and is_static(dims) and total != Monomial.of(dims):
        raise ValueError(
            f"cannot reshape {list(in_shape)} ({total.coefficient} elements) into {list(target)}"
        )
    return tuple(dims)


def split_sizes(dim: int, parts: int) -> list[int]:
    """Split's sizes when no ``split`` input is given: equal chunks of ceil(dim/parts), the last smaller."""
    if parts <= 0:
        raise ValueError(f"cannot split into {parts} parts")
    if dim % parts == 0:
        return [dim // parts] * parts
    chunk = -(-dim // parts)
    sizes = [chunk] * (parts - 1)
    last = dim - sum(sizes)
    if last < 0:
        raise ValueError(f"cannot split a dimension of {dim} into {parts} chunks of {chunk}")
    return [*sizes, last]


def pad_widths(rank: int, pads: Sequence[int], axes: Sequence[int] | None) -> list[tuple[int, int]]:
    """Per-axis (begin, end) pads from ONNX's ``[b0, b1, ..., e0, e1, ...]`` over ``axes``."""
    axes_list = normalize_axes(axes, rank) if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes_list):
        raise ValueError(f"pads has {len(pads)} values; expected {2 * len(axes_list)} (2 per axis)")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes_list):
        widths[axis] = (pads[i], pads[i + len(axes_list)])
    return widths


def shape_range(rank: int, start: int, end: int | None) -> tuple[int, int]:
    """Shape's ``start``/``end`` clamped into ``[0, rank]`` (negative values count from the end)."""
    start = start + rank if start < 0 else start
    end = rank if end is None else (end + rank if end < 0 else end)
    return min(max(start, 0), rank), min(max(end, 0), rank)


def cast_dtype(to: int) -> np.dtype:
    """The numpy dtype for Cast's ``to`` (ONNX element type); raises ValueError when numpy lacks it."""
    try:
        return dtypes.from_onnx(to)
    except TypeError as error:
        raise ValueError(str(error)) from None


# -- family bases ---------------------------------------------------------------------------------
class ViewOp(OpDef):
    """Family base: ops that only reinterpret the shape (the CPU kernels return numpy views).

    Backward: the output gradient reshaped to the input's shape; shape-carrying inputs get none.
    """

    traits = frozenset({"view"})

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        x, dy = inputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if x is not None and dy is not None and wants(wanted, 0):
            grads[0] = dy.reshape(x.shape)
        return grads

    def cost(self, node: Node, inputs: Inputs, outputs: Sequence[TensorInfo]) -> Cost:
        # NOTE: a view moves no data; a copy happens only when the input is not contiguous.
        return Cost()


@register_op
class Concat(OpDef):
    """Join tensors along ``axis`` (negative counts from the end); all other dimensions must agree.

    Attributes:
        axis: the axis to join along, in ``[-rank, rank)``.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        axis: int = required()

    op_type = "Concat"
    num_inputs = (1, -1)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        present_inputs = [i for i in inputs if i is not None]
        first = present_inputs[0]
        rank = len(first.shape)
        axis = normalize_axis(node.attrs.axis, rank)
        dims = list(first.shape)
        for other in present_inputs[1:]:
            if other.dtype != first.dtype:
                raise ValueError(f"inputs have different dtypes {first.dtype} and {other.dtype}")
            if len(other.shape) != rank:
                raise ValueError(f"inputs have different ranks {rank} and {len(other.shape)}")
            for i, d in enumerate(other.shape):
                if i != axis:
                    dims[i] = unify_dims(dims[i], d, f"axis {i}")
        lengths = [i.shape[axis] for i in present_inputs]
        dims[axis] = sum(lengths) if is_static(lengths) else _symbolic_sum(lengths, fresh_dim(node, axis))
        return [TensorInfo(tuple(dims), first.dtype)]

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY cut back into the inputs' pieces along the axis."""
        dy = grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if dy is None:
            return grads
        axis = normalize_axis(node.attrs.axis, dy.ndim)
        start = 0
        for index, x in enumerate(inputs):
            if x is None:
                continue
            stop = start + x.shape[axis]
            if wants(wanted, index):
                grads[index] = np.take(dy, np.arange(start, stop), axis=axis)
            start = stop
        return grads


def _symbolic_sum(lengths: Sequence[Dim], fallback: str) -> Dim:
    # One symbolic length plus zero-length pieces is still that symbol; anything else is unknown.
    nonzero = [d for d in lengths if d != 0]
    return nonzero[0] if len(nonzero) == 1 else fallback


@register_op
class Split(OpDef):
    """Split a tensor along ``axis`` into several outputs.

    The sizes come from the optional ``split`` input; without it the axis is cut into ``num_outputs``
    (or, before opset 18, as many as the node has outputs) chunks of ``ceil(dim / n)``, the last one
    smaller when the axis does not divide evenly.

    Attributes:
        axis: the axis to split, negative counts from the end.
        num_outputs: how many outputs when ``split`` is not given (opset 18).
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        num_outputs: int | None = None

    op_type = "Split"
    num_inputs = (1, 2)
    num_outputs = (1, -1)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        axis = normalize_axis(node.attrs.axis, len(x.shape))
        count = len(node.outputs)
        if node.attrs.num_outputs is not None:
            if present(inputs, 1):
                raise ValueError("give either the split input or the num_outputs attribute, not both")
            if node.attrs.num_outputs != count:
                raise ValueError(f"num_outputs is {node.attrs.num_outputs} but the node has {count} outputs")
        dim = x.shape[axis]
        sizes: list[Dim]
        if present(inputs, 1):
            given = const_ints(consts, 1)
            if given is None:
                sizes = [fresh_dim(node, i) for i in range(count)]
            else:
                if len(given) != count:
                    raise ValueError(f"split has {len(given)} sizes but the node has {count} outputs")
                if any(s < 0 for s in given):
                    raise ValueError(f"split sizes {list(given)} must not be negative")
                if isinstance(dim, int) and sum(given) != dim:
                    raise ValueError(f"split sizes {list(given)} do not add up to the axis length {dim}")
                sizes = list(given)
        elif isinstance(dim, int):
            sizes = list(split_sizes(dim, count))
        else:
            sizes = [dim] if count == 1 else [fresh_dim(node, i) for i in range(count)]
        return [TensorInfo(tuple(x.shape[:axis]) + (s,) + tuple(x.shape[axis + 1 :]), x.dtype) for s in sizes]

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """The outputs' gradients joined along the axis (zeros for outputs the loss does not reach)."""
        x = inputs[0]
        grads: Grads = [None] * len(inputs)
        if x is None or not wants(wanted, 0) or all(g is None for g in grad_outputs):
            return grads
        axis = normalize_axis(node.attrs.axis, x.ndim)
        pieces = [g if g is not None else np.zeros_like(y) for g, y in zip(grad_outputs, outputs)]
        grads[0] = np.concatenate(pieces, axis=axis).astype(x.dtype, copy=False)
        return grads


@register_op
class Slice(OpDef):
    """Take ``data[starts:ends:steps]`` on ``axes`` (inputs; axes default to the first ones, steps to 1).

    Indices follow Python slicing: negative values count from the end, out-of-range values clamp
    (so ``INT64_MAX`` / ``INT64_MIN`` mean "to the end"), and negative steps walk backwards.
    """

    op_type = "Slice"
    num_inputs = (3, 5)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        rank = len(x.shape)
        starts, ends = const_ints(consts, 1), const_ints(consts, 2)
        axes = const_ints(consts, 3) if present(inputs, 3) else None
        steps = const_ints(consts, 4) if present(inputs, 4) else None
        unknown_axes = present(inputs, 3) and axes is None
        if starts is None or ends is None or (present(inputs, 4) and steps is None) or unknown_axes:
            if axes is not None:
                touched: Sequence[int] = normalize_axes(axes, rank)
            elif unknown_axes:
                touched = range(rank)
            else:  # axes default to the first len(starts) ones
                touched = range(min(vector_length(inputs[1], "starts"), rank))
            dims = [fresh_dim(node, i) if i in touched else d for i, d in enumerate(x.shape)]
            return [TensorInfo(tuple(dims), x.dtype)]
        slices = slice_specs(rank, starts, ends, axes, steps)
        dims = list(x.shape)
        for axis, (start, end, step) in slices.items():
            dims[axis] = _sliced_dim(x.shape[axis], start, end, step, fresh_dim(node, axis))
        return [TensorInfo(tuple(dims), x.dtype)]

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (1, 2, 3, 4), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY written into zeros of X's shape at the sliced positions."""
        x, dy = inputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if x is None or dy is None or not wants(wanted, 0):
            return grads
        ints = [None if a is None else [int(v) for v in np.asarray(a).reshape(-1)] for a in inputs[1:5]]
        ints += [None] * (4 - len(ints))
        specs = slice_specs(x.ndim, ints[0] or [], ints[1] or [], ints[2], ints[3])
        index = [slice(None)] * x.ndim
        for axis, (start, end, step) in specs.items():
            index[axis] = slice(start, end, step)
        dx = np.zeros_like(x)
        dx[tuple(index)] = dy
        grads[0] = dx
        return grads


def slice_specs(
    rank: int,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> dict[int, tuple[int, int, int]]:
    """Axis -> (start, end, step) from Slice's inputs; raises ValueError on inconsistent lengths."""
    if len(starts) != len(ends):
        raise ValueError(f"starts has {len(starts)} values but ends has {len(ends)}")
    axes_list = normalize_axes(axes, rank) if axes is not None else list(range(len(starts)))
    steps_list = list(steps) if steps is not None else [1] * len(starts)
    if len(axes_list) != len(starts) or len(steps_list) != len(starts):
        raise ValueError(
            f"starts, ends, axes and steps must have the same length ({len(starts)}, {len(ends)}, "
            f"{len(axes_list)}, {len(steps_list)})"
        )
    if len(starts) > rank:
        raise ValueError(f"{len(starts)} slices for a rank-{rank} tensor")
    if 0 in steps_list:
        raise ValueError("slice steps must not be 0")
    return {a: (s, e, st) for a, s, e, st in zip(axes_list, starts, ends, steps_list)}


def _sliced_dim(dim: Dim, start: int, end: int, step: int, fallback: str) -> Dim:
    if isinstance(dim, int):
        return slice_length(dim, start, end, step)
    # A symbolic axis keeps its symbol only when the whole axis is taken in order.
    if step == 1 and start in (0, INT64_MIN) and end >= INT64_MAX:
        return dim
    if step == -1 and start in (-1, INT64_MAX) and end <= INT64_MIN:
        return dim
    return fallback


@register_op
class Reshape(ViewOp):
    """Give the data a new shape (``shape`` input): ``0`` copies the input's dimension unless
    ``allowzero`` is set (then 0 is a real empty dimension), ``-1`` takes what is left.

    Attributes:
        allowzero: 1 makes 0 in ``shape`` an empty dimension instead of a copy.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        allowzero: int = 0

    op_type = "Reshape"
    num_inputs = (2, 2)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        target = const_ints(consts, 1)
        if target is None:
            rank = vector_length(inputs[1], "shape")
            return [TensorInfo(tuple(fresh_dim(node, i) for i in range(rank)), x.dtype)]
        fallback = fresh_dim(node, target.index(-1) if -1 in target else 0)
        return [TensorInfo(reshape_target(x.shape, target, node.attrs.allowzero, fallback), x.dtype)]


@register_op
class Flatten(ViewOp):
    """Reshape to 2-D: dimensions before ``axis`` form the rows, the rest the columns.

    Attributes:
        axis: in ``[-rank, rank]``; 0 gives shape ``(1, numel)``.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        axis: int = 1

    op_type = "Flatten"

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        axis = flatten_axis(node.attrs.axis, len(x.shape))
        outer = product_dim(x.shape[:axis], fresh_dim(node, 0))
        inner = product_dim(x.shape[axis:], fresh_dim(node, 1))
        return [TensorInfo((outer, inner), x.dtype)]


def flatten_axis(axis: int, rank: int) -> int:
    """Flatten's axis mapped into ``[0, rank]``; raises ValueError when out of range."""
    if not -rank <= axis <= rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank} (expected [-{rank}, {rank}])")
    return axis + rank if axis < 0 else axis


@register_op
class Transpose(OpDef):
    """Permute the axes: output axis i is input axis ``perm[i]`` (default: reversed).

    Attributes:
        perm: a permutation of ``range(rank)``.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        perm: tuple[int, ...] | None = None

    op_type = "Transpose"

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        perm = transpose_perm(node.attrs.perm, len(x.shape))
        return [TensorInfo(tuple(x.shape[p] for p in perm), x.dtype)]

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY with the inverse permutation."""
        x, dy = inputs[0], grad_outputs[0]
        if x is None or dy is None or not wants(wanted, 0):
            return [None]
        perm = transpose_perm(node.attrs.perm, x.ndim)
        return [np.ascontiguousarray(np.transpose(dy, np.argsort(perm)))]


def transpose_perm(perm: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """The permutation to apply (reversed axes by default); negative entries count from the end."""
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    normalized = tuple(normalize_axis(p, rank) for p in perm)
    if sorted(normalized) != list(range(rank)):
        raise ValueError(f"perm {list(perm)} is not a permutation of {rank} axes")
    return normalized


@register_op
class Squeeze(ViewOp):
    """Remove axes of length 1: those in the optional ``axes`` input, or every length-1 axis."""

    op_type = "Squeeze"
    num_inputs = (1, 2)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        rank = len(x.shape)
        if not present(inputs, 1):
            return [TensorInfo(tuple(d for d in x.shape if d != 1), x.dtype)]
        axes = const_ints(consts, 1)
        if axes is None:
            out_rank = rank - vector_length(inputs[1], "axes")
            return [TensorInfo(tuple(fresh_dim(node, i) for i in range(out_rank)), x.dtype)]
        squeezed = normalize_axes(axes, rank)
        for axis in squeezed:
            if isinstance(x.shape[axis], int) and x.shape[axis] != 1:
                raise ValueError(f"cannot squeeze axis {axis} of length {x.shape[axis]}")
        return [TensorInfo(tuple(d for i, d in enumerate(x.shape) if i not in squeezed), x.dtype)]


@register_op
class Unsqueeze(ViewOp):
    """Insert length-1 axes at the positions ``axes`` (input) names in the *output* shape."""

    op_type = "Unsqueeze"
    num_inputs = (2, 2)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        axes = const_ints(consts, 1)
        if axes is None:
            out_rank = len(x.shape) + vector_length(inputs[1], "axes")
            return [TensorInfo(tuple(fresh_dim(node, i) for i in range(out_rank)), x.dtype)]
        return [TensorInfo(unsqueeze_shape(x.shape, axes), x.dtype)]


def unsqueeze_shape(shape: Sequence[Dim], axes: Sequence[int]) -> Dims:
    """``shape`` with 1s inserted at ``axes`` (relative to the output's rank)."""
    out_rank = len(shape) + len(axes)
    inserted = set(normalize_axes(axes, out_rank))
    rest = iter(shape)
    return tuple(1 if i in inserted else next(rest) for i in range(out_rank))


@register_op
class Pad(OpDef):
    """Pad (or, with negative pads, crop) a tensor.

    Inputs: ``data``, ``pads`` (int64 ``[begin..., end...]`` over ``axes``), optional ``constant_value``
    (scalar of the data's type, default 0), optional ``axes`` (default: every axis).

    Attributes:
        mode: ``"constant"``, ``"reflect"`` (mirror without repeating the edge), ``"edge"`` (repeat the
            edge) or ``"wrap"`` (circular).
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        mode: str = "constant"

    op_type = "Pad"
    num_inputs = (2, 4)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        if node.attrs.mode not in PAD_MODES:
            raise ValueError(f"mode {node.attrs.mode!r} is not one of {list(PAD_MODES)}")
        rank = len(x.shape)
        pads = const_ints(consts, 1)
        axes = const_ints(consts, 3) if present(inputs, 3) else None
        if pads is None or (present(inputs, 3) and axes is None):
            touched = normalize_axes(axes, rank) if axes is not None else range(rank)
            dims = [fresh_dim(node, i) if i in touched else d for i, d in enumerate(x.shape)]
            return [TensorInfo(tuple(dims), x.dtype)]
        widths = pad_widths(rank, pads, axes)
        dims = []
        for axis, (d, (begin, end)) in enumerate(zip(x.shape, widths)):
            if begin + end == 0 and begin >= 0:
                dims.append(d)
            elif isinstance(d, int):
                if d + begin + end < 0 or d + min(begin, 0) + min(end, 0) < 0:
                    raise ValueError(f"pads ({begin}, {end}) crop more than axis {axis}'s {d} elements")
                dims.append(d + begin + end)
            else:
                dims.append(fresh_dim(node, axis))
        return [TensorInfo(tuple(dims), x.dtype)]

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (1, 3), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """Constant mode: dY cropped back to X (zeros where negative pads cropped X away). The other
        modes copy input elements into the border and have no rule yet."""
        x, dy = inputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if x is None or dy is None or not wants(wanted, 0):
            return grads
        if node.attrs.mode != "constant":
            raise NotImplementedError(f"Pad '{node.name}': backward supports mode='constant' only")
        pads = [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        given_axes = inputs[3] if len(inputs) > 3 else None
        axes = None if given_axes is None else [int(a) for a in np.asarray(given_axes).reshape(-1)]
        widths = pad_widths(x.ndim, pads, axes)
        dx = np.zeros(x.shape, dy.dtype)
        source, target = [], []
        for size, (begin, end) in zip(x.shape, widths):
            first, last = max(0, -begin), size - max(0, -end)
            target.append(slice(first, last))
            source.append(slice(max(0, begin), max(0, begin) + max(0, last - first)))
        dx[tuple(target)] = dy[tuple(source)]
        grads[0] = dx.astype(x.dtype, copy=False)
        return grads


@register_op
class Dropout(OpDef):
    """Randomly zero elements with probability ``ratio`` and scale the rest by ``1 / (1 - ratio)``.

    At inference (``training_mode`` absent or false) it is the identity and the optional ``mask``
    output is all True. Inputs: ``data``, optional ``ratio`` (scalar, default 0.5), optional
    ``training_mode`` (bool scalar).

    Attributes:
        seed: seed of the random generator; the same seed gives the same mask.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        seed: int | None = None

    op_type = "Dropout"
    num_inputs = (1, 3)
    num_outputs = (1, 2)
    traits = frozenset({"noop"})

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        ratio = consts[1] if len(consts) > 1 else None
        if ratio is not None and not 0.0 <= float(np.asarray(ratio).reshape(-1)[0]) < 1.0:
            raise ValueError(f"ratio {float(np.asarray(ratio).reshape(-1)[0])} is outside [0, 1)")
        return [TensorInfo(x.shape, x.dtype), TensorInfo(x.shape, np.dtype(bool))]

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (1, 2), (1,)

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """In training mode ``dx = dy * mask / (1 - ratio)`` with the mask the forward pass drew (its
        second output, which a training graph must name); otherwise the identity."""
        x, dy = inputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if x is None or dy is None or not wants(wanted, 0):
            return grads
        given_ratio = inputs[1] if len(inputs) > 1 else None
        ratio = 0.5 if given_ratio is None else float(np.asarray(given_ratio).reshape(-1)[0])
        training = len(inputs) > 2 and inputs[2] is not None and bool(np.asarray(inputs[2]).reshape(-1)[0])
        if not training or ratio == 0.0:
            grads[0] = dy
            return grads
        mask = outputs[1] if len(outputs) > 1 else None
        if mask is None:
            raise ValueError(f"Dropout '{node.name}' in training mode needs its mask output for backward")
        grads[0] = (dy * mask / (1.0 - ratio)).astype(x.dtype, copy=False)
        return grads


@register_op
class Identity(OpDef):
    """Return the input unchanged."""

    op_type = "Identity"
    traits = frozenset({"noop"})

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        return [grad_outputs[0] if wants(wanted, 0) else None]

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        return [TensorInfo(x.shape, x.dtype)]


@register_op
class Shape(OpDef):
    """The input's shape as a 1-D int64 tensor, optionally only axes ``[start, end)``.

    Attributes:
        start: first axis (negative counts from the end; clamped to ``[0, rank]``).
        end: one past the last axis (default: the rank; negative counts from the end; clamped).
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        start: int = 0
        end: int | None = None

    op_type = "Shape"
    traits = frozenset({"shape"})

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        start, end = shape_range(len(x.shape), node.attrs.start, node.attrs.end)
        return [TensorInfo((max(end - start, 0),), np.dtype(np.int64))]

    def cost(self, node: Node, inputs: Inputs, outputs: Sequence[TensorInfo]) -> Cost:
        # Reads only the input's metadata.
        return Cost(bytes_written=sum(nbytes(o) for o in outputs))


@register_op
class Gather(OpDef):
    """Pick slices of ``data`` along ``axis`` at ``indices`` (any shape; negative indices count from the
    end). Output shape: ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``.

    Attributes:
        axis: the axis to index, negative counts from the end.
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        axis: int = 0

    op_type = "Gather"
    num_inputs = (2, 2)

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        data, indices = inputs
        assert data is not None and indices is not None
        if indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
        axis = normalize_axis(node.attrs.axis, len(data.shape))
        dim = data.shape[axis]
        values = const_ints(consts, 1)
        if values is not None and isinstance(dim, int) and any(not -dim <= v < dim for v in values):
            raise ValueError(f"indices {list(values)} are out of range for axis {axis} of length {dim}")
        shape = tuple(data.shape[:axis]) + tuple(indices.shape) + tuple(data.shape[axis + 1 :])
        return [TensorInfo(shape, data.dtype)]

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (1,), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY added back at the gathered positions (repeated indices accumulate)."""
        data, indices = inputs
        dy = grad_outputs[0]
        if data is None or indices is None or dy is None or not wants(wanted, 0) or data.dtype.kind != "f":
            return [None, None]
        axis = normalize_axis(node.attrs.axis, data.ndim)
        positions = np.where(indices < 0, indices + data.shape[axis], indices).reshape(-1)
        flat = dy.reshape(*data.shape[:axis], positions.size, *data.shape[axis + 1 :])
        dx = np.zeros(data.shape, dy.dtype)
        np.add.at(dx, (slice(None),) * axis + (positions,), flat)
        return [dx.astype(data.dtype, copy=False), None]


@register_op
class ConstantOfShape(OpDef):
    """A tensor of the shape given by the (int64, 1-D) input, filled with ``value``.

    Attributes:
        value: a one-element tensor giving the fill value and the output dtype (default float32 0).
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        value: np.ndarray | None = dataclasses.field(default=None, compare=False)

    op_type = "ConstantOfShape"
    traits = frozenset({"shape"})

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        fill = fill_value(node.attrs.value)
        shape = const_ints(consts, 0)
        if shape is None:
            rank = vector_length(inputs[0], "shape")
            return [TensorInfo(tuple(fresh_dim(node, i) for i in range(rank)), fill.dtype)]
        if any(d < 0 for d in shape):
            raise ValueError(f"shape {list(shape)} has a negative dimension")
        return [TensorInfo(shape, fill.dtype)]


def fill_value(value: np.ndarray | None) -> np.ndarray:
    """ConstantOfShape's fill value as a 0-d array (float32 0 by default)."""
    if value is None:
        return np.zeros((), np.float32)
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"value must hold exactly one element, got shape {list(array.shape)}")
    return array.reshape(())


@register_op
class Cast(OpDef):
    """Convert elements to the type ``to``: numbers, bool and strings (decimal text) as numpy does.

    Attributes:
        to: the ONNX element type of the output (``TensorProto.FLOAT`` ...).
        saturate: for float8 targets, clamp values beyond the range to the largest finite value.
        round_mode: rounding for float8e8m0 targets (``"up"``, ``"down"``, ``"nearest"``).
    """

    @dataclasses.dataclass(frozen=True)
    class Attrs:
        to: int = required()
        saturate: int = 1
        round_mode: str = "up"

    op_type = "Cast"
    traits = frozenset({"elementwise"})

    def infer(self, node: Node, inputs: Inputs, consts: Consts) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        if node.attrs.round_mode not in ("up", "down", "nearest"):
            raise ValueError(f"round_mode {node.attrs.round_mode!r} is not one of up, down, nearest")
        return [TensorInfo(x.shape, cast_dtype(node.attrs.to))]
