"""CPU kernels: LSTM, GRU and RNN.

One driver, ``_run_recurrent``, does everything the three ops share: layout, the input projection of
every time step and direction as ONE GEMM up front (``X @ W^T``), biases folded into it, the time loop
over each direction, ``sequence_lens`` (steps past an element's length leave its state unchanged and
write zeros to Y; the reverse direction runs backward within each element's own length), and the
outputs. The ops differ only in their cell (``_LSTMCell``, ``_GRUCell``, ``_RNNCell``): which bias
folds into the projection and what one step does with the recurrent GEMM ``h @ R^T``.

Everything is vectorised over the batch; the only Python loop is over time steps. float16 is computed
in float32 and cast back; outputs keep X's dtype.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels import jit_lstm
from hetflow.devices.cpu.kernels.jit_copy import transpose_planes_job
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.jit_gate_panels import packed_bytes, packed_gates
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import spinning
from hetflow.graph import Node
from hetflow.graph.shapes import is_static
from hetflow.ops.base import TensorInfo, WeightInfo
from hetflow.ops.rnn import (
    GRU,
    LSTM,
    RNN,
    ActivationSpec,
    RecurrentOp,
    num_directions,
    resolve_activations,
)

Activation = Callable[[np.ndarray], np.ndarray]
States = tuple[np.ndarray, ...]

#: An LSTM's W or R (``[dirs, 4*hidden, depth]``) packed per direction for one column's spinning steps
#: (``jit_gate_panels.packed_gates``), per weight array. (W and R fed as graph inputs rather than held as
#: initializers are packed again for every new array: correct, and the rare case.)
GATE_PANELS = WeightCache(lambda weights, direction: packed_gates(weights[direction]))


# -- activations ------------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    # NOTE: 1 / (1 + exp(-x)) because numpy's exp is SIMD-vectorised and its tanh is not (3x faster
    # than the tanh form). exp(-x) overflows to inf for x << 0, giving the right limit 0; the kernels
    # run under np.errstate(over="ignore") for that reason.
    e = np.negative(x)
    np.exp(e, out=e)
    e += 1
    return np.reciprocal(e, out=e)


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _elu(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    # expm1 of the negative part only, so large positive inputs do not overflow in the unused branch.
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


_ACTIVATIONS: dict[str, Callable[[np.ndarray, float, float], np.ndarray]] = {
    "relu": lambda x, alpha, beta: np.maximum(x, 0),
    "tanh": lambda x, alpha, beta: np.tanh(x),
    "sigmoid": _sigmoid,
    "affine": lambda x, alpha, beta: alpha * x + beta,
    "leakyrelu": lambda x, alpha, beta: np.where(x >= 0, x, alpha * x),
    "thresholdedrelu": lambda x, alpha, beta: np.where(x > alpha, x, 0),
    "scaledtanh": lambda x, alpha, beta: alpha * np.tanh(beta * x),
    "hardsigmoid": _hard_sigmoid,
    "elu": _elu,
    "softsign": lambda x, alpha, beta: x / (1 + np.abs(x)),
    "softplus": lambda x, alpha, beta: np.logaddexp(0, x),
}


def _bind(spec: ActivationSpec) -> Activation:
    return functools.partial(_ACTIVATIONS[spec.name], alpha=spec.alpha, beta=spec.beta)


def _clipper(clip: float | None) -> Activation:
    """Bound a gate's pre-activation to ``[-clip, clip]`` (identity when the node sets no clip)."""
    if clip is None:
        return lambda x: x
    return functools.partial(np.clip, a_min=-clip, a_max=clip)


# -- cells: the only op-specific piece --------------------------------------------------------------
class _Cell(abc.ABC):
    """One direction's recurrent weights and the update of one time step.

    Args:
        attrs: the node's attributes.
        r: ``[gates*hidden, hidden]`` recurrent weights of this direction.
        bias: ``[2*gates*hidden]`` (Wb then Rb) or None.
        peepholes: ``[3*hidden]`` (LSTM only) or None.
        activations: this direction's resolved activations.
    """

    op: ClassVar[type[RecurrentOp]]

    def __init__(
        self,
        attrs: Any,
        r: np.ndarray,
        bias: np.ndarray | None,
        peepholes: np.ndarray | None,
        activations: Sequence[ActivationSpec],
    ):
        self.hidden = r.shape[1]
        self.r = r
        self.rt = r.T
        self.clip = _clipper(attrs.clip)
        self.specs = tuple(activations)
        self.activations = [_bind(spec) for spec in activations]
        rows = self.op.gates * self.hidden
        self.wb = None if bias is None else bias[:rows]
        self.rb = None if bias is None else bias[rows:]

    def input_bias(self) -> np.ndarray | None:
        """The bias added once to the whole input projection (``[gates*hidden]``) or None."""
        return None if self.wb is None else self.wb + self.rb

    @abc.abstractmethod
    def step(self, xw: np.ndarray, states: States) -> States:
        """The next states from this step's projected input ``xw`` ``[batch, gates*hidden]``."""


class _LSTMCell(_Cell):
    """LSTM step: gates i, o, f, c; optional peepholes and coupled input/forget gates."""

    op = LSTM

    def __init__(
        self,
        attrs: Any,
        r: np.ndarray,
        bias: np.ndarray | None,
        peepholes: np.ndarray | None,
        activations: Sequence[ActivationSpec],
    ):
        super().__init__(attrs, r, bias, peepholes, activations)
        self.input_forget = bool(attrs.input_forget)
        self.peepholes = None if peepholes is None else np.split(peepholes, 3)  # i, o, f
        self.compiled = runs_compiled(attrs, self.specs, peepholes is not None, r.dtype)

    def step(self, xw: np.ndarray, states: States) -> States:
        h, c = states
        f, g, act_h = self.activations
        n = self.hidden
        gates = h @ self.rt
        gates += xw
        if self.peepholes is None:
            # Nothing reads the new cell state before o: activate the i, o, f block in one call.
            iof = f(self.clip(gates[:, : 3 * n]))
            i, o, forget = iof[:, :n], iof[:, n : 2 * n], iof[:, 2 * n :]
            if self.input_forget:
                forget = 1 - i
            c_next = forget * c + i * g(self.clip(gates[:, 3 * n :]))
        else:
            peep_i, peep_o, peep_f = self.peepholes
            pre_i, pre_o, pre_f, pre_c = (gates[:, k * n : (k + 1) * n] for k in range(4))
            pre_i += peep_i * c
            pre_f += peep_f * c
            i = f(self.clip(pre_i))
            forget = 1 - i if self.input_forget else f(self.clip(pre_f))
            c_next = forget * c + i * g(self.clip(pre_c))
            # NOTE: the output gate's peephole reads the *new* cell state.
            pre_o += peep_o * c_next
            o = f(self.clip(pre_o))
        return o * act_h(c_next), c_next


class _GRUCell(_Cell):
    """GRU step: gates z, r, h; the reset gate scales H before R_h or, linear_before_reset, after."""

    op = GRU

    def __init__(
        self,
        attrs: Any,
        r: np.ndarray,
        bias: np.ndarray | None,
        peepholes: np.ndarray | None,
        activations: Sequence[ActivationSpec],
    ):
        super().__init__(attrs, r, bias, peepholes, activations)
        self.linear_before_reset = bool(attrs.linear_before_reset)
        n = self.hidden
        # linear_before_reset=0 multiplies (r * H) by R_h, a second GEMM per step after r is known.
        self.rt_zr = self.rt[:, : 2 * n]
        self.rt_h = self.rt[:, 2 * n :]

    def input_bias(self) -> np.ndarray | None:
        if self.wb is None:
            return None
        n = self.hidden
        folded = self.wb + self.rb
        if self.linear_before_reset:
            # Rb_h is scaled by r there, so it stays in the step.
            folded[2 * n :] = self.wb[2 * n :]
        return folded

    def step(self, xw: np.ndarray, states: States) -> States:
        (h,) = states
        f, g = self.activations
        n = self.hidden
        if self.linear_before_reset:
            hr = h @ self.rt
            zr = hr[:, : 2 * n]
        else:
            zr = h @ self.rt_zr
        zr += xw[:, : 2 * n]
        zr = f(self.clip(zr))
        z, reset = zr[:, :n], zr[:, n:]
        if self.linear_before_reset:
            recurrent = hr[:, 2 * n :]
            if self.rb is not None:
                recurrent += self.rb[2 * n :]
            pre_h = reset * recurrent
        else:
            pre_h = (reset * h) @ self.rt_h
        pre_h += xw[:, 2 * n :]
        candidate = g(self.clip(pre_h))
        return (candidate + z * (h - candidate),)


class _RNNCell(_Cell):
    """Simple RNN step: ``H' = f(xw + H R^T)``."""

    op = RNN

    def step(self, xw: np.ndarray, states: States) -> States:
        (h,) = states
        pre = h @ self.rt
        pre += xw
        return (self.activations[0](self.clip(pre)),)


# -- the shared driver ------------------------------------------------------------------------------
def _lengths(sequence_lens: np.ndarray | None, seq_length: int, batch: int) -> np.ndarray | None:
    """Per-element lengths, or None when every element uses the whole sequence (the fast path)."""
    if sequence_lens is None:
        return None
    lengths = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    if lengths.shape != (batch,):
        raise ValueError(f"sequence_lens has {lengths.size} entries for a batch of {batch}")
    if np.any(lengths < 0) or np.any(lengths > seq_length):
        raise ValueError(f"sequence_lens {lengths.tolist()} must lie in [0, {seq_length}]")
    return None if np.all(lengths == seq_length) else lengths


def _reverse_within_lengths(a: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """``a`` ``[seq, batch, ...]`` with each element's first ``lengths[b]`` steps reversed.

    Steps past an element's length stay where they are. The map is its own inverse, so the same call
    turns the reverse direction's outputs back into time order.
    """
    if lengths is None:
        return a[::-1]
    seq_length, batch = a.shape[:2]
    steps = np.arange(seq_length)[:, None]
    source = lengths[None, :] - 1 - steps
    source = np.where(source >= 0, source, steps)
    return a[source, np.arange(batch)[None, :]]


def _scan(
    cell: _Cell,
    xw: np.ndarray,
    states: States,
    lengths: np.ndarray | None,
    reverse: bool,
    y: np.ndarray | None,
) -> States:
    """Run one direction over the sequence; fill ``y`` ``[seq, batch, hidden]`` when given.

    Returns:
        The final states, which are each element's last *valid* states when lengths differ.
    """
    if reverse:
        xw = _reverse_within_lengths(xw, lengths)
    seq_length, batch = xw.shape[:2]
    # valid[t, b]: step t exists for element b; past it the state is carried over unchanged.
    valid = None if lengths is None else (np.arange(seq_length)[:, None] < lengths[None, :])[..., None]
    for t in range(seq_length):
        new_states = cell.step(xw[t], states)
        if valid is not None:
            new_states = tuple(np.where(valid[t], new, old) for new, old in zip(new_states, states))
        states = new_states
        if y is not None:
            y[t] = states[0]
    if y is not None:
        if valid is not None:
            y[...] = np.where(valid, y, 0)
        if reverse:
            y[...] = _reverse_within_lengths(y, lengths)
    if lengths is not None and not lengths.all():
        # NOTE: an element of length 0 runs no step; ONNX Runtime (the reference we match) reports
        # zeros for its final states rather than its initial ones.
        states = tuple(np.where(lengths[:, None] > 0, s, 0) for s in states)
    return states


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    # NOTE: float16 accumulates too coarsely over many steps; compute in float32 and cast back.
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _wants(node: Node, index: int) -> bool:
    return len(node.outputs) > index and bool(node.outputs[index])


def _run_recurrent(
    node: Node, inputs: Sequence[np.ndarray | None], cell_type: type[_Cell]
) -> list[np.ndarray | None]:
    attrs = node.attrs
    op = cell_type.op
    padded = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, sequence_lens, initial_h, initial_c, peepholes = padded
    assert x is not None and w is not None and r is not None
    out_dtype = x.dtype
    work = _compute_dtype(out_dtype)
    batch_first = attrs.layout == 1
    if batch_first:
        x = x.transpose(1, 0, 2)
    x, w, r = (a.astype(work, copy=False) for a in (x, w, r))
    seq_length, batch, input_size = x.shape
    directions = num_directions(attrs.direction)
    hidden = r.shape[2]
    gate_rows = op.gates * hidden
    if w.shape != (directions, gate_rows, input_size) or r.shape != (directions, gate_rows, hidden):
        raise ValueError(
            f"W {w.shape} / R {r.shape} do not match {directions} direction(s), {op.gates} gate(s), "
            f"hidden size {hidden} and input size {input_size}"
        )
    lengths = _lengths(sequence_lens, seq_length, batch)
    specs = resolve_activations(
        attrs.activations,
        attrs.activation_alpha,
        attrs.activation_beta,
        op.activations_per_direction,
        directions,
        op.default_activations,
    )
    cells = [
        cell_type(
            attrs,
            r[d],
            None if b is None else b[d].astype(work, copy=False),
            None if peepholes is None else peepholes[d].astype(work, copy=False),
            specs[d],
        )
        for d in range(directions)
    ]

    initial = [
        _initial_state(s, directions, batch, hidden, work, batch_first) for s in (initial_h, initial_c)
    ]
    y = np.zeros((seq_length, directions, batch, hidden), work) if _wants(node, 0) else None
    if lengths is None and all(isinstance(cell, _LSTMCell) and cell.compiled for cell in cells):
        packs = attrs.packed_weights and batch == 1 and jit_lstm.runs_spinning(batch, hidden, r.dtype)
        finals = _compiled_lstm(x, w, r if packs else None, cells, initial, attrs.direction, y)
    else:
        finals = _numpy_scans(x, w, cells, initial, lengths, attrs.direction, y)

    outputs: list[np.ndarray | None] = [
        None if y is None else _finish(y, out_dtype, (2, 0, 1, 3), batch_first)
    ]
    for k in range(op.states):
        stacked = np.stack(finals[k]) if _wants(node, 1 + k) else None
        outputs.append(None if stacked is None else _finish(stacked, out_dtype, (1, 0, 2), batch_first))
    return outputs


def runs_compiled(attrs: Any, specs: Sequence[ActivationSpec], peepholes: bool, dtype: np.dtype) -> bool:
    """Whether one direction of an LSTM is the standard cell, which runs compiled (``jit_lstm.scan``);
    any variant (peepholes, clipping, coupled input/forget gates, other activations) keeps the numpy
    step."""
    return (
        not peepholes
        and attrs.clip is None
        and not attrs.input_forget
        and tuple(spec.name for spec in specs) == ("sigmoid", "tanh", "tanh")
        and dtype in COMPILED_DTYPES
    )


def _input(inputs: Sequence[TensorInfo | None], index: int) -> TensorInfo | None:
    """Input ``index`` of a node, None when omitted (trailing optional inputs may be absent)."""
    return inputs[index] if index < len(inputs) else None


def _compiled_lstm_shape(node: Node, inputs: Sequence[TensorInfo | None]) -> tuple[int, int, int, int, int] | None:
    """(directions, seq_length, batch, input_size, hidden) of an LSTM whose every direction runs compiled
    (``jit_lstm.scan``) on concrete shapes; None for any other node."""
    x, r, sequence_lens, peepholes = (_input(inputs, i) for i in (0, 2, 4, 7))
    attrs = node.attrs
    # NOTE: sequence_lens sends every LSTM to the numpy scans (_run_recurrent).
    if node.op_type != "LSTM" or x is None or r is None or sequence_lens is not None:
        return None
    if not is_static(x.shape) or not is_static(r.shape):
        return None
    directions = num_directions(attrs.direction)
    specs = resolve_activations(attrs.activations, attrs.activation_alpha, attrs.activation_beta,
                                LSTM.activations_per_direction, directions, LSTM.default_activations)
    work = _compute_dtype(np.dtype(x.dtype))
    if not all(runs_compiled(attrs, group, peepholes is not None, work) for group in specs):
        return None
    seq_length, batch, input_size = (int(d) for d in x.shape)
    if attrs.layout == 1:
        seq_length, batch = batch, seq_length
    return directions, seq_length, batch, input_size, int(r.shape[2])


#: The threads a one-column LSTM is taken to spin on where a run decides whether to hold a spinning
#: pool for it (``spinning_lstm_batch``): the fewest a spinning run has.
VECTOR_DECISION_THREADS = 2


def spinning_lstm_batch(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """The batch of an LSTM that would run on a spinning pool (``jit_lstm.runs_spinning``, given one),
    else 0 (a batch ``jit_lstm.spins_at`` refuses; one column whose R is too small to spin,
    ``jit_lstm.column_spins`` on ``VECTOR_DECISION_THREADS``, or whose weights may not be packed,
    ``LSTMAttrs.packed_weights``): the executor holds that pool for runs with such an LSTM."""
    shape = _compiled_lstm_shape(node, inputs)
    if shape is None or _compute_dtype(np.dtype(inputs[0].dtype)) != np.float32:
        return 0
    batch, hidden = shape[2], shape[4]
    if not jit_lstm.spins_at(batch):
        return 0
    if batch == 1 and not (node.attrs.packed_weights and jit_lstm.column_spins(hidden, VECTOR_DECISION_THREADS)):
        return 0
    return batch


def gate_panel_bytes(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """Bytes of the packed copies of W and R (``GATE_PANELS``) an LSTM keeps: those of every direction
    where one column spins (``spinning_lstm_batch``), else none."""
    if node.op_type != "LSTM" or spinning_lstm_batch(node, inputs) != 1:
        return 0
    directions, _, _, input_size, hidden = _compiled_lstm_shape(node, inputs)  # type: ignore[misc]
    return directions * (packed_bytes(hidden, hidden) + packed_bytes(hidden, input_size))


def compiled_lstm_scratch_bytes(
    node: Node, inputs: Sequence[TensorInfo | None], pool_held: bool = False
) -> int | None:
    """Bytes the compiled LSTM (``jit_lstm.scan``) allocates in one call beyond its outputs; None when
    the node runs the numpy step (whose scratch is the op's: the input projection of every step).

    Per direction: the transposed input, the summed biases, the gates (``4*hidden x batch``), the
    initial states (zeros where not given, and the transposed copies the scan updates) and, when Y is
    asked for, every step's hidden state in the transposed layout (copied into Y after the scan); then
    the driver's own buffers. ``pool_held``: the call runs inside a spinning pool (a run whose recurrent
    batch is one that spins, ``jit_lstm.spins_at``), where float32 steps of that many columns run on it.

    * spinning pool: two state buffers, and for a batch a zero bias (one column's steps make their input
      projection in the step, from W's packed copy: ``gate_panel_bytes``);
    * compiled sequence (``jit_lstm.runs_sequence``): two state buffers and
      ``jit_lstm.sequence_scratch_bytes``;
    * stepwise driver: a projection buffer (``4*hidden x batch``) and four state buffers.
    """
    shape = _compiled_lstm_shape(node, inputs)
    if shape is None:
        return None
    directions, seq_length, batch, input_size, hidden = shape
    work = _compute_dtype(np.dtype(inputs[0].dtype))  # type: ignore[union-attr]
    itemsize = np.dtype(work).itemsize
    every_step = seq_length * hidden * batch if _wants(node, 0) else 0
    states = 2 + sum(_input(inputs, i) is None for i in (5, 6))  # copies, and zeros for the states not given
    shared = ((seq_length * input_size + 4 * hidden + states * hidden) * batch + every_step + 4 * hidden) * itemsize
    if pool_held and spinning_lstm_batch(node, inputs):
        driver = (2 * hidden * batch + (0 if batch == 1 else 4 * hidden)) * itemsize
    elif jit_lstm.runs_sequence(batch):
        driver = 2 * hidden * batch * itemsize + jit_lstm.sequence_scratch_bytes(seq_length, hidden, batch, itemsize)
    else:
        driver = (4 * hidden + 4 * hidden) * batch * itemsize
    return directions * (shared + driver)


def _numpy_scans(
    x: np.ndarray,
    w: np.ndarray,
    cells: Sequence[_Cell],
    initial: Sequence[np.ndarray],
    lengths: np.ndarray | None,
    direction: str,
    y: np.ndarray | None,
) -> list[list[np.ndarray]]:
    """Every direction by its cell's numpy step; the final states per state, per direction."""
    seq_length, batch, input_size = x.shape
    gate_rows = w.shape[1]
    # The input projection of every step and direction in one GEMM: [seq*batch, input] x
    # [input, dirs*gates*hidden]; only h @ R^T is left for the time loop.
    xw = x.reshape(seq_length * batch, input_size) @ w.reshape(len(cells) * gate_rows, input_size).T
    xw = xw.reshape(seq_length, batch, len(cells), gate_rows)
    states = cells[0].op.states
    finals: list[list[np.ndarray]] = [[] for _ in range(states)]
    for d, cell in enumerate(cells):
        bias = cell.input_bias()
        if bias is not None:
            xw[:, :, d] += bias
        reverse = direction == "reverse" or d == 1
        start = tuple(initial[k][d] for k in range(states))
        ends = _scan(cell, xw[:, :, d], start, lengths, reverse, None if y is None else y[:, d])
        for k in range(states):
            finals[k].append(ends[k])
    return finals


def _compiled_lstm(
    x: np.ndarray,
    w: np.ndarray,
    packed_r: np.ndarray | None,
    cells: Sequence[_LSTMCell],
    initial: Sequence[np.ndarray],
    direction: str,
    y: np.ndarray | None,
) -> list[list[np.ndarray]]:
    """Every direction of a standard LSTM by ``jit_lstm.scan`` (transposed layout; see there);
    ``packed_r``: ``cells``' recurrent weights R, all directions, where one column's steps read W and R
    packed (``GATE_PANELS``), else None."""
    seq_length, batch, _ = x.shape
    x_t = np.ascontiguousarray(x.transpose(0, 2, 1))  # [seq, input, B]
    finals: list[list[np.ndarray]] = [[], []]
    for d, cell in enumerate(cells):
        bias = cell.input_bias()
        if bias is None:
            bias = np.zeros(w.shape[1], x.dtype)
        # Copies: the scan updates C in place, and a state's transposed view may be the caller's input.
        h_t, c_t = initial[0][d].T.copy(), initial[1][d].T.copy()
        y_t = None if y is None else np.empty((seq_length, cell.hidden, batch), x.dtype)
        reverse = direction == "reverse" or d == 1
        panels = None if packed_r is None else (GATE_PANELS.get(packed_r, d), GATE_PANELS.get(w, d))
        h_end, c_end = jit_lstm.scan(cell.r, w[d], bias, x_t, h_t, c_t, reverse, y_t, panels)
        if y is not None and y_t is not None:
            y[:, d] = y_t.transpose(0, 2, 1)
        finals[0].append(h_end.T)
        finals[1].append(c_end.T)
    return finals


def _initial_state(
    given: np.ndarray | None, directions: int, batch: int, hidden: int, dtype: np.dtype, batch_first: bool
) -> np.ndarray:
    """``[dirs, batch, hidden]`` initial state: the input (made direction-first) or zeros."""
    if given is None:
        return np.zeros((directions, batch, hidden), dtype)
    if batch_first:
        given = given.transpose(1, 0, 2)
    if given.shape != (directions, batch, hidden):
        raise ValueError(f"initial state has shape {given.shape}; expected {(directions, batch, hidden)}")
    return given.astype(dtype, copy=False)


def _finish(
    a: np.ndarray, dtype: np.dtype, batch_first_axes: tuple[int, ...], batch_first: bool
) -> np.ndarray:
    if batch_first:
        a = a.transpose(batch_first_axes)
    return np.ascontiguousarray(a, dtype=dtype)


def _run_quietly(
    node: Node, inputs: Sequence[np.ndarray | None], cell_type: type[_Cell]
) -> list[np.ndarray | None]:
    # exp overflowing to inf inside the sigmoid is expected and harmless (see _sigmoid).
    with np.errstate(over="ignore"):
        return _run_recurrent(node, inputs, cell_type)


def captures_sequence(node: Node, infos: Sequence[TensorInfo | None]) -> bool:
    """Whether a spinning run captures an LSTM's whole sequence as jobs (``_prepare_lstm``): a batch
    whose steps spin (``spinning_lstm_batch``: one column, or ``jit_lstm.SPIN_MIN_BATCH`` and more in
    layout 0), one direction, float32, on W, R and B the plan holds (``WeightInfo``)."""
    shape = _compiled_lstm_shape(node, infos)
    weights = all(isinstance(_input(infos, i), WeightInfo) for i in (1, 2, 3))
    if shape is None or shape[0] != 1 or not weights or spinning_lstm_batch(node, infos) != shape[2]:
        return False
    if any(_input(infos, i) is not None for i in (4, 7)) or infos[0].dtype != np.float32:  # type: ignore[union-attr]
        return False
    return shape[2] == 1 or node.attrs.layout == 0


def sequence_capture_bytes(node: Node, infos: Sequence[TensorInfo | None]) -> int:
    """Bytes of the buffers a captured sequence keeps between runs (``_sequence_jobs``: X's columns for a
    batch, H0, C and its zero start, the summed bias, the states, the gates, a batch's zero bias, and its
    outputs); 0 where the sequence is not captured (``captures_sequence``)."""
    if not captures_sequence(node, infos):
        return 0
    _, seq_length, batch, input_size, hidden = _compiled_lstm_shape(node, infos)  # type: ignore[misc]
    states = (seq_length if _wants(node, 0) else 2) * hidden * batch
    columns = 0 if batch == 1 else seq_length * input_size * batch
    zero_start = hidden * batch if _input(infos, 6) is None else 0
    outputs = (seq_length * _wants(node, 0) + _wants(node, 1) + _wants(node, 2)) * hidden * batch
    floats = columns + 2 * hidden * batch + zero_start + 4 * hidden + states + 4 * hidden * batch + outputs
    return 4 * (floats + (4 * hidden if batch > 1 else 0))


def _prepare_lstm(node: Node, infos: Sequence[TensorInfo | None], out: Any, workspace: Any) -> BoundCall | None:
    """An LSTM bound to its shapes: the call as ``lstm`` makes it, and, where a spinning run captures its
    sequence (``captures_sequence``), that capture as jobs (``_sequence_jobs``), so that a captured run
    replays it and a compiled package can hold it."""
    if not captures_sequence(node, infos):
        return None
    shape = _compiled_lstm_shape(node, infos)
    assert shape is not None

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        return lstm(node, arrays)

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray | None], list[Job]] | None:
        if spinning() is None or not all(a is None or a.flags.c_contiguous for a in arrays):
            return None
        return _sequence_jobs(node, arrays, shape[1], shape[2], shape[4])

    return with_capture(call, capture)


def _sequence_jobs(
    node: Node, arrays: Sequence[np.ndarray | None], seq_length: int, batch: int, hidden: int
) -> tuple[list[np.ndarray | None], list[Job]]:
    """A spinning sequence (one direction, float32, C-contiguous inputs) as jobs: X into the columns the
    steps read (one column reads X where it lies: ``[seq, 1, input]`` is ``[seq, input, 1]``), H0 and
    C set to their initial states, every step (``jit_lstm.step_jobs``), then the wanted outputs
    transposed out of the states (``[hidden, B]`` a step)."""
    padded = list(arrays) + [None] * (8 - len(arrays))
    x, w, r, b, _, initial_h, initial_c, _ = padded
    assert x is not None and w is not None and r is not None and b is not None
    pool = spinning()
    assert pool is not None
    gate_rows, inputs = 4 * hidden, x.shape[-1]
    jobs: list[Job] = []

    def columns_of(source: np.ndarray | None, planes: int, rows: int, columns: int) -> np.ndarray:
        """``[planes, columns, rows]`` filled from ``source`` ``[planes, rows, columns]`` at every run."""
        made = np.zeros((planes, columns, rows), np.float32)
        if source is not None:
            jobs.append(transpose_planes_job(source, made, planes, rows, columns))
        return made

    if batch == 1:
        x_t = x.reshape(seq_length, inputs, 1)
    else:
        x_t = columns_of(x, seq_length, batch, inputs)
    h0 = columns_of(initial_h, 1, batch, hidden)[0]
    c = np.empty((hidden, batch), np.float32)
    c_start = np.zeros((1, batch, hidden), np.float32) if initial_c is None else initial_c
    jobs.append(transpose_planes_job(c_start, c, 1, batch, hidden))
    bias = np.ascontiguousarray(b[0, :gate_rows] + b[0, gate_rows:], np.float32)
    wants_y = _wants(node, 0)
    states = np.empty((seq_length if wants_y else 2, hidden, batch), np.float32)
    reverse = node.attrs.direction == "reverse"
    gates = np.empty(gate_rows * batch, np.float32)
    weights = (GATE_PANELS.get(r, 0), GATE_PANELS.get(w, 0)) if batch == 1 else (r[0], w[0])
    jobs += jit_lstm.step_jobs(weights, bias, x_t, states, h0, c, gates, reverse, wants_y, pool.workers + 1)
    last = (0 if reverse else seq_length - 1) if wants_y else (seq_length - 1) % 2
    outputs: list[np.ndarray | None] = []
    for index, source, planes in ((0, states, seq_length), (1, states[last], 1), (2, c, 1)):
        if not _wants(node, index):
            outputs.append(None)
            continue
        made = np.empty((planes, batch, hidden), np.float32)
        jobs.append(transpose_planes_job(source, made, planes, hidden, batch))
        outputs.append(made.reshape(_lstm_output_shape(node, seq_length, batch, hidden)[index]))
    return outputs, jobs


def _lstm_output_shape(node: Node, seq_length: int, batch: int, hidden: int) -> tuple[tuple[int, ...], ...]:
    """(Y, Y_h, Y_c) shapes in one direction (batch first in layout 1)."""
    if node.attrs.layout == 1:
        return (batch, seq_length, 1, hidden), (batch, 1, hidden), (batch, 1, hidden)
    return (seq_length, 1, batch, hidden), (1, batch, hidden), (1, batch, hidden)


@cpu_kernel("LSTM", prepare=_prepare_lstm)
def lstm(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """LSTM, any direction/layout, sequence_lens, peepholes, input_forget; float16/32/64."""
    return _run_quietly(node, inputs, _LSTMCell)


@cpu_kernel("GRU")
def gru(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """GRU, any direction/layout, sequence_lens, both linear_before_reset forms; float16/32/64."""
    return _run_quietly(node, inputs, _GRUCell)


@cpu_kernel("RNN")
def rnn(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Simple RNN, any direction/layout, sequence_lens; float16/32/64."""
    return _run_quietly(node, inputs, _RNNCell)
