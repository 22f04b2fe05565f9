"""The one lookup point for operator definitions."""

from __future__ import annotations

from typing import TypeVar

from hetflow.errors import UnsupportedNode
from hetflow.ops.base import OpDef

_OPS: dict[tuple[str, str], OpDef] = {}
_DEFAULT_DOMAINS = ("", "ai.onnx")

T = TypeVar("T", bound=type[OpDef])


def register_op(cls: T) -> T:
    """Class decorator: make an OpDef subclass known under its ``op_type`` and ``domain``."""
    key = (_canonical_domain(cls.domain), cls.op_type)
    if key in _OPS:
        raise RuntimeError(f"op {cls.op_type} registered twice")
    _OPS[key] = cls()
    return cls


def _canonical_domain(domain: str) -> str:
    return "" if domain in _DEFAULT_DOMAINS else domain


def lookup(op_type: str, domain: str = "") -> OpDef | None:
    """The definition of ``op_type``, or None when hetflow does not know it."""
    _ensure_loaded()
    return _OPS.get((_canonical_domain(domain), op_type))


def get(op_type: str, domain: str = "") -> OpDef:
    """The definition of ``op_type``; raises KeyError when unknown."""
    opdef = lookup(op_type, domain)
    if opdef is None:
        raise KeyError(f"unknown op {op_type!r} (domain {domain!r})")
    return opdef


def registered_ops() -> list[str]:
    """Names of every op hetflow defines (default domain), sorted."""
    _ensure_loaded()
    return sorted(op for domain, op in _OPS if domain == "")


def unsupported_reason(op_type: str, domain: str) -> str | None:
    """Why an op cannot be imported, or None when it can."""
    if lookup(op_type, domain) is not None:
        return None
    if _canonical_domain(domain) != "":
        return f"operator domain '{domain}' is not supported"
    return "hetflow has no definition for this op"


def describe_unsupported(name: str, op_type: str, domain: str) -> UnsupportedNode | None:
    reason = unsupported_reason(op_type, domain)
    return None if reason is None else UnsupportedNode(name, op_type, domain, reason)


def _ensure_loaded() -> None:
    # NOTE: the families are imported lazily so that ``registry`` can be imported by them.
    import hetflow.ops  # noqa: F401
