"""Frontends turn model files into Graphs (ONNX; Caffe prototxt + caffemodel); ``load_model`` picks one
by the source's form."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from hetflow.errors import ModelLoadError
from hetflow.frontends.caffe import CAFFEMODEL_SUFFIX, PROTOTXT_SUFFIXES, import_caffe
from hetflow.frontends.onnx_import import ModelSource, import_onnx
from hetflow.graph import Graph
from hetflow.passes import fold_constants, infer_shapes

ZOO_PREFIX = "zoo:"


def load_model(source: ModelSource | Graph, weights: str | os.PathLike | None = None) -> Graph:
    """Load a model into a folded, shape-inferred Graph.

    Args:
        source: a path to an ``.onnx`` file, a Caffe deploy ``.prototxt``, ``"zoo:NAME"`` for a built-in
            model, serialized ONNX bytes, an ``onnx.ModelProto``, or an existing Graph (returned as is).
        weights: for a ``.prototxt`` only: its ``.caffemodel``. When omitted, a ``.caffemodel`` beside
            the prototxt with the same stem is used if there is one; otherwise the weights are
            placeholders (``graph.metadata["weights"] == "placeholder"``), enough to estimate.

    Raises:
        ModelLoadError: unreadable source, or ``weights`` given for a format that has none.
    """
    if isinstance(source, Graph):
        return source
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).startswith(ZOO_PREFIX):
        from hetflow import zoo

        source = zoo.model_path(os.fspath(source)[len(ZOO_PREFIX):])
    if _is_caffe(source):
        graph = import_caffe(source, weights if weights is not None else _caffemodel_beside(source))
    elif weights is not None:
        raise ModelLoadError("weights= only applies to a Caffe .prototxt; ONNX models carry their weights")
    else:
        graph = import_onnx(source)
    graph = infer_shapes(graph)
    graph = fold_constants(graph)
    return infer_shapes(graph)


def _is_caffe(source: ModelSource) -> bool:
    """Whether ``source`` names a Caffe file (a weights-only .caffemodel is refused with a hint)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    suffix = Path(os.fspath(source)).suffix.lower()
    if suffix == CAFFEMODEL_SUFFIX:
        raise ModelLoadError(
            f"{os.fspath(source)} holds weights only; load the deploy .prototxt and pass weights=this file"
        )
    return suffix in PROTOTXT_SUFFIXES


def _caffemodel_beside(prototxt: str | os.PathLike) -> Path | None:
    candidate = Path(prototxt).with_suffix(CAFFEMODEL_SUFFIX)
    return candidate if candidate.is_file() else None


def describe_source(source: ModelSource | Graph) -> str:
    """A short name for messages: the path, the zoo name, or the kind of object."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, onnx.ModelProto):
        return source.graph.name or "model"
    if isinstance(source, Graph):
        return source.name
    return "model bytes"


__all__ = ["ZOO_PREFIX", "describe_source", "load_model"]
