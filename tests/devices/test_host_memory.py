"""``hetflow.devices.host_memory.aligned_empty``: shape, dtype and alignment as asked, under any
earlier allocation's offset."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.host_memory import CACHE_LINE, PAGE, aligned_empty


@pytest.mark.parametrize("alignment", [CACHE_LINE, 128, PAGE])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.float64])
@pytest.mark.parametrize("shape", [(1,), (3,), (5, 7), (2, 3, 4), (0,), (4, 0)])
def test_aligned_empty_has_the_shape_dtype_and_alignment_asked(shape, dtype, alignment):
    # Small arrays allocated in between shift where the next one lands (numpy promises 16 bytes).
    keep = [np.empty(n, np.uint8) for n in (1, 17, 33, 49)]
    array = aligned_empty(shape, dtype, alignment)
    assert array.shape == shape and array.dtype == np.dtype(dtype)
    assert array.flags.c_contiguous and array.flags.writeable
    assert array.ctypes.data % alignment == 0
    array[...] = 1  # all of it is usable memory
    assert array.sum() == array.size
    del keep


def test_aligned_arrays_do_not_overlap():
    first, second = aligned_empty((1000,), np.float32), aligned_empty((1000,), np.float32)
    assert not np.shares_memory(first, second)


def test_timed_calls_get_activations_on_cache_lines_and_weights_as_they_are():
    from hetflow.devices.base import aligned_inputs

    raw = aligned_empty((1000 + CACHE_LINE,), np.uint8)
    off_line = raw[16 : 16 + 1000].view(np.float32)  # 250 floats starting 16 bytes past a line
    off_line[:] = np.arange(250)
    assert off_line.ctypes.data % CACHE_LINE != 0
    on_line = aligned_empty((250,), np.float32)
    moved, kept, same_weight, nothing = aligned_inputs([off_line, on_line, off_line, None], weights={2})
    assert moved is not off_line and moved.ctypes.data % CACHE_LINE == 0
    np.testing.assert_array_equal(moved, off_line)
    assert kept is on_line
    assert same_weight is off_line  # a weight stays the array a plan holds resident
    assert nothing is None
