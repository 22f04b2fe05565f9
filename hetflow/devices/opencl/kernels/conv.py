"""OpenCL Conv (2-D NCHW float32), one registered kernel per algorithm, like the CPU device's:

* ``depthwise`` (group == channels > 1): ``conv_depthwise``, one work-item per output, the window only;
* ``im2col`` (every Conv): ``im2col_panels`` writes the column matrix of each (image, group) straight
  into the tiled GEMM's B panels on the device, then one batched GEMM launch multiplies the packed
  weights (kept resident) with all of them, bias and fused activation in its epilogue;
* ``winograd_f23`` (3x3, stride 1, no dilation, one group): the input transform writes the 16 B panels
  of F(2x2, 3x3), one batched GEMM with the transformed weights (``U = G g G^T``, computed once per
  weight array and kept resident), and the output transform adds bias and activation;
* ``direct`` (every Conv): one work-item per output element (the reference the others are checked by).

The planner picks among the candidates that support a layer the way it does on the CPU
(``hetflow.tuning.select``): a measurement in the tuning cache, else the cost model's algorithm when
this device has it, else the first candidate (depthwise for depthwise layers, else im2col). 1-D
convolutions run as 2-D ones over a height of 1; 3-D and higher stay on the CPU.

X may be a numpy array or a ``DeviceArray`` (``common.Tensor``); Y comes back the same way. W and the
bias are host arrays kept resident. Scratch (im2col and Winograd panels, Winograd's products) goes back
to the device's pool as soon as its last kernel is queued.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    act_args,
    act_options,
    device_inputs,
    float32_reason,
    i32,
    on_device,
    result,
    source,
    source_paths,
)
from hetflow.devices.opencl.kernels.gemm import Bias, GemmLayout, launch_packed, pack_a
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import (
    DEPTHWISE,
    IM2COL,
    WINOGRAD_F23,
    ConvAttrs,
    conv_window,
    winograd_unsupported,
)
from hetflow.ops.spatial import geometry

if TYPE_CHECKING:
    from hetflow.devices.opencl import DeviceArray, OpenCLDevice

SOURCE = source("epilogue.cl", "conv.cl")
#: The direct kernel's algorithm name.
DIRECT = "direct"
#: Every algorithm registered here, in preference order.
ALGORITHMS = (DEPTHWISE, IM2COL, WINOGRAD_F23, DIRECT)

#: Winograd F(2x2, 3x3) weight transform G (4x3).
WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def _layer(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> _Layer:
    """A Conv's sizes for concrete X and W shapes (2-D), worked out once per attributes and shapes.

    Why: every run asks for each layer's, and on a GPU the run is bound by the host (an H100 ran
    GoogLeNet's batch-1 kernels in 3.6 ms of a 13.3 ms run). Kept with the GEMM's panel layouts
    (``GemmLayout.of``), GoogLeNet's batch-1 run there went 10.1 -> 6.2 ms (minimums)."""
    return _sizes(node.attrs, tuple(int(d) for d in x_shape), tuple(int(d) for d in w_shape))


@functools.lru_cache(maxsize=1024)
def _sizes(attrs: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> _Layer:
    return _Layer(attrs, x_shape, w_shape)


class _Layer:
    """A Conv's sizes for concrete X and W shapes (2-D); made through ``_layer``."""

    def __init__(self, attrs: Any, x_shape: Sequence[int], w_shape: Sequence[int]):
        spec = conv_window(attrs, w_shape)
        geo = geometry(spec, x_shape[2:])
        self.n, self.c, self.h, self.w = (int(d) for d in x_shape)
        self.k = int(w_shape[0])
        self.group = int(attrs.group)
        self.cg = self.c // self.group
        self.kg = self.k // self.group
        self.kh, self.kw = geo.kernel
        self.oh, self.ow = geo.out
        self.sh, self.sw = (a.stride for a in geo.axes)
        self.ph, self.pw = geo.pads_begin
        self.dh, self.dw = (a.dilation for a in geo.axes)
        self.spec = spec

    @functools.cached_property
    def window_args(self) -> tuple[np.int32, ...]:
        return i32(self.kh, self.kw, self.oh, self.ow, self.sh, self.sw, self.ph, self.pw, self.dh, self.dw)

    @property
    def positions(self) -> int:
        return self.oh * self.ow

    @property
    def reduction(self) -> int:
        return self.cg * self.kh * self.kw

    @property
    def tiles(self) -> tuple[int, int]:
        return -(-self.oh // 2), -(-self.ow // 2)


# -- supports ----------------------------------------------------------------------------------------
def _supports_any(node: Node, inputs: InputInfos) -> str | None:
    reason = float32_reason(node, inputs)
    if reason is not None:
        return reason
    attrs = node.attrs
    if attrs.shuffle_groups:
        return "OpenCL Conv reads X as it lies, not channel-shuffled"
    if attrs.residual:
        return "OpenCL Conv adds no residual input"
    if inputs is None or inputs[1] is None:
        if attrs.kernel_shape and len(attrs.kernel_shape) not in (1, 2):
            return f"OpenCL Conv runs 1-D and 2-D convolutions only, got a {len(attrs.kernel_shape)}-D kernel"
        return None
    if len(inputs[1].shape) not in (3, 4) or (inputs[0] is not None and len(inputs[0].shape) != len(inputs[1].shape)):
        return f"OpenCL Conv runs 1-D and 2-D convolutions only, got W of rank {len(inputs[1].shape)}"
    return None


def _supports_depthwise(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None or inputs[0] is None or not isinstance(inputs[0].shape[1], int):
        return "depthwise needs X's channel count"
    channels, group = inputs[0].shape[1], node.attrs.group
    if group == 1 or group != channels:
        return f"depthwise needs group == channels > 1; got group {group}, {channels} channels"
    return _supports_any(node, inputs)


def _supports_winograd(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None or inputs[1] is None:
        return "winograd needs W's shape"
    reason = _supports_any(node, inputs)
    if reason is not None:
        return reason
    return winograd_unsupported(conv_window(node.attrs, inputs[1].shape), node.attrs.group)


# -- the algorithms ----------------------------------------------------------------------------------
def _bias_buffer(device: OpenCLDevice, bias: np.ndarray | None, k: int) -> tuple[object, np.int32]:
    """The bias on the device (resident), and the has-bias flag; a 1-float dummy without one."""
    if bias is None:
        dummy = device.resident.device_copy(device, _DUMMY)
        return dummy.buffer, np.int32(0)
    values = device.resident.device_copy(device, bias)
    return values.buffer, np.int32(1)


_DUMMY = np.zeros(1, np.float32)
_DUMMY.flags.writeable = False  # read-only, so the resident cache uploads it once, not on every launch


def _direct_operands(
    device: OpenCLDevice, layer: _Layer, x: Tensor, w: np.ndarray, bias: np.ndarray | None
) -> tuple[tuple[Any, ...], DeviceArray]:
    """The leading kernel arguments shared by the direct and depthwise kernels (X, the resident W, the
    bias and its flag, Y) and the output array Y."""
    x_buf = on_device(device, x)
    w_buf = device.resident.device_copy(device, w)
    bias_buf, has_bias = _bias_buffer(device, bias, layer.k)
    y = device.empty((layer.n, layer.k, layer.oh, layer.ow))
    return (x_buf.buffer, w_buf.buffer, bias_buf, has_bias, y.buffer), y


def run_direct(device: OpenCLDevice, node: Node, x: Tensor, w: np.ndarray, bias: np.ndarray | None) -> Tensor:
    """Any 2-D Conv, one work-item per output element."""
    layer = _layer(node, x.shape, w.shape)
    kernel = device.kernel("conv_direct", SOURCE, act_options(node.attrs.fused))
    buffers, y = _direct_operands(device, layer, x, w, bias)
    args = (
        *buffers,
        *i32(layer.c, layer.h, layer.w, layer.k, layer.cg, layer.kg),
        *layer.window_args, *act_args(node.attrs.fused),
    )  # fmt: skip
    device.enqueue(kernel, (layer.positions, layer.k, layer.n), None, args)
    return result(device, y, x)


def run_depthwise(
    device: OpenCLDevice, node: Node, x: Tensor, w: np.ndarray, bias: np.ndarray | None
) -> Tensor:
    """Depthwise Conv (group == C, any channel multiplier)."""
    layer = _layer(node, x.shape, w.shape)
    kernel = device.kernel("conv_depthwise", SOURCE, act_options(node.attrs.fused))
    buffers, y = _direct_operands(device, layer, x, w, bias)
    args = (
        *buffers,
        *i32(layer.c, layer.h, layer.w, layer.k, layer.k // layer.c),
        *layer.window_args, *act_args(node.attrs.fused),
    )  # fmt: skip
    device.enqueue(kernel, (layer.ow, layer.oh, layer.n * layer.k), None, args)
    return result(device, y, x)


def _bias(device: OpenCLDevice, bias: np.ndarray | None, rows: int, groups: int) -> Bias | None:
    """The bias as a GEMM epilogue operand: one value per output row, group ``z % groups`` offset."""
    if bias is None:
        return None
    values = device.resident.device_copy(device, bias)
    return Bias(values, sm=1, sn=0, batch_stride=rows, mod=groups)


def run_im2col(
    device: OpenCLDevice, node: Node, x: Tensor, w: np.ndarray, bias: np.ndarray | None
) -> Tensor:
    """Any 2-D Conv: im2col into the GEMM's panels on the device, then one batched GEMM."""
    layer = _layer(node, x.shape, w.shape)
    batch = layer.n * layer.group
    m, n, k = layer.kg, layer.positions, layer.reduction
    config = device.gemm_config(m, n, k, batch)
    layout = GemmLayout.of(config, m, n, k)
    weights = device.resident.get(
        w, ("im2col", config),
        lambda: device.to_device(pack_a(w.reshape(layer.group, m, k), layout)),
    )  # fmt: skip
    x_buf = on_device(device, x)
    panels = device.empty((batch * layout.b_elements,))
    im2col = device.kernel("im2col_panels", SOURCE, act_options(None))
    args = (
        x_buf.buffer, panels.buffer,
        *i32(layer.c, layer.h, layer.w, layer.group, layer.cg), *layer.window_args,
        *i32(k, n, layout.kp, layout.np_, layout.b_width),
    )  # fmt: skip
    device.enqueue(im2col, (layout.np_, layout.kp, batch), None, args)
    launch = launch_packed(
        device, config, layout, batch, weights, panels, a_mod=layer.group, b_mod=batch,
        bias=_bias(device, bias, m, layer.group), fused=node.attrs.fused,
    )  # fmt: skip
    launch.enqueue()
    device.release(panels)
    # Matrix z = image * groups + group holds that group's kernels: the products are Y in NCHW order.
    return result(device, launch.out.reshape(layer.n, layer.k, layer.oh, layer.ow), x)


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """``U = G g G^T`` of every 3x3 kernel, as 16 matrices ``[16, K, C]`` (float32)."""
    u = np.einsum("ai,kcij,bj->abkc", WINOGRAD_G, w.astype(np.float64), WINOGRAD_G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), np.float32)


def run_winograd_f23(
    device: OpenCLDevice, node: Node, x: Tensor, w: np.ndarray, bias: np.ndarray | None
) -> Tensor:
    """3x3 stride-1 Conv by Winograd F(2x2, 3x3): input transform, 16 GEMMs, output transform."""
    layer = _layer(node, x.shape, w.shape)
    th, tw = layer.tiles
    tiles = layer.n * th * tw
    config = device.gemm_config(layer.k, tiles, layer.c, 16)
    layout = GemmLayout.of(config, layer.k, tiles, layer.c)
    weights = device.resident.get(
        w, ("winograd_f23", config), lambda: device.to_device(pack_a(winograd_weights(w), layout))
    )
    x_buf = on_device(device, x)
    panels = device.empty((16 * layout.b_elements,))
    transform = device.kernel("winograd_f23_input", SOURCE, act_options(None))
    args = (
        x_buf.buffer, panels.buffer,
        *i32(layer.c, layer.h, layer.w, th, tw, layer.ph, layer.pw, tiles),
        *i32(layout.kp, layout.np_, layout.b_width),
    )  # fmt: skip
    device.enqueue(transform, (layout.np_, layout.kp), None, args)
    launch = launch_packed(device, config, layout, 16, weights, panels, a_mod=16, b_mod=16)
    launch.enqueue()
    device.release(panels)
    finish = device.kernel("winograd_f23_output", SOURCE, act_options(node.attrs.fused))
    bias_buf, has_bias = _bias_buffer(device, bias, layer.k)
    y = device.empty((layer.n, layer.k, layer.oh, layer.ow))
    args = (
        launch.out.buffer, y.buffer, bias_buf, has_bias,
        *i32(layer.k, layer.oh, layer.ow, th, tw, tiles), *act_args(node.attrs.fused),
    )  # fmt: skip
    device.enqueue(finish, (tiles, layer.k), None, args)
    device.release(launch.out)
    return result(device, y, x)


Runner = Callable[["OpenCLDevice", Node, Tensor, np.ndarray, "np.ndarray | None"], Tensor]


def conv_products(node: Node, inputs: Sequence[TensorInfo | None]) -> list[tuple[int, int, int, int]]:
    """The GEMM products (M, N, K, batch) the GEMM-based algorithms run for this layer (tuning)."""
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    if len(x.shape) != 4:
        return []
    layer = _layer(node, x.shape, w.shape)
    products = []
    if not (layer.group > 1 and layer.group == layer.c):
        products.append((layer.kg, layer.positions, layer.reduction, layer.n * layer.group))
    if _supports_winograd(node, inputs) is None:
        th, tw = layer.tiles
        products.append((layer.k, layer.n * th * tw, layer.c, 16))
    return products


#: id(1-D node) -> (that node, its 2-D form); nodes are not hashable, and kernels ask on every run.
_AS_2D: dict[int, tuple[Node, Node]] = {}


def _as_2d(node: Node) -> Node:
    """A 1-D Conv node as the equivalent 2-D one over a height of 1 (memoised per node)."""
    found = _AS_2D.get(id(node))
    if found is not None and found[0] is node:
        return found[1]
    attrs: ConvAttrs = node.attrs
    pads = attrs.pads
    attrs_2d = dataclasses.replace(
        attrs,
        kernel_shape=(1, *attrs.kernel_shape) if attrs.kernel_shape else (),
        strides=(1, *attrs.strides) if attrs.strides else (),
        dilations=(1, *attrs.dilations) if attrs.dilations else (),
        pads=(0, pads[0], 0, pads[1]) if pads else (),
    )
    converted = dataclasses.replace(node, attrs=attrs_2d)
    _AS_2D[id(node)] = (node, converted)
    return converted


def register(device: OpenCLDevice) -> None:
    """Add the Conv algorithms to ``device``'s kernel table, in preference order."""
    runners: dict[str, tuple[Runner, Callable[[Node, InputInfos], str | None]]] = {
        DEPTHWISE: (run_depthwise, _supports_depthwise),
        IM2COL: (run_im2col, _supports_any),
        WINOGRAD_F23: (run_winograd_f23, _supports_winograd),
        DIRECT: (run_direct, _supports_any),
    }
    for algorithm in ALGORITHMS:
        runner, supports = runners[algorithm]
        device.kernels.register("Conv", algorithm=algorithm, supports=supports)(_conv_kernel(device, runner))


def _conv_kernel(device: OpenCLDevice, runner: Runner):  # noqa: ANN202  (a KernelFn)
    @device_inputs((0,))
    def kernel(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        x, w = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        assert x is not None and isinstance(w, np.ndarray)
        if isinstance(x, np.ndarray):
            x = np.ascontiguousarray(x, np.float32)
        w = np.ascontiguousarray(w, np.float32)
        if x.ndim == 3:
            # A 1-D convolution is a 2-D one over a height of 1.
            n, c, width = x.shape
            y = runner(device, _as_2d(node), x.reshape(n, c, 1, width), w[:, :, None, :], bias)
            return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]
        return [runner(device, node, x, w, bias)]

    functools.update_wrapper(kernel, runner)  # tuning hashes the runner's module (and conv.cl)
    kernel.kernel_sources = source_paths("epilogue.cl", "conv.cl")  # type: ignore[attr-defined]
    return kernel
