"""The standard LSTM cell (sigmoid / tanh / tanh, no peepholes, no clip, separate input and forget
gates) over a whole sequence, in the transposed layout, compiled.

Layout: the states are kept as ``[hidden, B]`` and the gates as ``[4*hidden, B]``, so that the
recurrent product is ``R @ H^T`` on R as the model stores it. In the usual layout, ``H @ R^T`` reads R
through its transposed view, which OpenBLAS ran 1.3x (B = 64) to 1.7x (B = 8) slower than R as stored,
and transposing the product back cost as much again (~1 ns an element). Y is written
``[seq, hidden, B]`` and transposed once at the end.

Four drivers, the same arithmetic:

* up to ``SEQUENCE_MAX_BATCH`` columns, one compiled loop runs every step (``_sequence``): the
  products call numpy's OpenBLAS from compiled code (``jit_gemm``) and the cell is one flat pass whose
  ``exp`` vectorises (``jit_math.exp``), so a step never returns to Python. At batch 1 a step is the
  recurrent GEMV (~36 us for hidden 512) plus ~4 us; the stepwise driver spent ~25 us more a step on
  seven Python-level calls.
* above it (and where BLAS cannot be called from compiled code), each step runs from Python
  (``_scan_stepwise``): the products by numpy, the elementwise work in three compiled passes around
  numpy's SIMD ``np.exp``, which beats the fused pass on long rows (at B = 64, hidden 512: 123 against
  210 us a step, the fused pass being one thread's 8-lane loop with five divisions an element).
* from ``SPIN_MIN_BATCH`` columns, in a run on the spinning pool (``threads.spinning``: the executor
  holds one for a recurrent network's batch), every step is one job of the pool (``_spin_step``), run
  from compiled code step after step (``SpinPool.run_steps``): a share of a step takes a range of hidden
  units, computes their rows of all four gates on the tile GEMM (``jit_tile_gemm.columns``: ``W x_t +
  b``, then ``R h`` added in place), and updates their cell and hidden states. OpenBLAS multiplied R by
  H at ~120 GMAC/s on two threads here (557 us a step at B = 64, hidden 512), the tile GEMM at ~200,
  and the elementwise work splits too.
* one column (batch 1) in such a run likewise, from a size of R on (``column_spins``), each step one
  job (``_spin_vector_step``) on W and R packed once by the caller (``jit_gate_panels``: 16 hidden
  units of all four gates a panel): a share takes a range of panels, makes their units' gates ``b + W
  x_t + R h`` with the units in the vector lanes, and updates their cells. lstm-gesture (hidden 512, R
  4 MB: 2 MB a core, streamed from the last-level cache at every step) ran 3.6-3.8 ms a sequence by
  OpenBLAS's GEMV or by rows of R dotted with H, 2.6 ms so (``benchmarks/lstm_one_column.py``). A
  captured run replays those steps as jobs of their own (``step_jobs``, ``rnn``'s capture).

The stepwise passes, per step after the GEMM (numpy's LSTM step took a dozen ufunc calls, each a pass
over memory):

1. ``negate_preactivations``: ``-(R h + W x + b)`` for the sigmoid gates i, o, f and twice that for
   the cell gate, in place;
2. ``np.exp``;
3. ``update_cell``: ``sigmoid = 1 / (1 + e)``, ``tanh(z) = 2 / (1 + exp(-2z)) - 1``, the new cell state
   ``C' = f C + i g`` in place, the output gate, and ``-2 C'`` for the second ``exp``;
4. ``np.exp``, then ``update_hidden``: ``H' = o tanh(C')``.

Every pass is a flat loop over contiguous arrays with unsigned offsets, compiled with numpy's error
model (no division-by-zero branch): the compiler vectorises them (the cell update went from 170 to 36 us
at B = 64, hidden 512, when its four divisions stopped being scalar). The tanh identity loses a few ulps
near zero against ``np.tanh`` (about 1e-7 absolute in float32).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_gemm
from hetflow.devices.cpu.kernels.jit_gate_panels import UNITS, panel_count, share_gates
from hetflow.devices.cpu.kernels.jit_math import exp
from hetflow.devices.cpu.kernels.jit_tile_gemm import BLOCK_BYTES, ROWS, block_width, columns
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_2d, float32_3d
from hetflow.devices.cpu.threads import SPIN_SHARES_PER_THREAD, spinning

#: Up to this many bytes, the input projection of every step is made up front in one product (0.8 MB
#: for lstm-gesture at batch 1, where a product per step cost ~7 us of the step's ~45); beyond it, each
#: step's projection is made beside its recurrent product, in cache (52 MB at batch 64: 30 ms of writing).
WHOLE_PROJECTION_BYTES = 8 << 20
#: The most columns (batch) the compiled sequence runs (``_sequence``). Measured on the 2-core VM,
#: hidden 512, 100 steps, compiled against stepwise: B = 1 5.1 / 6.2 ms, 2 23.1 / 25.4, 8 28.4 / 29.2,
#: 16 32.6 / 32.6, 32 49.5 / 47.3, 64 82.1 / 76.6.
SEQUENCE_MAX_BATCH = 16
#: Up to this many columns the recurrent product is one GEMV per column: OpenBLAS's GEMM on a few
#: columns runs far below its GEMV (hidden 512, 2 threads: 1 column by GEMV 45 us, 2 columns by GEMM
#: 210 us, 8 columns 235 us). A 100-step sequence, GEMVs against one GEMM a step: B = 2 9.9 / 23.1 ms,
#: 4 19.5 / 23.2, 8 42.2 / 28.4.
GEMV_MAX_COLUMNS = 4


#: From this many columns (batch), a float32 sequence in a run on the spinning pool runs there
#: (``_scan_spinning``); so does one column where R is large enough (``column_spins``).
SPIN_MIN_BATCH = 16
#: R's bytes (float32) from which one column's steps spin: below, a step's products are shorter than
#: the pool's hand-over between steps. 100 steps, the compiled sequence (OpenBLAS's GEMV) against the
#: spinning steps on packed panels, minimums (Zen 4 VM, 2026-12-07, ``benchmarks/lstm_one_column.py``):
#: hidden 32 (R 16 KB) 0.083 -> 0.085 ms, 48 (37 KB) 0.115 -> 0.121, 64 (66 KB) 0.163 -> 0.124, 96
#: 0.292 -> 0.177, 128 0.400 -> 0.240.
VECTOR_MIN_BYTES = 64 << 10


def spins_at(batch: int) -> bool:
    """Whether a float32 sequence of ``batch`` columns may run on a spinning pool when the run holds one:
    ``SPIN_MIN_BATCH`` columns and more (on the tile GEMM), or one (on packed W and R, where
    ``column_spins``)."""
    return batch == 1 or batch >= SPIN_MIN_BATCH


def column_spins(hidden: int, threads: int) -> bool:
    """Whether one column's steps spin on ``threads`` threads: more than one, and R (``4 * hidden`` rows
    of ``hidden``) from ``VECTOR_MIN_BYTES``."""
    return threads > 1 and 16 * hidden * hidden >= VECTOR_MIN_BYTES


def runs_spinning(batch: int, hidden: int, dtype: np.dtype) -> bool:
    """Whether ``scan`` runs ``batch`` columns of ``dtype`` on the running call's spinning pool."""
    pool = spinning()
    if pool is None or np.dtype(dtype) != np.float32 or not spins_at(batch):
        return False
    return batch > 1 or column_spins(hidden, pool.workers + 1)


def runs_sequence(batch: int) -> bool:
    """Whether ``scan`` runs ``batch`` columns as one compiled loop (``_sequence``)."""
    return batch <= SEQUENCE_MAX_BATCH and jit_gemm.available()


def whole_projection(seq_length: int, rows: int, batch: int, itemsize: int) -> bool:
    """Whether the compiled sequence makes every step's input projection up front (``WHOLE_PROJECTION_BYTES``)."""
    return seq_length * rows * batch * itemsize <= WHOLE_PROJECTION_BYTES


def sequence_scratch_bytes(seq_length: int, hidden: int, batch: int, itemsize: int) -> int:
    """Bytes the compiled sequence allocates beyond what both drivers share (the gates, the states):
    the input projections (every step's, or one step's) and the bias repeated per column."""
    rows = 4 * hidden
    steps = seq_length if whole_projection(seq_length, rows, batch, itemsize) else 1
    return (steps * rows * batch + rows * batch) * itemsize


def scan(
    r: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray,
    x_t: np.ndarray,
    h_t: np.ndarray,
    c_t: np.ndarray,
    reverse: bool,
    y_t: np.ndarray | None,
    panels: tuple[np.ndarray, np.ndarray] | None = None,
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
        panels: R and W as ``jit_gate_panels.packed_gates``, kept by the caller: one column's steps
            run on the spinning pool only on them.
    """
    batch = x_t.shape[2]
    if runs_spinning(batch, r.shape[1], r.dtype) and (batch > 1 or panels is not None):
        return _scan_spinning(r, w, bias, x_t, h_t, c_t, reverse, y_t, panels)
    if not runs_sequence(x_t.shape[2]):
        return _scan_stepwise(r, w, bias, x_t, h_t, c_t, reverse, y_t)
    # One compiled loop over the steps (``_sequence``).
    seq_length, _, batch = x_t.shape
    rows, hidden = r.shape[0], r.shape[0] // 4
    gates = np.empty((rows, batch), r.dtype)
    whole = whole_projection(seq_length, rows, batch, r.itemsize)
    projections = np.matmul(w, x_t) if whole else np.empty((1, rows, batch), r.dtype)
    spare = np.empty((2, hidden, batch), r.dtype)
    bias_per_column = np.repeat(np.ascontiguousarray(bias, r.dtype), batch)
    h_end = _sequence(np.ascontiguousarray(r), np.ascontiguousarray(w), bias_per_column, x_t, h_t, c_t, reverse,
                      spare if y_t is None else y_t, y_t is not None, whole, gates, projections, spare)  # fmt: skip
    return h_end, c_t


_NO_TRANS = 111  # CBLAS: the matrix as stored


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _sequence(r, w, bias, x_t, h, c, reverse, y_t, has_y, whole, gates, projections, spare):  # noqa: ANN001, ANN202
    """Every step of the standard cell: ``gates = R h`` (BLAS, at the session's threads: a GEMV per
    column up to ``GEMV_MAX_COLUMNS``, else one GEMM), the input projection (``projections[t]`` made up
    front when ``whole``, else ``W x_t`` now into ``projections[0]``), then ``_update_states``; H goes
    into ``y_t[t]`` when ``has_y``, else into the ``spare`` buffer it is not in. Returns the last H."""
    seq_length, inputs, batch = x_t.shape
    rows = r.shape[0]
    hidden = rows // 4
    single = r.itemsize == 4
    for index in range(seq_length):
        t = seq_length - 1 - index if reverse else index
        projection = projections[t] if whole else projections[0]
        if batch <= GEMV_MAX_COLUMNS:
            for column in range(batch):
                offset = column * r.itemsize
                jit_gemm._gemv(single, _NO_TRANS, rows, hidden, r.ctypes.data, hidden, h.ctypes.data + offset, batch,
                               gates.ctypes.data + offset, batch)  # fmt: skip
        else:
            jit_gemm._gemm(single, rows, batch, hidden, r.ctypes.data, _NO_TRANS, hidden, h.ctypes.data, _NO_TRANS,
                           batch, gates.ctypes.data, batch)  # fmt: skip
        if not whole:
            jit_gemm._gemm(single, rows, batch, inputs, w.ctypes.data, _NO_TRANS, inputs, x_t[t].ctypes.data,
                           _NO_TRANS, batch, projection.ctypes.data, batch)  # fmt: skip
        h_next = y_t[t] if has_y else spare[index % 2]
        _update_states(gates.reshape(-1), projection.reshape(-1), bias, c.reshape(-1), h_next.reshape(-1))
        h = h_next
    return h


@numba.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _sigmoid(z, one):  # noqa: ANN001, ANN202
    """``1 / (1 + e^-z)``; ``one`` is 1 in z's dtype."""
    return one / (one + exp(-z))


@numba.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _cell(input_pre, output_pre, forget_pre, cell_pre, c_old, one, two):  # noqa: ANN001, ANN202
    """The standard cell on one element's pre-activations: ``(C, H)`` with ``C = f C_old + i g`` and
    ``H = o tanh(C)``, ``tanh(z) = 2 sigmoid(2z) - 1``."""
    candidate = two * _sigmoid(two * cell_pre, one) - one
    cell = _sigmoid(forget_pre, one) * c_old + _sigmoid(input_pre, one) * candidate
    return cell, _sigmoid(output_pre, one) * (two * _sigmoid(two * cell, one) - one)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _update_states(gates, projection, bias, c, h):  # noqa: ANN001, ANN202
    """One step of the cell in one flat pass: pre-activations ``gates + projection + bias`` (blocks i,
    o, f, c of ``c.size`` elements), ``C`` updated in place and ``H`` (``_cell``). The loop vectorises
    (``jit_math.exp``)."""
    size = np.uint64(c.shape[0])
    two = c.dtype.type(2)
    one = c.dtype.type(1)
    for j in range(size):
        c[j], h[j] = _cell(gates[j] + projection[j] + bias[j], gates[size + j] + projection[size + j] + bias[size + j],
                           gates[2 * size + j] + projection[2 * size + j] + bias[2 * size + j],
                           gates[3 * size + j] + projection[3 * size + j] + bias[3 * size + j], c[j], one, two)  # fmt: skip


def _scan_stepwise(
    r: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray,
    x_t: np.ndarray,
    h_t: np.ndarray,
    c_t: np.ndarray,
    reverse: bool,
    y_t: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``scan`` with each step's products by numpy and its elementwise work in three compiled passes
    around numpy's ``exp`` (where BLAS cannot be called from compiled code)."""
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


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of ``_spin_step``'s argument block: R, W (2-D), the bias, X, the states (3-D), H0, C (2-D), the
#: gates, a zero bias (1-D), each its address and dimensions; then reverse, whether the states are Y,
#: and the step (``run_steps`` writes it).
_SPIN_SLOTS = 3 + 3 + 2 + 4 + 4 + 3 + 3 + 2 + 2 + 3
_STEP_SLOT = _SPIN_SLOTS - 1


def _scan_spinning(
    r: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray,
    x_t: np.ndarray,
    h_t: np.ndarray,
    c_t: np.ndarray,
    reverse: bool,
    y_t: np.ndarray | None,
    panels: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``scan`` with every step one job of the spinning pool (see the module docstring)."""
    pool = spinning()
    assert pool is not None  # runs_spinning
    seq_length, _, batch = x_t.shape
    rows, hidden = r.shape[0], r.shape[0] // 4
    # Each step's H goes to Y's step, or (no Y wanted) to the one of two buffers H is not in.
    states = y_t if y_t is not None else np.empty((2, hidden, batch), np.float32)
    gates = np.empty(rows * batch, np.float32)
    r, w, bias = (np.ascontiguousarray(a, np.float32) for a in (r, w, bias))
    assert batch > 1 or panels is not None  # scan: one column spins only on its panels
    weights = (r, w) if panels is None or batch > 1 else panels
    job, arrays, shares = _step_job(weights, bias, x_t, states, h_t, c_t, gates, pool.workers + 1)
    block = argument_block(_SPIN_SLOTS, arrays, (int(reverse), int(y_t is not None), 0))
    pool.run_steps(job, block, shares, seq_length, _STEP_SLOT)
    last = seq_length - 1
    if y_t is not None:
        return y_t[0 if reverse else last], c_t
    return states[last % 2], c_t


def step_jobs(
    weights: tuple[np.ndarray, np.ndarray],
    bias: np.ndarray,
    x_t: np.ndarray,
    states: np.ndarray,
    h0: np.ndarray,
    c: np.ndarray,
    gates: np.ndarray,
    reverse: bool,
    states_are_y: bool,
    threads: int,
) -> list[Job]:
    """Every step of a spinning sequence on ``threads`` threads as one job, on a block of its own: what a
    captured run replays (``rnn``'s capture). The arguments are ``_step_job``'s; C is updated in place,
    so a run must set it to the initial state before the first step."""
    address, arrays, shares = _step_job(weights, bias, x_t, states, h0, c, gates, threads)
    return [
        Job(address, argument_block(_SPIN_SLOTS, arrays, (int(reverse), int(states_are_y), step)), shares, arrays)
        for step in range(x_t.shape[0])
    ]


def _step_job(
    weights: tuple[np.ndarray, np.ndarray],
    bias: np.ndarray,
    x_t: np.ndarray,
    states: np.ndarray,
    h0: np.ndarray,
    c: np.ndarray,
    gates: np.ndarray,
    threads: int,
) -> tuple[int, tuple[np.ndarray, ...], int]:
    """A spinning step's job on ``threads`` threads: (its address, the ``_SPIN_SLOTS`` arrays, its shares).
    ``weights``: for one column (``x_t`` ``[seq, input, 1]``) R's and W's panels (``jit_gate_panels``;
    ``_spin_vector_step``, one share a thread: a core's panels stream from L2 or L3 at the same rate, and
    more shares only add hand-overs), for a batch R and W as stored (``_spin_step``, on a zero bias of
    its own; whole tiles of ``ROWS`` hidden units a share, ``SPIN_SHARES_PER_THREAD`` a thread at most).
    All float32, C-contiguous; ``states`` Y's steps or two buffers."""
    hidden = c.shape[0]
    if x_t.shape[2] == 1:
        arrays = (*weights, bias, x_t, states, h0, c, gates, bias)
        return _spin_vector_job_address(), arrays, min(panel_count(hidden), threads)
    arrays = (*weights, bias, x_t, states, h0, c, gates, np.zeros(bias.size, np.float32))
    return _spin_job_address(), arrays, min(-(-hidden // ROWS), threads * SPIN_SHARES_PER_THREAD)


def _spin_job(args, share, shares):  # noqa: ANN001, ANN202
    """``_spin_step`` on a pool job's argument block (``_SPIN_SLOTS``)."""
    _spin_step(float32_2d(args, 0), float32_2d(args, 3), float32_1d(args, 6), float32_3d(args, 8),
               float32_3d(args, 12), float32_2d(args, 16), float32_2d(args, 19), float32_1d(args, 22),
               float32_1d(args, 24), args[26] != 0, args[27] != 0, args[_STEP_SLOT], share, shares)  # fmt: skip


@functools.cache
def _spin_job_address() -> int:
    """The address of ``_spin_job`` compiled as a pool job (on first use)."""
    return spin_pool.job(_spin_job)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _spin_step(r, w, bias, x_t, states, h0, c, gates, zeros, reverse, states_are_y, step, share, shares):  # noqa: ANN001, ANN202, E501
    """Share ``share`` of ``shares`` of step ``step``: its range of hidden units (whole tiles of
    ``ROWS``), their rows of the gates i, o, f, c (``W x_t + b + R h``, on the tile GEMM), then their
    cell and hidden states. H comes from ``h0`` at the first step, else from the previous step's
    states; it goes into ``states[t]`` (``states_are_y``: Y, [seq, hidden, B]) or ``states[step % 2]``."""
    seq_length, inputs, batch = x_t.shape
    hidden = c.shape[0]
    blocks = (hidden + ROWS - 1) // ROWS
    first_block, last_block = blocks * share // shares, blocks * (share + 1) // shares
    t, source_start, target = _step_places(step, seq_length, reverse, states_are_y, hidden * batch)
    h_flat = states.reshape(states.size)
    source = h0.reshape(h0.size) if step == 0 else h_flat
    batch64 = np.int64(batch)
    x_flat = x_t.reshape(x_t.size)
    r_flat, w_flat = r.reshape(r.size), w.reshape(w.size)
    no_residual = np.int64(-1)
    low, high = np.float32(-np.inf), np.float32(np.inf)
    for gate in range(4):
        rows_before = gate * hidden
        y_start = np.int64(rows_before * batch)
        columns(w_flat[rows_before * inputs:], np.int64(inputs), x_flat, np.int64(t * inputs * batch), batch64, gates,
                y_start, batch64, np.int64(hidden), bias[rows_before:], gates, np.int64(0), no_residual, low, high,
                np.int64(0), batch64, block_width(BLOCK_BYTES, inputs), np.int64(first_block),
                np.int64(last_block))  # fmt: skip
        columns(r_flat[rows_before * hidden:], np.int64(hidden), source, np.int64(source_start), batch64, gates,
                y_start, batch64, np.int64(hidden), zeros, gates, y_start, batch64, low, high, np.int64(0), batch64,
                block_width(BLOCK_BYTES, hidden), np.int64(first_block), np.int64(last_block))  # fmt: skip
    start, stop = first_block * ROWS * batch, min(last_block * ROWS, hidden) * batch
    size = hidden * batch
    _update_cells(gates[start:stop], gates[size + start:size + stop], gates[2 * size + start:2 * size + stop],
                  gates[3 * size + start:3 * size + stop], c.reshape(c.size)[start:stop],
                  h_flat[target + start:target + stop])  # fmt: skip


@numba.njit(nogil=True, cache=True, inline="always")
def _step_places(step, seq_length, reverse, states_are_y, state_size):  # noqa: ANN001, ANN202
    """Where step ``step`` of a spinning sequence works: its time ``t``, and the offsets (in the flat
    states, ``state_size`` floats a state) of the H it reads (none at the first step, which reads H0)
    and of the H it writes: Y's steps when ``states_are_y``, else the two buffers in turn."""
    t = seq_length - 1 - step if reverse else step
    before = t + 1 if reverse else t - 1
    source = 0 if step == 0 else (before if states_are_y else (step - 1) % 2) * state_size
    return t, source, (t if states_are_y else step % 2) * state_size


def _spin_vector_job(args, share, shares):  # noqa: ANN001, ANN202
    """``_spin_vector_step`` on a pool job's argument block (``_SPIN_SLOTS``; R's and W's panels in their
    slots)."""
    _spin_vector_step(float32_2d(args, 0), float32_2d(args, 3), float32_1d(args, 6), float32_3d(args, 8),
                      float32_3d(args, 12), float32_2d(args, 16), float32_2d(args, 19), float32_1d(args, 22),
                      args[26] != 0, args[27] != 0, args[_STEP_SLOT], share, shares)  # fmt: skip


@functools.cache
def _spin_vector_job_address() -> int:
    """The address of ``_spin_vector_job`` compiled as a pool job (on first use)."""
    return spin_pool.job(_spin_vector_job)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _spin_vector_step(r_panels, w_panels, bias, x_t, states, h0, c, gates, reverse, states_are_y, step, share, shares):  # noqa: ANN001, ANN202, E501
    """``_spin_step`` for one column: share ``share`` of ``shares`` of step ``step`` takes a range of the
    panels of R and W (``jit_gate_panels``: 16 hidden units each), their units' gates i, o, f, c (``b + W
    x_t + R h``), then their cell and hidden states (``_update_cells``)."""
    seq_length, inputs, _ = x_t.shape
    hidden = c.shape[0]
    count = (hidden + UNITS - 1) // UNITS
    first, last = count * share // shares, count * (share + 1) // shares
    t, source_start, target = _step_places(step, seq_length, reverse, states_are_y, hidden)
    h_flat = states.reshape(states.size)
    h = h0.reshape(h0.size) if step == 0 else h_flat[source_start : source_start + hidden]
    share_gates(r_panels.reshape(r_panels.size), w_panels.reshape(w_panels.size), h, x_t[t].reshape(inputs), bias,
                gates, first, last)  # fmt: skip
    start, stop = first * UNITS, min(last * UNITS, hidden)
    _update_cells(gates[start:stop], gates[hidden + start:hidden + stop], gates[2 * hidden + start:2 * hidden + stop],
                  gates[3 * hidden + start:3 * hidden + stop], c.reshape(c.size)[start:stop],
                  h_flat[target + start:target + stop])  # fmt: skip


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _update_cells(input_pre, output_pre, forget_pre, cell_pre, c, h):  # noqa: ANN001, ANN202
    """``_cell`` over aligned ranges of the four gates' pre-activations, C updated in place, H written.
    The unsigned index spares every access its negative-index branch, so the loop vectorises (706 ->
    ~50 us for 512 x 64 elements)."""
    one, two = c.dtype.type(1), c.dtype.type(2)
    for j in range(np.uint64(c.shape[0])):
        c[j], h[j] = _cell(input_pre[j], output_pre[j], forget_pre[j], cell_pre[j], c[j], one, two)
