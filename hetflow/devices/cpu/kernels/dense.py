"""Fully connected layers on hetflow's dense kernel (``jit_dense``), their weights packed once.

A Gemm whose B is a weight (the plan binds it as a ``WeightInfo``: the same array on every call) runs
here instead of OpenBLAS, which packs B again on every call, in two cases:

- B is small (up to ``HELD_PACKED_BYTES``) and A holds at least ``DENSE_MIN_ROWS`` rows: B is packed into
  ``jit_dense``'s panels on the first call (``PANELS``, kept per weight array) beside the raw weights.
  One image keeps the GEMV (``jit_gemm``), which reads a B that fits in cache where it lies.
- B is large (AlexNet's, ZFNet's and VGG-19's 16-411 MB layers): at every batch, one image included.
  The session packs such weights when it is made (``runtime.held_weights``) and, where they were read from the
  model file, maps the file in place of the raw array, so the panels are the only copy in memory (ONNX
  Runtime prepacks the same way). Two threads, AlexNet's 9216 -> 4096 layer with a ReLU: OpenBLAS 20.4
  ms at batch 16, 16.2 at batch 2 (it packs 151 MB per call), the GEMV 4.7 at batch 1; here 9.5, 4.2
  and 4.0 (ONNX Runtime 10.5, 4.8, 4.4).

A memory budget that cannot hold the packed copies clears ``GemmAttrs.packed_weights``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels import jit_dense
from hetflow.devices.cpu.kernels.buffers import Out
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
from hetflow.devices.cpu.kernels.jit_epilogue import activation_code
from hetflow.devices.cpu.kernels.own_gemm import zero_bias
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.spin_pool import Job, SpinPool
from hetflow.devices.cpu.threads import intra_op_threads, parallel_for, spinning
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo, WeightInfo

#: Rows of A from which a product runs here. One core, OpenBLAS -> here: 4 x 2048 x 512 652 -> 194 us,
#: 16 x 800 x 500 313 -> 129; but 2 x 800 x 500 25 -> 46 (OpenBLAS multiplies so few rows without
#: packing B).
DENSE_MIN_ROWS = 4
#: Weights (bytes of B) past which a layer holds only its packed copy and runs here at any batch
#: (``runtime.held_weights``); up to it, the packed copy is memory beside the raw weights, from ``DENSE_MIN_ROWS``.
HELD_PACKED_BYTES = 8 << 20
#: Multiply-adds from which a product is shared out over the run's threads on the Python pool. Its
#: worker sleeps between calls and takes ~50-100 us to start on the 2-core VM, so a split gains only
#: past a few hundred microseconds of work (16 x 800 x 500, 129 us on one core, took 156 split in two).
MIN_MACS_PER_SPLIT = 12_000_000
#: Weights packed into panels, per weight array and ``transB`` (``jit_dense.packed_panels``).
PANELS = WeightCache(lambda b, trans_b: jit_dense.packed_panels(b if trans_b else b.T))


def runs_dense(node: Node, inputs: Sequence[TensorInfo | None] | None) -> bool:
    """Whether the Gemm ``node`` over inputs (A, B, C) of these shapes runs on ``jit_dense``: B a weight
    (``WeightInfo``) with packing allowed (``GemmAttrs.packed_weights``), float32, 2-D, ``alpha`` 1, A not
    transposed with at least ``DENSE_MIN_ROWS`` rows or B past ``HELD_PACKED_BYTES``, C absent or a row of
    biases added once."""
    if not inputs or len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        return False
    a, b, c = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    attrs = node.attrs
    if not isinstance(b, WeightInfo) or not attrs.packed_weights or attrs.alpha != 1 or attrs.transA:
        return False
    if a.dtype != np.float32 or b.dtype != np.float32 or len(a.shape) != 2 or len(b.shape) != 2:
        return False
    if not all(isinstance(d, int) for d in (a.shape[1], *b.shape)):
        return False
    rows = a.shape[0]
    if not holds_packed(b) and not (isinstance(rows, int) and rows >= DENSE_MIN_ROWS):
        return False
    columns = b.shape[0] if attrs.transB else b.shape[1]
    return c is None or attrs.beta == 0 or _row_bias(c, columns, attrs.beta)


def holds_packed(b: TensorInfo) -> bool:
    """Whether weights of B's shape are large enough to be held only as panels (``HELD_PACKED_BYTES``)."""
    return int(np.prod(b.shape)) * b.dtype.itemsize > HELD_PACKED_BYTES


def _row_bias(c: TensorInfo, columns: int, beta: float) -> bool:
    """Whether C adds one bias per column: ``[N]`` or ``[1, N]`` float32, ``beta`` 1."""
    return beta == 1 and c.dtype == np.float32 and tuple(c.shape) in ((columns,), (1, columns))


def panel_bytes(node: Node, inputs: Sequence[TensorInfo | None] | None) -> int:
    """Bytes of the packed copy of B the node keeps once it has run (``runs_dense``), else 0."""
    if not runs_dense(node, inputs):
        return 0
    b = inputs[1]  # type: ignore[index]
    columns, depth = (b.shape[0], b.shape[1]) if node.attrs.transB else (b.shape[1], b.shape[0])
    return -(-int(columns) // jit_dense.TILE_COLUMNS) * jit_dense.TILE_COLUMNS * int(depth) * 4


class DenseCall:
    """One Gemm node bound to ``jit_dense`` (``runs_dense``): what every call shares, worked out once.

    A call whose A does not fit (not C-contiguous float32) goes to ``fallback``."""

    def __init__(self, node: Node, a: TensorInfo, b: TensorInfo, out: Out, fallback: object) -> None:
        attrs = node.attrs
        self.fallback = fallback
        self.trans_b = bool(attrs.transB)
        self.m, self.k = int(a.shape[0]), int(a.shape[1])
        self.n = int(b.shape[0] if self.trans_b else b.shape[1])
        target = out[0] if out is not None else None
        fits = target is not None and target.shape == (self.m, self.n) and target.dtype == np.float32
        self.target = target if fits and target.flags.c_contiguous else None
        self.has_bias = attrs.beta != 0
        code, alpha, beta = activation_code(attrs.fused)
        self.constants = activation_constants(code, alpha, beta)
        self.after = attrs.fused if code == 0 else None  # an activation the tiles cannot apply
        self.macs = self.m * self.n * self.k
        #: B is held only as panels (its raw array mapped from the file where it was read from one)
        self.held = holds_packed(b)

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        a = arrays[0]
        if not a.flags.c_contiguous or a.dtype != np.float32:  # type: ignore[union-attr]
            if not self.held:
                return self.fallback(arrays)  # type: ignore[operator]
            # NOTE: a held weight's raw array is a mapping of the model file, often unaligned (where
            # its raw_data lies): numpy multiplies it without BLAS. A is small: copy it instead.
            a = np.ascontiguousarray(a, np.float32)
        y, panels, bias = self._operands(arrays)
        self._multiply(a.reshape(-1), panels, y.reshape(-1), bias)  # type: ignore[union-attr]
        apply_activation(y, self.after)
        return [y]

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The product as one spin-pool job, shared out as a spinning run shares it (``BoundCall``'s
        capture); None where the call would split on the Python pool or apply an activation after."""
        a = arrays[0]
        if self.after is not None or not a.flags.c_contiguous or a.dtype != np.float32:  # type: ignore[union-attr]
            return None
        pool = spinning()
        shares = self._shares(pool)
        if shares > 1 and pool is None:
            return None
        y, panels, bias = self._operands(arrays)
        return [y], [self._job(a.reshape(-1), panels, y.reshape(-1), bias, shares)]  # type: ignore[union-attr]

    def _operands(self, arrays: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Y, B's packed panels and the bias of a call."""
        c = arrays[2] if len(arrays) > 2 and self.has_bias else None
        panels = PANELS.get(arrays[1], int(self.trans_b))  # type: ignore[arg-type]
        bias = zero_bias(self.n) if c is None else np.ascontiguousarray(c, np.float32).reshape(-1)
        y = np.empty((self.m, self.n), np.float32) if self.target is None else self.target
        return y, panels, bias

    def _shares(self, pool: SpinPool | None) -> int:
        threads = pool.workers + 1 if pool is not None else intra_op_threads()
        # A held B streams from memory whatever the rows (16 MB: ~0.45 ms on one thread), past the
        # Python pool's hand-off however few its multiply-adds.
        worth_splitting = self.macs >= MIN_MACS_PER_SPLIT or self.held or pool is not None
        return jit_dense.shares_for(self.n, threads) if worth_splitting else 1

    def _job(self, a: np.ndarray, panels: np.ndarray, y: np.ndarray, bias: np.ndarray, shares: int) -> Job:
        m, n, k = self.m, self.n, self.k
        panel, row = jit_dense.TILE_COLUMNS * k, jit_dense.TILE_COLUMNS
        return jit_dense.share_job(a, k, panels, row, panel, y, n, bias, self.constants, m, n, k, shares)

    def _multiply(self, a: np.ndarray, panels: np.ndarray, y: np.ndarray, bias: np.ndarray) -> None:
        """The product shared out on the spinning pool, the Python pool, or on this thread alone."""
        m, n, k = self.m, self.n, self.k
        panel, row = jit_dense.TILE_COLUMNS * k, jit_dense.TILE_COLUMNS
        pool = spinning()
        shares = self._shares(pool)
        if shares > 1 and pool is not None:
            self._job(a, panels, y, bias, shares).run(pool)
        elif shares > 1:

            def part(index: int) -> None:
                jit_dense.dense_share(a, k, panels, row, panel, y, n, bias, self.constants, m, n, k, index, shares)

            parallel_for(part, shares, intra_op_threads())
        else:
            jit_dense.dense_share(a, k, panels, row, panel, y, n, bias, self.constants, m, n, k, 0, 1)
