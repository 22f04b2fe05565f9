"""OpenCL discovery lists only devices whose compiler builds kernels, and says why where none does."""

from __future__ import annotations

import sys
import types

import pytest

from hetflow.devices import opencl


class _Error(Exception):
    pass


def _fake_pyopencl(devices: dict[str, str | None]) -> types.ModuleType:
    """A stand-in for pyopencl: one platform whose devices build a kernel, or fail with the given log."""
    module = types.ModuleType("pyopencl")
    module.Error = _Error

    class Device:
        def __init__(self, name: str):
            self.name = name

    class Platform:
        name, version = "Fake CL", "OpenCL 3.0 Fake 1.0"

        def get_devices(self) -> list[Device]:
            return [Device(name) for name in devices]

    class Program:
        def __init__(self, context: object, source: str):
            self.context = context

        def build(self, devices: list[Device], cache_dir: object) -> None:
            log = _LOGS[devices[0].name]
            if log is not None:
                raise _Error(f"clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n{log}\nDevice failed to build")

    _LOGS = dict(devices)
    module.get_platforms = lambda: [Platform()]
    module.Context = lambda devices: object()
    module.Program = Program
    return module


@pytest.fixture
def fake_discovery(monkeypatch):
    def install(devices: dict[str, str | None]) -> tuple[list, str | None]:
        monkeypatch.setitem(sys.modules, "pyopencl", _fake_pyopencl(devices))
        opencl._discover.cache_clear()
        return opencl._discover()

    yield install
    opencl._discover.cache_clear()


def test_a_device_that_cannot_build_kernels_is_left_out_with_a_warning(fake_discovery):
    with pytest.warns(RuntimeWarning, match="unknown target CPU 'generic'"):
        pairs, reason = fake_discovery({"old-pocl": "error: unknown target CPU 'generic'", "good": None})
    assert reason is None
    assert [device.name for _, device in pairs] == ["good"]  # opencl:0 is the device that works


def test_no_device_that_builds_kernels_is_a_reason_naming_the_failure_and_the_way_out(fake_discovery):
    with pytest.warns(RuntimeWarning):
        pairs, reason = fake_discovery({"old-pocl": "error: unknown target CPU 'generic'"})
    assert pairs == []
    assert "old-pocl" in reason and "unknown target CPU 'generic'" in reason and "pocl-opencl-icd" in reason
    with pytest.raises(opencl.DeviceUnavailableError, match="unknown target CPU"):
        opencl.OpenCLDevice(0)
