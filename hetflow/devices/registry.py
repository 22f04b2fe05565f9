"""The explicit list of device packages, resolved from the strings users write.

``"cpu"`` is the host; ``"opencl:N"`` the N-th OpenCL device in discovery order (``"opencl"`` alone
means ``"opencl:0"``); ``"auto"`` is every device that starts here, accelerators first and the CPU
always last, so the planner puts each node on the first device with a kernel for it and everything
else on the CPU.
"""

from __future__ import annotations

import warnings

from hetflow.devices.base import Device
from hetflow.errors import DeviceUnavailableError

#: Device kinds users can name, for messages.
KNOWN = "cpu, opencl:N, auto"


def get_device(device_id: str) -> Device:
    """The device named ``device_id``; raises DeviceUnavailableError (with the reason) when it cannot start."""
    if device_id == "cpu":
        from hetflow.devices.cpu import CPUDevice

        return CPUDevice()
    if device_id == "opencl" or device_id.startswith("opencl:"):
        index_text = device_id.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise DeviceUnavailableError(f"device '{device_id}': the OpenCL index must be a number")
        from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

        reason = OpenCLDevice.is_available()
        if reason is not None:
            raise DeviceUnavailableError(f"device '{device_id}': {reason}")
        return get_opencl_device(int(index_text))
    raise DeviceUnavailableError(f"unknown device '{device_id}'; known: {KNOWN}")


def accelerator_ids() -> list[str]:
    """Ids of the accelerators this machine has, in ``"auto"`` priority order (no device is started)."""
    from hetflow.devices.opencl import device_count

    return [f"opencl:{i}" for i in range(device_count())]


def resolve_devices(device: str) -> list[Device]:
    """Devices a session may use, in priority order, for ``device`` as users write it.

    With ``"auto"`` an accelerator that fails to start is left out with one warning (the CPU runs
    its nodes); a device named explicitly raises instead.
    """
    if device != "auto":
        return [get_device(device)]
    from hetflow.devices.opencl import OpenCLDevice

    devices: list[Device] = []
    reason = OpenCLDevice.is_available()
    if reason is None:
        for device_id in accelerator_ids():
            try:
                devices.append(get_device(device_id))
            except Exception as error:  # noqa: BLE001  (any driver failure means: run on the CPU)
                warnings.warn(
                    f"device '{device_id}' could not start ({error}); its nodes run on the CPU",
                    RuntimeWarning,
                    stacklevel=2,
                )
    devices.append(get_device("cpu"))
    return devices


def list_devices() -> list[Device]:
    """Every device this machine can start: the CPU first, then each OpenCL device (for listings)."""
    devices: list[Device] = [get_device("cpu")]
    from hetflow.devices.opencl import list_opencl_devices

    devices.extend(list_opencl_devices())
    return devices
