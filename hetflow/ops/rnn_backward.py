"""Backpropagation through time for LSTM, GRU and RNN (the backward rules ``hetflow.ops.rnn`` declares).

Each rule recomputes its direction's forward pass keeping the gate activations (the forward kernel
keeps none), then walks the steps back: one recurrent GEMM per step for dh, and after the loop one GEMM
each for dW, dX and the input-side biases over every step at once. Both directions, both layouts,
``B``, ``initial_h``/``initial_c`` and LSTM peepholes are differentiated. Not covered (the rule raises
NotImplementedError with the reason): non-default activations, ``clip``, LSTM's ``input_forget``, and
``sequence_lens`` shorter than the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hetflow.graph import Node
from hetflow.ops.base import Grads, wants

X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, P = range(8)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # never overflows


def _check_supported(
    node: Node, x_time_major: np.ndarray, inputs: Sequence[np.ndarray | None], gates: int
) -> None:
    attrs = node.attrs
    defaults = {4: ("sigmoid", "tanh", "tanh"), 3: ("sigmoid", "tanh"), 1: ("tanh",)}[gates]
    names = tuple(a.lower() for a in attrs.activations)
    if names and names not in (defaults, defaults * 2):
        raise NotImplementedError(
            f"{node.op_type} '{node.name}': backward supports the default activations only"
        )
    if attrs.clip is not None:
        raise NotImplementedError(f"{node.op_type} '{node.name}': backward does not support clip")
    if getattr(attrs, "input_forget", 0):
        raise NotImplementedError(f"LSTM '{node.name}': backward does not support input_forget=1")
    lens = inputs[SEQUENCE_LENS] if len(inputs) > SEQUENCE_LENS else None
    if lens is not None and np.any(np.asarray(lens) != x_time_major.shape[0]):
        raise NotImplementedError(f"{node.op_type} '{node.name}': backward needs full-length sequences")


def _get(inputs: Sequence[np.ndarray | None], index: int) -> np.ndarray | None:
    return inputs[index] if index < len(inputs) else None


def _time_major(node: Node, array: np.ndarray | None, kind: str) -> np.ndarray | None:
    """Layout 1 arrays in layout 0: X/Y batch-first -> time-major, states batch-first -> direction-first."""
    if array is None or node.attrs.layout == 0:
        return array
    if kind == "x":
        return array.transpose(1, 0, 2)
    if kind == "y":
        return array.transpose(1, 2, 0, 3)
    return array.transpose(1, 0, 2)


def _back_to_layout(node: Node, array: np.ndarray | None, kind: str) -> np.ndarray | None:
    if array is None or node.attrs.layout == 0:
        return array
    if kind == "x":
        return np.ascontiguousarray(array.transpose(1, 0, 2))
    return np.ascontiguousarray(array.transpose(1, 0, 2))


def recurrent_backward(
    node: Node,
    inputs: Sequence[np.ndarray | None],
    grad_outputs: Sequence[np.ndarray | None],
    wanted: Sequence[bool] | None,
    gates: int,
) -> Grads:
    """Gradients of every differentiable input of an LSTM (``gates=4``), GRU (3) or RNN (1) node."""
    x = _time_major(node, inputs[X], "x")
    w, r = inputs[W], inputs[R]
    assert x is not None and w is not None and r is not None
    _check_supported(node, x, inputs, gates)
    steps, batch, _ = x.shape
    directions, _, hidden = r.shape
    dtype = x.dtype
    bias = _get(inputs, B)
    initial_h = _time_major(node, _get(inputs, INITIAL_H), "state")
    initial_c = _time_major(node, _get(inputs, INITIAL_C), "state") if gates == 4 else None
    peepholes = _get(inputs, P) if gates == 4 else None
    dy = _time_major(node, grad_outputs[0] if grad_outputs else None, "y")
    dy_h = _time_major(node, grad_outputs[1] if len(grad_outputs) > 1 else None, "state")
    dy_c = _time_major(node, grad_outputs[2] if len(grad_outputs) > 2 and gates == 4 else None, "state")

    grads: Grads = [None] * len(inputs)
    dx = np.zeros_like(x)
    dw, dr = np.zeros_like(w), np.zeros_like(r)
    db = np.zeros((directions, 2 * gates * hidden), dtype)
    dh0 = np.zeros((directions, batch, hidden), dtype)
    dc0 = np.zeros((directions, batch, hidden), dtype)
    dp = np.zeros((directions, 3 * hidden), dtype)
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[node.attrs.direction]
    for d, backwards in enumerate(reverse):
        order = np.arange(steps)[::-1] if backwards else np.arange(steps)
        xs = x[order]
        h0 = initial_h[d] if initial_h is not None else np.zeros((batch, hidden), dtype)
        wb = bias[d, : gates * hidden] if bias is not None else np.zeros(gates * hidden, dtype)
        rb = bias[d, gates * hidden :] if bias is not None else np.zeros(gates * hidden, dtype)
        dys = dy[order, d] if dy is not None else None
        if gates == 4:
            c0 = initial_c[d] if initial_c is not None else np.zeros((batch, hidden), dtype)
            peep = peepholes[d] if peepholes is not None else None
            result = _lstm_direction(
                xs,
                w[d],
                r[d],
                wb + rb,
                h0,
                c0,
                peep,
                dys,
                None if dy_h is None else dy_h[d],
                None if dy_c is None else dy_c[d],
            )
            dxw, dr[d], dh0[d], dc0[d], dpeep = result
            if dpeep is not None:
                dp[d] = dpeep
            db[d, : gates * hidden] = db[d, gates * hidden :] = dxw.sum(axis=(0, 1))
        elif gates == 1:
            dxw, dr[d], dh0[d] = _rnn_direction(
                xs, w[d], r[d], wb + rb, h0, dys, None if dy_h is None else dy_h[d]
            )
            db[d, :hidden] = db[d, hidden:] = dxw.sum(axis=(0, 1))
        else:
            dxw, dr[d], dh0[d], drb_h = _gru_direction(
                xs,
                w[d],
                r[d],
                wb,
                rb,
                h0,
                bool(node.attrs.linear_before_reset),
                dys,
                None if dy_h is None else dy_h[d],
            )
            # Wb of every gate and Rb_z, Rb_r add to the input projection; Rb_h has its own path.
            db[d, : gates * hidden] = dxw.sum(axis=(0, 1))
            db[d, gates * hidden : gates * hidden + 2 * hidden] = db[d, : 2 * hidden]
            db[d, gates * hidden + 2 * hidden :] = drb_h
        flat = dxw.reshape(steps * batch, gates * hidden)
        dw[d] = flat.T @ xs.reshape(steps * batch, -1)
        dx[order] += (flat @ w[d]).reshape(steps, batch, -1)
    if wants(wanted, X):
        grads[X] = _back_to_layout(node, dx, "x")
    if wants(wanted, W):
        grads[W] = dw
    if wants(wanted, R):
        grads[R] = dr
    if bias is not None and wants(wanted, B):
        grads[B] = db
    if initial_h is not None and wants(wanted, INITIAL_H):
        grads[INITIAL_H] = _back_to_layout(node, dh0, "state")
    if initial_c is not None and wants(wanted, INITIAL_C):
        grads[INITIAL_C] = _back_to_layout(node, dc0, "state")
    if peepholes is not None and wants(wanted, P):
        grads[P] = dp
    return grads


def _lstm_direction(
    xs: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    bias: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray,
    peep: np.ndarray | None,
    dys: np.ndarray | None,
    dh_last: np.ndarray | None,
    dc_last: np.ndarray | None,
) -> tuple[Any, ...]:
    """One direction, steps in processing order. Returns (d pre-activations [T, B, 4H], dR, dh0, dc0, dP)."""
    steps, batch, _ = xs.shape
    n = r.shape[1]
    projected = xs @ w.T + bias
    p_i, p_o, p_f = (peep[:n], peep[n : 2 * n], peep[2 * n :]) if peep is not None else (0.0, 0.0, 0.0)
    hs, cs, saved = [h0], [c0], []
    for t in range(steps):
        h, c = hs[-1], cs[-1]
        pre = projected[t] + h @ r.T
        i = _sigmoid(pre[:, :n] + p_i * c)
        f = _sigmoid(pre[:, 2 * n : 3 * n] + p_f * c)
        g = np.tanh(pre[:, 3 * n :])
        c_next = f * c + i * g
        o = _sigmoid(pre[:, n : 2 * n] + p_o * c_next)
        tc = np.tanh(c_next)
        hs.append(o * tc)
        cs.append(c_next)
        saved.append((i, o, f, g, tc))
    dpre = np.zeros((steps, batch, 4 * n), xs.dtype)
    dr = np.zeros_like(r)
    dpeep = np.zeros(3 * n, xs.dtype) if peep is not None else None
    dh = np.zeros_like(h0) if dh_last is None else dh_last.copy()
    dc = np.zeros_like(c0) if dc_last is None else dc_last.copy()
    for t in range(steps - 1, -1, -1):
        i, o, f, g, tc = saved[t]
        c_prev, c_next, h_prev = cs[t], cs[t + 1], hs[t]
        if dys is not None:
            dh = dh + dys[t]
        d_o = dh * tc * o * (1 - o)
        dc = dc + dh * o * (1 - tc * tc) + d_o * p_o
        d_i = dc * g * i * (1 - i)
        d_f = dc * c_prev * f * (1 - f)
        d_g = dc * i * (1 - g * g)
        step = dpre[t]
        step[:, :n], step[:, n : 2 * n], step[:, 2 * n : 3 * n], step[:, 3 * n :] = d_i, d_o, d_f, d_g
        dr += step.T @ h_prev
        if dpeep is not None:
            dpeep[:n] += (d_i * c_prev).sum(axis=0)
            dpeep[n : 2 * n] += (d_o * c_next).sum(axis=0)
            dpeep[2 * n :] += (d_f * c_prev).sum(axis=0)
        dh = step @ r
        dc = dc * f + d_i * p_i + d_f * p_f
    return dpre, dr, dh, dc, dpeep


def _gru_direction(
    xs: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    wb: np.ndarray,
    rb: np.ndarray,
    h0: np.ndarray,
    linear_before_reset: bool,
    dys: np.ndarray | None,
    dh_last: np.ndarray | None,
) -> tuple[Any, ...]:
    """One direction, steps in processing order. Returns (d input-side pre-activations [T, B, 3H], dR,
    dh0, dRb_h)."""
    steps, batch, _ = xs.shape
    n = r.shape[1]
    projected = xs @ w.T + wb
    projected[..., : 2 * n] += rb[: 2 * n]
    r_zr, r_h, rb_h = r[: 2 * n], r[2 * n :], rb[2 * n :]
    hs, saved = [h0], []
    for t in range(steps):
        h = hs[-1]
        zr = _sigmoid(projected[t, :, : 2 * n] + h @ r_zr.T)
        z, reset = zr[:, :n], zr[:, n:]
        if linear_before_reset:
            linear = h @ r_h.T + rb_h
            candidate = np.tanh(projected[t, :, 2 * n :] + reset * linear)
        else:
            linear = reset * h
            candidate = np.tanh(projected[t, :, 2 * n :] + linear @ r_h.T + rb_h)
        hs.append((1 - z) * candidate + z * h)
        saved.append((z, reset, candidate, linear))
    dpre = np.zeros((steps, batch, 3 * n), xs.dtype)
    dr = np.zeros_like(r)
    drb_h = np.zeros(n, xs.dtype)
    dh = np.zeros_like(h0) if dh_last is None else dh_last.copy()
    for t in range(steps - 1, -1, -1):
        z, reset, candidate, linear = saved[t]
        h_prev = hs[t]
        if dys is not None:
            dh = dh + dys[t]
        d_cand = dh * (1 - z) * (1 - candidate * candidate)
        d_z = dh * (h_prev - candidate) * z * (1 - z)
        dh_prev = dh * z
        if linear_before_reset:
            d_reset = d_cand * linear
            d_linear = d_cand * reset
            dr[2 * n :] += d_linear.T @ h_prev
            drb_h += d_linear.sum(axis=0)
            dh_prev += d_linear @ r_h
        else:
            d_a = d_cand @ r_h
            dr[2 * n :] += d_cand.T @ linear
            drb_h += d_cand.sum(axis=0)
            d_reset = d_a * h_prev
            dh_prev += d_a * reset
        d_reset = d_reset * reset * (1 - reset)
        step = dpre[t]
        step[:, :n], step[:, n : 2 * n], step[:, 2 * n :] = d_z, d_reset, d_cand
        dr[: 2 * n] += step[:, : 2 * n].T @ h_prev
        dh = dh_prev + step[:, : 2 * n] @ r_zr
    return dpre, dr, dh, drb_h


def _rnn_direction(
    xs: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    bias: np.ndarray,
    h0: np.ndarray,
    dys: np.ndarray | None,
    dh_last: np.ndarray | None,
) -> tuple[Any, ...]:
    """One direction of ``h' = tanh(x W^T + h R^T + Wb + Rb)``, steps in processing order. Returns
    (d pre-activations [T, B, H], dR, dh0)."""
    steps = xs.shape[0]
    projected = xs @ w.T + bias
    hs = [h0]
    for t in range(steps):
        hs.append(np.tanh(projected[t] + hs[-1] @ r.T))
    dpre = np.zeros_like(projected)
    dr = np.zeros_like(r)
    dh = np.zeros_like(h0) if dh_last is None else dh_last.copy()
    for t in range(steps - 1, -1, -1):
        if dys is not None:
            dh = dh + dys[t]
        dpre[t] = dh * (1 - hs[t + 1] * hs[t + 1])
        dr += dpre[t].T @ hs[t]
        dh = dpre[t] @ r
    return dpre, dr, dh
