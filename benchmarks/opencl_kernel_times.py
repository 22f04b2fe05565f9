"""Where an OpenCL run's time goes: the device's launch costs, and each kernel's device time in one run.

Usage: python benchmarks/opencl_kernel_times.py [--model zoo:googlenet] [--batch 1] [--device 0]

A diagnostic, not a race (no peer runs): it first times the launch path itself (an empty kernel's
enqueue, enqueue + finish, ``OpenCLDevice.enqueue`` with argument setting, 4 KiB copies), then records
every launch of one ``session.run`` of the model on ``opencl:N`` and replays each, twice, on a profiling
queue, reporting the second replay's device time per kernel name (sum, mean, the slowest launch's
global and local sizes). The replay measures kernels one at a time, so the sum is the run's kernel
time without host overhead or overlap; compare it with the run's wall time to see which one bounds.
This is how the H100 session found the CPU-style GEMM default and pyopencl's untyped ``set_args``.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hetflow
from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

_NOP = "__kernel void nop(__global float* x, const int n) { int i = get_global_id(0); if (i < n) x[i] += 1.0f; }"


def _per_call(device: OpenCLDevice, fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """Microseconds per call on the host, and per call until the queue has finished."""
    device.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    device.synchronize()
    total = time.perf_counter() - start
    return host / calls * 1e6, total / calls * 1e6


def launch_costs(device: OpenCLDevice) -> None:
    """Print the launch path's costs on ``device``."""
    import pyopencl as cl

    kernel = device.kernel("nop", _NOP)
    buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4096)
    host = np.zeros(1024, np.float32)
    n = np.int32(1024)
    device.enqueue(kernel, (1024,), None, (buffer, n))
    cases = {
        "enqueue (arguments already set)": lambda: cl.enqueue_nd_range_kernel(device.queue, kernel, (1024,), None),
        "enqueue + finish": lambda: (cl.enqueue_nd_range_kernel(device.queue, kernel, (1024,), None),
                                     device.queue.finish()),
        "OpenCLDevice.enqueue (sets 2 arguments)": lambda: device.enqueue(kernel, (1024,), None, (buffer, n)),
        "4 KiB write, blocking": lambda: cl.enqueue_copy(device.queue, buffer, host),
        "4 KiB read, blocking": lambda: cl.enqueue_copy(device.queue, host, buffer),
    }  # fmt: skip
    print(f"{'launch path':<42} {'host us':>8} {'done us':>8}")
    for name, fn in cases.items():
        host_us, total_us = _per_call(device, fn, 500)
        print(f"{name:<42} {host_us:>8.1f} {total_us:>8.1f}")


def record_launches(device: OpenCLDevice, session: hetflow.InferenceSession, feeds: dict) -> list[tuple]:
    """Every ``(kernel, global size, local size, arguments)`` one run of ``session`` enqueues."""
    launches: list[tuple[Any, tuple, tuple | None, tuple]] = []
    original = device.enqueue

    def recording(kernel: Any, global_size: tuple, local_size: tuple | None, args: tuple) -> None:
        launches.append((kernel, global_size, local_size, args))
        original(kernel, global_size, local_size, args)

    device.enqueue = recording  # type: ignore[method-assign]
    try:
        session.run(None, feeds)
        device.synchronize()
    finally:
        del device.enqueue  # back to the class's method
    return launches


def kernel_times(device: OpenCLDevice, launches: list[tuple]) -> dict[str, list[tuple[float, tuple, Any]]]:
    """Each launch replayed twice on a profiling queue: kernel name -> (second replay's microseconds,
    global size, local size) per launch."""
    import pyopencl as cl

    queue = cl.CommandQueue(device.context, device.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    times: dict[str, list[tuple[float, tuple, Any]]] = collections.defaultdict(list)
    for kernel, global_size, local_size, args in launches:
        for _ in range(2):  # the first replay may pay for caches the run had warm
            kernel.set_args(*args)
            event = cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
            event.wait()
        seconds = (event.profile.end - event.profile.start) * 1e-9
        times[kernel.function_name].append((seconds * 1e6, global_size, local_size))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:googlenet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", type=int, default=0, help="OpenCL device index (0)")
    args = parser.parse_args()
    device = get_opencl_device(args.device)
    print(f"device: {device.id} {device.name()} ({device.fingerprint()['platform']})")
    launch_costs(device)

    session = hetflow.InferenceSession(args.model, device=device.id)
    first = session.get_inputs()[0]
    shape = [args.batch, *(d if isinstance(d, int) else 1 for d in first.shape[1:])]
    feeds = {first.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    walls = []
    for _ in range(5):
        start = time.perf_counter()
        session.run(None, feeds)
        walls.append(time.perf_counter() - start)
    launches = record_launches(device, session, feeds)
    times = kernel_times(device, launches)
    total = sum(t for rows in times.values() for t, _, _ in rows)
    print(f"\n{args.model} batch {args.batch}: run {min(walls) * 1e3:.2f} ms (min of 5), {len(launches)} launches, "
          f"kernel time {total / 1e3:.2f} ms")
    print(f"{'kernel':<26} {'launches':>8} {'sum ms':>8} {'mean us':>8} {'max us':>8}  slowest (global, local)")
    for name, rows in sorted(times.items(), key=lambda item: -sum(t for t, _, _ in item[1])):
        micros = [t for t, _, _ in rows]
        slowest = rows[int(np.argmax(micros))]
        print(f"{name:<26} {len(rows):>8} {sum(micros) / 1e3:>8.2f} {np.mean(micros):>8.1f} {max(micros):>8.1f}  "
              f"{slowest[1]}, {slowest[2]}")


if __name__ == "__main__":
    main()
