"""Shared fixtures of the device tests: one OpenCL device per test session (its built programs are
reused by every test), skipped with the reason only where no OpenCL platform exists."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def opencl():
    from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

    reason = OpenCLDevice.is_available()
    if reason is not None:
        pytest.skip(f"no OpenCL platform: {reason}")
    return get_opencl_device(0)
