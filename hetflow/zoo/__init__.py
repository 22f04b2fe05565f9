"""The model zoo: the seed papers' benchmark networks as ONNX models with seeded random weights.

Every model is opset 17, IR 8, float32, with a symbolic batch dimension "N" on its input and output,
He-normal conv/FC weights and BatchNormalization statistics calibrated on random data, so its
outputs are finite and differ between inputs. Weights are random: the models are for timing,
estimating and checking numerics, not for accuracy.

Example::

    from hetflow import zoo
    [entry.name for entry in zoo.list_models()]
    model = zoo.build("lenet", seed=0)      # onnx.ModelProto
    path = zoo.model_path("resnet50")       # built once, cached under $HETFLOW_HOME/zoo
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from hetflow.errors import ModelLoadError
from hetflow.options import home_dir
from hetflow.zoo import demos, nets
from hetflow.zoo.calibrate import calibrate_batchnorm
from hetflow.zoo.light import from_light_model

#: Bump whenever any builder's output changes: it is part of every cached file name.
ZOO_VERSION = 1
#: Images (sequences) in the random batch BatchNormalization statistics are computed from.
CALIBRATION_BATCH = 4

Shape = tuple[int | str, ...]


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model.

    Attributes:
        name: what ``build``, ``model_path`` and ``"zoo:NAME"`` accept.
        description: the architecture in a line.
        source: where the architecture comes from ("onnx light model ..." or "built with onnx.helper").
        paper: which seed paper(s) benchmark this network.
        input_shape: the input's shape, batch as "N".
        num_classes: size of the output's class axis.
    """

    name: str
    description: str
    source: str
    paper: str
    input_shape: Shape
    num_classes: int
    builder: Callable[[int], onnx.ModelProto] = field(repr=False, compare=False)


def _light(stem: str) -> Callable[[int], onnx.ModelProto]:
    def build_light(seed: int) -> onnx.ModelProto:
        return from_light_model(stem, seed)

    build_light.__name__ = f"light_{stem}"
    return build_light


_IMAGENET: Shape = ("N", 3, 224, 224)
_ENTRIES = (
    ZooEntry("alexnet", "AlexNet (BVLC Caffe): 5 conv, 2 LRN, 3 FC, softmax",
             "onnx light model bvlc_alexnet", "CNNdroid, Augur", _IMAGENET, 1000, _light("bvlc_alexnet")),
    ZooEntry("zfnet512", "ZFNet-512: AlexNet-like, 5 conv, 2 LRN, 3 FC, softmax",
             "onnx light model zfnet512", "Augur (AlexNet family)", _IMAGENET, 1000, _light("zfnet512")),
    ZooEntry("vgg19", "VGG-19: 16 conv 3x3, 5 max pools, 3 FC, softmax",
             "onnx light model vgg19", "Augur (VGGNet)", _IMAGENET, 1000, _light("vgg19")),
    ZooEntry("googlenet", "GoogLeNet / Inception v1: 57 conv in 9 inception modules, 2 LRN, softmax",
             "onnx light model inception_v1", "RSTensorFlow (Inception), Augur", _IMAGENET, 1000,
             _light("inception_v1")),
    ZooEntry("inception_v2", "Inception v2 (BN-Inception): 69 conv + BN, softmax",
             "onnx light model inception_v2", "RSTensorFlow (Inception family)", _IMAGENET, 1000,
             _light("inception_v2")),
    ZooEntry("resnet50", "ResNet-50: 53 conv + BN, 16 residual blocks, softmax",
             "onnx light model resnet50", "Augur (ResNet)", _IMAGENET, 1000, _light("resnet50")),
    ZooEntry("squeezenet", "SqueezeNet 1.0: 8 fire modules, global average pool, softmax",
             "onnx light model squeezenet", "mobile CNN (no seed experiment)", _IMAGENET, 1000,
             _light("squeezenet")),
    ZooEntry("shufflenet", "ShuffleNet (g=4): grouped 1x1 conv, channel shuffle, depthwise 3x3, softmax",
             "onnx light model shufflenet", "mobile CNN (no seed experiment)", _IMAGENET, 1000,
             _light("shufflenet")),
    ZooEntry("densenet121", "DenseNet-121: 120 conv + BN in 4 dense blocks, 1x1 conv classifier (logits)",
             "onnx light model densenet121", "mobile CNN (no seed experiment)", _IMAGENET, 1000,
             _light("densenet121")),
    ZooEntry("lenet", "Caffe LeNet: conv 20, pool, conv 50, pool, FC 500, ReLU, FC 10, softmax",
             "built with onnx.helper", "CNNdroid", ("N", 1, 28, 28), 10, nets.lenet),
    ZooEntry("cifar10-quick", "Caffe cifar10_quick: 3 conv 5x5, max/ave pools, FC 64, FC 10, softmax",
             "built with onnx.helper", "CNNdroid (Alex's CIFAR-10)", ("N", 3, 32, 32), 10, nets.cifar10_quick),
    ZooEntry("mentee", "Mentee net: 5 conv 3x3 + 3 FC for CIFAR-10 (sizes chosen, see docstring)",
             "built with onnx.helper", "TensorFlow+", ("N", 3, 32, 32), 10, nets.mentee),
    ZooEntry("lstm-gesture", "LSTM 512 units over 100 steps of 6 sensor features, FC 11, softmax",
             "built with onnx.helper", "RSTensorFlow", ("N", nets.LSTM_STEPS, nets.LSTM_FEATURES),
             nets.GESTURES, nets.lstm_gesture),
    ZooEntry("mobilenetv2", "MobileNetV2 1.0: 17 inverted residual blocks, BN, ReLU6, FC 1000, softmax",
             "built with onnx.helper", "mobile CNN (no seed experiment)", _IMAGENET, 1000, nets.mobilenetv2),
)
#: Demos: trained weights (built by training on real data on first use), kept apart from the seeded
#: benchmark models above (see ``hetflow.zoo.demos``).
_DEMOS = (
    ZooEntry("lenet-digits", "Caffe LeNet trained by hetflow on scikit-learn's digits (~98% test accuracy)",
             "zoo lenet trained with hetflow.train", "TensorFlow+ (on-device training)", ("N", 1, 28, 28), 10,
             demos.lenet_digits),
)
_BY_NAME = {entry.name: entry for entry in _ENTRIES + _DEMOS}


def list_models() -> list[ZooEntry]:
    """Every zoo model, in a stable order (the light ImageNet models first)."""
    return list(_ENTRIES)


def list_demos() -> list[ZooEntry]:
    """The trained demo models (``zoo:lenet-digits``): built by training once, then cached."""
    return list(_DEMOS)


def entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``.

    Raises:
        ModelLoadError: no such model; the message lists the known names.
    """
    found = _BY_NAME.get(name)
    if found is None:
        raise ModelLoadError(f"unknown zoo model '{name}'; the zoo has: {', '.join(_BY_NAME)}")
    return found


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model ``name`` with weights drawn from ``seed`` (same seed, same bytes).

    BatchNormalization statistics are computed by one forward pass over a random batch on
    hetflow's CPU kernels.

    Raises:
        ModelLoadError: unknown name.
    """
    chosen = entry(name)
    model = chosen.builder(seed)
    sample_shape = tuple(CALIBRATION_BATCH if dim == "N" else dim for dim in chosen.input_shape)
    sample = np.random.default_rng([seed, 1]).standard_normal(sample_shape).astype(np.float32)
    calibrate_batchnorm(model, sample)
    model.graph.name = chosen.name
    del model.metadata_props[:]
    onnx.helper.set_model_props(
        model, {"hetflow.zoo.name": chosen.name, "hetflow.zoo.seed": str(seed),
                "hetflow.zoo.version": str(ZOO_VERSION)},
    )
    return model


def cache_dir() -> Path:
    """Where built zoo models are cached: ``<hetflow home>/zoo``."""
    return home_dir() / "zoo"


def model_path(name: str, seed: int = 0) -> Path:
    """The path of zoo model ``name`` as an .onnx file, building and caching it on first use.

    The file name carries the zoo version, so a changed builder never reuses a stale file. The file
    is written to a temporary name and renamed, so concurrent processes never read half a model.

    Raises:
        ModelLoadError: unknown name.
    """
    entry(name)
    directory = cache_dir()
    path = directory / f"{name}-seed{seed}-zoo{ZOO_VERSION}.onnx"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    data = build(name, seed).SerializeToString()
    handle, temporary = tempfile.mkstemp(prefix=f".{name}-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


__all__ = ["ZOO_VERSION", "ZooEntry", "build", "cache_dir", "entry", "list_demos", "list_models", "model_path"]
