"""Read the weights out of a ``.caffemodel``: a binary protobuf ``NetParameter``, decoded by hand.

Only the protobuf *wire format* is needed (no compiler, no caffe package): a message is a sequence of
``(field number << 3 | wire type)`` keys, each followed by a varint (type 0), 8 bytes (1), a
length-prefixed payload (2: strings, nested messages, packed repeated numbers) or 4 bytes (5).

The fields read (numbers from Caffe's ``caffe.proto``):

- ``NetParameter``: ``name`` = 1, ``layer`` = 100 (``LayerParameter``), legacy ``layers`` = 2
  (``V1LayerParameter``).
- ``LayerParameter``: ``name`` = 1, ``type`` = 2 (string), ``blobs`` = 7.
- ``V1LayerParameter``: ``name`` = 4, ``type`` = 5 (the ``LayerType`` enum), ``blobs`` = 6.
- ``BlobProto``: ``shape`` = 7 (``BlobShape``: ``dim`` = 1, packed int64), ``data`` = 5 (packed
  float), ``double_data`` = 8 (packed double), legacy 4-D ``num`` = 1, ``channels`` = 2, ``height`` = 3,
  ``width`` = 4.

Everything else (layer parameters, learning-rate multipliers, ``diff`` blobs) is skipped by length, so a
500 MB model is decoded with a handful of Python steps per layer and one ``np.frombuffer`` per blob.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetflow.errors import ModelLoadError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5

NET_NAME, NET_LAYER, NET_V1_LAYERS = 1, 100, 2
LAYER_NAME, LAYER_TYPE, LAYER_BLOBS = 1, 2, 7
V1_NAME, V1_TYPE, V1_BLOBS = 4, 5, 6
BLOB_NUM, BLOB_CHANNELS, BLOB_HEIGHT, BLOB_WIDTH = 1, 2, 3, 4
BLOB_DATA, BLOB_SHAPE, BLOB_DOUBLE_DATA = 5, 7, 8
SHAPE_DIM = 1

#: ``V1LayerParameter.LayerType``: enum number -> (V1 enum name, the V2 type string it became).
V1_LAYER_TYPES: dict[int, tuple[str, str]] = {
    0: ("NONE", ""),
    1: ("ACCURACY", "Accuracy"),
    2: ("BNLL", "BNLL"),
    3: ("CONCAT", "Concat"),
    4: ("CONVOLUTION", "Convolution"),
    5: ("DATA", "Data"),
    6: ("DROPOUT", "Dropout"),
    7: ("EUCLIDEAN_LOSS", "EuclideanLoss"),
    8: ("FLATTEN", "Flatten"),
    9: ("HDF5_DATA", "HDF5Data"),
    10: ("HDF5_OUTPUT", "HDF5Output"),
    11: ("IM2COL", "Im2col"),
    12: ("IMAGE_DATA", "ImageData"),
    13: ("INFOGAIN_LOSS", "InfogainLoss"),
    14: ("INNER_PRODUCT", "InnerProduct"),
    15: ("LRN", "LRN"),
    16: ("MULTINOMIAL_LOGISTIC_LOSS", "MultinomialLogisticLoss"),
    17: ("POOLING", "Pooling"),
    18: ("RELU", "ReLU"),
    19: ("SIGMOID", "Sigmoid"),
    20: ("SOFTMAX", "Softmax"),
    21: ("SOFTMAX_LOSS", "SoftmaxWithLoss"),
    22: ("SPLIT", "Split"),
    23: ("TANH", "TanH"),
    24: ("WINDOW_DATA", "WindowData"),
    25: ("ELTWISE", "Eltwise"),
    26: ("POWER", "Power"),
    27: ("SIGMOID_CROSS_ENTROPY_LOSS", "SigmoidCrossEntropyLoss"),
    28: ("HINGE_LOSS", "HingeLoss"),
    29: ("MEMORY_DATA", "MemoryData"),
    30: ("ARGMAX", "ArgMax"),
    31: ("THRESHOLD", "Threshold"),
    32: ("DUMMY_DATA", "DummyData"),
    33: ("SLICE", "Slice"),
    34: ("MVN", "MVN"),
    35: ("ABSVAL", "AbsVal"),
    36: ("SILENCE", "Silence"),
    37: ("CONTRASTIVE_LOSS", "ContrastiveLoss"),
    38: ("EXP", "Exp"),
    39: ("DECONVOLUTION", "Deconvolution"),
}
#: V1 enum name (as a V1 prototxt writes it, ``type: CONVOLUTION``) -> V2 type string.
V1_TYPE_NAMES: dict[str, str] = {enum: name for enum, name in V1_LAYER_TYPES.values() if name}


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


@dataclass
class LayerBlobs:
    """One layer's learned blobs as stored in a caffemodel."""

    name: str
    type: str
    blobs: list[np.ndarray]


@dataclass
class CaffeWeights:
    """The decoded weights of a caffemodel: net name and every layer that has a name, in file order."""

    name: str
    layers: dict[str, LayerBlobs]


# -- wire format ------------------------------------------------------------------------------------
def read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    """Decode the varint at ``pos``; returns (value, position after it)."""
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def iter_fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield ``(field number, wire type, value)`` for each field of one message.

    The value is an int for varint and fixed-width fields (fixed ones as unsigned little-endian bits)
    and a zero-copy memoryview of the payload for length-delimited ones.
    """
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(data, pos)
            yield number, wire, value
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > len(data):
                raise WireError("truncated fixed-width field")
            yield number, wire, int.from_bytes(data[pos:pos + width], "little")
            pos += width
        elif wire == LENGTH:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise WireError(f"field {number} claims {length} bytes; only {len(data) - pos} remain")
            yield number, wire, data[pos:pos + length]
            pos += length
        else:
            raise WireError(f"unsupported wire type {wire} (field {number})")


def _string(value: int | memoryview) -> str:
    if not isinstance(value, memoryview):
        raise WireError("expected a string, found a number")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as error:
        raise WireError(f"string is not UTF-8: {error}") from error


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _ints(wire: int, value: int | memoryview) -> list[int]:
    """A repeated integer field's values from one occurrence (packed or not)."""
    if wire == VARINT:
        assert isinstance(value, int)
        return [_signed64(value)]
    if wire == LENGTH:
        assert isinstance(value, memoryview)
        out, pos = [], 0
        while pos < len(value):
            item, pos = read_varint(value, pos)
            out.append(_signed64(item))
        return out
    raise WireError(f"integer field has wire type {wire}")


def _floats(wire: int, value: int | memoryview, dtype: str) -> np.ndarray:
    """A repeated float/double field's values from one occurrence (packed or not)."""
    width = np.dtype(dtype).itemsize
    if wire == LENGTH:
        assert isinstance(value, memoryview)
        if len(value) % width:
            raise WireError(f"packed {dtype} payload of {len(value)} bytes is not a multiple of {width}")
        return np.frombuffer(value, dtype=dtype)
    if wire == (FIXED32 if width == 4 else FIXED64):
        assert isinstance(value, int)
        return np.frombuffer(value.to_bytes(width, "little"), dtype=dtype)
    raise WireError(f"{dtype} field has wire type {wire}")


# -- Caffe messages ---------------------------------------------------------------------------------
def decode_blob(data: memoryview) -> np.ndarray:
    """A ``BlobProto`` as a float32 array of its declared shape."""
    shape: list[int] | None = None
    legacy = {BLOB_NUM: None, BLOB_CHANNELS: None, BLOB_HEIGHT: None, BLOB_WIDTH: None}
    chunks: list[np.ndarray] = []
    doubles: list[np.ndarray] = []
    for number, wire, value in iter_fields(data):
        if number == BLOB_SHAPE and wire == LENGTH:
            assert isinstance(value, memoryview)
            shape = [d for n, w, v in iter_fields(value) if n == SHAPE_DIM for d in _ints(w, v)]
        elif number == BLOB_DATA:
            chunks.append(_floats(wire, value, "<f4"))
        elif number == BLOB_DOUBLE_DATA:
            doubles.append(_floats(wire, value, "<f8"))
        elif number in legacy and wire == VARINT:
            assert isinstance(value, int)
            legacy[number] = _signed64(value)
    values = chunks if chunks else doubles
    array = (np.concatenate(values) if values else np.zeros(0)).astype(np.float32)
    if shape is None:
        # NOTE: old blobs are 4-D num x channels x height x width; absent dims default to 0 in the
        # proto, but a blob that carries data and no dims at all is read as a vector.
        dims = [legacy[k] for k in (BLOB_NUM, BLOB_CHANNELS, BLOB_HEIGHT, BLOB_WIDTH)]
        shape = [int(d) if d is not None else 0 for d in dims] if any(d is not None for d in dims) else [array.size]
    expected = int(np.prod(shape, dtype=np.int64))
    if expected != array.size:
        raise WireError(f"blob declares shape {tuple(shape)} ({expected} values) but holds {array.size}")
    return array.reshape(shape)


def _decode_layer(data: memoryview, v1: bool) -> LayerBlobs:
    name_field, type_field, blobs_field = (V1_NAME, V1_TYPE, V1_BLOBS) if v1 else (LAYER_NAME, LAYER_TYPE, LAYER_BLOBS)
    name, type_name, blobs = "", "", []
    for number, wire, value in iter_fields(data):
        if number == name_field and wire == LENGTH:
            name = _string(value)
        elif number == type_field:
            if v1 and wire == VARINT:
                assert isinstance(value, int)
                type_name = V1_LAYER_TYPES.get(value, (f"enum {value}", f"V1 type {value}"))[1]
            elif not v1 and wire == LENGTH:
                type_name = _string(value)
        elif number == blobs_field and wire == LENGTH:
            assert isinstance(value, memoryview)
            try:
                blobs.append(decode_blob(value))
            except WireError as error:
                raise WireError(f"layer '{name or '?'}' blob {len(blobs)}: {error}") from error
    return LayerBlobs(name, type_name, blobs)


def decode_caffemodel(data: bytes | memoryview, where: str = "caffemodel") -> CaffeWeights:
    """Decode a serialized ``NetParameter`` into its layers' blobs.

    Raises:
        ModelLoadError: the bytes are not a NetParameter (malformed, or no layers at all).
    """
    view = memoryview(data)
    name, layers = "", {}
    try:
        for number, wire, value in iter_fields(view):
            if number == NET_NAME and wire == LENGTH:
                name = _string(value)
            elif number in (NET_LAYER, NET_V1_LAYERS) and wire == LENGTH:
                assert isinstance(value, memoryview)
                layer = _decode_layer(value, v1=number == NET_V1_LAYERS)
                if layer.name:
                    layers[layer.name] = layer
    except WireError as error:
        raise ModelLoadError(f"{where}: not a valid caffemodel ({error})") from error
    if not layers:
        raise ModelLoadError(f"{where}: not a caffemodel (no named layers found)")
    return CaffeWeights(name, layers)


def read_caffemodel(path: str | os.PathLike) -> CaffeWeights:
    """Read and decode a ``.caffemodel`` file.

    Raises:
        ModelLoadError: the file is missing, unreadable or not a caffemodel.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"caffemodel not found: {path}")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    return decode_caffemodel(data, str(path))
