"""Typed exceptions. Anything a user can trigger raises one of these, with names and expectations."""

from __future__ import annotations

from dataclasses import dataclass


class HetflowError(Exception):
    """Base class of every error hetflow raises on purpose."""


class ModelLoadError(HetflowError):
    """The model file is missing, unreadable, corrupt, or not in a format hetflow reads."""


class InvalidModelError(HetflowError):
    """The model parsed but is inconsistent: bad attributes, shapes that do not agree, dangling names."""


@dataclass(frozen=True)
class UnsupportedNode:
    """One node hetflow cannot run, and why."""

    name: str
    op_type: str
    domain: str
    reason: str

    def describe(self) -> str:
        op = f"{self.domain}::{self.op_type}" if self.domain not in ("", "ai.onnx") else self.op_type
        return f"  node '{self.name}' ({op}): {self.reason}"


class UnsupportedOpsError(HetflowError):
    """Raised once per model, listing every node whose op hetflow cannot run."""

    def __init__(self, nodes: list[UnsupportedNode]):
        self.nodes = nodes
        op_types = sorted({n.op_type for n in nodes})
        lines = [f"{len(nodes)} node(s) use unsupported ops ({', '.join(op_types)}):"]
        lines += [n.describe() for n in nodes]
        super().__init__("\n".join(lines))


class FeedError(HetflowError, ValueError):
    """A feed passed to ``run`` has a wrong name, shape or dtype, or a required feed is missing."""


class DeviceUnavailableError(HetflowError):
    """A device asked for by name cannot start here."""


class KernelBuildError(HetflowError):
    """A device kernel failed to compile; carries the build log."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(f"{message}\n{log}" if log else message)


class BudgetError(HetflowError):
    """A plan cannot fit inside the memory budget the user set."""


class TuningError(HetflowError):
    """Auto-tuning failed or its cache is unusable."""
