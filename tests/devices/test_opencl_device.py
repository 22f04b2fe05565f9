"""The OpenCL device: discovery, info, transfers, the program build cache and build errors."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest

from hetflow.cli import main
from hetflow.devices.opencl import DeviceArray, OpenCLDevice, aligned_empty
from hetflow.devices.opencl.build import ProgramCache, build_key
from hetflow.errors import DeviceUnavailableError, KernelBuildError

INFO_FIELDS = {
    "id", "kind", "name", "vendor", "platform", "compute_units", "max_clock_mhz", "global_memory_bytes",
    "local_memory_bytes", "host_unified_memory", "opencl_version", "driver_version",
}  # fmt: skip


def test_info_describes_the_device(opencl):
    info = opencl.info()
    assert set(info) == INFO_FIELDS
    assert info["id"] == "opencl:0" and info["kind"] == "opencl"
    assert info["compute_units"] >= 1 and info["global_memory_bytes"] > 0 and info["local_memory_bytes"] > 0
    assert info["opencl_version"].startswith("OpenCL ")
    assert opencl.name() == info["name"]


def test_fingerprint_names_platform_device_and_driver(opencl):
    fingerprint = opencl.fingerprint()
    assert fingerprint["kind"] == "opencl"
    assert fingerprint["driver"] == opencl.info()["driver_version"]
    assert fingerprint["device"] == opencl.name()
    assert opencl.platform.name.strip() in fingerprint["platform"]


def test_missing_index_says_how_many_devices_exist(opencl):
    with pytest.raises(DeviceUnavailableError, match=r"opencl:7.*does not exist"):
        OpenCLDevice(7)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not contiguous
        np.zeros((0, 5), np.float32),  # empty
        np.float32(3.5) * np.ones((), np.float32),  # 0-d
        np.arange(10, dtype=np.int32)[1:],  # misaligned start
    ],
)
def test_round_trip_preserves_values(opencl, array):
    buffer = opencl.to_device(array)
    assert isinstance(buffer, DeviceArray)
    back = opencl.to_host(buffer)
    assert back.shape == array.shape and back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


def test_read_only_input_is_accepted(opencl):
    array = np.arange(6, dtype=np.float32)
    array.flags.writeable = False
    np.testing.assert_array_equal(opencl.to_host(opencl.to_device(array)), array)


def test_unified_memory_maps_instead_of_copying(opencl):
    if not opencl.unified_memory:
        pytest.skip("this OpenCL device does not share host memory")
    array = aligned_empty((64,), np.float32)
    array[:] = 1
    before = (opencl.transfers.copied_in, opencl.transfers.copied_out, opencl.transfers.mapped)
    buffer = opencl.to_device(array)
    assert buffer.host is array  # an aligned, writable array is wrapped, not copied
    opencl.to_host(buffer)
    after = (opencl.transfers.copied_in, opencl.transfers.copied_out, opencl.transfers.mapped)
    assert after[:2] == before[:2] and after[2] == before[2] + 2 * array.nbytes


def test_aligned_empty_is_aligned():
    for count in (1, 3, 1000):
        assert aligned_empty((count,), np.float32).ctypes.data % 128 == 0


def test_synchronize_returns(opencl):
    opencl.synchronize()


SOURCE = "__kernel void fill(__global float* y, const float v) { y[get_global_id(0)] = v; }\n"


_AXPB = """__kernel void axpb(__global float* y, __global const float* x, const float a, const int b,
                   const long n) { const long i = get_global_id(0); if (i < n) y[i] = a * x[i] + b; }"""


def test_launches_with_scalar_arguments_keep_their_values(opencl):
    # The first launch declares the kernel's scalar types (pyopencl's fast, typed path); later launches
    # with other values, and a buffer in another position's place, must still read what they pass.
    kernel = opencl.kernel("axpb", _AXPB)
    x = opencl.to_device(np.arange(37, dtype=np.float32))
    for a, b in ((2.0, 1), (-0.5, 7), (3.25, -4)):
        y = opencl.empty((37,))
        opencl.enqueue(kernel, (64,), None, (y.buffer, x.buffer, np.float32(a), np.int32(b), np.int64(37)))
        np.testing.assert_array_equal(opencl.to_host(y), a * np.arange(37, dtype=np.float32) + b)
    assert kernel._hetflow_typed


def test_build_cache_reuses_the_binary_from_disk(opencl, tmp_path):
    # A unique comment makes the source new to every cache (PoCL's own included): a real compile.
    source = f"// {uuid.uuid4()}\n{SOURCE}"
    cache = ProgramCache(directory=tmp_path)
    start = time.perf_counter()
    cache.build(opencl.context, opencl.device, source, ("-DX=1",), opencl.fingerprint())
    compile_seconds = time.perf_counter() - start
    assert cache.stats.compiled == 1 and len(list(tmp_path.glob("*.bin"))) == 1

    cache.clear_memory()
    start = time.perf_counter()
    program = cache.build(opencl.context, opencl.device, source, ("-DX=1",), opencl.fingerprint())
    load_seconds = time.perf_counter() - start
    assert cache.stats.disk_hits == 1 and cache.stats.compiled == 1
    assert load_seconds < compile_seconds / 3, (load_seconds, compile_seconds)

    # The loaded binary works.
    import pyopencl as cl

    out = np.zeros(4, np.float32)
    buffer = cl.Buffer(opencl.context, cl.mem_flags.WRITE_ONLY, out.nbytes)
    program.fill(opencl.queue, (4,), None, buffer, np.float32(2.5))
    cl.enqueue_copy(opencl.queue, out, buffer)
    np.testing.assert_array_equal(out, 2.5)


def test_build_key_depends_on_source_options_and_device():
    fingerprint = {"device": "a", "driver": "1"}
    key = build_key(SOURCE, ("-DX=1",), fingerprint)
    assert key != build_key(SOURCE + " ", ("-DX=1",), fingerprint)
    assert key != build_key(SOURCE, ("-DX=2",), fingerprint)
    assert key != build_key(SOURCE, ("-DX=1",), {"device": "a", "driver": "2"})


def test_corrupt_cached_binary_is_rebuilt(opencl, tmp_path):
    source = f"// {uuid.uuid4()}\n{SOURCE}"
    key = build_key(source, (), opencl.fingerprint())
    (tmp_path / f"{key}.bin").write_bytes(b"not a binary")
    cache = ProgramCache(directory=tmp_path)
    cache.build(opencl.context, opencl.device, source, (), opencl.fingerprint())
    assert cache.stats.compiled == 1


def test_broken_source_raises_with_the_build_log(opencl, tmp_path):
    cache = ProgramCache(directory=tmp_path)
    broken = "__kernel void broken(__global float* y) { y[0] = undeclared_name; }\n"
    with pytest.raises(KernelBuildError) as caught:
        cache.build(opencl.context, opencl.device, broken, ("-DX=1",), opencl.fingerprint(), "broken")
    assert "undeclared_name" in caught.value.log
    assert "broken" in str(caught.value) and "-DX=1" in str(caught.value)
    assert not list(tmp_path.glob("*.bin"))


def test_devices_command_lists_cpu_then_opencl(opencl, capsys):
    assert main(["devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows][:2] == ["cpu", "opencl:0"]
    assert all({"id", "kind", "name"} <= set(r) for r in rows)
    assert set(rows[1]) >= INFO_FIELDS

    assert main(["devices"]) == 0
    table = capsys.readouterr().out
    assert "opencl:0" in table and opencl.name() in table and "cpu" in table
