"""The explicit list of device packages, resolved from the strings users write."""

from __future__ import annotations

from hetflow.devices.base import Device
from hetflow.errors import DeviceUnavailableError


def get_device(device_id: str) -> Device:
    """The device named ``device_id`` (``"cpu"``); raises DeviceUnavailableError when it cannot start."""
    if device_id == "cpu":
        from hetflow.devices.cpu import CPUDevice

        return CPUDevice()
    if device_id.startswith("opencl"):
        raise DeviceUnavailableError(
            f"device '{device_id}': the OpenCL backend is not part of this build yet; use 'cpu'"
        )
    raise DeviceUnavailableError(f"unknown device '{device_id}'; known: cpu")


def resolve_devices(device: str) -> list[Device]:
    """Devices a session may use, in priority order, for ``device`` as users write it."""
    if device == "auto":
        return [get_device("cpu")]
    return [get_device(device)]
