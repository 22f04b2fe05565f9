"""Opset normalisation: rewrite older ONNX op forms into the newest one before attributes are parsed.

Kernels and op definitions see one canonical form per op (the newest opset's), so the differences
between opsets 7..N are handled here, in one table, and nowhere else. Most rewrites move a value that
an older opset carried as an attribute (Slice's ``starts``, Squeeze's ``axes``, Clip's ``min``...) to the
input the newer opset reads it from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.errors import InvalidModelError


@dataclass
class RawNode:
    """A node between decoding and attribute parsing: attributes still a plain dict."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


class ConstantSink:
    """Where normalisers put the constants they create (the importer adds them as initializers)."""

    def __init__(self, add: Callable[[np.ndarray, str], str]):
        self._add = add

    def add(self, array: np.ndarray, hint: str) -> str:
        """Store ``array`` as a new initializer and return its (unique) name."""
        return self._add(array, hint)


Normaliser = Callable[[RawNode, int, ConstantSink], None]
_RULES: dict[str, list[tuple[int, Normaliser]]] = {}


def rule(op_type: str, before: int) -> Callable[[Normaliser], Normaliser]:
    """Register a normaliser applied to ``op_type`` nodes of models whose opset is < ``before``."""

    def decorate(fn: Normaliser) -> Normaliser:
        _RULES.setdefault(op_type, []).append((before, fn))
        return fn

    return decorate


def normalise(node: RawNode, opset: int, constants: ConstantSink) -> None:
    """Rewrite ``node`` in place into the canonical (newest-opset) form."""
    for before, fn in _RULES.get(node.op_type, []):
        if opset < before:
            fn(node, opset, constants)


def _set_input(node: RawNode, index: int, name: str) -> None:
    while len(node.inputs) <= index:
        node.inputs.append("")
    node.inputs[index] = name


def _attr_to_input(
    node: RawNode, constants: ConstantSink, attr: str, index: int, dtype: type = np.int64
) -> None:
    if attr in node.attrs:
        value = np.asarray(node.attrs.pop(attr), dtype=dtype)
        _set_input(node, index, constants.add(value, f"{node.name}_{attr}"))


@rule("Slice", before=10)
def _slice_inputs(node: RawNode, opset: int, constants: ConstantSink) -> None:
    for index, attr in enumerate(("starts", "ends", "axes"), start=1):
        _attr_to_input(node, constants, attr, index)


@rule("Split", before=13)
def _split_input(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "split", 1)


@rule("Squeeze", before=13)
@rule("Unsqueeze", before=13)
def _axes_input(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "axes", 1)


@rule("ReduceMean", before=18)
def _reduce_axes_input(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "axes", 1)


@rule("Pad", before=11)
def _pad_inputs(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "pads", 1)
    # NOTE: the constant's dtype must match the data's, unknown here; float32 is what opset < 11
    # allowed (float types only) and the kernel casts it to the data's dtype.
    _attr_to_input(node, constants, "value", 2, dtype=np.float32)


@rule("Clip", before=11)
def _clip_inputs(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "min", 1, dtype=np.float32)
    _attr_to_input(node, constants, "max", 2, dtype=np.float32)


@rule("Dropout", before=12)
def _dropout_ratio_input(node: RawNode, opset: int, constants: ConstantSink) -> None:
    _attr_to_input(node, constants, "ratio", 1, dtype=np.float32)
    node.attrs.pop("is_test", None)


@rule("Softmax", before=13)
@rule("LogSoftmax", before=13)
def _softmax_coerce_2d(node: RawNode, opset: int, constants: ConstantSink) -> None:
    # Before opset 13 the input was flattened to 2-D at ``axis`` (default 1) and normalised over
    # everything after it; the canonical form keeps that meaning in ``coerce_2d``.
    node.attrs.setdefault("axis", 1)
    node.attrs["coerce_2d"] = 1


@rule("BatchNormalization", before=9)
def _batchnorm_spatial(node: RawNode, opset: int, constants: ConstantSink) -> None:
    node.attrs.pop("is_test", None)
    node.attrs.pop("consumed_inputs", None)


@rule("BatchNormalization", before=14)
def _batchnorm_training_outputs(node: RawNode, opset: int, constants: ConstantSink) -> None:
    # Before opset 14 the outputs alone chose the mode: Y only is inference; Y, mean, var (updated
    # running statistics, same formula as opset 14's) plus saved_mean, saved_var is training.
    while len(node.outputs) > 1 and not node.outputs[-1]:
        node.outputs.pop()
    if len(node.outputs) > 3:
        raise InvalidModelError(
            f"node '{node.name}' (BatchNormalization, opset {opset}): the saved_mean / saved_var "
            "training outputs are not supported; only Y, mean and var are"
        )
    if len(node.outputs) > 1:
        node.attrs["training_mode"] = 1
