"""``onnx.backend.base.Backend`` for hetflow, so ONNX's own test suites can drive it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from hetflow.errors import HetflowError
from hetflow.ops import registry
from hetflow.runtime.session import InferenceSession


class HetflowRep(BackendRep):
    """A prepared model: runs positional inputs in graph-input order."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            names = [arg.name for arg in self.session.get_inputs()]
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class HetflowBackend(Backend):
    """Runs ONNX models through an InferenceSession on the given device (``"CPU"`` -> ``"cpu"``)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return all(
            node.op_type == "Constant" or registry.lookup(node.op_type, node.domain) is not None
            for node in model.graph.node
        )

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> HetflowRep:
        return HetflowRep(InferenceSession(model, device=_device_id(device)))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[np.ndarray],
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        raise HetflowError("run_node is not supported; wrap the node in a model and use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


def _device_id(device: str) -> str:
    return "cpu" if device.upper() == "CPU" else device


prepare = HetflowBackend.prepare
run_model = HetflowBackend.run_model
supports_device = HetflowBackend.supports_device
