"""Graph-to-graph rewrites. Each pass is a function ``Graph -> Graph`` with its own tests."""

from hetflow.passes.fold_constants import fold_constants
from hetflow.passes.infer_shapes import bind_batch, infer_shapes

__all__ = ["bind_batch", "fold_constants", "infer_shapes"]
