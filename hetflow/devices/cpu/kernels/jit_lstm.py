"""The standard LSTM cell (sigmoid / tanh / tanh, no peepholes, no clip, separate input and forget
gates) over a whole sequence, in the transposed layout, with each step's elementwise work in three
compiled passes around numpy's vectorised ``exp``.

Layout: the states are kept as ``[hidden, B]`` and the gates as ``[4*hidden, B]``, so that the
recurrent product is ``R @ H^T`` on R as the model stores it. In the usual layout, ``H @ R^T`` reads R
through its transposed view, which OpenBLAS ran 1.3x (B = 64) to 1.7x (B = 8) slower than R as stored,
and transposing the product back cost as much again (~1 ns an element). Each step's input projection
is made in the same layout beside it, and Y is written ``[seq, hidden, B]`` and transposed once at the
end.

Per step, after the GEMM (numpy's LSTM step took a dozen ufunc calls, each a pass over memory):

1. ``negate_preactivations``: ``-(R h + W x + b)`` for the sigmoid gates i, o, f and twice that for
   the cell gate, in place;
2. ``np.exp`` (numba's ``exp`` is scalar libm here; numpy's is SIMD);
3. ``update_cell``: ``sigmoid = 1 / (1 + e)``, ``tanh(z) = 2 / (1 + exp(-2z)) - 1``, the new cell state
   ``C' = f C + i g`` in place, the output gate, and ``-2 C'`` for the second ``exp``;
4. ``np.exp``, then ``update_hidden``: ``H' = o tanh(C')``.

Every pass is a flat loop over contiguous arrays with unsigned offsets, compiled with numpy's error
model (no division-by-zero branch): the compiler vectorises them (the cell update went from 170 to 36 us
at B = 64, hidden 512, when its four divisions stopped being scalar). The tanh identity loses a few ulps
near zero against ``np.tanh`` (about 1e-7 absolute in float32).
"""

from __future__ import annotations

import numba
import numpy as np


def scan(
    r: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray,
    x_t: np.ndarray,
    h_t: np.ndarray,
    c_t: np.ndarray,
    reverse: bool,
    y_t: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run the standard LSTM cell over a sequence; returns the final ``(H^T, C^T)`` ``[hidden, B]``.

    Args:
        r: ``[4*hidden, hidden]`` recurrent weights (gates i, o, f, c).
        w: ``[4*hidden, input]`` input weights.
        bias: ``[4*hidden]``, both biases summed.
        x_t: ``[seq, input, B]`` the input, C-contiguous.
        h_t, c_t: initial states ``[hidden, B]``; ``c_t`` is updated in place.
        reverse: run the steps from last to first.
        y_t: ``[seq, hidden, B]`` to receive every step's hidden state, or None.
    """
    seq_length, _, batch = x_t.shape
    rows = r.shape[0]
    hidden = rows // 4
    gates = np.empty((rows, batch), r.dtype)
    # NOTE: each step's input projection is made beside its recurrent product, in cache: made for the
    # whole sequence up front it was 52 MB at B = 64 (lstm-gesture), 30 ms of writing and adding bias.
    projection = np.empty((rows, batch), r.dtype)
    cell_exponent = np.empty((hidden, batch), r.dtype)
    output_gate = np.empty((hidden, batch), r.dtype)
    spare = [np.empty((hidden, batch), r.dtype), np.empty((hidden, batch), r.dtype)]
    for index in range(seq_length):
        t = seq_length - 1 - index if reverse else index
        np.matmul(r, h_t, out=gates)
        np.matmul(w, x_t[t], out=projection)
        negate_preactivations(gates, projection, bias, 3 * hidden)
        np.exp(gates, out=gates)
        update_cell(gates.reshape(-1), c_t.reshape(-1), cell_exponent.reshape(-1), output_gate.reshape(-1))
        np.exp(cell_exponent, out=cell_exponent)
        # Write the new state into Y's step when there is one, else into the buffer H^T is not in.
        h_next = y_t[t] if y_t is not None else spare[index % 2]
        update_hidden(output_gate.reshape(-1), cell_exponent.reshape(-1), h_next.reshape(-1))
        h_t = h_next
    return h_t, c_t


@numba.njit(nogil=True, cache=True, error_model="numpy")
def negate_preactivations(gates, projection, bias, sigmoid_rows):  # noqa: ANN001, ANN201
    """``gates = -s (gates + projection + bias)`` row by row, ``s`` 1 for the first ``sigmoid_rows`` (gates
    i, o, f) and 2 for the rest (the cell gate, whose tanh is taken as ``2 sigmoid(2z) - 1``)."""
    for k in range(gates.shape[0]):
        scale = gates.dtype.type(-1 if k < sigmoid_rows else -2)
        offset = bias[k]
        row, inputs = gates[k], projection[k]
        for b in range(np.uint64(row.shape[0])):
            row[b] = scale * (row[b] + inputs[b] + offset)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def update_cell(exponents, c, cell_exponent, output_gate):  # noqa: ANN001, ANN201
    """From ``exp`` of the negated pre-activations (blocks i, o, f, c of ``c.size`` elements each):
    ``C = f C + i g`` in place, ``cell_exponent = -2 C`` (for ``tanh(C)``) and the output gate."""
    one = exponents.dtype.type(1)
    two = exponents.dtype.type(2)
    size = np.uint64(c.shape[0])
    o_block, f_block, c_block = size, 2 * size, 3 * size
    for j in range(size):
        input_gate = one / (one + exponents[j])
        forget_gate = one / (one + exponents[f_block + j])
        candidate = two / (one + exponents[c_block + j]) - one
        cell = forget_gate * c[j] + input_gate * candidate
        c[j] = cell
        cell_exponent[j] = -two * cell
        output_gate[j] = one / (one + exponents[o_block + j])


@numba.njit(nogil=True, cache=True, error_model="numpy")
def update_hidden(output_gate, cell_exponent, h):  # noqa: ANN001, ANN201
    """``H = o tanh(C)`` from the output gate and ``exp(-2 C)``."""
    one = output_gate.dtype.type(1)
    two = output_gate.dtype.type(2)
    for j in range(np.uint64(h.shape[0])):
        h[j] = output_gate[j] * (two / (one + cell_exponent[j]) - one)
