"""``StepBuffers``: a training step's large outputs reused from step to step, never while referenced;
and a steady-state training step that allocates no large arrays (tracemalloc)."""

from __future__ import annotations

import numpy as np

from hetflow.devices.cpu.kernels.buffers import MIN_POOLED_BYTES, StepBuffers, step_buffers, step_empty
from hetflow.train import SGD, Trainer
from hetflow.zoo.layers import LayerBuilder
from tests.train.test_trainer import traced_step

SHAPE = (4, MIN_POOLED_BYTES // 4)


def test_an_array_is_handed_out_again_only_once_unreferenced():
    pool = StepBuffers()
    first = pool.empty(SHAPE, np.float32)
    assert pool.empty(SHAPE, np.float32) is not first  # still held here
    address = first.ctypes.data
    del first
    again = pool.empty(SHAPE, np.float32)
    assert again.ctypes.data == address
    view = again.reshape(-1)[:10]
    del again
    assert pool.empty(SHAPE, np.float32).ctypes.data != address  # a view keeps it in use
    del view
    assert pool.empty(SHAPE, np.float32).ctypes.data == address


def test_shapes_dtypes_and_small_arrays():
    pool = StepBuffers()
    pool.empty(SHAPE, np.float32)
    assert pool.empty(SHAPE[::-1], np.float32).shape == SHAPE[::-1]
    assert pool.empty(SHAPE, np.float64).dtype == np.float64
    pool.empty((3,), np.float32)  # below MIN_POOLED_BYTES: not kept
    assert pool.nbytes == 2 * 4 * MIN_POOLED_BYTES + 8 * MIN_POOLED_BYTES


def test_step_empty_takes_from_the_active_pool_only():
    pool = StepBuffers()
    with step_buffers(pool):
        step_empty(SHAPE, np.float32)
    assert pool.nbytes == 4 * MIN_POOLED_BYTES
    step_empty(SHAPE, np.float32)
    assert pool.nbytes == 4 * MIN_POOLED_BYTES


def _conv_net():
    """conv+relu -> maxpool -> conv+relu -> GAP -> FC on 16x24x24: activations of 0.3-1.2 MB at batch 8."""
    b = LayerBuilder("pooled", 0)
    x = b.max_pool(b.relu(b.conv(b.input("data", (3, 24, 24)), 16, 3, pad=1)), 2, 2)
    x = b.relu(b.conv(x, 16, 3, pad=1))
    return b.model([b.fc(b.flatten(b.global_avg_pool(x)), 4)])


def test_a_steady_state_step_allocates_no_large_arrays_and_trains_the_same():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 24, 24)).astype(np.float32), rng.integers(0, 4, 8)
    pooled = Trainer(_conv_net(), optimizer=SGD(0.1, momentum=0.9))
    fresh = Trainer(_conv_net(), optimizer=SGD(0.1, momentum=0.9))
    fresh._step_buffers = None
    for _ in range(2):
        assert pooled.train_step(x, y) == fresh.train_step(x, y)
    loss, traced = traced_step(pooled, x, y)
    fresh_loss, fresh_traced = traced_step(fresh, x, y)
    assert loss == fresh_loss
    # The kept activations and the gradients came from the pool; what is left is scratch (im2col
    # chunks, small temporaries), as in the step without a pool.
    assert traced + pooled.tape.peak_bytes // 2 < fresh_traced, (traced, fresh_traced, pooled.tape.peak_bytes)
    for name, param in fresh.params.items():
        np.testing.assert_array_equal(pooled.params[name], param)
