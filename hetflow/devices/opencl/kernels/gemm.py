"""OpenCL Gemm and MatMul through one tiled, register-blocked kernel (``gemm.cl``).

The launcher packs ``op(A)`` transposed and ``op(B)`` into zero-padded buffers whose sizes are multiples
of the tile, so the kernel's inner loop has no bounds checks and transposes cost nothing on the device;
alpha, beta, the bias ``C`` (any shape broadcastable to ``[M, N]``) and a fused activation are applied
in the kernel's epilogue.

The knobs (``GemmConfig``) are compile-time ``-D`` definitions; ``GEMM_SPACE`` declares the values a
tuner may search.

Operands on the host are packed by numpy and uploaded (weights once, through the resident cache);
operands already on the device (``DeviceArray``: activations from the previous node) are packed by
``pack.cl`` on the device, so a chain of OpenCL nodes never brings them back. Results come back as the
operands came (``common.result``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray, aligned_empty
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    any_on_device,
    device_inputs,
    on_host,
    result,
    source,
)
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("epilogue.cl", "gemm.cl")
PACK_SOURCE = source("pack.cl")

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
    mb: int = 0
    kc: int = 256

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
            f"-DMB={self.mb if not self.local else 0}",
            f"-DKC={self.kc}",
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
    Knob("wgm", (1, 2, 4, 8, 16)),
    Knob("wgn", (1, 2, 4, 8, 16)),
    Knob("local", (0, 1)),
    Knob("mb", (0, 4, 16, 64)),
    Knob("kc", (128, 256, 512)),
]

#: The configuration used on a CPU device when nothing is tuned: the fastest of a hand search on PoCL 3.0
#: (which compiles for AVX2 here): 12 float8 accumulators fill the 16 ymm registers with the B and A
#: operands; PoCL's loops over the work-items of a group cost more than they gain, hence 1x1 work-groups.
DEFAULT_CONFIG = GemmConfig()

#: The configuration used on a GPU (any device that is not a CPU) when nothing is tuned: 8x8 work-groups
#: sharing 32x64 tiles of A and B through local memory. On an H100 (NVIDIA's OpenCL 3.0, driver 580)
#: the CPU default's one-item work-groups ran at 0.9 TFLOP/s at 2048 and this at 14 TFLOP/s; GoogLeNet's
#: products at batch 16 took 54 of the run's 58 ms of kernel time with the CPU default.
GPU_DEFAULT_CONFIG = GemmConfig(rm=4, rn=1, vw=8, kt=16, wgm=8, wgn=8, local=1)

#: Smaller tiles for products too small to give every compute unit a work-group of 32x64 tiles (a
#: GoogLeNet 1x1 layer at batch 1, 384 x 36: 12 groups for an H100's 132 units), largest first.
GPU_SMALL_CONFIGS = (
    GemmConfig(rm=2, rn=1, vw=4, kt=16, wgm=8, wgn=8, local=1),  # 16 x 32 tiles
    GemmConfig(rm=1, rn=1, vw=4, kt=16, wgm=8, wgn=8, local=1),  # 8 x 32 tiles
)


def default_config(device: OpenCLDevice, m: int, n: int, batch: int = 1) -> GemmConfig:
    """The untuned configuration for an ``M x N`` product (``batch`` of them) on ``device``.

    ``DEFAULT_CONFIG`` on a CPU. On a GPU (any other device type; its cores idle in one-item
    work-groups) ``GPU_DEFAULT_CONFIG``, or, where its tiles would leave compute units without a
    work-group, the largest of ``GPU_SMALL_CONFIGS`` that gives each one, else the smallest.
    """
    if device.is_cpu:
        return DEFAULT_CONFIG
    units = device.compute_units
    ladder = (GPU_DEFAULT_CONFIG, *GPU_SMALL_CONFIGS)
    for config in ladder:
        groups = -(-m // config.tile_m) * -(-n // config.tile_n) * batch
        if groups >= units:
            return config
    return ladder[-1]


def gemm_configs(space: Sequence[Knob] = GEMM_SPACE, max_work_group: int = 256) -> list[GemmConfig]:
    """Every distinct, valid configuration of ``space`` whose work-group fits ``max_work_group``
    work-items: MB and KC only apply without local memory, KC only with MB > 0, and the MB walk
    needs one-row work-groups (its row items are not a multiple of WGM)."""
    names = [k.name for k in space]
    configs = []
    for values in itertools.product(*(k.values for k in space)):
        config = GemmConfig(**dict(zip(names, values)))
        if config.wgm * config.wgn > max_work_group:
            continue
        if (config.local or not config.mb) and (config.mb, config.kc) != (0, GemmConfig.kc):
            continue
        if config.mb and config.wgm != 1:
            continue
        configs.append(config)
    return configs


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class GemmLayout:
    """Padded sizes and panel widths of one ``M x K @ K x N`` product under one configuration.

    A is packed as ``[Mp / a_width][Kp][a_width]`` and B as ``[Np / b_width][Kp][b_width]`` (see gemm.cl):
    one work-item's rows / columns per panel without local memory, one panel each with it.
    """

    m: int
    n: int
    k: int
    mp: int
    np_: int
    kp: int
    a_width: int
    b_width: int

    @classmethod
    @functools.lru_cache(maxsize=1024)  # every run asks once per product (host time on a GPU)
    def of(cls, config: GemmConfig, m: int, n: int, k: int) -> GemmLayout:
        mp, np_ = _round_up(max(m, 1), config.tile_m), _round_up(max(n, 1), config.tile_n)
        kp = _round_up(max(k, 1), config.kt)
        if config.local:
            return cls(m, n, k, mp, np_, kp, mp, np_)
        return cls(m, n, k, mp, np_, kp, config.rm, config.rn * config.vw)

    @property
    def a_elements(self) -> int:
        """Floats of one packed A matrix."""
        return self.mp * self.kp

    @property
    def b_elements(self) -> int:
        """Floats of one packed B matrix."""
        return self.np_ * self.kp


def pack_a(a: np.ndarray, layout: GemmLayout) -> np.ndarray:
    """``a`` ``[batch, M, K]`` as zero-padded panels ``[batch, Mp / w, Kp, w]`` in one copy: panel ``p``
    holds rows ``p * w ...`` of A, one k-slice of ``w`` values after the other."""
    batch, m, k = a.shape
    width, mp, kp = layout.a_width, layout.mp, layout.kp
    panels = aligned_empty((batch, mp // width, kp, width), np.float32)
    panels[...] = 0  # NOTE: a memset; cheaper than tracking which parts the copies below leave out
    rows = panels.transpose(0, 1, 3, 2)  # [batch, Mp / w, w, Kp], a view
    full = m // width
    rows[:, :full, :, :k] = a[:, : full * width].reshape(batch, full, width, k)
    if m % width:
        rows[:, full, : m % width, :k] = a[:, full * width :]
    return panels


def pack_b(b: np.ndarray, layout: GemmLayout) -> np.ndarray:
    """``b`` ``[batch, K, N]`` as zero-padded panels ``[batch, Np / w, Kp, w]`` in one copy."""
    batch, k, n = b.shape
    width, np_, kp = layout.b_width, layout.np_, layout.kp
    panels = aligned_empty((batch, np_ // width, kp, width), np.float32)
    panels[...] = 0
    cols = panels.transpose(0, 2, 1, 3)  # [batch, Kp, Np / w, w], a view
    full = n // width
    cols[:, :k, :full, :] = b[:, :, : full * width].reshape(batch, k, full, width)
    if n % width:
        cols[:, :k, full, : n % width] = b[:, :, full * width :]
    return panels


@dataclass(frozen=True)
class Strides:
    """Where element ``(i, kk)`` of matrix ``z`` lies in a contiguous source: ``z * batch + i * row +
    kk * depth`` (in elements)."""

    batch: int
    row: int
    depth: int


def pack_on_device(
    device: OpenCLDevice, src: DeviceArray, layout: GemmLayout, side: str, batch: int, strides: Strides
) -> DeviceArray:
    """Pack ``batch`` matrices of the device buffer ``src`` as the GEMM's ``side`` (``"a"``: rows = M,
    ``"b"``: rows = N) operand, on the device (pack.cl). The panels come from the device's pool; the
    caller releases them once the GEMM is queued."""
    rows, width, padded = (
        (layout.m, layout.a_width, layout.mp) if side == "a" else (layout.n, layout.b_width, layout.np_)
    )
    per_matrix = padded // width
    panels = device.empty((batch * per_matrix * layout.kp * width,))
    kernel = device.kernel("pack_panels", PACK_SOURCE)
    args = (
        src.buffer, panels.buffer, np.int32(rows), np.int32(layout.k),
        np.int64(strides.batch), np.int64(strides.row), np.int64(strides.depth),
        np.int32(width), np.int32(layout.kp), np.int32(per_matrix),
    )  # fmt: skip
    device.enqueue(kernel, (layout.kp * width, per_matrix, batch), None, args)
    return panels


def a_panels(
    device: OpenCLDevice, a: Tensor, layout: GemmLayout, trans_a: bool = False
) -> tuple[DeviceArray, bool]:
    """A ``[batch, M, K]`` (``[batch, K, M]`` with ``trans_a``) packed on the device, and whether the
    panels are scratch the caller releases (True) or an upload parked until the queue is waited on."""
    batch = a.shape[0]
    if isinstance(a, DeviceArray):
        m, k = layout.m, layout.k
        strides = Strides(m * k, 1, m) if trans_a else Strides(m * k, k, 1)
        return pack_on_device(device, a, layout, "a", batch, strides), True
    host = np.asarray(a, np.float32)
    panels = device.to_device(pack_a(host.transpose(0, 2, 1) if trans_a else host, layout))
    device.park(panels)
    return panels, False


def b_panels(
    device: OpenCLDevice, b: Tensor, layout: GemmLayout, trans_b: bool = False
) -> tuple[DeviceArray, bool]:
    """B ``[batch, K, N]`` (``[batch, N, K]`` with ``trans_b``) packed on the device; see ``a_panels``."""
    batch = b.shape[0]
    if isinstance(b, DeviceArray):
        n, k = layout.n, layout.k
        strides = Strides(n * k, k, 1) if trans_b else Strides(n * k, 1, n)
        return pack_on_device(device, b, layout, "b", batch, strides), True
    host = np.asarray(b, np.float32)
    panels = device.to_device(pack_b(host.transpose(0, 2, 1) if trans_b else host, layout))
    device.park(panels)
    return panels, False


@dataclass(frozen=True)
class Bias:
    """The epilogue's ``C`` on the device: element ``(i, j)`` of matrix ``z`` is
    ``C[(z % mod) * batch_stride + i * sm + j * sn]``."""

    buffer: DeviceArray
    sm: int
    sn: int
    batch_stride: int = 0
    mod: int = 1


@dataclass
class GemmLaunch:
    """A GEMM ready to run: operands in device buffers, kernel arguments set.

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


def launch_packed(
    device: OpenCLDevice,
    config: GemmConfig,
    layout: GemmLayout,
    batch: int,
    a_panels: DeviceArray,
    b_panels: DeviceArray,
    *,
    a_mod: int = 1,
    b_mod: int = 1,
    bias: Bias | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    out: DeviceArray | None = None,
) -> GemmLaunch:
    """A launch of ``batch`` products on operands already packed on the device (``pack_a``/``pack_b``
    layouts, or written in them by another kernel); matrix ``z`` reads A set ``z % a_mod`` and B set
    ``z % b_mod``. The result ``[batch, M, N]`` goes to ``out`` (allocated when None)."""
    activation = fused.op_type if fused is not None else None
    kernel = device.kernel("gemm", SOURCE, config.options(activation))
    if out is None:
        out = device.empty((batch, layout.m, layout.n), np.float32)
    c_buf = bias.buffer if bias is not None else a_panels  # never read without a bias: has_c is 0
    act_a = fused.alpha if fused is not None else 0.0
    act_b = fused.beta if fused is not None else 0.0
    args = (
        np.int32(layout.m), np.int32(layout.n), np.int32(layout.kp), np.int32(layout.mp),
        np.int32(layout.np_),
        a_panels.buffer, np.int64(layout.a_elements), np.int32(a_mod),
        b_panels.buffer, np.int64(layout.b_elements), np.int32(b_mod),
        out.buffer,
        c_buf.buffer, np.int32(bias.sm if bias else 0), np.int32(bias.sn if bias else 0),
        np.int64(bias.batch_stride if bias else 0), np.int32(bias.mod if bias else 1),
        np.int32(bias is not None),
        np.float32(alpha), np.float32(beta), np.float32(act_a), np.float32(act_b),
    )  # fmt: skip
    row_items = layout.mp // config.rm
    if config.mb and not config.local:
        row_items = -(-row_items // config.mb)
    global_size = (layout.np_ // (config.rn * config.vw), row_items, batch)
    local_size = (config.wgn, config.wgm, 1)
    operands = (a_panels, b_panels) + ((bias.buffer,) if bias else ())
    return GemmLaunch(device, kernel, global_size, local_size, out, args, operands)


def matrix_bias(device: OpenCLDevice, c: Tensor) -> Bias:
    """``c`` broadcastable to ``[M, N]`` as an epilogue bias: a ``[rows, cols]`` matrix with rows in
    (1, M) and cols in (1, N), read through strides that are 0 along broadcast axes."""
    shape = (1,) * (2 - c.ndim) + tuple(c.shape)
    c_sm = shape[1] if shape[0] != 1 else 0
    c_sn = 1 if shape[1] != 1 else 0
    if isinstance(c, DeviceArray):
        return Bias(c.reshape(shape), c_sm, c_sn)
    # A private copy: wrapping ``c`` itself would tie a resident entry to the array it is keyed by.
    c2 = np.array(c, np.float32).reshape(shape)
    return Bias(device.to_device(c2), c_sm, c_sn)


def prepare_gemm(
    device: OpenCLDevice,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    config: GemmConfig | None = None,
) -> GemmLaunch:
    """Pack the operands of ``act(alpha * a @ b + beta * c)`` and set the kernel's arguments.

    Args:
        a: ``[batch, M, K]`` (already transposed as the op asks), with ``batch, M, N >= 1``.
        b: ``[batch, K, N]`` or ``[1, K, N]`` (shared by every batch element).
        c: optional, broadcastable to ``[M, N]``.
        config: the kernel's knobs; None: the device's choice for this shape (tuned, else default).
    """
    batch, m, k = a.shape
    n = b.shape[2]
    if config is None:
        config = device.gemm_config(m, n, k, batch)
    layout = GemmLayout.of(config, m, n, k)
    a_buf = device.to_device(pack_a(np.asarray(a, np.float32), layout))
    b_buf = device.to_device(pack_b(np.asarray(b, np.float32), layout))
    bias = matrix_bias(device, c) if c is not None else None
    return launch_packed(
        device, config, layout, batch, a_buf, b_buf, a_mod=batch, b_mod=b.shape[0], bias=bias,
        alpha=alpha, beta=beta, fused=fused,
    )  # fmt: skip


def run_gemm(
    device: OpenCLDevice,
    a: Tensor,
    b: Tensor,
    c: Tensor | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    config: GemmConfig | None = None,
) -> Tensor:
    """``act(alpha * a @ b + beta * c)`` on the device for stacks of matrices: ``[batch, M, N]`` float32
    (see ``prepare_gemm`` for the arguments). ``a`` and ``b`` may be device buffers (then so is the
    result, and nothing crosses to the host); ``a``'s batch may be 1 (shared) as ``b``'s may."""
    batch = max(a.shape[0], b.shape[0])
    m, n = a.shape[1], b.shape[2]
    if batch == 0 or m == 0 or n == 0:
        return np.zeros((batch, m, n), np.float32)
    if not any_on_device(a, b, c):
        launch = prepare_gemm(device, a, b, c, alpha=alpha, beta=beta, fused=fused, config=config)  # type: ignore[arg-type]
        launch.enqueue()
        return launch.result()
    k = a.shape[2]
    config = config or device.gemm_config(m, n, k, batch)
    layout = GemmLayout.of(config, m, n, k)
    a_buf, a_scratch = a_panels(device, a, layout)
    b_buf, b_scratch = b_panels(device, b, layout)
    bias = matrix_bias(device, c) if c is not None else None
    launch = launch_packed(
        device, config, layout, batch, a_buf, b_buf, a_mod=a.shape[0], b_mod=b.shape[0], bias=bias,
        alpha=alpha, beta=beta, fused=fused,
    )  # fmt: skip
    launch.enqueue()
    _release_scratch(device, (a_buf, a_scratch), (b_buf, b_scratch))
    return result(device, launch.out, a, b, c)


def _release_scratch(device: OpenCLDevice, *panels: tuple[DeviceArray, bool]) -> None:
    """Give packed panels that came from the pool back to it (their GEMM is queued)."""
    for buffer, scratch in panels:
        if scratch:
            device.release(buffer)


def run_weights_gemm(
    device: OpenCLDevice,
    a: Tensor,
    weights: Tensor,
    b: Tensor,
    key: tuple[object, ...],
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    fused: FusedActivation | None = None,
    trans_a: bool = False,
    trans_b: bool = False,
) -> Tensor:
    """``act(alpha * op(a) @ op(b) + beta * c)`` for 2-D ``a`` and ``b``, where ``b`` is ``weights`` or a
    view of it (``key`` says which): read-only weights and bias (initializers) are packed once per
    session, activations on every call (on the device when they are device buffers). ``trans_a`` /
    ``trans_b``: ``a`` is ``[K, M]`` / ``b`` is ``[N, K]``."""
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    n = b.shape[0] if trans_b else b.shape[1]
    if m == 0 or n == 0:
        return np.zeros((m, n), np.float32)
    config = device.gemm_config(m, n, k, 1)
    layout = GemmLayout.of(config, m, n, k)
    if isinstance(b, DeviceArray):
        b_buf, b_scratch = b_panels(device, b.reshape(1, *b.shape), layout, trans_b)
    else:
        b_host = np.asarray(b, np.float32)
        b_buf = device.resident.get(
            weights, (*key, config), lambda: device.to_device(pack_b((b_host.T if trans_b else b_host)[None], layout))
        )
        b_scratch = False
    a_buf, a_scratch = a_panels(device, a.reshape(1, *a.shape), layout, trans_a)
    bias = device.resident.get(c, "gemm_c", lambda: matrix_bias(device, c)) if c is not None else None
    launch = launch_packed(
        device, config, layout, 1, a_buf, b_buf, bias=bias, alpha=alpha, beta=beta, fused=fused
    )
    launch.enqueue()
    _release_scratch(device, (a_buf, a_scratch), (b_buf, b_scratch))
    return result(device, launch.out.reshape(m, n), a, b)


def _float32_only(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None:
        return None
    for info in inputs:
        if info is not None and info.dtype != np.float32:
            return f"OpenCL {node.op_type} runs float32 only, got {info.dtype}"
    return None


def gemm_products(node: Node, inputs: Sequence[TensorInfo | None]) -> list[tuple[int, int, int, int]]:
    """The ``(M, N, K, batch)`` product a Gemm or MatMul node runs (for tuning)."""
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    if node.op_type == "Gemm":
        m, k = (a.shape[1], a.shape[0]) if node.attrs.transA else (a.shape[0], a.shape[1])
        n = b.shape[0] if node.attrs.transB else b.shape[1]
        return [(int(m), int(n), int(k), 1)]
    a_shape = (1, *a.shape) if len(a.shape) == 1 else tuple(a.shape)
    b_shape = (*b.shape, 1) if len(b.shape) == 1 else tuple(b.shape)
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    if len(b_shape) == 2:
        return [(int(np.prod(a_shape[:-1], dtype=np.int64)), int(n), int(k), 1)]
    batch = int(np.prod(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), dtype=np.int64))
    return [(int(m), int(n), int(k), batch)]


def register(device: OpenCLDevice) -> None:
    """Add Gemm and MatMul to ``device``'s kernel table."""

    @device.kernels.register("Gemm", supports=_float32_only)
    @device_inputs((0,))
    def gemm(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Gemm: transposes by packing, alpha/beta/C/fused activation in the kernel's epilogue."""
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        assert a is not None and b is not None
        attrs = node.attrs
        use_c = c is not None and attrs.beta != 0
        y = run_weights_gemm(
            device, a, b, b, ("gemm", int(attrs.transB)), on_host(device, c) if use_c else None,
            alpha=attrs.alpha, beta=attrs.beta, fused=attrs.fused,
            trans_a=bool(attrs.transA), trans_b=bool(attrs.transB),
        )  # fmt: skip
        return [y]

    @device.kernels.register("MatMul", supports=_float32_only)
    @device_inputs((0, 1))
    def matmul(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """numpy ``matmul`` semantics: 1-D operands, broadcast batch dimensions."""
        a, b = inputs
        assert a is not None and b is not None
        if any_on_device(a, b):
            return [_matmul_on_device(device, a, b)]
        return [_matmul_on_host(device, a, b)]


def _matmul_on_host(device: OpenCLDevice, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MatMul of host operands (numpy in, numpy out)."""
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if b2.ndim == 2:
        # A stack of matrices times one matrix is one tall GEMM.
        rows = a2.reshape(-1, k)
        y = run_weights_gemm(device, rows, b, b2, ("matmul",)).reshape(*batch_shape, m, n)
    else:
        a3 = np.broadcast_to(a2, (*batch_shape, m, k)).reshape(-1, m, k)
        b3 = np.broadcast_to(b2, (*batch_shape, k, n)).reshape(-1, k, n)
        y = run_gemm(device, a3, b3).reshape(*batch_shape, m, n)
    if a.ndim == 1:
        y = y[..., 0, :]
    if b.ndim == 1:
        y = y[..., 0]
    # NOTE: not ascontiguousarray, which turns the 0-d result of vector @ vector into shape (1,).
    return np.array(y, np.float32, order="C")


def _matmul_on_device(device: OpenCLDevice, a: Tensor, b: Tensor) -> Tensor:
    """MatMul with at least one operand on the device; the result stays there. Batch broadcasting that
    is not a repeat of a whole operand (``[2, 1, M, K] @ [3, K, N]``) runs on the host instead."""
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    batch_shape = tuple(np.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])))
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if b2.ndim == 2:
        y = run_weights_gemm(device, a2.reshape(-1, k), b, b2, ("matmul",))
    elif _repeats(a2.shape[:-2], batch_shape) and _repeats(b2.shape[:-2], batch_shape):
        a3 = a2.reshape(-1, m, k)
        b3 = b2.reshape(-1, k, n)
        y = run_gemm(device, a3, b3)
    else:
        host = _matmul_on_host(device, on_host(device, a), on_host(device, b))  # type: ignore[arg-type]
        return host
    out_shape = (*batch_shape, m, n)
    if a.ndim == 1:
        out_shape = (*out_shape[:-2], n)
    if b.ndim == 1:
        out_shape = out_shape[:-1]
    return y.reshape(out_shape)


def _repeats(shape: Sequence[int], batch_shape: Sequence[int]) -> bool:
    """Whether an operand of batch dims ``shape`` is ``batch_shape`` itself or repeated whole along
    leading axes (the GEMM reads matrix ``z % count``)."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return not dims or tuple(dims) == tuple(batch_shape[len(batch_shape) - len(dims):])
