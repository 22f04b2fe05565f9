"""Zoo models built layer by layer with ``LayerBuilder`` (the seed papers' own benchmark networks).

Each builder returns an uncalibrated ModelProto; ``hetflow.zoo.build`` calibrates BatchNormalization
statistics afterwards where a model has any.
"""

from __future__ import annotations

import onnx

from hetflow.zoo.layers import LayerBuilder, Tensor, he_normal, small_normal


def lenet(seed: int) -> onnx.ModelProto:
    """Caffe's LeNet for MNIST (CNNdroid's first benchmark) on 1x28x28.

    conv 20 5x5 -> maxpool 2/2 -> conv 50 5x5 -> maxpool 2/2 -> FC 500 -> ReLU -> FC 10 -> Softmax.
    """
    b = LayerBuilder("lenet", seed)
    x = b.input("data", (1, 28, 28))
    x = b.max_pool(b.conv(x, 20, 5), 2, 2)
    x = b.max_pool(b.conv(x, 50, 5), 2, 2)
    x = b.relu(b.fc(b.flatten(x), 500))
    x = b.fc(x, 10, gain=1.0)
    return b.model([b.softmax(x)], doc=lenet.__doc__ or "")


def cifar10_quick(seed: int) -> onnx.ModelProto:
    """Caffe's cifar10_quick ("Alex's CIFAR-10" in CNNdroid) on 3x32x32.

    conv 32 5x5 pad 2 -> maxpool 3/2 -> ReLU -> conv 32 5x5 pad 2 -> ReLU -> avepool 3/2 ->
    conv 64 5x5 pad 2 -> ReLU -> avepool 3/2 -> FC 64 -> FC 10 -> Softmax. Caffe's pools round up
    (ceil_mode=1), so the maps go 32 -> 16 -> 8 -> 4.
    """
    b = LayerBuilder("cifar10_quick", seed)
    x = b.input("data", (3, 32, 32))
    x = b.relu(b.max_pool(b.conv(x, 32, 5, pad=2), 3, 2, ceil_mode=True))
    x = b.avg_pool(b.relu(b.conv(x, 32, 5, pad=2)), 3, 2, ceil_mode=True)
    x = b.avg_pool(b.relu(b.conv(x, 64, 5, pad=2)), 3, 2, ceil_mode=True)
    # NOTE: cifar10_quick has no ReLU between its two FC layers; gain 1 keeps the logits' scale.
    x = b.fc(b.flatten(x), 64, gain=1.0)
    x = b.fc(x, 10, gain=1.0)
    return b.model([b.softmax(x)], doc=cifar10_quick.__doc__ or "")


def mentee(seed: int) -> onnx.ModelProto:
    """TensorFlow+'s Mentee network (5 conv + 3 FC) for CIFAR-10 on 3x32x32.

    The TensorFlow+ paper gives only "five convolutional layers and three fully-connected layers"
    (after Venkatesan & Li, "Diving deeper into mentee networks"); the sizes here are our choice, a
    VGG-style mid-sized net: conv 3x3 pad 1 with 32, 32 | maxpool 2/2 | 64, 64 | maxpool 2/2 | 128 |
    maxpool 2/2 (each conv followed by ReLU) -> FC 512 -> ReLU -> FC 256 -> ReLU -> FC 10 -> Softmax.
    """
    b = LayerBuilder("mentee", seed)
    x = b.input("data", (3, 32, 32))
    for stage in ((32, 32), (64, 64), (128,)):
        for channels in stage:
            x = b.relu(b.conv(x, channels, 3, pad=1))
        x = b.max_pool(x, 2, 2)
    x = b.flatten(x)
    x = b.relu(b.fc(x, 512))
    x = b.relu(b.fc(x, 256))
    x = b.fc(x, 10, gain=1.0)
    return b.model([b.softmax(x)], doc=mentee.__doc__ or "")


LSTM_STEPS = 100
LSTM_FEATURES = 6
LSTM_UNITS = 512
GESTURES = 11


def lstm_gesture(seed: int) -> onnx.ModelProto:
    """RSTensorFlow's gesture classifier: 100 steps x 6 sensor features -> LSTM 512 -> FC 11 -> Softmax.

    The input is batch-major (N, 100, 6). ONNX Runtime's CPU LSTM lacks ``layout=1``, so the graph
    transposes to time-major (100, N, 6), runs a layout-0 LSTM, and classifies the last hidden state
    Y_h (1, N, 512), squeezed to (N, 512) along the constant direction axis.
    """
    b = LayerBuilder("lstm_gesture", seed)
    x = b.input("data", (LSTM_STEPS, LSTM_FEATURES))
    (time_major,) = b.node("Transpose", [x.name], "to_time_major", perm=[1, 0, 2])
    hidden = LSTM_UNITS
    # He-scaled input and recurrent weights: gate pre-activations are O(1) for unit-variance sensors
    # and the state neither dies out nor saturates over 100 steps.
    w = b.param("lstm_W", he_normal(b.rng, (1, 4 * hidden, LSTM_FEATURES), LSTM_FEATURES))
    r = b.param("lstm_R", he_normal(b.rng, (1, 4 * hidden, hidden), hidden))
    bias = small_normal(b.rng, (1, 8 * hidden))
    bias[0, 2 * hidden:3 * hidden] += 1.0  # forget-gate bias 1: the usual LSTM initialisation (gates i, o, f, c)
    _, last_hidden, _ = b.node(
        "LSTM", [time_major, w, r, b.param("lstm_B", bias)], "lstm", num_outputs=3, hidden_size=hidden,
        direction="forward", layout=0,
    )
    (features,) = b.node("Squeeze", [last_hidden, b.ints("direction_axis", [0])], "last_hidden")
    # NOTE: h = o * tanh(c) has an rms near 0.3, far below the unit scale He assumes; gain 16 brings
    # the logits to std ~1, so the 11-way softmax is neither uniform nor one-hot.
    logits = b.fc(Tensor(features, (hidden,)), GESTURES, gain=16.0)
    return b.model([b.softmax(logits)], doc=lstm_gesture.__doc__ or "")


#: MobileNetV2 1.0 body: (expansion t, output channels c, repeats n, first stride s), from the paper.
MOBILENET_V2_BLOCKS = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def mobilenetv2(seed: int) -> onnx.ModelProto:
    """MobileNetV2 1.0 at 224x224 (Sandler et al. 2018), as torchvision lays it out.

    conv 3x3/2 32 -> 17 inverted residual blocks (1x1 expand by t, depthwise 3x3, 1x1 linear
    project; residual Add when stride 1 and channels match) -> conv 1x1 1280 -> global average pool
    -> FC 1000 -> Softmax. Every conv is followed by BatchNormalization; ReLU6 is Clip(0, 6).
    """
    b = LayerBuilder("mobilenetv2", seed)
    x = b.input("data", (3, 224, 224))
    x = _conv_bn(b, x, 32, 3, stride=2, activate=True)
    for expansion, channels, repeats, first_stride in MOBILENET_V2_BLOCKS:
        for index in range(repeats):
            x = _inverted_residual(b, x, channels, expansion, first_stride if index == 0 else 1)
    x = _conv_bn(b, x, 1280, 1, stride=1, activate=True)
    x = b.flatten(b.global_avg_pool(x))
    x = b.fc(x, 1000, gain=1.0)
    return b.model([b.softmax(x)], doc=mobilenetv2.__doc__ or "")


def _conv_bn(
    b: LayerBuilder, x: Tensor, channels: int, kernel: int, stride: int, activate: bool, group: int = 1
) -> Tensor:
    y = b.batch_norm(b.conv(x, channels, kernel, stride, pad=kernel // 2, group=group, bias=False))
    return b.relu6(y) if activate else y


def _inverted_residual(b: LayerBuilder, x: Tensor, channels: int, expansion: int, stride: int) -> Tensor:
    hidden = x.channels * expansion
    y = _conv_bn(b, x, hidden, 1, stride=1, activate=True) if expansion != 1 else x
    y = _conv_bn(b, y, hidden, 3, stride=stride, activate=True, group=hidden)
    y = _conv_bn(b, y, channels, 1, stride=1, activate=False)
    if stride == 1 and x.channels == channels:
        y = b.add(x, y)
    return y


__all__ = ["cifar10_quick", "lenet", "lstm_gesture", "mentee", "mobilenetv2"]
