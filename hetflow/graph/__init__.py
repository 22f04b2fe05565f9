"""The intermediate representation every other unit reads: Graph, Node, Value."""

from hetflow.graph.dtypes import DType
from hetflow.graph.graph import Graph, Node, Value
from hetflow.graph.shapes import Dim, Shape

__all__ = ["DType", "Dim", "Graph", "Node", "Shape", "Value"]
