"""OpenCL Gemm and MatMul through one tiled, register-blocked kernel (``gemm.cl``).

The launcher packs ``op(A)`` transposed and ``op(B)`` into zero-padded buffers whose sizes are multiples
of the tile, so the kernel's inner loop has no bounds checks and transposes cost nothing on the device;
alpha, beta, the bias ``C`` (any shape broadcastable to ``[M, N]``) and a fused activation are applied
in the kernel's epilogue.

The knobs (``GemmConfig``) are compile-time ``-D`` definitions; ``GEMM_SPACE`` declares the values a
tuner may search.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray, aligned_empty
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = (Path(__file__).with_name("gemm.cl")).read_text(encoding="utf-8")

#: ``ACT`` codes of gemm.cl's epilogue.
ACTIVATION_CODES = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "Tanh": 5}


@dataclass(frozen=True)
class GemmConfig:
    """One point of the GEMM's parameter space (see gemm.cl for the meaning of each knob)."""

    rm: int = 4
    rn: int = 3
    vw: int = 8
    kt: int = 16
    wgm: int = 1
    wgn: int = 1
    local: int = 0

    @property
    def tile_m(self) -> int:
        return self.wgm * self.rm

    @property
    def tile_n(self) -> int:
        return self.wgn * self.rn * self.vw

    def options(self, activation: str | None = None) -> tuple[str, ...]:
        return (
            f"-DRM={self.rm}",
            f"-DRN={self.rn}",
            f"-DVW={self.vw}",
            f"-DKT={self.kt}",
            f"-DWGM={self.wgm}",
            f"-DWGN={self.wgn}",
            f"-DLOCAL={self.local}",
            f"-DACT={ACTIVATION_CODES[activation]}",
            "-cl-mad-enable",
        )


@dataclass(frozen=True)
class Knob:
    """One tunable knob: its name (a GemmConfig field) and the values worth trying."""

    name: str
    values: tuple[int, ...]


#: The GEMM's declared search space; ``gemm_configs()`` enumerates it.
GEMM_SPACE: list[Knob] = [
    Knob("rm", (1, 2, 4, 6, 8)),
    Knob("rn", (1, 2, 3, 4)),
    Knob("vw", (1, 4, 8, 16)),
    Knob("kt", (8, 16, 32)),
    Knob("wgm", (1, 2, 4, 8)),
    Knob("wgn", (1, 2, 4, 8, 16)),
    Knob("local", (0, 1)),
]

#: The configuration used when nothing is tuned: the fastest of a hand search on PoCL 3.0 (which compiles
#: for AVX2 here): 12 float8 accumulators fill the 16 ymm registers with the B and A operands; PoCL's
#: loops over the work-items of a group cost more than they gain, hence 1x1 work-groups.
DEFAULT_CONFIG = GemmConfig()


def gemm_configs(space: Sequence[Knob] = GEMM_SPACE, max_work_group: int = 256) -> list[GemmConfig]:
    """Every configuration of ``space`` whose work-group fits ``max_work_group`` work-items."""
    names = [k.name for k in space]
    configs = []
    for values in itertools.product(*(k.values for k in space)):
        config = GemmConfig(**dict(zip(names, values)))
        if config.wgm * config.wgn <= max_work_group:
            configs.append(config)
    return configs


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _pack(matrices: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``[batch, r, c]`` float32 into a zero-padded contiguous ``[batch, rows, cols]``."""
    packed = aligned_empty((matrices.shape[0], rows, cols), np.float32)
    packed[:, : matrices.shape[1], : matrices.shape[2]] = matrices
    # Only the padding is zeroed: the body is overwritten anyway.
    packed[:, matrices.shape[1] :, :] = 0
    packed[:, : matrices.shape[1], matrices.shape[2] :] = 0
    return packed


def _a_panels(a: np.ndarray, rm: int, mp: int, kp: int) -> np.ndarray:
    """``a`` ``[batch, M, K]`` as zero-padded panels ``[batch, Mp / rm, Kp, rm]`` in one copy: panel
    ``p`` holds rows ``p * rm ...`` of A, one k-slice of ``rm`` values after the other."""
    batch, m, k = a.shape
    panels = aligned_empty((batch, mp // rm, kp, rm), np.float32)
    panels[...] = 0  # NOTE: a memset; cheaper than tracking which parts the copies below leave out
    rows = panels.transpose(0, 1, 3, 2)  # [batch, Mp / rm, rm, Kp], a view
    full = m // rm
    rows[:, :full, :, :k] = a[:, : full * rm].reshape(batch, full, rm, k)
    if m % rm:
        rows[:, full, : m % rm, :k] = a[:, full * rm :]
    return panels


def _b_panels(b: np.ndarray, width: int, np_: int, kp: int) -> np.ndarray:
    """``b`` ``[batch, K, N]`` as zero-padded panels ``[batch, Np / width, Kp, width]`` in one copy."""
    batch, k, n = b.shape
    panels = aligned_empty((batch, np_ // width, kp, width), np.float32)
    panels[...] = 0
    cols = panels.transpose(0, 2, 1, 3)  # [batch, Kp, Np / width, width], a view
    full = n // width
    cols[:, :k, :full, :] = b[:, :, : full * width].reshape(batch, k, full, width)
    if n % width:
        cols[:, :k, full, : n % width] = b[:, :, full * width :]
    return panels


@dataclass
class GemmLaunch:
    """A GEMM ready to run: operands packed into device buffers, kernel arguments set.

    ``enqueue`` may be called repeatedly (benchmarks, the tuner time the kernel alone this way).
    """

    device: OpenCLDevice
    kernel: Any
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    out: DeviceArray
    args: tuple[Any, ...]
    operands: tuple[DeviceArray, ...]  # kept alive while the kernel may read them

    def enqueue(self) -> None:
        self.device.enqueue(self.kernel, self.global_size, self.local_size, self.args)

    def result(self) -> np.ndarray:
        """The ``[batch, M, N]`` result on the host (waits for the queue)."""
        return self.device.to_host(self.out)


def prepare_gemm(
    device: OpenCLDevice,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    config: GemmConfig = DEFAULT_CONFIG,
) -> GemmLaunch:
    """Pack the operands of ``act(alpha * a @ b + beta * c)`` and set the kernel's arguments.

    Args:
        a: ``[batch, M, K]`` (already transposed as the op asks), with ``batch, M, N >= 1``.
        b: ``[batch, K, N]`` or ``[1, K, N]`` (shared by every batch element).
        c: optional, broadcastable to ``[M, N]``.
        config: the kernel's knobs.
    """
    batch, m, k = a.shape
    n = b.shape[2]
    mp, np_, kp = _round_up(m, config.tile_m), _round_up(n, config.tile_n), _round_up(max(k, 1), config.kt)
    if config.local:
        at = _pack(np.swapaxes(a, 1, 2), kp, mp)
        bp = _pack(b, kp, np_)
    else:
        at = _a_panels(a, config.rm, mp, kp)
        bp = _b_panels(b, config.rn * config.vw, np_, kp)
    activation = fused.op_type if fused is not None else None
    kernel = device.kernel("gemm", SOURCE, config.options(activation))
    at_buf, b_buf = device.to_device(at), device.to_device(bp)
    out = device.empty((batch, m, n), np.float32)
    if c is not None:
        # C broadcasts to [M, N]: as a [rows, cols] matrix with rows in (1, M), cols in (1, N), read
        # through strides that are 0 along broadcast axes.
        c2 = np.asarray(c, np.float32).reshape((1,) * (2 - c.ndim) + c.shape)
        c_sm = c2.shape[1] if c2.shape[0] != 1 else 0
        c_sn = 1 if c2.shape[1] != 1 else 0
        c_buf = device.to_device(c2)
    else:
        c_sm = c_sn = 0
        c_buf = at_buf  # never read: has_c is 0
    act_a = fused.alpha if fused is not None else 0.0
    act_b = fused.beta if fused is not None else 0.0
    args = (
        np.int32(m), np.int32(n), np.int32(kp), np.int32(mp), np.int32(np_),
        at_buf.buffer, np.int64(kp * mp),
        b_buf.buffer, np.int64(kp * np_ if b.shape[0] > 1 else 0),
        out.buffer,
        c_buf.buffer, np.int32(c_sm), np.int32(c_sn), np.int32(c is not None),
        np.float32(alpha), np.float32(beta), np.float32(act_a), np.float32(act_b),
    )  # fmt: skip
    global_size = (np_ // (config.rn * config.vw), mp // config.rm, batch)
    local_size = (config.wgn, config.wgm, 1)
    return GemmLaunch(device, kernel, global_size, local_size, out, args, (at_buf, b_buf, c_buf))


def run_gemm(
    device: OpenCLDevice,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    config: GemmConfig = DEFAULT_CONFIG,
) -> np.ndarray:
    """``act(alpha * a @ b + beta * c)`` on the device for stacks of matrices: ``[batch, M, N]`` float32
    (see ``prepare_gemm`` for the arguments)."""
    batch, m, _ = a.shape
    n = b.shape[2]
    if batch == 0 or m == 0 or n == 0:
        return np.zeros((batch, m, n), np.float32)
    launch = prepare_gemm(device, a, b, c, alpha=alpha, beta=beta, fused=fused, config=config)
    launch.enqueue()
    return launch.result()


def _float32_only(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None:
        return None
    for info in inputs:
        if info is not None and info.dtype != np.float32:
            return f"OpenCL {node.op_type} runs float32 only, got {info.dtype}"
    return None


def register(device: OpenCLDevice) -> None:
    """Add Gemm and MatMul to ``device``'s kernel table."""

    @device.kernels.register("Gemm", supports=_float32_only)
    def gemm(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Gemm: transposes by packing, alpha/beta/C/fused activation in the kernel's epilogue."""
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        assert a is not None and b is not None
        attrs = node.attrs
        a2 = a.T if attrs.transA else a
        b2 = b.T if attrs.transB else b
        use_c = c is not None and attrs.beta != 0
        y = run_gemm(
            device, a2[None], b2[None], c if use_c else None,
            alpha=attrs.alpha, beta=attrs.beta, fused=attrs.fused,
        )  # fmt: skip
        return [y[0]]

    @device.kernels.register("MatMul", supports=_float32_only)
    def matmul(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """numpy ``matmul`` semantics: 1-D operands, broadcast batch dimensions."""
        a, b = inputs
        assert a is not None and b is not None
        a2 = a[None] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
        if b2.ndim == 2:
            # A stack of matrices times one matrix is one tall GEMM.
            rows = a2.reshape(1, -1, k)
            y = run_gemm(device, rows, b2[None]).reshape(*batch_shape, m, n)
        else:
            a3 = np.broadcast_to(a2, (*batch_shape, m, k)).reshape(-1, m, k)
            b3 = np.broadcast_to(b2, (*batch_shape, k, n)).reshape(-1, k, n)
            y = run_gemm(device, a3, b3).reshape(*batch_shape, m, n)
        if a.ndim == 1:
            y = y[..., 0, :]
        if b.ndim == 1:
            y = y[..., 0]
        return [np.ascontiguousarray(y)]
