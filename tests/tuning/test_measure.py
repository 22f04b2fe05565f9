"""The measurement protocol: minimum times, interleaving, failing and wrong candidates as data."""

from __future__ import annotations

import time

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.tuning.measure import ErrorKind, MeasureOptions, measure, random_inputs

NODE = Node("Fake", "fake", ["x"], ["y"], None)
INPUTS = [TensorInfo((4, 5), np.dtype(np.float32))]


def _kernel(name: str, fn) -> Kernel:
    return Kernel("Fake", fn, name)


def _copy(node, inputs):
    return [inputs[0] * 2]


def _slow(node, inputs):
    time.sleep(0.003)
    return [inputs[0] * 2]


def _wrong(node, inputs):
    return [inputs[0] * 3]


def _broken(node, inputs):
    raise RuntimeError("boom")


def test_the_fast_candidate_is_fastest_and_failures_are_recorded():
    calls: list[str] = []

    def counting(node, inputs):
        calls.append("fast")
        return _copy(node, inputs)

    kernels = [_kernel("fast", counting), _kernel("slow", _slow), _kernel("wrong", _wrong),
               _kernel("broken", _broken)]
    options = MeasureOptions(warmup=2, repeats=3, min_seconds=0.0, max_repeats=3)
    results = {r.algorithm: r for r in measure(kernels, NODE, INPUTS, options)}
    assert results["fast"].ok and results["slow"].ok
    assert results["fast"].seconds < results["slow"].seconds
    assert results["slow"].seconds >= 0.003
    assert results["wrong"].seconds is None and results["wrong"].error.startswith(ErrorKind.WRONG_RESULT.value)
    assert "boom" in results["broken"].error and results["broken"].error.startswith("runtime_error")
    assert len(calls) == 2 + 3  # warm-up calls, then one per round


def test_short_kernels_get_more_rounds_until_min_seconds():
    calls: list[int] = []

    def tiny(node, inputs):
        calls.append(1)
        return _copy(node, inputs)

    measure([_kernel("tiny", tiny)], NODE, INPUTS, MeasureOptions(warmup=1, repeats=2, min_seconds=1.0,
                                                                  max_repeats=7))
    assert len(calls) == 1 + 7


def test_random_inputs_are_seeded_and_typed():
    infos = [TensorInfo((2, 3), np.dtype(np.float64)), None, TensorInfo((4,), np.dtype(np.int64))]
    first, second = random_inputs(infos), random_inputs(infos)
    assert first[1] is None
    assert first[0].dtype == np.float64 and first[2].dtype == np.int64
    np.testing.assert_array_equal(first[0], second[0])
