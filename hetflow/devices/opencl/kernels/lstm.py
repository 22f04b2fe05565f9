"""OpenCL LSTM (``lstm.cl``): the input projection of every step as one tiled GEMM, then per step the
recurrent gates GEMM ``H @ R^T`` and the cell-update kernel, all queued on the device with no host
round trip inside the sequence.

The cell kernel writes the new hidden state straight into the GEMM's A-panel layout for the next step
(two buffers, used in turn), so a step costs two launches. Forward, reverse and bidirectional layers,
both layouts, initial states, ``sequence_lens``, peepholes, clip and input_forget are supported; other
activations than ONNX's defaults stay on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray
from hetflow.devices.opencl.kernels.common import float32_reason, i32, source
from hetflow.devices.opencl.kernels.gemm import (
    GemmConfig,
    GemmLayout,
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


def run_lstm(device: OpenCLDevice, node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    attrs = node.attrs
    padded = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, sequence_lens, initial_h, initial_c, peepholes = padded
    assert x is not None and w is not None and r is not None
    batch_first = attrs.layout == 1
    if batch_first:
        x = x.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    x = np.ascontiguousarray(x, np.float32)
    seq, batch, width = x.shape
    directions = num_directions(attrs.direction)
    hidden = r.shape[2]
    rows = 4 * hidden
    lengths = _lengths(sequence_lens, seq, batch)
    # With lengths, Y past each element's length stays zero: start from zeros.
    y = device.empty((seq, directions, batch, hidden)) if lengths is None else device.zeros(
        (seq, directions, batch, hidden)
    )
    lengths_buf = device.to_device(np.zeros(1, np.int32) if lengths is None else lengths)
    finals_h, finals_c = [], []
    cell = device.kernel("lstm_cell", SOURCE)
    x_rows = x.reshape(1, seq * batch, width)
    for d in range(directions):
        # Input projection for every step: [seq * batch, input] @ W^T + (Wb + Rb).
        in_config = device.gemm_config(seq * batch, rows, width, 1)
        in_layout = GemmLayout.of(in_config, seq * batch, rows, width)
        w_panels = _transposed_panels(device, w, d, in_config, in_layout)
        bias = None if b is None else matrix_bias(device, (b[d, :rows] + b[d, rows:]).astype(np.float32))
        x_panels = device.to_device(pack_a(x_rows, in_layout))
        projection = launch_packed(device, in_config, in_layout, 1, x_panels, w_panels, bias=bias)
        projection.enqueue()
        # The recurrence: gates = H @ R^T, then the cell.
        config = device.gemm_config(batch, rows, hidden, 1)
        layout = GemmLayout.of(config, batch, rows, hidden)
        r_panels = _transposed_panels(device, r, d, config, layout)
        h0 = np.zeros((batch, hidden), np.float32) if initial_h is None else initial_h[d]
        c0 = np.zeros((batch, hidden), np.float32) if initial_c is None else initial_c[d]
        h_panels = [device.to_device(pack_a(np.asarray(h0, np.float32)[None], layout)) for _ in range(2)]
        c_state = device.to_device(np.array(c0, np.float32))
        h_out = device.to_device(np.array(h0, np.float32))
        gates = device.empty((1, batch, rows))
        steps = [
            launch_packed(device, config, layout, 1, panels, r_panels, out=gates) for panels in h_panels
        ]
        if peepholes is not None:
            peep = device.to_device(np.ascontiguousarray(peepholes[d], np.float32))
        else:
            peep = h_out  # never read: has_peep is 0
        reverse = attrs.direction == "reverse" or d == 1
        for step in range(seq):
            current = step % 2
            steps[current].enqueue()
            args = (
                gates.buffer, projection.out.buffer, c_state.buffer, h_panels[current].buffer,
                h_panels[1 - current].buffer, *i32(layout.a_width, layout.kp),
                y.buffer, h_out.buffer, peep.buffer, np.int32(peepholes is not None),
                np.int32(hidden), np.int32(attrs.clip is not None),
                np.float32(attrs.clip if attrs.clip is not None else 0.0), np.int32(attrs.input_forget),
                lengths_buf.buffer, np.int32(lengths is not None),
                *i32(step, seq, batch, int(reverse), directions, d),
            )  # fmt: skip
            device.enqueue(cell, (hidden, batch), None, args)
        final_h = device.to_host(h_out).copy()
        final_c = device.to_host(c_state).copy()
        if lengths is not None:
            # NOTE: an element of length 0 runs no step; ONNX Runtime (the reference) reports zeros
            # for its final states rather than its initial ones.
            final_h[lengths == 0] = 0
            final_c[lengths == 0] = 0
        finals_h.append(final_h)
        finals_c.append(final_c)
    outputs: list[np.ndarray | None] = []
    wants = [len(node.outputs) > i and bool(node.outputs[i]) for i in range(3)]
    y_host = device.to_host(y)
    outputs.append(_layout(y_host, (2, 0, 1, 3), batch_first) if wants[0] else None)
    outputs.append(_layout(np.stack(finals_h), (1, 0, 2), batch_first) if wants[1] else None)
    outputs.append(_layout(np.stack(finals_c), (1, 0, 2), batch_first) if wants[2] else None)
    return outputs[: max(len(node.outputs), 1)]


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
    def lstm(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        """LSTM: input projection GEMM, then per step the gates GEMM and the cell kernel."""
        return run_lstm(device, node, inputs)
