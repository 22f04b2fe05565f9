"""OpenCL LSTM (``lstm.cl``): the input projection of every step as one tiled GEMM, then the steps, all
queued on the device with no host round trip inside the sequence.

A step of a small batch (up to ``FUSED_MAX_BATCH`` elements) is one launch of the fused ``lstm_step``
kernel: the dot products of the hidden state with R's gate rows, and the cell update. The skinny
recurrent product is latency-bound: on an H100, lstm-gesture at batch 1 spent ~39 us per step in the
tiled GEMM (64 work-groups, each looping over all of K) and ~7 us in the cell kernel, against 1.7 ms for
the whole run on the host. Larger batches run per step the recurrent gates GEMM ``H @ R^T`` and the cell
kernel, which writes the new hidden state straight into the GEMM's A-panel layout for the next step.
Both paths keep two hidden-state buffers and use them in turn.

Forward, reverse and bidirectional layers, both layouts, initial states, ``sequence_lens``, peepholes,
clip and input_forget are supported; other activations than ONNX's defaults stay on the CPU.

X may be a device tensor (packed for the input projection on the device); Y then stays on the device
(layout 0; batch-first Y is transposed on the host). Weights, the summed bias and peepholes are
resident; zero initial states are filled on the device, so a run moves only X, Y and the final states
that the node outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    device_inputs,
    float32_reason,
    i32,
    on_host,
    source,
)
from hetflow.devices.opencl.kernels.gemm import (
    GemmConfig,
    GemmLayout,
    a_panels,
    launch_packed,
    matrix_bias,
    pack_a,
    pack_b,
)
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.rnn import LSTM, num_directions

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("lstm.cl")

#: The largest batch that runs the fused step kernel (one launch per step: the gates' dot products and
#: the cell). Its work-items keep four accumulators (one per gate) per element in registers; larger
#: batches run the tiled gates GEMM, which fills the device with their product, and the cell kernel.
FUSED_MAX_BATCH = 8


@dataclass(frozen=True)
class StepSplit:
    """How the fused step kernel splits a layer (build options of ``lstm_step``; see lstm.cl)."""

    units: int  # hidden units per work-group (J): its 4J rows of R
    lanes: int  # work-items per unit (T, a power of two), striding over K
    vector: int  # floats per read (1, 4, 8 or 16)

    @property
    def group(self) -> int:
        """Work-items per work-group."""
        return self.units * self.lanes

    def row_width(self, hidden: int) -> int:
        """Floats per row of R and of the states: ``hidden`` padded to whole strides of the lanes."""
        stride = self.lanes * self.vector
        return -(-hidden // stride) * stride

    def options(self, batch: int) -> tuple[str, ...]:
        """Build options of ``lstm_step`` for a layer of ``batch`` elements."""
        return (
            f"-DLSTM_BATCH={batch}", f"-DLSTM_UNITS={self.units}", f"-DLSTM_LANES={self.lanes}",
            f"-DLSTM_VEC={self.vector}", "-cl-mad-enable",
        )  # fmt: skip


#: On a GPU: a warp per hidden unit (32 lanes), so each of its four gate rows is read as whole 128-byte
#: lines, 16 reads per lane for H = 512; 4 units give 128-item groups and an H = 512 layer 128 of them to
#: spread over the compute units (the GEMM path had 64, each looping over all of K).
GPU_STEP_SPLIT = StepSplit(units=4, lanes=32, vector=1)
#: On a CPU (PoCL): one work-item per unit (no local-memory reduction, no barrier: PoCL's work-item loops
#: around barriers cost more than they gain), reading float8 vectors along K: the fastest of J in 8..32
#: and vectors of 4, 8 and 16 on lstm-gesture at batch 1 to 8 under PoCL 3.0 (float16 tied at batch 1,
#: slower from batch 2; lanes > 1 ran 3x slower). There it beats the GEMM path up to batch 8, ties at 16.
CPU_STEP_SPLIT = StepSplit(units=16, lanes=1, vector=8)


def _supports(node: Node, inputs: InputInfos) -> str | None:
    attrs = node.attrs
    directions = num_directions(attrs.direction)
    names = [a.lower() for a in attrs.activations]
    defaults = [a.lower() for a in LSTM.default_activations] * directions
    if names and names != defaults:
        return f"OpenCL LSTM runs the default activations only ({', '.join(LSTM.default_activations)})"
    return float32_reason(node, inputs, [0, 1, 2, 3, 5, 6, 7])


def lstm_products(node: Node, inputs: Sequence[TensorInfo | None]) -> list[tuple[int, int, int, int]]:
    """The GEMM products (M, N, K, batch) of one direction (tuning): the input projection, and the
    recurrent gates product where the batch is too large for the fused step."""
    x, r = inputs[0], inputs[2]
    assert x is not None and r is not None
    seq, batch, width = x.shape if node.attrs.layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
    hidden = int(r.shape[2])
    products = [(int(seq * batch), 4 * hidden, int(width), 1)]
    if not fused_step(int(batch)):
        products.append((int(batch), 4 * hidden, hidden, 1))
    return products


def run_lstm(device: OpenCLDevice, node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor | None]:
    """The LSTM node's outputs (Y, Y_h, Y_c; None for those it omits). Y stays on the device when X came
    as a device buffer in layout 0."""
    attrs = node.attrs
    padded = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, sequence_lens, initial_h, initial_c, peepholes = padded
    assert x is not None and isinstance(w, np.ndarray) and isinstance(r, np.ndarray)
    batch_first = attrs.layout == 1
    keep_on_device = isinstance(x, DeviceArray) and not batch_first
    if batch_first:
        x = on_host(device, x).transpose(1, 0, 2)  # type: ignore[union-attr]
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x, np.float32)
    seq, batch, width = x.shape
    directions = num_directions(attrs.direction)
    hidden = r.shape[2]
    lengths = _lengths(on_host(device, sequence_lens), seq, batch)
    # With lengths, Y past each element's length stays zero: start from zeros.
    y_shape = (seq, directions, batch, hidden)
    y = device.empty(y_shape) if lengths is None else device.zeros(y_shape)
    lengths_buf = _lengths_buffer(device, lengths)
    wants = [len(node.outputs) > i and bool(node.outputs[i]) for i in range(3)]
    finals: list[tuple[DeviceArray, DeviceArray]] = []
    for d in range(directions):
        finals.append(_run_direction(
            device, attrs, x, w, r, b, d, y, lengths_buf, lengths is not None, peepholes,
            None if initial_h is None else initial_h[d], None if initial_c is None else initial_c[d],
        ))  # fmt: skip
    outputs: list[Tensor | None] = []
    if not wants[0]:
        # The cell kernel writes every step into Y anyway. Wait for it before Y's buffer goes back to
        # the pool: on PoCL's unified memory, not waiting here (Y unread, lstm-gesture's graph since
        # drop_unread_outputs) corrupted the host heap within a few runs, with Y parked too. The wait
        # is what reading Y back did before; one per node, not per step.
        device.synchronize()
        device.release(y)
        outputs.append(None)
    elif keep_on_device:
        outputs.append(y)
    else:
        outputs.append(_layout(device.to_host(y), (2, 0, 1, 3), batch_first))
    # NOTE: one direction's final states are the node's Y_h / Y_c as they are; with several directions
    # or lengths (length-0 rows zeroed) they are assembled on the host.
    states_on_device = keep_on_device and directions == 1 and lengths is None
    for which in (0, 1):
        if not wants[1 + which]:
            outputs.append(None)
        elif states_on_device:
            outputs.append(finals[0][which].reshape(1, batch, hidden))
        else:
            stacked = np.stack([_final_state(device, pair[which], lengths) for pair in finals])
            outputs.append(_layout(stacked, (1, 0, 2), batch_first))
    return outputs[: max(len(node.outputs), 1)]


def _run_direction(
    device: OpenCLDevice,
    attrs: Any,
    x: Tensor,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    d: int,
    y: DeviceArray,
    lengths_buf: DeviceArray,
    has_lengths: bool,
    peepholes: np.ndarray | None,
    h0: np.ndarray | None,
    c0: np.ndarray | None,
) -> tuple[DeviceArray, DeviceArray]:
    """Queue direction ``d`` of the layer, writing its slice of ``y``; its final (h, c) buffers."""
    seq, batch, width = x.shape
    hidden = r.shape[2]
    rows = 4 * hidden
    # Input projection for every step: [seq * batch, input] @ W^T + (Wb + Rb).
    in_config = device.gemm_config(seq * batch, rows, width, 1)
    in_layout = GemmLayout.of(in_config, seq * batch, rows, width)
    w_panels = _transposed_panels(device, w, d, in_config, in_layout)
    bias = None if b is None else device.resident.get(b, ("lstm_bias", d), lambda: _summed_bias(device, b, d, rows))
    x_panels, x_scratch = a_panels(device, x.reshape(1, seq * batch, width), in_layout)
    projection = launch_packed(device, in_config, in_layout, 1, x_panels, w_panels, bias=bias)
    projection.enqueue()
    if x_scratch:
        device.release(x_panels)
    cell = _CellArgs(
        xw=projection.out, c=_state(device, c0, batch, hidden), h_out=_state(device, h0, batch, hidden),
        y=y, peep=None if peepholes is None else _peepholes(device, peepholes, d), lengths=lengths_buf,
        has_lengths=has_lengths, attrs=attrs, reverse=attrs.direction == "reverse" or d == 1, d=d,
    )  # fmt: skip
    if fused_step(batch):
        _fused_steps(device, r, h0, cell)
    else:
        _gemm_steps(device, r, h0, cell)
    device.release(projection.out)
    return cell.h_out, cell.c


@dataclass(frozen=True)
class _CellArgs:
    """What both step kernels take besides the recurrent product: one direction's buffers and flags."""

    xw: DeviceArray
    c: DeviceArray
    h_out: DeviceArray
    y: DeviceArray
    peep: DeviceArray | None
    lengths: DeviceArray
    has_lengths: bool
    attrs: Any
    reverse: bool
    d: int

    def tail(self) -> tuple[Any, ...]:
        """The arguments from ``y`` to ``has_lengths`` (the same in both kernels)."""
        clip = self.attrs.clip
        peep = self.h_out if self.peep is None else self.peep  # never read without peepholes
        return (
            self.y.buffer, self.h_out.buffer, peep.buffer, np.int32(self.peep is not None),
            np.int32(self.c.shape[1]), np.int32(clip is not None), np.float32(clip if clip is not None else 0.0),
            np.int32(self.attrs.input_forget), self.lengths.buffer, np.int32(self.has_lengths),
        )  # fmt: skip


def fused_step(batch: int) -> bool:
    """Whether a layer of ``batch`` elements runs the fused step kernel rather than GEMM + cell."""
    return 1 <= batch <= FUSED_MAX_BATCH


def _fused_steps(device: OpenCLDevice, r: np.ndarray, h0: np.ndarray | None, cell: _CellArgs) -> None:
    """Queue the recurrence as one ``lstm_step`` launch per step (small batches)."""
    seq = cell.y.shape[0]
    batch, hidden = cell.c.shape
    split = CPU_STEP_SPLIT if device.is_cpu else GPU_STEP_SPLIT
    kernel = device.kernel("lstm_step", SOURCE, split.options(batch))
    width = split.row_width(hidden)
    rows = device.resident.get(r, ("lstm_rows", cell.d, width), lambda: _padded_rows(device, r[cell.d], width))
    # The step reads one state and writes the other; both start as h0 (padding zero: the kernel reads it).
    states = [_padded_state(device, h0, batch, width) for _ in range(2)]
    global_size = (-(-hidden // split.units) * split.group,)
    where = (np.int32(seq), np.int32(cell.reverse), np.int32(cell.y.shape[1]), np.int32(cell.d))
    head, tail = (rows.buffer, np.int32(width), cell.xw.buffer, cell.c.buffer), cell.tail()
    for step in range(seq):
        h_prev, h_next = states[step % 2], states[1 - step % 2]
        args = (*head, h_prev.buffer, h_next.buffer, *tail, np.int32(step), *where)
        device.enqueue(kernel, global_size, (split.group,), args)
    for state in states:
        device.release(state)


def _padded_rows(device: OpenCLDevice, r: np.ndarray, width: int) -> DeviceArray:
    """One direction's R as ONNX stores it ([4H, H], row-major: each gate row contiguous over K), each
    row zero-padded to ``width`` floats."""
    rows = np.zeros((r.shape[0], width), np.float32)
    rows[:, : r.shape[1]] = r
    return device.to_device(rows)


def _padded_state(device: OpenCLDevice, h0: np.ndarray | None, batch: int, width: int) -> DeviceArray:
    """A ``[batch, width]`` hidden state: ``h0`` zero-padded, or zeros filled on the device."""
    if h0 is None:
        return device.zeros((batch, width))
    state = np.zeros((batch, width), np.float32)
    state[:, : h0.shape[1]] = h0
    buffer = device.to_device(state)
    device.park(buffer)
    return buffer


def _gemm_steps(device: OpenCLDevice, r: np.ndarray, h0: np.ndarray | None, cell: _CellArgs) -> None:
    """Queue the recurrence as the gates GEMM ``H @ R^T`` and the ``lstm_cell`` kernel per step."""
    seq, directions = cell.y.shape[:2]
    batch, hidden = cell.c.shape
    rows = 4 * hidden
    config = device.gemm_config(batch, rows, hidden, 1)
    layout = GemmLayout.of(config, batch, rows, hidden)
    r_panels = _transposed_panels(device, r, cell.d, config, layout)
    h_panels = [_state_panels(device, h0, layout, batch, hidden) for _ in range(2)]
    gates = device.empty((1, batch, rows))
    steps = [launch_packed(device, config, layout, 1, panels, r_panels, out=gates) for panels in h_panels]
    kernel = device.kernel("lstm_cell", SOURCE)
    where = (np.int32(seq), np.int32(batch), np.int32(cell.reverse), np.int32(directions), np.int32(cell.d))
    shape, tail = i32(layout.a_width, layout.kp), cell.tail()
    for step in range(seq):
        current = step % 2
        steps[current].enqueue()
        args = (
            gates.buffer, cell.xw.buffer, cell.c.buffer, h_panels[current].buffer,
            h_panels[1 - current].buffer, *shape, *tail, np.int32(step), *where,
        )  # fmt: skip
        device.enqueue(kernel, (hidden, batch), None, args)
    for scratch in (*h_panels, gates):
        device.release(scratch)


def _peepholes(device: OpenCLDevice, peepholes: np.ndarray, d: int) -> DeviceArray:
    # A private copy of direction d's row: wrapping a view would tie the entry to the array it is keyed by.
    return device.resident.get(peepholes, ("peep", d), lambda: device.to_device(np.array(peepholes[d], np.float32)))


def _summed_bias(device: OpenCLDevice, b: np.ndarray, d: int, rows: int) -> Any:
    return matrix_bias(device, (b[d, :rows] + b[d, rows:]).astype(np.float32))


def _state(device: OpenCLDevice, value: np.ndarray | None, batch: int, hidden: int) -> DeviceArray:
    """A ``[batch, hidden]`` state on the device: ``value`` uploaded, or zeros filled on the device."""
    if value is None:
        return device.zeros((batch, hidden))
    state = device.to_device(np.array(value, np.float32))
    device.park(state)
    return state


def _state_panels(
    device: OpenCLDevice, h0: np.ndarray | None, layout: GemmLayout, batch: int, hidden: int
) -> DeviceArray:
    """The hidden state packed as the recurrent GEMM's A operand (zeros filled on the device)."""
    if h0 is None:
        return device.zeros((layout.a_elements,))
    panels = device.to_device(pack_a(np.asarray(h0, np.float32)[None], layout))
    device.park(panels)
    return panels


def _final_state(device: OpenCLDevice, state: DeviceArray, lengths: np.ndarray | None) -> np.ndarray:
    final = device.to_host(state).copy()
    if lengths is not None:
        # NOTE: an element of length 0 runs no step; ONNX Runtime (the reference) reports zeros for its
        # final states rather than its initial ones.
        final[lengths == 0] = 0
    return final


def _lengths_buffer(device: OpenCLDevice, lengths: np.ndarray | None) -> DeviceArray:
    if lengths is None:
        return device.constant(("lstm", "no lengths"), lambda: np.zeros(1, np.int32))
    buffer = device.to_device(lengths)
    device.park(buffer)
    return buffer


def _lengths(sequence_lens: np.ndarray | None, seq: int, batch: int) -> np.ndarray | None:
    """Per-element lengths as int32, or None when every element runs the whole sequence."""
    if sequence_lens is None:
        return None
    lengths = np.asarray(sequence_lens, np.int64).reshape(-1)
    if lengths.shape != (batch,):
        raise ValueError(f"sequence_lens has {lengths.size} entries for a batch of {batch}")
    if np.any(lengths < 0) or np.any(lengths > seq):
        raise ValueError(f"sequence_lens {lengths.tolist()} must lie in [0, {seq}]")
    return None if np.all(lengths == seq) else lengths.astype(np.int32)


def _transposed_panels(
    device: OpenCLDevice, weights: np.ndarray, direction: int, config: GemmConfig, layout: GemmLayout
) -> DeviceArray:
    """``weights[direction]^T`` packed as the GEMM's B operand, kept on the device with the array."""

    def make() -> DeviceArray:
        matrix = np.ascontiguousarray(weights[direction].T, np.float32)
        return device.to_device(pack_b(matrix[None], layout))

    return device.resident.get(weights, ("lstm", direction, config), make)


def _layout(a: np.ndarray, batch_first_axes: tuple[int, ...], batch_first: bool) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(batch_first_axes) if batch_first else a)


def register(device: OpenCLDevice) -> None:
    """Add LSTM to ``device``'s kernel table."""

    @device.kernels.register("LSTM", supports=_supports)
    @device_inputs((0,))
    def lstm(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor | None]:
        """LSTM: input projection GEMM, then per step the fused step kernel (small batches) or the gates
        GEMM and the cell kernel."""
        return run_lstm(device, node, inputs)
