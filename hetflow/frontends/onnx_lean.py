"""Read an ONNX file without holding its weights twice.

``onnx.load`` keeps every weight in the parsed message, and converting them to arrays makes a second
copy, so loading VGG-19 (548 MB of weights) peaked at twice that. Here the file is scanned in protobuf's
wire format instead: the message is rebuilt without the ``raw_data`` of the large top-level initializers
(a few kilobytes to parse), and each of those is read from the file straight into its own array. The
weights then exist once, and the file's pages stay in the page cache, not in this process. Each array
read so remembers where it came from (``file_origin``): a kernel that keeps the weights in a layout of
its own can map the file instead of holding the raw array beside its copy (``runtime.held_weights``).

Only the path from ``ModelProto.graph`` (field 7) to ``GraphProto.initializer`` (field 5) to
``TensorProto.raw_data`` (field 9) is taken apart; every other field is copied through unchanged. A
file this scanner does not understand is left to the full parser (``Lean.of`` returns None).
"""

from __future__ import annotations

import mmap
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from hetflow.errors import InvalidModelError

#: raw_data this long or longer is read from the file; shorter stays in the message.
MIN_STREAMED_BYTES = 64 * 1024

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DATA_TYPE = 2
_TENSOR_RAW_DATA = 9
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

# Element types stored in raw_data exactly as numpy holds them (little-endian); the others (bfloat16,
# float8, 4-bit, strings) keep numpy_helper's conversions.
_PLAIN_TYPES = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT8: np.int8, onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64, onnx.TensorProto.BOOL: np.bool_,
}  # fmt: skip


@dataclass(frozen=True)
class FileOrigin:
    """Where an array read from a model file lies in it: its bytes from ``offset``, as stored."""

    path: Path
    offset: int
    #: the file's size and modification time when it was read (``file_origin`` checks them)
    stamp: tuple[int, int]

    def mapped(self, array: np.ndarray) -> np.ndarray:
        """A read-only mapping of the file with ``array``'s dtype and shape (its pages not resident)."""
        return np.memmap(self.path, array.dtype, "r", self.offset, array.shape)

    def rows(self, array: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Rows ``start .. stop - 1`` of ``array`` (2-D, as stored) read from the file into a new array,
        without mapping it (a mapping's pages would count as this process's memory)."""
        width = int(array.shape[1])
        out = np.empty((stop - start, width), array.dtype)
        with open(self.path, "rb") as file:
            file.seek(self.offset + start * width * array.dtype.itemsize)
            if file.readinto(memoryview(out.reshape(-1)).cast("B")) != out.nbytes:
                raise InvalidModelError(f"{self.path}: the file ends inside a weight's data")
        return out


#: id of an array ``Lean.read`` made -> (a weak reference to it, its origin).
_ORIGINS: dict[int, tuple[weakref.ref, FileOrigin]] = {}
_ORIGINS_LOCK = threading.Lock()


def file_origin(array: np.ndarray) -> FileOrigin | None:
    """Where ``array`` was read from, if ``Lean.read`` read it and the file has not changed since, else
    None."""
    found = _ORIGINS.get(id(array))
    if found is None or found[0]() is not array:
        return None
    origin = found[1]
    return origin if _stamp(origin.path) == origin.stamp else None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def _remember(array: np.ndarray, origin: FileOrigin) -> None:
    key = id(array)

    def forget(reference: weakref.ref) -> None:
        # NOTE: no lock here: the collector may call this inside the locked section below.
        if _ORIGINS.get(key, (None,))[0] is reference:
            del _ORIGINS[key]

    with _ORIGINS_LOCK:
        _ORIGINS[key] = (weakref.ref(array, forget), origin)


class _NotUnderstood(Exception):
    """The bytes are not protobuf this scanner can take apart (the full parser will say why)."""


@dataclass(frozen=True)
class Span:
    """Where one initializer's raw_data lies in the file."""

    offset: int
    length: int


@dataclass(frozen=True)
class Lean:
    """A model's message without its large weights, and where those weights are in its file."""

    message: bytes
    #: index in ``graph.initializer`` -> its raw_data's place in the file
    spans: dict[int, Span]
    path: Path

    @classmethod
    def of(cls, path: Path) -> Lean | None:
        """Scan ``path``; None where the file is empty, not protobuf this scanner follows, or worth
        nothing to scan (no initializer large enough), and on a big-endian machine."""
        if sys.byteorder != "little":
            return None
        with open(path, "rb") as file:
            if path.stat().st_size == 0:
                return None
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                spans: list[Span | None] = []
                try:
                    message = _rebuild(data, 0, len(data), _model_field, spans)
                except (_NotUnderstood, IndexError):
                    return None
        found = {index: span for index, span in enumerate(spans) if span is not None}
        return cls(message, found, path) if found else None

    def read(self, tensor: onnx.TensorProto, span: Span) -> np.ndarray:
        """The initializer ``tensor`` (parsed from ``message``) with its data read from the file."""
        dtype = np.dtype(_PLAIN_TYPES[tensor.data_type])
        shape = tuple(int(d) for d in tensor.dims)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != span.length:
            raise InvalidModelError(
                f"tensor '{tensor.name}': {span.length} bytes of raw_data for shape {list(shape)} of {dtype}"
            )
        array = np.empty(shape, dtype)
        with open(self.path, "rb") as file:
            file.seek(span.offset)
            if file.readinto(memoryview(array.reshape(-1)).cast("B")) != span.length:
                raise InvalidModelError(f"tensor '{tensor.name}': the file ends inside its data")
        _remember(array, FileOrigin(self.path.resolve(), span.offset, _stamp(self.path)))
        return array


# -- the wire format ---------------------------------------------------------------------------------
def _varint(data: mmap.mmap, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise _NotUnderstood


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data: mmap.mmap, start: int, end: int):  # noqa: ANN202 (a generator of tuples)
    """(field number, wire type, where the field starts, where its value starts, where it ends)."""
    position = start
    while position < end:
        key, value_start = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            _, value_end = _varint(data, value_start)
        elif wire_type == _FIXED64:
            value_end = value_start + 8
        elif wire_type == _FIXED32:
            value_end = value_start + 4
        elif wire_type == _LENGTH:
            length, value_start = _varint(data, value_start)
            value_end = value_start + length
        else:
            raise _NotUnderstood  # groups: not in ONNX
        if value_end > end or number == 0:
            raise _NotUnderstood
        yield number, wire_type, position, value_start, value_end
        position = value_end


_DROP = object()  # a rewrite's answer for a field to leave out


def _rebuild(data: mmap.mmap, start: int, end: int, rewrite, spans: list[Span | None]) -> bytes:  # noqa: ANN001
    """The message in ``data[start:end]`` with each field passed through ``rewrite(data, number, wire
    type, value start, value end, spans)``, which returns the field's new value, None to copy it
    unchanged, or ``_DROP`` to leave it out."""
    out = bytearray()
    for number, wire_type, field_start, value_start, value_end in _fields(data, start, end):
        value = rewrite(data, number, wire_type, value_start, value_end, spans)
        if value is None:
            out += data[field_start:value_end]
        elif value is not _DROP:
            out += _encode_varint(number << 3 | wire_type) + _encode_varint(len(value)) + value
    return bytes(out)


def _model_field(data, number, wire_type, start, end, spans):  # noqa: ANN001, ANN202
    if number == _MODEL_GRAPH and wire_type == _LENGTH:
        return _rebuild(data, start, end, _graph_field, spans)
    return None


def _graph_field(data, number, wire_type, start, end, spans):  # noqa: ANN001, ANN202
    if number == _GRAPH_INITIALIZER and wire_type == _LENGTH:
        span, data_type = None, None
        for field, kind, _, value_start, value_end in _fields(data, start, end):
            if field == _TENSOR_RAW_DATA and kind == _LENGTH:
                span = Span(value_start, value_end - value_start)
            elif field == _TENSOR_DATA_TYPE and kind == _VARINT:
                data_type, _ = _varint(data, value_start)
        if span is None or span.length < MIN_STREAMED_BYTES or data_type not in _PLAIN_TYPES:
            spans.append(None)
            return None
        spans.append(span)
        return _rebuild(data, start, end, _without_raw_data, spans)
    return None


def _without_raw_data(data, number, wire_type, start, end, spans):  # noqa: ANN001, ANN202
    return _DROP if number == _TENSOR_RAW_DATA else None
