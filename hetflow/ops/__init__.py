"""Operator definitions, one module per family; importing this package registers them all."""

from hetflow.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    conv,
    elementwise,
    gemm,
    norm,
    pool,
    reduce,
    rnn,
    softmax,
    tensor,
)
from hetflow.ops.base import Cost, GemmDims, OpDef, TensorInfo
from hetflow.ops.registry import get, lookup, register_op, registered_ops

__all__ = ["Cost", "GemmDims", "OpDef", "TensorInfo", "get", "lookup", "register_op", "registered_ops"]
