"""One dtype table: numpy <-> ONNX element types."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

DType = np.dtype

_ONNX_TO_NUMPY: dict[int, np.dtype] = {}
for _elem_type in TensorProto.DataType.values():
    if _elem_type == TensorProto.UNDEFINED:
        continue
    try:
        _ONNX_TO_NUMPY[_elem_type] = np.dtype(helper.tensor_dtype_to_np_dtype(_elem_type))
    except (KeyError, TypeError, ValueError):
        continue
# NOTE: several ONNX types (e.g. float8 variants) map to the same numpy stand-in; the first mapping wins
# for the reverse direction, which is why the reverse table is built from an explicit, preferred list.
_PREFERRED = [
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.INT16,
    TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
    TensorProto.UINT64, TensorProto.BOOL, TensorProto.STRING,
    # ml_dtypes' stand-ins (each a distinct numpy dtype): lets such tensors be fed and described.
    TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT8E8M0, TensorProto.INT4, TensorProto.UINT4,
    TensorProto.INT2, TensorProto.UINT2, TensorProto.FLOAT4E2M1,
]
_NUMPY_TO_ONNX: dict[np.dtype, int] = {_ONNX_TO_NUMPY[t]: t for t in _PREFERRED if t in _ONNX_TO_NUMPY}


def from_onnx(elem_type: int) -> np.dtype:
    """The numpy dtype for an ONNX ``TensorProto`` element type."""
    try:
        return _ONNX_TO_NUMPY[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise TypeError(f"ONNX element type {name} has no numpy equivalent") from None


def to_onnx(dtype: np.dtype | type) -> int:
    """The ONNX element type for a numpy dtype."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("U", "S", "O"):
        return TensorProto.STRING
    try:
        return _NUMPY_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"numpy dtype {dtype} has no ONNX equivalent") from None


def onnx_name(dtype: np.dtype) -> str:
    """ONNX Runtime's spelling of a tensor type, e.g. ``tensor(float)``."""
    elem = to_onnx(dtype)
    return f"tensor({TensorProto.DataType.Name(elem).lower()})"
