"""Recurrent layers: LSTM, GRU and RNN (one layer, forward / reverse / bidirectional).

The three ops share their interface (``X, W, R, B, sequence_lens, initial_h`` in, ``Y, Y_h`` out, the
``direction``/``layout``/``activations``/``clip`` attributes), so the shape rules, checks and cost live
in one family base, ``RecurrentOp``; each op only says how many gates and states it has, which
activations it uses by default and which extra inputs/attributes it adds (LSTM's ``initial_c``, ``P``
and ``input_forget``; GRU's ``linear_before_reset``).

The activation table (names, which of alpha/beta each one takes, their defaults) and the rule that
hands out ``activation_alpha``/``activation_beta`` values also live here, so that shape inference
rejects a bad list at import time and every device kernel reads the same resolved parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape, is_static
from hetflow.ops.base import Arrays, Cost, GemmDims, Grads, OpDef, TensorInfo, Wanted, nbytes
from hetflow.ops.registry import register_op

# Input positions shared by the three ops (LSTM adds INITIAL_C and P).
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, P = range(8)

DIRECTIONS: dict[str, int] = {"forward": 1, "reverse": 1, "bidirectional": 2}

#: Lower-case activation name -> (default alpha, default beta); ``None`` where the function takes no
#: such parameter (and so consumes no value from ``activation_alpha`` / ``activation_beta``).
#: Defaults are the ones of the ONNX operator of the same name, as the RNN specs ask (Affine and
#: ScaledTanh were experimental ops: alpha=1, beta=0 and alpha=1, beta=1 keep them the identity/tanh).
ACTIVATION_PARAMETERS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None),
    "tanh": (None, None),
    "sigmoid": (None, None),
    "affine": (1.0, 0.0),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, None),
    "softsign": (None, None),
    "softplus": (None, None),
}

_SPEC_NAMES = (
    "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, "
    "Softplus"
)


@dataclass(frozen=True)
class ActivationSpec:
    """One resolved activation: lower-case ``name`` and the alpha/beta it applies (0 when unused)."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0


def num_directions(direction: str) -> int:
    """1 for ``forward``/``reverse``, 2 for ``bidirectional``; ValueError for anything else."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    return DIRECTIONS[direction]


def resolve_activations(
    names: Sequence[str],
    alphas: Sequence[float],
    betas: Sequence[float],
    per_direction: int,
    directions: int,
    defaults: Sequence[str],
) -> tuple[tuple[ActivationSpec, ...], ...]:
    """The activations of each direction, with their alpha/beta filled in.

    ``activation_alpha`` / ``activation_beta`` values are consumed in the order of the activation list,
    each value going to the next function that takes that parameter (ONNX Runtime's reading of "the
    values are consumed in the order of activation functions"); a function finding the list used up
    takes its ONNX default. Names are case-insensitive. A list written for two directions on a
    one-direction node uses its first half: RNN's own default, ``["Tanh", "Tanh"]``, is such a list.

    Args:
        names: the ``activations`` attribute; empty means ``defaults`` for every direction.
        alphas: ``activation_alpha``.
        betas: ``activation_beta``.
        per_direction: functions one direction uses (LSTM 3, GRU 2, RNN 1).
        directions: 1 or 2.
        defaults: one direction's default functions.

    Returns:
        One tuple of ``per_direction`` specs for each direction.

    Raises:
        ValueError: an unknown name or a list of the wrong length.
    """
    listed = list(names) if names else list(defaults) * directions
    if len(listed) not in (per_direction * directions, per_direction * 2):
        raise ValueError(
            f"activations lists {len(listed)} function(s); this node needs {per_direction} per direction "
            f"x {directions} direction(s) = {per_direction * directions}"
        )
    next_alpha, next_beta = iter(alphas), iter(betas)
    specs = []
    for name in listed:
        key = name.lower()
        if key not in ACTIVATION_PARAMETERS:
            raise ValueError(f"unknown activation {name!r}; the RNN ops accept {_SPEC_NAMES}")
        default_alpha, default_beta = ACTIVATION_PARAMETERS[key]
        alpha = 0.0 if default_alpha is None else float(next(next_alpha, default_alpha))
        beta = 0.0 if default_beta is None else float(next(next_beta, default_beta))
        specs.append(ActivationSpec(key, alpha, beta))
    return tuple(tuple(specs[d * per_direction : (d + 1) * per_direction]) for d in range(directions))


def _dims_conflict(actual: Dim, expected: Dim | None) -> bool:
    # NOTE: only two different integers are a proven conflict; a symbol may take any value at run time.
    return isinstance(actual, int) and isinstance(expected, int) and actual != expected


def _check_shape(what: str, actual: Shape, expected: Sequence[Dim | None], meaning: str = "") -> None:
    if len(actual) != len(expected) or any(map(_dims_conflict, actual, expected)):
        wanted = format_shape(tuple("?" if d is None else d for d in expected))
        because = f" ({meaning})" if meaning else ""
        raise ValueError(f"{what} has shape {format_shape(actual)}; expected {wanted}{because}")


def _has_output(node: Node, index: int) -> bool:
    return len(node.outputs) > index and bool(node.outputs[index])


@dataclass(frozen=True)
class RecurrentDims:
    """The sizes one recurrent node works with (symbols where the graph has them)."""

    seq_length: Dim
    batch: Dim
    input_size: Dim
    hidden: Dim
    directions: int


class RecurrentOp(OpDef):
    """Family base of LSTM, GRU and RNN: shared shapes, checks and cost.

    Subclasses set ``gates`` (gate blocks stacked in W and R), ``states`` (1 for h; 2 for h and c),
    ``activations_per_direction`` and ``default_activations``.
    """

    gates: ClassVar[int]
    states: ClassVar[int] = 1
    activations_per_direction: ClassVar[int]
    default_activations: ClassVar[tuple[str, ...]]
    num_inputs = (3, 6)
    num_outputs = (0, 2)

    # -- training ----------------------------------------------------------------------------------
    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (X, W, R, B, INITIAL_H)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return None, ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """Backpropagation through time (``hetflow.ops.rnn_backward``), for this op's gate count."""
        from hetflow.ops.rnn_backward import recurrent_backward

        return recurrent_backward(node, inputs, grad_outputs, wanted, gates=self.gates)

    # -- shapes ---------------------------------------------------------------------------------
    def dims(self, node: Node, inputs: Sequence[TensorInfo | None]) -> RecurrentDims:
        """Validate every input against the others and the attributes; return the sizes.

        Raises:
            ValueError: a bad attribute, rank, dtype or a dimension that contradicts another.
        """
        attrs = node.attrs
        # NOTE: trailing omitted inputs are absent from the list; pad so every position can be read.
        inputs = list(inputs) + [None] * (P + 1 - len(inputs))
        x, w, r = inputs[X], inputs[W], inputs[R]
        if x is None or w is None or r is None:
            raise ValueError("X, W and R are required")
        self.check_attrs(attrs)
        directions = num_directions(attrs.direction)
        for name, info in (("X", x), ("W", w), ("R", r)):
            if len(info.shape) != 3:
                raise ValueError(f"{name} must be 3-D, got shape {format_shape(info.shape)}")
        if x.dtype.kind != "f":
            raise ValueError(f"X must be a floating-point tensor, got {x.dtype}")
        for name, info in (("W", w), ("R", r), ("B", inputs[B])):
            if info is not None and info.dtype != x.dtype:
                raise ValueError(f"{name} has dtype {info.dtype} but X has {x.dtype}")
        seq_length, batch, input_size = x.shape if attrs.layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
        hidden = self._hidden_size(attrs, r)
        gate_rows = hidden * self.gates if isinstance(hidden, int) else None
        meaning = (
            f"direction={attrs.direction!r} has {directions} direction(s), hidden size {hidden}, "
            f"{self.gates} gate(s) stacked"
        )
        _check_shape("R", r.shape, (directions, gate_rows, hidden), meaning)
        _check_shape("W", w.shape, (directions, gate_rows, input_size), f"{meaning}, input size {input_size}")
        resolve_activations(
            attrs.activations,
            attrs.activation_alpha,
            attrs.activation_beta,
            self.activations_per_direction,
            directions,
            self.default_activations,
        )
        dims = RecurrentDims(seq_length, batch, input_size, hidden, directions)
        self._check_optional_inputs(attrs, inputs, dims)
        return dims

    def _hidden_size(self, attrs: Any, r: TensorInfo) -> Dim:
        hidden_attr = attrs.hidden_size
        hidden = r.shape[2]
        if hidden_attr is not None:
            if hidden_attr <= 0:
                raise ValueError(f"hidden_size must be positive, got {hidden_attr}")
            if _dims_conflict(hidden, hidden_attr):
                raise ValueError(
                    f"hidden_size is {hidden_attr} but R has shape {format_shape(r.shape)} "
                    f"(its last dimension is the hidden size)"
                )
            hidden = hidden_attr
        return hidden

    def _check_optional_inputs(
        self, attrs: Any, inputs: Sequence[TensorInfo | None], dims: RecurrentDims
    ) -> None:
        hidden, directions = dims.hidden, dims.directions
        gate_rows = hidden * self.gates if isinstance(hidden, int) else None
        state_shape = self.state_shape(attrs, dims)
        expected: dict[int, tuple[str, Sequence[Dim | None]]] = {
            B: ("B", (directions, 2 * gate_rows if gate_rows else None)),
            SEQUENCE_LENS: ("sequence_lens", (dims.batch,)),
            INITIAL_H: ("initial_h", state_shape),
            INITIAL_C: ("initial_c", state_shape),
            P: ("P", (directions, 3 * hidden if isinstance(hidden, int) else None)),
        }
        x_dtype = inputs[X].dtype  # type: ignore[union-attr]
        for index, info in enumerate(inputs):
            if index not in expected or info is None:
                continue
            name, shape = expected[index]
            _check_shape(name, info.shape, shape)
            if index == SEQUENCE_LENS:
                if info.dtype.kind not in "iu":
                    raise ValueError(f"sequence_lens must be an integer tensor, got {info.dtype}")
            elif info.dtype != x_dtype:
                raise ValueError(f"{name} has dtype {info.dtype} but X has {x_dtype}")

    def state_shape(self, attrs: Any, dims: RecurrentDims) -> Shape:
        """Shape of initial_h / Y_h / Y_c: ``[dirs, batch, hidden]``, or ``[batch, dirs, hidden]``."""
        if attrs.layout == 0:
            return (dims.directions, dims.batch, dims.hidden)
        return (dims.batch, dims.directions, dims.hidden)

    def check_attrs(self, attrs: Any) -> None:
        """Reject attribute values the spec does not allow (subclasses add their own)."""
        layout = attrs.layout
        if layout not in (0, 1):
            raise ValueError(f"layout must be 0 or 1, got {layout}")
        clip = attrs.clip
        if clip is not None and clip < 0:
            raise ValueError(f"clip must be non-negative, got {clip}")

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        dims = self.dims(node, inputs)
        dtype = inputs[X].dtype  # type: ignore[union-attr]
        if node.attrs.layout == 0:
            y_shape: Shape = (dims.seq_length, dims.directions, dims.batch, dims.hidden)
        else:
            y_shape = (dims.batch, dims.seq_length, dims.directions, dims.hidden)
        state = TensorInfo(self.state_shape(node.attrs, dims), dtype)
        return [TensorInfo(y_shape, dtype)] + [state] * self.states

    def backward_workspace(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo | None]
    ) -> int:
        """Backpropagation through time recomputes and keeps, per direction, the input projection and
        its gradient (``gates`` wide each), the states and the gate activations of every step, and builds
        dX; ``3 * gates + 8`` arrays of ``[seq, batch, hidden]`` per direction, X twice, and R twice (dR
        and each step's ``dgates^T h`` product; tracemalloc-checked on lstm-gesture)."""
        dims = self.dims(node, inputs)
        sizes = (dims.seq_length, dims.batch, dims.hidden)
        if not is_static(sizes):
            return 0
        itemsize = inputs[X].dtype.itemsize  # type: ignore[union-attr]
        per_direction = int(np.prod(sizes, dtype=np.int64)) * (3 * self.gates + 8) * itemsize
        return dims.directions * per_direction + 2 * nbytes(inputs[X]) + 2 * nbytes(inputs[R])

    # -- cost -----------------------------------------------------------------------------------
    #: elementwise operations per hidden unit and time step (gate arithmetic, biases, activations).
    cell_flops: ClassVar[int]

    def cost(self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> Cost:
        """Work of the whole sequence in every direction.

        ``macs`` = the input projection ``X @ W^T`` for all steps (``seq*batch*input*gates*hidden``
        per direction) + the recurrent ``h @ R^T`` of every step (``batch*hidden*gates*hidden`` per
        step and direction). ``gemm`` describes the recurrent GEMM, the one that runs once per step and
        bounds the latency: ``n = gates*hidden`` (output columns), ``m = batch`` (rows), ``k = hidden``
        (reduction), ``count = seq_length*directions``. ``flops`` counts the gate arithmetic (one per
        elementwise operation per hidden unit, step, batch element and direction), ``workspace_bytes``
        the input projection buffer. Omitted outputs are not written; symbolic shapes give zeros.
        """
        bytes_read = sum(nbytes(i) for i in inputs)
        bytes_written = sum(nbytes(o) for i, o in enumerate(outputs) if _has_output(node, i))
        dims = self.dims(node, inputs)
        sizes = (dims.seq_length, dims.batch, dims.input_size, dims.hidden)
        if not is_static(sizes):
            return Cost(bytes_read=bytes_read, bytes_written=bytes_written)
        seq, batch, input_size, hidden = (int(s) for s in sizes)
        steps = seq * dims.directions
        gate_rows = self.gates * hidden
        itemsize = inputs[X].dtype.itemsize  # type: ignore[union-attr]
        return Cost(
            macs=steps * batch * gate_rows * (input_size + hidden),
            flops=steps * batch * hidden * self.cell_flops,
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            gemm=GemmDims(n=gate_rows, m=batch, k=hidden, count=steps),
            workspace_bytes=steps * batch * gate_rows * itemsize,
        )


@dataclass(frozen=True)
class LSTMAttrs:
    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] = ()
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None
    input_forget: int = 0
    layout: int = 0
    #: hetflow-internal: the CPU may keep W and R packed for one column's steps (``jit_gate_panels``), a
    #: copy beside the raw weights; a memory budget too small for such copies clears it (``runtime.budget``).
    packed_weights: bool = True


@register_op
class LSTM(RecurrentOp):
    """Long short-term memory layer.

    Gates, stacked in W/R/B in the order ``i, o, f, c``::

        i = f(X W_i^T + H R_i^T + P_i * C + Wb_i + Rb_i)
        f = f(X W_f^T + H R_f^T + P_f * C + Wb_f + Rb_f)      (1 - i when input_forget=1)
        c = g(X W_c^T + H R_c^T + Wb_c + Rb_c)
        C' = f * C + i * c
        o = f(X W_o^T + H R_o^T + P_o * C' + Wb_o + Rb_o)
        H' = o * h(C')

    with ``f, g, h`` = Sigmoid, Tanh, Tanh by default; ``clip`` bounds every gate's pre-activation.

    Inputs: X ``[seq, batch, input]`` (``[batch, seq, input]`` when layout=1), W ``[dirs, 4*hidden,
    input]``, R ``[dirs, 4*hidden, hidden]``, optional B ``[dirs, 8*hidden]``, sequence_lens
    ``[batch]`` (int32), initial_h / initial_c ``[dirs, batch, hidden]``, P ``[dirs, 3*hidden]``.
    Outputs (each optional): Y ``[seq, dirs, batch, hidden]``, Y_h and Y_c ``[dirs, batch, hidden]``
    (batch first when layout=1).
    """

    op_type = "LSTM"
    Attrs = LSTMAttrs
    gates = 4
    states = 2
    activations_per_direction = 3
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    num_inputs = (3, 8)
    num_outputs = (0, 3)
    # 4 bias adds, 4 gate activations, C' (3), h(C') and o * h(C') (2).
    cell_flops = 13

    def check_attrs(self, attrs: Any) -> None:
        super().check_attrs(attrs)
        if attrs.input_forget not in (0, 1):
            raise ValueError(f"input_forget must be 0 or 1, got {attrs.input_forget}")

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (X, W, R, B, INITIAL_H, INITIAL_C, P)


@dataclass(frozen=True)
class GRUAttrs:
    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] = ()
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None
    layout: int = 0
    linear_before_reset: int = 0


@register_op
class GRU(RecurrentOp):
    """Gated recurrent unit layer.

    Gates, stacked in W/R/B in the order ``z, r, h``::

        z = f(X W_z^T + H R_z^T + Wb_z + Rb_z)
        r = f(X W_r^T + H R_r^T + Wb_r + Rb_r)
        h = g(X W_h^T + (r * H) R_h^T + Rb_h + Wb_h)           linear_before_reset = 0
        h = g(X W_h^T + r * (H R_h^T + Rb_h) + Wb_h)           linear_before_reset = 1
        H' = (1 - z) * h + z * H

    with ``f, g`` = Sigmoid, Tanh by default; ``clip`` bounds every gate's pre-activation.

    Inputs: X ``[seq, batch, input]`` (``[batch, seq, input]`` when layout=1), W ``[dirs, 3*hidden,
    input]``, R ``[dirs, 3*hidden, hidden]``, optional B ``[dirs, 6*hidden]``, sequence_lens
    ``[batch]`` (int32), initial_h ``[dirs, batch, hidden]``. Outputs (each optional): Y ``[seq, dirs,
    batch, hidden]``, Y_h ``[dirs, batch, hidden]`` (batch first when layout=1).
    """

    op_type = "GRU"
    Attrs = GRUAttrs
    gates = 3
    activations_per_direction = 2
    default_activations = ("Sigmoid", "Tanh")
    # 3 bias adds, 3 gate activations, the reset product, (1 - z) * h + z * H (3).
    cell_flops = 10

    def check_attrs(self, attrs: Any) -> None:
        super().check_attrs(attrs)
        if attrs.linear_before_reset not in (0, 1):
            raise ValueError(f"linear_before_reset must be 0 or 1, got {attrs.linear_before_reset}")



@dataclass(frozen=True)
class RNNAttrs:
    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] = ("Tanh", "Tanh")
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None
    layout: int = 0


@register_op
class RNN(RecurrentOp):
    """Simple (Elman) recurrent layer: ``H' = f(X W^T + H R^T + Wb + Rb)``, f = Tanh by default.

    Inputs: X ``[seq, batch, input]`` (``[batch, seq, input]`` when layout=1), W ``[dirs, hidden,
    input]``, R ``[dirs, hidden, hidden]``, optional B ``[dirs, 2*hidden]``, sequence_lens ``[batch]``
    (int32), initial_h ``[dirs, batch, hidden]``. Outputs (each optional): Y ``[seq, dirs, batch,
    hidden]``, Y_h ``[dirs, batch, hidden]`` (batch first when layout=1). The ``activations`` default
    lists one function per direction of a bidirectional node; a one-direction node uses the first.
    """

    op_type = "RNN"
    Attrs = RNNAttrs
    gates = 1
    activations_per_direction = 1
    default_activations = ("Tanh",)
    # the bias add and the activation.
    cell_flops = 2

