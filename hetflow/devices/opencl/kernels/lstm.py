"""OpenCL LSTM (``lstm.cl``): the input projection of every step as one tiled GEMM, then per step the
recurrent gates GEMM ``H @ R^T`` and the cell-update kernel, all queued on the device with no host
round trip inside the sequence.

The cell kernel writes the new hidden state straight into the GEMM's A-panel layout for the next step
(two buffers, used in turn), so a step costs two launches. Forward, reverse and bidirectional layers,
both layouts, initial states, ``sequence_lens``, peepholes, clip and input_forget are supported; other
activations than ONNX's defaults stay on the CPU.

X may be a device tensor (packed for the input projection on the device); Y then stays on the device
(layout 0; batch-first Y is transposed on the host). Weights, the summed bias and peepholes are
resident; zero initial states are filled on the device, so a run moves only X, Y and the final states
that the node outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _supports(node: Node, inputs: InputInfos) -> str | None:
    attrs = node.attrs
    directions = num_directions(attrs.direction)
    names = [a.lower() for a in attrs.activations]
    defaults = [a.lower() for a in LSTM.default_activations] * directions
    if names and names != defaults:
        return f"OpenCL LSTM runs the default activations only ({', '.join(LSTM.default_activations)})"
    return float32_reason(node, inputs, [0, 1, 2, 3, 5, 6, 7])


def lstm_products(node: Node, inputs: Sequence[TensorInfo | None]) -> list[tuple[int, int, int, int]]:
    """The GEMM products (M, N, K, batch) of one direction (tuning)."""
    x, r = inputs[0], inputs[2]
    assert x is not None and r is not None
    seq, batch, width = x.shape if node.attrs.layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
    hidden = int(r.shape[2])
    return [(int(seq * batch), 4 * hidden, int(width), 1), (int(batch), 4 * hidden, hidden, 1)]


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
    directions = y.shape[1]
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
    # The recurrence: gates = H @ R^T, then the cell.
    config = device.gemm_config(batch, rows, hidden, 1)
    layout = GemmLayout.of(config, batch, rows, hidden)
    r_panels = _transposed_panels(device, r, d, config, layout)
    h_panels = [_state_panels(device, h0, layout, batch, hidden) for _ in range(2)]
    c_state = _state(device, c0, batch, hidden)
    h_out = _state(device, h0, batch, hidden)
    gates = device.empty((1, batch, rows))
    steps = [launch_packed(device, config, layout, 1, panels, r_panels, out=gates) for panels in h_panels]
    peep = h_out if peepholes is None else _peepholes(device, peepholes, d)
    reverse = attrs.direction == "reverse" or d == 1
    cell = device.kernel("lstm_cell", SOURCE)
    for step in range(seq):
        current = step % 2
        steps[current].enqueue()
        args = (
            gates.buffer, projection.out.buffer, c_state.buffer, h_panels[current].buffer,
            h_panels[1 - current].buffer, *i32(layout.a_width, layout.kp),
            y.buffer, h_out.buffer, peep.buffer, np.int32(peepholes is not None),
            np.int32(hidden), np.int32(attrs.clip is not None),
            np.float32(attrs.clip if attrs.clip is not None else 0.0), np.int32(attrs.input_forget),
            lengths_buf.buffer, np.int32(has_lengths),
            *i32(step, seq, batch, int(reverse), directions, d),
        )  # fmt: skip
        device.enqueue(cell, (hidden, batch), None, args)
    for scratch in (*h_panels, gates, projection.out):
        device.release(scratch)
    return h_out, c_state


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
        """LSTM: input projection GEMM, then per step the gates GEMM and the cell kernel."""
        return run_lstm(device, node, inputs)
