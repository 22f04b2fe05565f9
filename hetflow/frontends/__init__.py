"""Frontends turn model files into Graphs; ``load_model`` picks one by the source's form."""

from __future__ import annotations

import os

import onnx

from hetflow.frontends.onnx_import import ModelSource, import_onnx
from hetflow.graph import Graph
from hetflow.passes import fold_constants, infer_shapes

ZOO_PREFIX = "zoo:"


def load_model(source: ModelSource | Graph) -> Graph:
    """Load a model into a folded, shape-inferred Graph.

    Args:
        source: a path to an ``.onnx`` file, ``"zoo:NAME"`` for a built-in model, serialized ONNX
            bytes, an ``onnx.ModelProto``, or an existing Graph (returned as is).
    """
    if isinstance(source, Graph):
        return source
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).startswith(ZOO_PREFIX):
        from hetflow import zoo

        source = zoo.model_path(os.fspath(source)[len(ZOO_PREFIX):])
    graph = import_onnx(source)
    graph = infer_shapes(graph)
    graph = fold_constants(graph)
    return infer_shapes(graph)


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
