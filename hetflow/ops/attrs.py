"""Attribute schemas: each op declares a frozen dataclass whose fields are its ONNX attributes.

Defaults live in exactly one place (the dataclass), the importer converts ONNX attributes once, and
kernels read typed fields (``node.attrs.strides``) instead of looking strings up in a dict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hetflow.errors import InvalidModelError

_REQUIRED_KEY = "hetflow_required"


def required() -> Any:
    """Mark a dataclass field as a required attribute (ONNX raises when it is absent)."""
    return dataclasses.field(default=None, metadata={_REQUIRED_KEY: True})


@dataclasses.dataclass(frozen=True)
class NoAttrs:
    """The attribute object of ops that take no attributes."""


def parse_attrs(schema: type, raw: dict[str, Any], *, op_type: str, node_name: str) -> Any:
    """Build ``schema`` from raw attribute values; unknown or missing-required attributes raise.

    Args:
        schema: the op's frozen attrs dataclass.
        raw: attribute name -> Python value (ints, floats, str, tuples, numpy arrays, graphs).
        op_type: for error messages.
        node_name: for error messages.
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise InvalidModelError(
            f"node '{node_name}' ({op_type}) has unknown attribute(s) {unknown}; {op_type} accepts: {allowed}"
        )
    missing = [
        name for name, f in fields.items() if f.metadata.get(_REQUIRED_KEY) and name not in raw
    ]
    if missing:
        raise InvalidModelError(f"node '{node_name}' ({op_type}) lacks required attribute(s) {missing}")
    return schema(**raw)


def replace(attrs: Any, **changes: Any) -> Any:
    """A copy of an attrs object with some fields changed (passes use this to rewrite nodes)."""
    return dataclasses.replace(attrs, **changes)
