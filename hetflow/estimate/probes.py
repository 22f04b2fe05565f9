"""Representative layers that calibration times: small ONNX models with CNN-typical shapes.

Each probe is a one- or two-node model (a Conv followed by its ReLU, so the session's fusion passes see
what they see in real networks). Calibration loads every probe the way a session does — import,
shape inference, the optimisation passes — and times every kernel the device offers for each node,
so algorithms added later are calibrated without touching this list.

Shapes follow Augur's observation that CNN layers come from a small set: kernels of 1, 3, 5, 7, 11;
output channels in multiples of 16 from 16 to 1024; feature maps of 224, 112, 56, 28, 14, 7 (and
AlexNet's 55, 27, 13).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17


@dataclass(frozen=True)
class Probe:
    """One calibration model: a name for the progress bar, and its builder."""

    name: str
    build: Callable[[], onnx.ModelProto]
    #: part of the reduced (quick) calibration too.
    quick: bool = False
    #: timed as a batch run of a big convolutional network runs: on the spinning pool with BLAS held at
    #: one thread (``hetflow.runtime.executor.BATCHES_SPIN``), or else BLAS at one thread and each GEMM
    #: split over the run's threads by hetflow (``hetflow.runtime.executor.splits_gemms``).
    split: bool = False
    #: timed as one example through a convolutional network runs: on the spinning pool
    #: (``hetflow.runtime.executor.spins``), its layers split there.
    spin: bool = False
    #: with ``spin``: BLAS held at one thread meanwhile, as a large network's spinning run holds it
    #: (``executor.SPIN_BLAS_MAX_CONV_MACS``); a small network's leaves BLAS its threads.
    hold_blas: bool = False


class _Model:
    """A minimal onnx.helper wrapper: float32 input ``x`` of a static shape, seeded weights."""

    def __init__(self, shape: Sequence[int], seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.count = 0

    def weight(self, shape: Sequence[int], scale: float = 0.1, dtype: type = np.float32) -> str:
        self.count += 1
        name = f"w{self.count}"
        # Uniform float32 draws, scaled in place: ten times cheaper than normal float64 ones for the big
        # FC weights (VGG's 411 MB).
        array = self.rng.random(tuple(shape), dtype=np.float32)
        array -= 0.5
        array *= 2 * scale
        self.initializers[name] = array.astype(dtype, copy=False)
        return name

    def constant(self, values: Sequence[int]) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.initializers[name] = np.asarray(values, dtype=np.int64)
        return name

    def extra_input(self, shape: Sequence[int]) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def node(self, op_type: str, inputs: Sequence[str], **attrs: object) -> str:
        self.count += 1
        output = f"t{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=f"n{self.count}", **attrs))
        return output

    def model(self, output: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "probe", self.inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)]
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        # NOTE: written straight into the model's own graph: make_graph, make_model and from_array each
        # copy what they are given, ~2 s for VGG's fully connected weights.
        for name, array in self.initializers.items():
            tensor = model.graph.initializer.add()
            tensor.name = name
            tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            tensor.dims.extend(array.shape)
            tensor.raw_data = np.ascontiguousarray(array).tobytes()
        return model


# -- builders --------------------------------------------------------------------------------------
def conv(
    channels: int, size: int, kernels: int, kernel: int, stride: int = 1, pad: int | None = None,
    group: int = 1, batch: int = 1, relu: bool = True,
) -> Callable[[], onnx.ModelProto]:
    pad = kernel // 2 if pad is None else pad

    def build() -> onnx.ModelProto:
        b = _Model((batch, channels, size, size))
        w = b.weight((kernels, channels // group, kernel, kernel))
        bias = b.weight((kernels,))
        y = b.node("Conv", ["x", w, bias], kernel_shape=[kernel, kernel], strides=[stride, stride],
                   pads=[pad] * 4, group=group)
        return b.model(b.node("Relu", [y]) if relu else y)

    return build


def pool(op_type: str, channels: int, size: int, kernel: int, stride: int, pad: int = 0,
         batch: int = 1) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model((batch, channels, size, size))
        return b.model(b.node(op_type, ["x"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                              pads=[pad] * 4))

    return build


def unary(op_type: str, shape: Sequence[int], **attrs: object) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model(shape)
        return b.model(b.node(op_type, ["x"], **attrs))

    return build


def clip(shape: Sequence[int]) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model(shape)
        low = b.weight((), 0.0)
        high = b.weight((), 0.0)
        b.initializers[high] = np.array(6.0, np.float32)  # ReLU6
        return b.model(b.node("Clip", ["x", low, high]))

    return build


def binary(op_type: str, shape: Sequence[int], other: Sequence[int] | None = None,
           constant: bool = False) -> Callable[[], onnx.ModelProto]:
    """``x op y``; y has ``other``'s shape (broadcast), as an initializer when ``constant``."""

    def build() -> onnx.ModelProto:
        b = _Model(shape)
        second_shape = tuple(other) if other is not None else tuple(shape)
        second = b.weight(second_shape) if constant else b.extra_input(second_shape)
        return b.model(b.node(op_type, ["x", second]))

    return build


def batchnorm(shape: Sequence[int], relu: bool = False) -> Callable[[], onnx.ModelProto]:
    """A BatchNormalization (with ``relu``: followed by a Relu, which the optimiser fuses into it, as
    DenseNet's pre-activation blocks have it)."""

    def build() -> onnx.ModelProto:
        b = _Model(shape)
        channels = shape[1]
        names = [b.weight((channels,)) for _ in range(4)]
        b.initializers[names[-1]] = np.ones(channels, np.float32)
        normalised = b.node("BatchNormalization", ["x", *names])
        return b.model(b.node("Relu", [normalised]) if relu else normalised)

    return build


def lrn(channels: int, size: int, batch: int = 1) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model((batch, channels, size, size))
        return b.model(b.node("LRN", ["x"], size=5, alpha=1e-4, beta=0.75, bias=1.0))

    return build


def fully_connected(batch: int, inputs: int, outputs: int, relu: bool = False) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model((batch, inputs))
        w = b.weight((outputs, inputs), 0.01)
        bias = b.weight((outputs,))
        y = b.node("Gemm", ["x", w, bias], transB=1)
        return b.model(b.node("Relu", [y]) if relu else y)

    return build


def matmul(batch: int, inputs: int, outputs: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model((batch, inputs))
        return b.model(b.node("MatMul", ["x", b.weight((inputs, outputs), 0.01)]))

    return build


def concat(shape: Sequence[int], parts: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model(shape)
        names = ["x"] + [b.extra_input(shape) for _ in range(parts - 1)]
        return b.model(b.node("Concat", names, axis=1))

    return build


def transpose(shape: Sequence[int], perm: Sequence[int]) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model(shape)
        return b.model(b.node("Transpose", ["x"], perm=list(perm)))

    return build


def reshape(shape: Sequence[int], target: Sequence[int]) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        b = _Model(shape)
        return b.model(b.node("Reshape", ["x", b.constant(target)]))

    return build


def lstm(steps: int, batch: int, features: int, hidden: int, last_only: bool = False) -> Callable[[], onnx.ModelProto]:
    """An LSTM layer returning every step's hidden state Y, or with ``last_only`` only the last, Y_h (as
    classifiers use it: the kernel then allocates no Y)."""

    def build() -> onnx.ModelProto:
        b = _Model((steps, batch, features))
        w = b.weight((1, 4 * hidden, features))
        r = b.weight((1, 4 * hidden, hidden))
        bias = b.weight((1, 8 * hidden))
        b.count += 1
        output = f"t{b.count}"
        outputs = ["", output] if last_only else [output]
        b.nodes.append(helper.make_node("LSTM", ["x", w, r, bias], outputs, name="lstm", hidden_size=hidden))
        return b.model(output)

    return build


def small_network() -> onnx.ModelProto:
    """A classifier of tiny layers (a 1x1 Conv + ReLU, a max pool, three fully connected layers, a
    softmax, each a microsecond or two) that one example runs through on the spinning pool, replayed
    whole from compiled code: calibration compares its layers, timed alone, against it
    (``calibrate._calibrate_direct_runs``); tiny, so that their own times' noise does not drown what a
    call from Python adds to each."""
    b = _Model((1, 32, 16, 16))
    y = b.node("Relu", [b.node("Conv", ["x", b.weight((32, 32, 1, 1)), b.weight((32,))], kernel_shape=[1, 1])])
    y = b.node("Flatten", [b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])])
    for inputs, outputs in ((2048, 256), (256, 32)):
        y = b.node("Relu", [b.node("Gemm", [y, b.weight((outputs, inputs)), b.weight((outputs,))], transB=1)])
    y = b.node("Gemm", [y, b.weight((10, 32)), b.weight((10,))], transB=1)
    return b.model(b.node("Softmax", [y]))


# -- the catalogue ---------------------------------------------------------------------------------
def _conv_probes() -> list[Probe]:
    specs: list[tuple[tuple, dict, bool]] = [
        # im2col: first layers, 3x3 stacks (VGG/ResNet), 5x5 (GoogLeNet, cifar), strided, grouped.
        ((3, 224, 64, 7, 2, 3), {}, True),
        ((3, 227, 96, 11, 4, 0), {}, False),
        ((3, 112, 32, 3, 2, 1), {}, False),
        ((3, 224, 32, 3, 2, 1), {}, False),
        # SqueezeNet's stem, which one image runs direct (on phase planes) from 64 kernels: the 7x7
        # stems alone left the @phases model's fill term to a window 5x as deep.
        ((3, 224, 64, 3, 2, 0), {}, False),
        ((1, 28, 20, 5, 1, 0), {}, True),
        # A single input channel at batch 16 (MNIST's first layer): the direct kernel's pass per image
        # dominates, 33 GMAC/s where the fit of the other shapes said 65.
        ((1, 28, 20, 5, 1, 0), {"batch": 16}, False),
        ((3, 32, 32, 5, 1, 2), {"batch": 4}, False),
        # CIFAR-10 quick's 5x5 layers at batch 1 (a spinning run's direct Convs of a few tens of
        # microseconds): priced 26-37% over from the fit of the larger ones.
        ((3, 32, 32, 5, 1, 2), {}, False),
        ((32, 16, 32, 5, 1, 2), {}, False),
        ((16, 112, 32, 3), {}, False),
        ((64, 56, 64, 3), {}, True),
        ((64, 56, 192, 3), {}, False),
        ((128, 28, 128, 3), {}, False),
        ((96, 28, 128, 3), {"batch": 4}, False),
        ((256, 14, 256, 3), {}, True),
        ((512, 14, 512, 3), {}, False),
        ((512, 7, 512, 3), {}, False),
        ((160, 7, 320, 3), {"batch": 8}, False),
        ((16, 28, 32, 5), {}, False),
        ((48, 27, 128, 5), {"group": 2}, False),
        ((32, 14, 64, 5), {"batch": 8}, False),
        ((256, 13, 384, 3), {}, False),
        ((64, 56, 128, 3, 2, 1), {}, False),
        ((256, 28, 256, 3, 2, 1), {}, False),
        ((32, 16, 32, 3), {"batch": 16}, True),  # quick: the plain im2col, Winograd and direct keys
        ((128, 8, 128, 3), {"batch": 16}, False),
        # DenseNet's growth layers (3x3, 128 -> 32, at every scale) and GoogLeNet's 5x5 reductions.
        ((128, 56, 32, 3), {}, False),
        ((128, 28, 32, 3), {}, False),
        ((128, 14, 32, 3), {}, False),
        ((128, 7, 32, 3), {"batch": 4}, False),
        ((16, 27, 32, 5), {}, False),
        ((32, 13, 64, 5), {}, False),
        # small layers (CIFAR/MNIST-sized nets), where the fixed cost per call dominates.
        ((3, 32, 16, 3), {}, False),
        ((3, 32, 24, 5), {"batch": 8}, False),
        ((1, 28, 8, 5, 1, 0), {}, False),
        ((24, 16, 48, 3), {}, False),
        ((16, 12, 40, 5, 1, 0), {"batch": 4}, False),
        ((48, 8, 64, 5), {"batch": 16}, False),
        ((64, 8, 96, 3), {}, False),
        # SqueezeNet's 3x3 expand layers (direct at batch 1): without them the direct fit, led by the
        # small nets' layers, priced these 23-29% slow.
        ((16, 55, 64, 3), {}, False),
        ((32, 27, 128, 3), {}, False),
        ((64, 13, 256, 3), {}, False),
        # pointwise 1x1: bottlenecks, inception reductions, grouped (ShuffleNet), classifier convs.
        ((64, 56, 256, 1), {}, True),
        ((256, 56, 64, 1), {}, False),
        ((512, 28, 128, 1), {}, False),
        ((192, 28, 64, 1), {"batch": 4}, False),
        ((1024, 14, 256, 1), {}, False),
        ((480, 14, 96, 1), {}, True),
        ((2048, 7, 512, 1), {}, False),
        ((16, 112, 96, 1), {}, False),
        # the thin 1x1 layers of SqueezeNet's fire modules and MobileNet v2's bottlenecks at batch 1.
        ((96, 55, 16, 1), {}, False),
        ((16, 55, 64, 1), {}, False),
        ((512, 13, 64, 1), {}, False),
        ((24, 56, 144, 1), {}, False),
        ((960, 7, 160, 1), {}, False),
        ((64, 56, 64, 1), {"batch": 8}, True),  # quick: the plain pointwise key
        ((240, 28, 240, 1), {"group": 4}, False),
        # ShuffleNet's grouped 1x1 layers at batch 1 on 14x14 and 7x7 (22 of its 32): with the deep
        # 1x1 layers on the tile GEMM at batch 1 too, the @own fit priced these 25-75% over.
        ((272, 14, 272, 1), {"group": 4}, False),
        ((544, 7, 544, 1), {"group": 4}, False),
        ((544, 14, 136, 1), {"group": 4, "batch": 4}, False),
        ((512, 13, 1000, 1), {}, False),
        ((320, 7, 1280, 1), {"batch": 8}, False),
        # strided 1x1 (ResNet downsampling): im2col with a tiny window.
        ((256, 56, 512, 1, 2, 0), {}, False),
        # depthwise: MobileNet / ShuffleNet.
        ((32, 112, 32, 3), {"group": 32}, True),
        ((96, 112, 96, 3, 2, 1), {"group": 96}, False),
        ((144, 56, 144, 3), {"group": 144}, False),
        ((192, 28, 192, 3), {"group": 192, "batch": 4}, True),  # quick: the plain depthwise key
        ((384, 14, 384, 3), {"group": 384}, True),
        ((272, 14, 272, 3), {"group": 272}, False),
        ((960, 7, 960, 3), {"group": 960}, False),
        ((60, 28, 60, 3, 2, 1), {"group": 60, "batch": 8}, False),
        ((576, 14, 576, 3), {"group": 576, "batch": 8}, False),
    ]
    probes = []
    for args, kwargs, quick in specs:
        probes.append(_conv_probe(args, kwargs, quick))
    for args, kwargs in BATCH_RUN_CONVS:
        probes.append(Probe(_conv_label(args, kwargs) + " split", conv(*args, **kwargs), split=True))
    for args, kwargs in SPIN_RUN_CONVS:
        probes.append(Probe(_conv_label(args, kwargs) + " spin", conv(*args, **kwargs), spin=True))
    for args, kwargs, hold in SPIN_BATCH_CONVS:
        probes.append(Probe(_conv_label(args, kwargs) + " spin", conv(*args, **kwargs), spin=True, hold_blas=hold))
    return probes


#: Multiply-adds from which a batch-1 Conv probe is timed with BLAS held at one thread: a layer of a
#: network past ``executor.SPIN_BLAS_MAX_CONV_MACS`` in all (the small networks' layers are under it).
SPIN_HOLD_BLAS_MIN_MACS = 8_000_000


def _conv_probe(args: tuple, kwargs: dict, quick: bool) -> Probe:
    """A Conv probe as runs have the layer: one image spins (``executor.spins``: every batch-1 run of
    a convolutional network does), with BLAS held at one thread where the layer is a large network's;
    a batch is timed beside BLAS's threads (as a small network's batch runs)."""
    label = _conv_label(args, kwargs)
    if kwargs.get("batch", 1) > 1:
        return Probe(label, conv(*args, **kwargs), quick)
    channels, size, kernels, kernel = args[:4]
    stride = args[4] if len(args) > 4 else 1
    out = -(-size // stride)
    macs = channels // kwargs.get("group", 1) * kernel * kernel * kernels * out * out
    hold = macs >= SPIN_HOLD_BLAS_MIN_MACS
    return Probe(label + " spin", conv(*args, **kwargs), quick, spin=True, hold_blas=hold)


#: More of the small networks' direct Convs at batch 1, spinning (``_conv_probe``): timed alone, one
#: thread computed them, and mentee's and cifar10-quick's predictions came out 30-38% slow.
SPIN_RUN_CONVS: list[tuple[tuple, dict]] = [
    ((20, 12, 50, 5, 1, 0), {}),
    ((32, 16, 32, 5), {}),
    ((32, 8, 64, 5), {}),
    ((3, 32, 32, 3), {}),
    ((32, 32, 32, 3), {}),
    ((64, 16, 64, 3), {}),
    ((64, 8, 128, 3), {}),
]


#: The small networks' direct Convs at batch 16, spinning as their batch runs do (``executor.spins``), BLAS
#: held at one thread where the network is past ``executor.SPIN_BLAS_MAX_CONV_MACS`` (cifar10-quick,
#: mentee; not lenet). Each image a share, where one image shares out its kernel blocks: priced from the
#: batch-1 samples alone, mentee's batch run came out +18% (lenet's +66%, its pools most of it).
SPIN_BATCH_CONVS: list[tuple[tuple, dict, bool]] = [
    ((1, 28, 20, 5, 1, 0), {"batch": 16}, False),
    ((20, 12, 50, 5, 1, 0), {"batch": 16}, False),
    ((32, 16, 32, 5), {"batch": 16}, True),
    ((32, 32, 32, 3), {"batch": 16}, True),
    ((64, 16, 64, 3), {"batch": 16}, True),
]


#: Convolutions as batch runs of the big networks have them (VGG, ResNet, GoogLeNet, AlexNet at batch
#: 16: each 0.2-1.9 G multiply-adds), timed with the GEMMs split over the run's threads as those runs
#: split them. Without them every large layer was predicted from the batch-1 probes' fit, 1.5x too slow
#: for VGG-19's Winograd layers at batch 16; with channels only up to 128 in the F(4,3) probes, its 256-
#: and 512-channel layers still came out 30-52% slow (their products run nearer the GEMM's peak). With the
#: 256- and 512-channel probes at 28x28 batch 8, the model's size curve stopped short of VGG-19's batch-16
#: layers (twice those) and its batch run came out 13-22% slow: probes at 56x56 batch 8 and 28x28 batch 16
#: took it to +0.8% (calibration +7 s).
BATCH_RUN_CONVS: list[tuple[tuple, dict]] = [
    ((64, 112, 64, 3), {"batch": 2}),
    ((64, 56, 64, 3), {"batch": 4}),
    ((128, 28, 128, 3), {"batch": 8}),
    ((96, 28, 128, 3), {"batch": 8}),
    ((256, 14, 256, 3), {"batch": 8}),
    ((256, 56, 256, 3), {"batch": 8}),
    ((512, 28, 512, 3), {"batch": 16}),
    ((512, 14, 512, 3), {"batch": 8}),
    ((512, 7, 512, 3), {"batch": 8}),
    # a batch's 3x3 stride-2 layers run direct (``_direct_takes_strided``): ResNet-50's and Inception v2's.
    ((128, 56, 128, 3, 2, 1), {"batch": 8}),
    ((256, 28, 256, 3, 2, 1), {"batch": 8}),
    ((3, 224, 64, 7, 2, 3), {"batch": 4}),
    ((3, 227, 96, 11, 4, 0), {"batch": 4}),
    ((96, 27, 256, 5), {"group": 2, "batch": 4}),
    # AlexNet's grouped 3x3 layers (12x12 in the zoo's 224-pixel AlexNet) as their one-group halves run
    # at a batch (``split_conv_groups``: Winograd F(2,3), rows of 6 tiles): the transforms' cost per row
    # does not shrink with the tiles, and the fit of the larger maps priced these 19-29% under.
    ((192, 12, 192, 3), {"batch": 16}),
    ((192, 12, 128, 3), {"batch": 16}),
    ((16, 28, 32, 5), {"batch": 8}),
    ((64, 56, 256, 1), {"batch": 8}),
    ((256, 56, 64, 1), {"batch": 8}),
    ((1024, 14, 256, 1), {"batch": 8}),
    ((2048, 7, 512, 1), {"batch": 8}),
    ((480, 14, 96, 1), {"batch": 8}),
    ((256, 56, 512, 1, 2, 0), {"batch": 8}),
    # MobileNet v2's thin 1x1 layers at 112x112, whose outputs at a batch stream from memory (77 MB at
    # batch 16): fitted only on layers that stay in the cache, they were priced 24-56% under.
    ((16, 112, 96, 1), {"batch": 8}),
    ((32, 112, 16, 1), {"batch": 8}),
    # MobileNet v2's and ShuffleNet's depthwise layers and image stems at a batch: spinning batch runs
    # split their planes (``executor.BATCHES_SPIN``), which no batch-1 probe times.
    ((96, 112, 96, 3, 2, 1), {"group": 96, "batch": 4}),
    ((144, 56, 144, 3), {"group": 144, "batch": 4}),
    ((192, 28, 192, 3), {"group": 192, "batch": 8}),
    ((576, 14, 576, 3), {"group": 576, "batch": 8}),
    ((960, 7, 960, 3), {"group": 960, "batch": 16}),
    ((3, 224, 32, 3, 2, 1), {"batch": 4}),
    ((3, 224, 24, 3, 2, 1), {"batch": 4}),
]


def _conv_label(args: tuple, kwargs: dict) -> str:
    channels, size, kernels, kernel = args[:4]
    label = f"conv {channels}x{size}x{size} -> {kernels} k{kernel}"
    label += f" s{args[4]}" if len(args) > 4 else ""
    return label + "".join(f" {k}={v}" for k, v in kwargs.items())


def catalogue() -> list[Probe]:
    """Every calibration probe, cheap enough that the whole list runs in well under a minute."""
    probes = _conv_probes()
    probes += [
        Probe("maxpool 3x3/2 64x112", pool("MaxPool", 64, 112, 3, 2, 1), True),
        Probe("maxpool 3x3/2 96x55", pool("MaxPool", 96, 55, 3, 2)),
        Probe("maxpool 3x3/2 256x13 b8", pool("MaxPool", 256, 13, 3, 2, batch=8)),
        Probe("maxpool 2x2/2 64x224", pool("MaxPool", 64, 224, 2, 2), True),
        Probe("maxpool 2x2/2 512x14 b4", pool("MaxPool", 512, 14, 2, 2, batch=4)),
        Probe("maxpool 2x2/2 20x24", pool("MaxPool", 20, 24, 2, 2)),
        Probe("maxpool 2x2/2 48x16 b16", pool("MaxPool", 48, 16, 2, 2, batch=16)),
        Probe("maxpool 3x3/2 24x32", pool("MaxPool", 24, 32, 3, 2, 1)),
        Probe("maxpool 2x2/2 96x8", pool("MaxPool", 96, 8, 2, 2)),
        Probe("maxpool 3x3/1 192x28", pool("MaxPool", 192, 28, 3, 1, 1), True),
        Probe("maxpool 3x3/1 832x7 b4", pool("MaxPool", 832, 7, 3, 1, 1, batch=4)),
        Probe("maxpool 3x3/1 480x14", pool("MaxPool", 480, 14, 3, 1, 1)),
        Probe("maxpool 3x3/2 480x27", pool("MaxPool", 480, 27, 3, 2)),
        Probe("maxpool 3x3/2 64x112 b4", pool("MaxPool", 64, 112, 3, 2, 1, batch=4)),
        Probe("maxpool 2x2/2 128x112", pool("MaxPool", 128, 112, 2, 2)),
        # Rows of 16 outputs or more tile in order (``jit_pool.runs_tiles``): without these two small
        # ones, mentee's 32x32x32 pool was predicted from two large probes at 4x its time.
        Probe("maxpool 2x2/2 32x32", pool("MaxPool", 32, 32, 2, 2)),
        Probe("maxpool 2x2/2 512x28", pool("MaxPool", 512, 28, 2, 2)),
        Probe("avgpool 3x3/1 256x28", pool("AveragePool", 256, 28, 3, 1, 1), True),
        Probe("avgpool 3x3/1 576x14", pool("AveragePool", 576, 14, 3, 1, 1)),
        Probe("avgpool 3x3/2 32x32 b8", pool("AveragePool", 32, 32, 3, 2, 1, batch=8)),
        Probe("avgpool 2x2/2 256x56", pool("AveragePool", 256, 56, 2, 2)),
        Probe("avgpool 7x7/1 1024x7 b4", pool("AveragePool", 1024, 7, 7, 1)),
        Probe("avgpool 3x3/2 240x56", pool("AveragePool", 240, 56, 3, 2, 1)),
        Probe("avgpool 3x3/2 48x16", pool("AveragePool", 48, 16, 3, 2, 1)),
        Probe("avgpool 3x3/2 24x12 b16", pool("AveragePool", 24, 12, 3, 2, 1, batch=16)),
        Probe("global avgpool 1024x7", unary("GlobalAveragePool", (1, 1024, 7, 7)), True),
        Probe("global avgpool 2048x7 b8", unary("GlobalAveragePool", (8, 2048, 7, 7))),
        Probe("global avgpool 512x13", unary("GlobalAveragePool", (1, 512, 13, 13))),
        Probe("lrn 96x55", lrn(96, 55), True),
        Probe("lrn 64x56", lrn(64, 56)),
        Probe("lrn 192x56 b2", lrn(192, 56, 2)),
        Probe("lrn 256x27", lrn(256, 27)),
        Probe("lrn 256x13 b8", lrn(256, 13, 8)),
        Probe("batchnorm 64x112", batchnorm((1, 64, 112, 112)), True),
        Probe("batchnorm 256x28 b4", batchnorm((4, 256, 28, 28))),
        Probe("batchnorm 1024x7", batchnorm((1, 1024, 7, 7))),
        Probe("batchnorm 32x56 b8", batchnorm((8, 32, 56, 56))),
        Probe("batchnorm 96x14", batchnorm((1, 96, 14, 14))),
        Probe("batchnorm relu 128x56", batchnorm((1, 128, 56, 56), relu=True)),
        Probe("batchnorm relu 384x28", batchnorm((1, 384, 28, 28), relu=True)),
        Probe("batchnorm relu 512x14", batchnorm((1, 512, 14, 14), relu=True)),
        Probe("batchnorm relu 256x14 b8", batchnorm((8, 256, 14, 14), relu=True)),
        Probe("fc 9216 -> 4096", fully_connected(1, 9216, 4096)),
        Probe("fc 4096 -> 1000 b16", fully_connected(16, 4096, 1000)),
        Probe("fc 4096 -> 4096 b4 relu", fully_connected(4, 4096, 4096, relu=True)),
        Probe("fc 1024 -> 1000", fully_connected(1, 1024, 1000), True),
        Probe("fc 2048 -> 1000 b8", fully_connected(8, 2048, 1000)),
        Probe("fc 800 -> 500 relu", fully_connected(1, 800, 500, relu=True), True),
        Probe("fc 64 -> 10 b16", fully_connected(16, 64, 10)),
        # The small networks' hidden layers at batch 16: 40% slower than the big layers' fit said.
        Probe("fc 800 -> 500 relu b16", fully_connected(16, 800, 500, relu=True)),
        Probe("fc 1024 -> 64 b16", fully_connected(16, 1024, 64)),
        Probe("fc 2048 -> 512 relu b16", fully_connected(16, 2048, 512, relu=True)),
        Probe("fc 512 -> 256 relu b16", fully_connected(16, 512, 256, relu=True)),
        # The same as the small networks' batch runs split them, spinning (``DENSE_SPIN_MARK``): there the
        # dense kernel shares its columns out at any size, and LeNet's 800 -> 500 ran in half the time.
        Probe("fc 800 -> 500 relu b16 spin", fully_connected(16, 800, 500, relu=True), spin=True, hold_blas=True),
        Probe("fc 1024 -> 64 b16 spin", fully_connected(16, 1024, 64), spin=True, hold_blas=True),
        Probe("fc 2048 -> 512 relu b16 spin", fully_connected(16, 2048, 512, relu=True), spin=True, hold_blas=True),
        Probe("fc 512 -> 256 relu b16 spin", fully_connected(16, 512, 256, relu=True), spin=True, hold_blas=True),
        Probe("fc 64 -> 10 b16 spin", fully_connected(16, 64, 10), spin=True, hold_blas=True),
        # LRN and BatchNormalization as batch-1 runs split them, on the spinning pool.
        Probe("lrn 96x55 spin", lrn(96, 55), spin=True, hold_blas=True),
        Probe("lrn 192x56 spin", lrn(192, 56), spin=True, hold_blas=True),
        Probe("lrn 256x13 spin", lrn(256, 13), spin=True, hold_blas=True),
        Probe("batchnorm relu 256x28 spin", batchnorm((1, 256, 28, 28), relu=True), spin=True, hold_blas=True),
        Probe("batchnorm relu 512x14 spin", batchnorm((1, 512, 14, 14), relu=True), spin=True, hold_blas=True),
        # Pools as batch-1 runs split them, their planes shared out on the spinning pool.
        Probe("maxpool 3x3/2 64x112 spin", pool("MaxPool", 64, 112, 3, 2, 1), spin=True),
        Probe("maxpool 3x3/2 96x55 spin", pool("MaxPool", 96, 55, 3, 2), spin=True),
        Probe("maxpool 3x3/1 192x28 spin", pool("MaxPool", 192, 28, 3, 1, 1), spin=True),
        Probe("maxpool 3x3/1 832x7 spin", pool("MaxPool", 832, 7, 3, 1, 1), spin=True),
        Probe("maxpool 3x3/2 24x32 spin", pool("MaxPool", 24, 32, 3, 2, 1), spin=True),
        # The small networks' 2x2/2 pools at batch 1 (LeNet's, mentee's), replayed in a few microseconds.
        Probe("maxpool 2x2/2 20x24 spin", pool("MaxPool", 20, 24, 2, 2), spin=True),
        Probe("maxpool 2x2/2 50x8 spin", pool("MaxPool", 50, 8, 2, 2), spin=True),
        Probe("maxpool 2x2/2 64x16 spin", pool("MaxPool", 64, 16, 2, 2), spin=True),
        Probe("maxpool 2x2/2 128x8 spin", pool("MaxPool", 128, 8, 2, 2), spin=True),
        # VGG-19's 2x2/2 pools at batch 1, on rows long enough for the tiles loop (``MaxPool/tiles@spin``).
        Probe("maxpool 2x2/2 64x224 spin", pool("MaxPool", 64, 224, 2, 2), spin=True),
        Probe("maxpool 2x2/2 256x56 spin", pool("MaxPool", 256, 56, 2, 2), spin=True),
        # ... and on small maps, whose rows are just long enough: from the two above the mentee's 32x32
        # pool came out at 11 us, 3.6 measured (2026-12-07).
        Probe("maxpool 2x2/2 48x40 spin", pool("MaxPool", 48, 40, 2, 2), spin=True),
        Probe("maxpool 2x2/2 16x64 spin", pool("MaxPool", 16, 64, 2, 2), spin=True),
        Probe("avgpool 3x3/1 256x28 spin", pool("AveragePool", 256, 28, 3, 1, 1), spin=True),
        Probe("avgpool 3x3/1 576x14 spin", pool("AveragePool", 576, 14, 3, 1, 1), spin=True),
        Probe("avgpool 3x3/2 240x56 spin", pool("AveragePool", 240, 56, 3, 2, 1), spin=True),
        Probe("avgpool 3x3/2 48x16 spin", pool("AveragePool", 48, 16, 3, 2, 1), spin=True),
        # The small networks' pools at batch 16, which spin too: the batch-1 samples above, all 3x3,
        # priced lenet's 2x2 pools at 3-19x their time.
        Probe("maxpool 2x2/2 20x24 b16 spin", pool("MaxPool", 20, 24, 2, 2, batch=16), spin=True),
        Probe("maxpool 2x2/2 50x8 b16 spin", pool("MaxPool", 50, 8, 2, 2, batch=16), spin=True),
        Probe("maxpool 2x2/2 32x32 b16 spin", pool("MaxPool", 32, 32, 2, 2, batch=16), spin=True, hold_blas=True),
        Probe("maxpool 2x2/2 64x16 b16 spin", pool("MaxPool", 64, 16, 2, 2, batch=16), spin=True, hold_blas=True),
        Probe("maxpool 3x3/2 32x32 b16 spin", pool("MaxPool", 32, 32, 3, 2, batch=16), spin=True, hold_blas=True),
        Probe("avgpool 3x3/2 32x16 b16 spin", pool("AveragePool", 32, 16, 3, 2, batch=16), spin=True,
              hold_blas=True),
        # Pools and LRN as batch runs on their own threads share their planes out (``@threads`` keys).
        Probe("maxpool 3x3/2 64x112 b8 split", pool("MaxPool", 64, 112, 3, 2, 1, batch=8), split=True),
        Probe("maxpool 3x3/2 96x55 b8 split", pool("MaxPool", 96, 55, 3, 2, batch=8), split=True),
        # Batch-16 pools whose input outgrows a 32 MiB last-level cache (SqueezeNet's, the stem pools of
        # GoogLeNet and Inception): priced from the in-cache probes above they came out 40-50% fast.
        Probe("maxpool 3x3/2 64x111 b16 split", pool("MaxPool", 64, 111, 3, 2, batch=16), split=True),
        Probe("maxpool 3x3/2 64x112 b16 split", pool("MaxPool", 64, 112, 3, 2, 1, batch=16), split=True),
        Probe("maxpool 3x3/1 192x28 b16 split", pool("MaxPool", 192, 28, 3, 1, 1, batch=16), split=True),
        Probe("maxpool 3x3/1 192x28 b8 split", pool("MaxPool", 192, 28, 3, 1, 1, batch=8), split=True),
        Probe("maxpool 3x3/2 480x27 b4 split", pool("MaxPool", 480, 27, 3, 2, batch=4), split=True),
        Probe("maxpool 2x2/2 64x224 b4 split", pool("MaxPool", 64, 224, 2, 2, batch=4), split=True),
        Probe("maxpool 2x2/2 256x56 b8 split", pool("MaxPool", 256, 56, 2, 2, batch=8), split=True),
        Probe("maxpool 2x2/2 512x14 b16 split", pool("MaxPool", 512, 14, 2, 2, batch=16), split=True),
        Probe("avgpool 3x3/1 256x28 b8 split", pool("AveragePool", 256, 28, 3, 1, 1, batch=8), split=True),
        Probe("avgpool 3x3/1 576x14 b8 split", pool("AveragePool", 576, 14, 3, 1, 1, batch=8), split=True),
        Probe("avgpool 3x3/1 1024x7 b16 split", pool("AveragePool", 1024, 7, 3, 1, 1, batch=16), split=True),
        Probe("maxpool 3x3/1 832x7 b16 split", pool("MaxPool", 832, 7, 3, 1, 1, batch=16), split=True),
        Probe("avgpool 3x3/2 240x56 b4 split", pool("AveragePool", 240, 56, 3, 2, 1, batch=4), split=True),
        Probe("lrn 96x55 b8 split", lrn(96, 55, 8), split=True),
        Probe("lrn 256x27 b8 split", lrn(256, 27, 8), split=True),
        # ZFNet's LRN at batch 16 (18 M elements, 8x the largest above): priced from those at 1.8x its time.
        Probe("lrn 96x109 b16 split", lrn(96, 109, 16), split=True),
        Probe("fc 800 -> 500 relu spin", fully_connected(1, 800, 500, relu=True), spin=True),
        Probe("fc 2048 -> 512 relu spin", fully_connected(1, 2048, 512, relu=True), spin=True),
        Probe("fc 1024 -> 64 spin", fully_connected(1, 1024, 64), spin=True),
        Probe("fc 512 -> 256 relu spin", fully_connected(1, 512, 256, relu=True), spin=True),
        # A small classifier's last layer: from the four above a 10-way one came out at 2.7 us, 1.5-1.8
        # measured (LeNet's, cifar10-quick's, the mentee's; 2026-12-07).
        Probe("fc 384 -> 10 spin", fully_connected(1, 384, 10), spin=True),
        Probe("fc 128 -> 10 spin", fully_connected(1, 128, 10), spin=True),
        # One example's classifier in a large network's spinning run (BLAS held at one thread): the
        # probes above all fit in L2, and from them AlexNet's 67 MB and 151 MB layers came out at 50-68
        # GB/s where they stream at 37-43 (its batch-1 estimate -20%).
        Probe("fc 4096 -> 4096 spin", fully_connected(1, 4096, 4096), spin=True, hold_blas=True),
        Probe("fc 4096 -> 1000 spin", fully_connected(1, 4096, 1000), spin=True, hold_blas=True),
        # ... and one past 100 MB: from the two above, ZFNet's 302 MB layer came out at 26 GB/s where it
        # streams at 35 (its batch-1 estimate +13.7%, 2026-12-07).
        Probe("fc 9216 -> 4096 spin", fully_connected(1, 9216, 4096), spin=True, hold_blas=True),
        Probe("fc 25088 -> 4096 b2", fully_connected(2, 25088, 4096)),
        Probe("fc 25088 -> 4096 b16 split", fully_connected(16, 25088, 4096), split=True),
        Probe("fc 4096 -> 4096 b16 split", fully_connected(16, 4096, 4096, relu=True), split=True),
        Probe("fc 2048 -> 1000 b16 split", fully_connected(16, 2048, 1000), split=True),
        Probe("matmul 512 -> 512 b64", matmul(64, 512, 512)),
        Probe("matmul 1280 -> 1000", matmul(1, 1280, 1000)),
        Probe("softmax 1000", unary("Softmax", (1, 1000)), True),
        Probe("softmax 1000 b16", unary("Softmax", (16, 1000))),
        Probe("softmax 10", unary("Softmax", (1, 10))),
        Probe("concat 4x 64x28", concat((1, 64, 28, 28), 4), True),
        Probe("concat 2x 128x56 b4", concat((4, 128, 56, 56), 2)),
        Probe("concat 3x 256x7", concat((1, 256, 7, 7), 3)),
        Probe("concat 2x 32x14 b8", concat((8, 32, 14, 14), 2)),
        Probe("transpose shuffle 4x60x28", transpose((1, 4, 60, 28, 28), (0, 2, 1, 3, 4)), True),
        Probe("transpose shuffle 4x120x14 b8", transpose((8, 4, 120, 14, 14), (0, 2, 1, 3, 4))),
        Probe("transpose 512x49", transpose((1, 512, 49), (0, 2, 1))),
        Probe("reshape 9216", reshape((1, 256, 6, 6), (1, 9216)), True),
        Probe("reshape 25088 b8", reshape((8, 512, 7, 7), (8, 25088))),
        Probe("flatten 1024", unary("Flatten", (1, 1024, 1, 1)), True),
        Probe("lstm 20x1x6 h128", lstm(20, 1, 6, 128), True),
        Probe("lstm 50x1x6 h512", lstm(50, 1, 6, 512)),
        Probe("lstm 20x16x64 h256", lstm(20, 16, 64, 256)),
        Probe("lstm 30x4x6 h512", lstm(30, 4, 6, 512)),
        Probe("lstm 100x1x6 h512 last", lstm(100, 1, 6, 512, last_only=True)),
        Probe("lstm 60x16x6 h512 last", lstm(60, 16, 6, 512, last_only=True)),
        Probe("lstm 40x2x6 h512 last", lstm(40, 2, 6, 512, last_only=True)),
        Probe("lstm 30x8x6 h512 last", lstm(30, 8, 6, 512, last_only=True)),
        Probe("lstm 20x32x6 h256", lstm(20, 32, 6, 256)),
        Probe("lstm 10x64x6 h512 last", lstm(10, 64, 6, 512, last_only=True)),
        # From ``jit_lstm.SPIN_MIN_BATCH`` columns a run holds the spinning pool for its LSTM's steps.
        Probe("lstm 20x64x6 h512 last spin", lstm(20, 64, 6, 512, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 30x16x6 h512 last spin", lstm(30, 16, 6, 512, last_only=True), True, spin=True, hold_blas=True),
        Probe("lstm 20x32x64 h256 spin", lstm(20, 32, 64, 256), spin=True, hold_blas=True),
        Probe("lstm 40x32x6 h512 last spin", lstm(40, 32, 6, 512, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 60x16x6 h512 last spin", lstm(60, 16, 6, 512, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 10x128x6 h384 last spin", lstm(10, 128, 6, 384, last_only=True), spin=True, hold_blas=True),
        # Longer sequences: a 16-column step reads 0.18 or 0.22 ms by the VM's state, and the short probes
        # alone let one slow reading set the per-step slope (lstm-gesture b16 came out +14-27%).
        Probe("lstm 80x16x6 h512 last spin", lstm(80, 16, 6, 512, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 50x48x6 h512 last spin", lstm(50, 48, 6, 512, last_only=True), spin=True, hold_blas=True),
        # One column spins from a size of R on (``jit_lstm.column_spins``): a GEMV a step on packed W and R,
        # streamed at one rate from H=256 to 640 (166-179 GB/s), H=128 with more per step. A step count is
        # a neighbour's distance too: with the H=512 probe at 50 steps, lstm-gesture's layer (100) came out
        # -9..-16%, no sample near enough to correct it (2026-12-07).
        Probe("lstm 100x1x6 h256 last spin", lstm(100, 1, 6, 256, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 60x1x6 h128 spin", lstm(60, 1, 6, 128), spin=True, hold_blas=True),
        Probe("lstm 80x1x6 h320 last spin", lstm(80, 1, 6, 320, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 60x1x6 h384 last spin", lstm(60, 1, 6, 384, last_only=True), spin=True, hold_blas=True),
        Probe("lstm 100x1x6 h512 last spin", lstm(100, 1, 6, 512, last_only=True), True, spin=True, hold_blas=True),
    ]
    probes += _elementwise_probes()
    return probes


def _elementwise_probes() -> list[Probe]:
    probes: list[Probe] = []
    for index, shape in enumerate([(1, 64, 112, 112), (1, 256, 28, 28), (4, 128, 28, 28), (1, 96, 14, 14),
                                   (16, 512, 7, 7), (8, 32, 112, 112), (1, 500)]):
        quick = index in (0, 3)
        dims = "x".join(str(d) for d in shape)
        probes.append(Probe(f"relu {dims}", unary("Relu", shape), quick))
        if index % 2 == 0:
            probes.append(Probe(f"clip {dims}", clip(shape), quick))
            probes.append(Probe(f"sigmoid {dims}", unary("Sigmoid", shape)))
        if len(shape) == 4:
            per_channel = (1, shape[1], 1, 1)
            probes.append(Probe(f"add {dims}", binary("Add", shape), quick))
            probes.append(Probe(f"sum {dims}", binary("Sum", shape)))
            probes.append(Probe(f"mul per-channel {dims}", binary("Mul", shape, per_channel, True), quick))
            probes.append(Probe(f"add per-channel {dims}", binary("Add", shape, per_channel, True)))
    return probes
