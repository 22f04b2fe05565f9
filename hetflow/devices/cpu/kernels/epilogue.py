"""The epilogue every producing kernel (Conv, Gemm) ends with: bias, then the fused activation.

One function so that every convolution algorithm and the GEMM finish their outputs the same way, in
place, without another pass over memory for the activation when it can be folded into the bias add.
"""

from __future__ import annotations

import numpy as np

from hetflow.devices.cpu.kernels.jit_epilogue import finish_planes
from hetflow.ops.activation import FusedActivation


def add_channel_bias(y: np.ndarray, bias: np.ndarray | None) -> None:
    """``y[:, c, ...] += bias[c]`` in place, for NC... layouts."""
    if bias is None:
        return
    # NOTE: copy=False: y may be a slice of a Concat's output, and a reshaped copy would lose the add.
    shape = (y.shape[0], y.shape[1], -1)
    flat = y.reshape(shape) if y.flags.c_contiguous else np.reshape(y, shape, copy=False)
    flat += bias.astype(y.dtype, copy=False)[:, None]


def apply_activation(y: np.ndarray, fused: FusedActivation | None) -> None:
    """Apply a fused activation to ``y`` in place."""
    if fused is None:
        return
    kind = fused.op_type
    # NOTE: np.clip measures about twice as fast as an in-place np.maximum for Relu (numpy 2.4,
    # float32); both keep NaN.
    if kind == "Relu":
        np.clip(y, 0, np.inf, out=y)
    elif kind == "Clip":
        np.clip(y, fused.alpha, fused.beta, out=y)
    elif kind == "LeakyRelu":
        # Only the negative elements are scaled; the mask is the only temporary (1 byte per element).
        np.multiply(y, y.dtype.type(fused.alpha), out=y, where=y < 0)
    elif kind == "Sigmoid":
        # 0.5 * (1 + tanh(x / 2)) is sigmoid without overflow for large |x|.
        np.multiply(y, 0.5, out=y)
        np.tanh(y, out=y)
        np.add(y, 1, out=y)
        np.multiply(y, 0.5, out=y)
    elif kind == "Tanh":
        np.tanh(y, out=y)
    else:
        raise ValueError(f"activation {kind} cannot be fused")


def finish_channels(y: np.ndarray, bias: np.ndarray | None, fused: FusedActivation | None) -> None:
    """Bias per channel, then the fused activation, in place (Conv's epilogue): one compiled pass where
    it can (``jit_epilogue.finish_planes``), else numpy's two."""
    if finish_planes(y, bias, fused):
        return
    add_channel_bias(y, bias)
    apply_activation(y, fused)
