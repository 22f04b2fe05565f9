"""Where a training step runs: the devices, per node the forward kernel and backward rule, and the
device's loss and optimizer updates.

Placement is the inference planner's (``hetflow.runtime.planner.make_plan``): every device, in priority
order, is asked for a kernel for each node, host-side shape arithmetic stays on the CPU, and the CPU
takes whatever no accelerator supports. A node's backward rule runs where its forward kernel ran when
that device has a rule for it (``TrainingKernels.backward``, asked with the same ``supports``
contract); otherwise the op's numpy rule runs (``OpDef.backward``). Losses and optimizer updates follow
the same "the device declares what it has, the host does the rest" rule.

A device package contributes its training kernels through one function, ``register_training(device,
kernels)``, found through ``TRAINING_REGISTRARS`` by device kind.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.base import Device, KernelTable
from hetflow.graph import Graph, Node
from hetflow.train.kernels import ForwardFn, training_kernel

#: ``rule(node, inputs, outputs, grad_outputs, wanted) -> grads``, as ``OpDef.backward`` is called.
BackwardFn = Callable[..., list]
#: Device kind -> module with ``register_training(device, kernels)``.
TRAINING_REGISTRARS: dict[str, str] = {
    "cpu": "hetflow.devices.cpu.training",
    "opencl": "hetflow.devices.opencl.kernels",
}


@dataclass
class TrainingKernels:
    """What one device brings to training beyond its forward kernel table.

    Attributes:
        backward: backward rules by op type (``KernelTable`` entries whose ``fn`` is a ``BackwardFn``).
        losses: loss name -> ``fn(scores, targets) -> LossResult`` (see ``hetflow.ops.loss``).
        updates: optimizer rule name (``"sgd"``, ``"adam"``) -> in-place update kernel (see
            ``hetflow.train.optim``).
        host_empty: ``(shape, dtype) -> array``: host memory the device uses in place (parameters and
            optimizer state are allocated with it).
    """

    backward: KernelTable = field(default_factory=KernelTable)
    losses: dict[str, Callable[..., Any]] = field(default_factory=dict)
    updates: dict[str, Callable[..., None]] = field(default_factory=dict)
    host_empty: Callable[..., np.ndarray] = np.empty

    def zeros_like(self, array: np.ndarray) -> np.ndarray:
        """Zeros of ``array``'s shape and dtype in memory the device uses in place."""
        out = self.host_empty(array.shape, array.dtype)
        out[...] = 0
        return out

    def host_copy(self, array: np.ndarray) -> np.ndarray:
        """A writable copy of ``array`` in memory the device uses in place."""
        out = self.host_empty(array.shape, array.dtype)
        out[...] = array
        return out


@dataclass(frozen=True)
class PlacedNode:
    """One node of a training graph: the device and forward function that run it, and its backward rule
    on that device (None: the op's numpy rule)."""

    node: Node
    device: Device
    forward: ForwardFn
    backward: BackwardFn | None


#: Per device object, not per id: ``OpenCLDevice(0, unified=False)`` may live beside the process-wide
#: ``opencl:0``. NOTE: the rules refer to their device, so an entry lives as long as the process, as
#: devices from ``get_device`` do anyway.
_KERNELS: dict[Device, TrainingKernels] = {}
#: What a device kind without training kernels has (numpy rules, losses and updates).
_NONE = TrainingKernels()
_LOCK = threading.Lock()


def training_kernels(device: Device) -> TrainingKernels:
    """``device``'s training kernels (built once per device object; empty for a kind without any)."""
    registrar = TRAINING_REGISTRARS.get(device.kind)
    if registrar is None:
        return _NONE
    with _LOCK:
        found = _KERNELS.get(device)
        if found is None:
            found = TrainingKernels()
            importlib.import_module(registrar).register_training(device, found)
            _KERNELS[device] = found
        return found


@dataclass
class TrainingDevices:
    """The devices a trainer runs on, in priority order (the CPU last), and their training kernels.

    Attributes:
        devices: the devices; the first is the trainer's device (``primary``).
    """

    devices: list[Device]

    @property
    def primary(self) -> Device:
        """The device the user asked for (the CPU when that is all there is)."""
        return self.devices[0]

    @property
    def kernels(self) -> TrainingKernels:
        """The primary device's training kernels (losses, updates, host memory)."""
        return training_kernels(self.primary)

    def place(self, graph: Graph) -> list[PlacedNode]:
        """Each node of ``graph`` with its device, forward function and backward rule.

        Raises:
            UnsupportedOpsError: no device has a forward kernel for some nodes (all are listed).
        """
        from hetflow.runtime.planner import known_infos, make_plan

        plan = make_plan(graph, self.devices)
        placed = []
        for step in plan.steps:
            node, device, kernel = step.node, step.device, step.kernel
            forward = training_kernel(node) if device.kind == "cpu" else None
            rule = training_kernels(device).backward.lookup(node, known_infos(graph, node))
            placed.append(PlacedNode(node, device, forward or kernel.fn, rule.fn if rule else None))
        return placed


def training_devices(device: str) -> TrainingDevices:
    """The devices for ``device`` as users write it.

    ``"cpu"``: the CPU. A device named explicitly (``"opencl:0"``, ``"opencl"``): that device first, the
    CPU for what it cannot run; raises DeviceUnavailableError when it cannot start or is unknown.
    ``"auto"``: the first accelerator that starts, else the CPU with one warning.
    """
    from hetflow.devices.registry import get_device, resolve_devices

    if device == "cpu":
        return TrainingDevices([get_device("cpu")])
    if device == "auto":
        devices = resolve_devices("auto")
        accelerators = [d for d in devices if d.kind != "cpu"]
        host = [d for d in devices if d.kind == "cpu"]
        if not accelerators:
            warnings.warn("no accelerator starts here; training runs on the CPU", RuntimeWarning, stacklevel=3)
            return TrainingDevices(host)
        return TrainingDevices([accelerators[0], *host])
    return TrainingDevices([get_device(device), get_device("cpu")])


def cpu_devices() -> TrainingDevices:
    """The CPU alone (what a Tape runs on when given no devices)."""
    return training_devices("cpu")

