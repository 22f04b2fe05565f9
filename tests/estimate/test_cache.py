"""What a whole run loses against its layers timed alone: data a layer finds in cache alone and in
memory inside the run (``hetflow.estimate.cache``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetflow import InferenceSession
from hetflow.estimate.cache import (
    BLOCK_BYTES,
    MIN_EFFECTIVE_CACHE_BYTES,
    LruCache,
    Touch,
    _parse_size,
    cold_bytes,
    effective_cache_bytes,
    last_level_cache_bytes,
)
from hetflow.estimate.models import bandwidth
from hetflow.estimate.predict import (
    batch_bindings,
    cold_bytes_per_second,
    estimate,
    in_run_seconds,
    layer_key,
)
from hetflow.estimate.profile import DeviceProfile
from hetflow.passes.infer_shapes import bind_batch
from hetflow.runtime.executor import memory_plan
from hetflow.runtime.memory import Placement

MIB = 1 << 20


def test_a_range_touched_again_is_a_hit():
    cache = LruCache(4 * MIB)
    weights = Touch("weight:w", 0, MIB)
    assert cache.touch([weights]) == MIB
    assert cache.touch([weights]) == 0


def test_ranges_count_every_block_they_overlap():
    assert list(Touch("arena", BLOCK_BYTES - 1, 2).blocks()) == [0, 1]
    assert list(Touch("arena", 0, 0).blocks()) == []
    assert LruCache(MIB).touch([Touch("arena", BLOCK_BYTES - 1, 2)]) == 2 * BLOCK_BYTES


def test_the_least_recently_used_block_is_evicted_first():
    cache = LruCache(2 * BLOCK_BYTES)
    a, b, c = (Touch(name, 0, BLOCK_BYTES) for name in "abc")
    cache.touch([a, b])
    cache.touch([a])  # b is now the least recently used
    cache.touch([c])
    assert cache.touch([a]) == 0
    assert cache.touch([b]) == BLOCK_BYTES


def test_address_spaces_are_apart():
    cache = LruCache(MIB)
    cache.touch([Touch("weight:a", 0, BLOCK_BYTES)])
    assert cache.touch([Touch("weight:b", 0, BLOCK_BYTES)]) == BLOCK_BYTES


def test_weights_that_outgrow_the_cache_together_are_cold_in_a_run():
    """Eight layers of 2 MiB weights each: every one fits a 4 MiB cache alone, all of them do not, so a
    run reads every layer's weights from memory; with a 32 MiB cache the whole run stays in it."""
    steps = [[Touch(f"weight:{i}", 0, 2 * MIB), Touch("arena", 0, 64 << 10)] for i in range(8)]
    assert cold_bytes(steps, 4 * MIB) == [2 * MIB] * 8
    assert cold_bytes(steps, 32 * MIB) == [0] * 8


def test_a_layer_larger_than_the_cache_loses_nothing_in_a_run():
    """Alone, it streams its data from memory too; the small layer after it finds its own evicted."""
    steps = [[Touch("weight:big", 0, 8 * MIB)], [Touch("weight:small", 0, MIB)]]
    assert cold_bytes(steps, 4 * MIB) == [0, MIB]


def test_no_cache_size_means_no_cold_bytes():
    assert cold_bytes([[Touch("weight:w", 0, MIB)]], 0) == [0]


def test_a_value_written_where_a_dead_one_lay_is_warm():
    """Arena regions, not value names: the output of the third step lands where the first step's output
    was, which the second step has just read."""
    first = [Touch("weight:a", 0, MIB), Touch("arena", 0, MIB)]
    second = [Touch("arena", 0, MIB), Touch("arena", 2 * MIB, MIB)]
    third = [Touch("arena", 2 * MIB, MIB), Touch("arena", 0, MIB)]
    filler = [[Touch(f"weight:f{i}", 0, MIB)] for i in range(6)]
    cold = cold_bytes([first, second, third, *filler], 4 * MIB)
    assert cold[2] == 0
    assert cold[0] == 2 * MIB  # the filler layers evicted its weights and its output region


def test_sizes_as_sysfs_writes_them():
    assert _parse_size("32768K") == 32 * MIB
    assert _parse_size("2M") == 2 * MIB
    assert _parse_size("512") == 512
    with pytest.raises(ValueError):
        _parse_size("lots")


#: Working sets (bytes copied: read + written) and copy bandwidths of the 2-vCPU Xeon VM's calibration
#: (2026-12-01), whose sysfs reports a 480 MiB L3.
VM_SETS = [16 * 1024, 64 * 1024, 256 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
VM_RATES = [84.4, 84.4, 84.4, 84.4, 25.7, 25.7, 13.3, 12.3]


def test_a_reported_cache_is_capped_where_the_copy_bandwidth_leaves_the_outer_caches_plateau():
    # Past the L2's drop (84.4 -> 25.7) the plateau is 25.7 GB/s up to 16 MB; 13.3 at 64 MB is off it.
    assert effective_cache_bytes(480 * MIB, VM_SETS, VM_RATES) == 32 * MIB
    assert effective_cache_bytes(0, VM_SETS, VM_RATES) == 0  # no cache model stays none


def test_a_drop_measured_in_the_l2_caps_no_lower_than_the_floor():
    noisy = [84.4, 84.4, 30.0, 12.0, 12.5, 12.5, 12.3, 12.3]  # a slow reading at 1 MiB and past it
    assert effective_cache_bytes(480 * MIB, VM_SETS, noisy) == MIN_EFFECTIVE_CACHE_BYTES
    assert effective_cache_bytes(4 * MIB, VM_SETS, noisy) == 4 * MIB  # never above the reported size


def test_a_gentle_slope_off_the_plateau_caps_where_it_leaves_it():
    """The calibration of 2026-12-02 08:07: 28 GB/s to 16 MB, 24.7 at 64 MB (88% of the plateau)."""
    rates = [95.8, 95.8, 95.8, 95.8, 28.0, 28.0, 24.7, 14.1]
    assert effective_cache_bytes(480 * MIB, VM_SETS, rates) == 32 * MIB
    assert effective_cache_bytes(480 * MIB, VM_SETS, [95.8, 95.8, 95.8, 95.8, 28.0, 28.0, 26.0, 14.1]) == 128 * MIB


def test_a_reported_cache_stands_where_the_curve_agrees_or_shows_no_drop():
    assert effective_cache_bytes(8 * MIB, VM_SETS, VM_RATES) == 8 * MIB  # smaller than the knee
    flat = [30.0] * len(VM_SETS)
    assert effective_cache_bytes(32 * MIB, VM_SETS, flat) == 32 * MIB
    assert effective_cache_bytes(32 * MIB, VM_SETS[:1], VM_RATES[:1]) == 32 * MIB  # one point: no curve


def test_this_machine_reports_a_cache():
    assert last_level_cache_bytes() >= MIB


def test_a_concat_part_occupies_one_range_per_image():
    placement = Placement(offset=128, shape=(2, 6, 4, 4), dtype=np.dtype(np.float32), part=(1, 2, 5))
    arena = np.zeros(128 + 2 * 6 * 16 * 4, dtype=np.uint8)
    view = placement.view(arena)
    view[...] = np.uint32(0xFFFFFFFF).view(np.float32)  # every byte non-zero
    touched = np.flatnonzero(arena)
    expected = np.concatenate([np.arange(r.offset, r.offset + r.nbytes) for r in placement.byte_ranges()])
    assert np.array_equal(touched, expected)
    assert [r.nbytes for r in placement.byte_ranges()] == [3 * 16 * 4] * 2


def _steps(session: InferenceSession, batch: int):
    bindings = batch_bindings(session.graph, batch)
    graph = bind_batch(session.graph, bindings)
    plan = session.plan_for(bindings)
    by_name = {node.name: node for node in graph.nodes}
    steps = [(by_name[step.node.name], step.kernel) for step in plan.steps]
    keys = [layer_key(node, kernel, graph) for node, kernel in steps]
    return graph, steps, keys, memory_plan(plan, [v.name for v in session.get_outputs()])


def test_a_network_whose_weights_outgrow_the_cache_loses_time_in_a_run(quick_profile: DeviceProfile):
    """VGG-19's 548 MB of weights overflow any cache: the estimate adds their cold reads to the layers,
    at each thread's copy rate past the cache; without a known cache size it adds nothing."""
    session = InferenceSession("zoo:vgg19")
    # A copy bandwidth that falls past 32 MiB, as a 32 MiB L3's does (``effective_cache_bytes``).
    memory = dataclasses.replace(quick_profile.memory, working_set_bytes=[64 * 1024, 4 * MIB, 16 * MIB, 64 * MIB],
                                 bandwidth_gbs=[80.0, 30.0, 30.0, 12.0])  # fmt: skip
    profile = dataclasses.replace(quick_profile, last_level_cache_bytes=32 * MIB, memory=memory)
    result = estimate(session, profile, 1)
    graph, steps, keys, planned = _steps(session, 1)
    seconds = in_run_seconds(graph, steps, keys, planned, profile)
    assert result.in_run_ms == pytest.approx(seconds * 1e3, rel=0.05)
    conv_weights = sum(int(graph.initializers[node.inputs[1]].nbytes) for node, _ in steps if node.op_type == "Conv")
    # Every Conv's weights (80 MB, more as Winograd holds them) are cold in the run; the fully
    # connected layers' 490 MB stream from memory alone too, except the last (16 MB), which fits.
    assert seconds * cold_bytes_per_second(profile) > conv_weights
    assert cold_bytes_per_second(profile) == profile.threads * bandwidth(profile.memory, 64 * MIB)
    assert result.predicted_ms == pytest.approx(
        sum(layer.predicted_ms for layer in result.layers) + result.in_run_ms + result.overhead_ms
    )
    blind = estimate(session, dataclasses.replace(profile, last_level_cache_bytes=0), 1)
    assert blind.in_run_ms == 0.0


def test_a_network_that_fits_the_cache_loses_nothing(quick_profile: DeviceProfile):
    """LeNet's weights and activations (under 2 MB) stay in a 32 MiB cache from one run to the next."""
    profile = dataclasses.replace(quick_profile, last_level_cache_bytes=32 * MIB)
    assert estimate(InferenceSession("zoo:lenet"), profile, 1).in_run_ms == 0.0


def test_profiles_keep_the_cache_size(quick_profile: DeviceProfile, tmp_path):
    assert quick_profile.last_level_cache_bytes == last_level_cache_bytes()
    profile = dataclasses.replace(quick_profile, last_level_cache_bytes=12 * MIB)
    loaded = DeviceProfile.load(profile.save(tmp_path / "p.json"))
    assert loaded.last_level_cache_bytes == 12 * MIB
