"""One column's LSTM gates with the hidden units in the vector lanes: ``gates = b + W x_t + R h`` from W
and R packed once in panels of 16 hidden units (the products of a batch-1 step, ``jit_lstm``).

R is ``[4*hidden, hidden]`` and W ``[4*hidden, input]`` (gates i, o, f, c stacked). A panel holds 16
consecutive hidden units of all four gates: ``[depth, 64]``, row k's column ``16g + u`` is row ``g*hidden
+ 16p + u`` of the matrix, column k (zero past the last unit). A panel is one tile: four accumulators
(the four gates' 16 units) start from the bias, then every row of W's panel adds itself times ``x_t[k]``
broadcast and every row of R's panel itself times ``h[k]`` -- four loads and four FMAs a row, no
horizontal sums -- and the tile is stored as those units' four gates. A share of a step is a range of
panels, so the same thread updates those units' cell and hidden states with no barrier. The input
projection made in the step costs 6 rows against R's 512 for lstm-gesture; made for every step up front
(the kernel this replaced) it was a 0.8 MB product and bias pass, ~0.2 ms of a 3 ms run.

Why not dot products of R's rows with h (the kernel this replaced, four rows at a time): each row's 16
partial sums end in a horizontal sum, and at hidden 512 a step's 2048 rows cost more in those sums and
in the loop around them than in the loads. Measured one core, R from L2 or the last-level cache
(2026-12-07, Zen 4 VM, minimums): 1024 x 512 rows 31.6 us as dot products, 23.2 as panels; 640 x 320
(L2) 11.6 -> 9.7. At that rate the panels stream R at ~30 bytes a cycle, the core's fill rate from L2 and
L3 alike, so a share's panels from L3 (lstm-gesture's 2 MB a core) cost little more than from L2.

Reading a share's panels in the opposite order at every other step (so that the panels read last, still
in L2, come first) measured no faster in a whole sequence (lstm-gesture, 2.5-3.0 ms either way): at ~30
bytes a cycle from L2 and L3 alike there is little to win.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import jit_lane_gemm
from hetflow.devices.cpu.kernels import llvm_vectors as lv

#: Gates of the standard cell (i, o, f, c), one vector of a panel each.
GATES = 4
#: Hidden units per panel: one vector's lanes.
UNITS = lv.LANES
#: Columns of a panel row (``jit_lane_gemm``'s packed tiles have the same width).
PANEL_COLUMNS = GATES * UNITS
assert PANEL_COLUMNS == jit_lane_gemm.TILE_KERNELS


def panel_count(hidden: int) -> int:
    """Panels of R for ``hidden`` units."""
    return -(-hidden // UNITS)


def packed_gates(m: np.ndarray) -> np.ndarray:
    """An LSTM's R ``[4*hidden, hidden]`` or W ``[4*hidden, input]`` as ``[panels * depth, 64]`` float32
    panels of ``depth`` rows (its columns; see the module docstring)."""
    rows, depth = m.shape
    hidden, rest = divmod(rows, GATES)
    if rest or not hidden:
        raise ValueError(f"an LSTM's weights have {GATES} x hidden rows, not {rows}")
    panels = panel_count(hidden)
    by_unit = np.zeros((GATES, panels * UNITS, depth), np.float32)
    by_unit[:, :hidden] = m.reshape(GATES, hidden, depth)
    # Row 64p + 16g + u of the reordered matrix is unit 16p + u of gate g: packed, that is panel p's column.
    reordered = by_unit.reshape(GATES, panels, UNITS, depth).transpose(1, 0, 2, 3).reshape(-1, depth)
    return jit_lane_gemm.packed_weights(reordered, panels * PANEL_COLUMNS).reshape(-1, PANEL_COLUMNS)


def packed_bytes(hidden: int, depth: int) -> int:
    """Bytes of ``packed_gates`` for ``hidden`` units and ``depth`` columns."""
    return panel_count(hidden) * depth * PANEL_COLUMNS * 4


def _add_panel_rows(builder, fma, panels_data, panel, vector_data, depth, slots):  # noqa: ANN001, ANN202
    """``slots[g] += sum_k panels[panel][k, 16g ..] * vector[k]`` over the ``depth`` rows of one panel."""
    first_row = builder.mul(panel, builder.mul(depth, lv.INT(PANEL_COLUMNS)))
    with cgutils.for_range(builder, depth) as loop:
        k = loop.index
        row = lv.load_vectors(builder, panels_data, builder.add(first_row, builder.mul(k, lv.INT(PANEL_COLUMNS))),
                              GATES)  # fmt: skip
        lv.multiply_add_broadcast(builder, fma, row, lv.load_scalar(builder, vector_data, k), slots)


@intrinsic
def _panel(typingctx, r_panels, w_panels, panel, h, x, bias, gates):  # noqa: ANN001, ANN202
    """Panel ``panel`` of R's and W's ``packed_gates`` (flat): ``gates[g*hidden + 16*panel + u] =
    bias[same] + sum_k W[..., k] x[k] + sum_k R[..., k] h[k]`` for its units u below ``hidden`` (h's
    length)."""
    signature = types.void(r_panels, w_panels, panel, h, x, bias, gates)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        r_v, w_v, panel_v, h_v, x_v, bias_v, gates_v = args
        data = [lv.array_data(context, builder, sig.args[i], args[i]) for i in (0, 1, 3, 4, 5, 6)]
        r_data, w_data, h_data, x_data, bias_data, gates_data = data
        hidden = lv.array_size(context, builder, sig.args[3], h_v)
        inputs = lv.array_size(context, builder, sig.args[4], x_v)
        unit = builder.mul(panel_v, lv.INT(UNITS))
        inside = lv.lanes_inside(builder, unit, UNITS, hidden)
        zero = lv.float_vector(UNITS, 0.0)
        starts = [builder.add(builder.mul(hidden, lv.INT(g)), unit) for g in range(GATES)]
        (slots,) = lv.accumulators(builder, 1, GATES)
        for start, slot in zip(starts, slots, strict=True):
            builder.store(lv.masked_load(builder, bias_data, start, inside, zero), slot)
        fma = lv.fused_multiply_add(builder)
        _add_panel_rows(builder, fma, w_data, panel_v, x_data, inputs, slots)
        _add_panel_rows(builder, fma, r_data, panel_v, h_data, hidden, slots)
        for start, slot in zip(starts, slots, strict=True):
            lv.masked_store(builder, builder.load(slot), gates_data, start, inside)
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(nogil=True, cache=True)
def share_gates(r_panels, w_panels, h, x, bias, gates, first, last):  # noqa: ANN001, ANN201
    """Panels ``first .. last - 1`` of R's and W's ``packed_gates`` (flat): their units' four gates,
    ``bias + W x + R h``, into ``gates`` (flat ``[4, hidden]``, as ``bias``)."""
    for panel in range(first, last):
        _panel(r_panels, w_panels, panel, h, x, bias, gates)
