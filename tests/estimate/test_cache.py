"""What a whole run loses against its layers timed alone: data a layer finds in cache alone and in
memory inside the run (``hetflow.estimate.cache``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetflow import InferenceSession
from hetflow.devices.cpu.caches import _parse_size, last_level_cache_bytes
from hetflow.estimate.cache import (
    BLOCK_BYTES,
    HitCurve,
    Touch,
    cold_bytes,
)
from hetflow.estimate.calibrate import faster_copies, faster_rereads
from hetflow.estimate.models import bandwidth
from hetflow.estimate.predict import (
    batch_bindings,
    cold_bytes_per_second,
    estimate,
    in_run_seconds,
    layer_key,
)
from hetflow.estimate.profile import DeviceProfile, MemoryModel
from hetflow.passes.infer_shapes import bind_batch
from hetflow.runtime.executor import memory_plan
from hetflow.runtime.memory import Placement

MIB = 1 << 20


def lru(capacity: int):
    """The hit curve of a least-recently-used cache of ``capacity`` bytes: all or nothing."""
    return lambda distance: 1.0 if distance < capacity else 0.0


def test_ranges_count_every_block_they_overlap():
    assert list(Touch("arena", BLOCK_BYTES - 1, 2).blocks()) == [0, 1]
    assert list(Touch("arena", 0, 0).blocks()) == []


def test_weights_that_outgrow_the_cache_together_are_cold_in_a_run():
    """Eight layers of 2 MiB weights each: every one fits a 4 MiB cache alone, all of them do not, so a
    run reads every layer's weights from memory; with a 32 MiB cache the whole run stays in it."""
    steps = [[Touch(f"weight:{i}", 0, 2 * MIB), Touch("arena", 0, 64 << 10)] for i in range(8)]
    assert cold_bytes(steps, lru(4 * MIB)) == [2 * MIB] * 8
    assert cold_bytes(steps, lru(32 * MIB)) == [0] * 8


def test_a_layer_larger_than_the_cache_loses_nothing_in_a_run():
    """Alone, it streams its data from memory too; the small layer after it finds its own evicted."""
    steps = [[Touch("weight:big", 0, 8 * MIB)], [Touch("weight:small", 0, MIB)]]
    assert cold_bytes(steps, lru(4 * MIB)) == [0, MIB]


def test_address_spaces_are_apart():
    """Two weights at the same offset are different bytes: each is read again after the other."""
    steps = [[Touch("weight:a", 0, 3 * MIB)], [Touch("weight:b", 0, 3 * MIB)]]
    assert cold_bytes(steps, lru(4 * MIB)) == [3 * MIB, 3 * MIB]


def test_a_value_written_where_a_dead_one_lay_is_warm():
    """Arena regions, not value names: the output of the third step lands where the first step's output
    was, which the second step has just read."""
    first = [Touch("weight:a", 0, MIB), Touch("arena", 0, MIB)]
    second = [Touch("arena", 0, MIB), Touch("arena", 2 * MIB, MIB)]
    third = [Touch("arena", 2 * MIB, MIB), Touch("arena", 0, MIB)]
    filler = [[Touch(f"weight:f{i}", 0, MIB)] for i in range(6)]
    cold = cold_bytes([first, second, third, *filler], lru(4 * MIB))
    assert cold[2] == 0
    assert cold[0] == 2 * MIB  # the filler layers evicted its weights and its output region


#: Read rates of a cache whose share of a footprint falls from all at 1 MiB to none at 64 MiB;
#: at 16 MiB a read costs halfway between the cache's time per byte and memory's.
HALFWAY_SETS = [MIB, 16 * MIB, 64 * MIB]
HALFWAY_RATES = [80.0, 1 / ((1 / 80 + 1 / 16) / 2), 16.0]


def test_the_share_in_cache_is_read_off_the_rates_over_footprints():
    hit = HitCurve(HALFWAY_SETS, HALFWAY_RATES)
    assert hit(MIB) == 1.0
    assert hit(64 << 10) == 1.0
    assert hit(16 * MIB) == pytest.approx(0.5)
    assert 0.5 < hit(8 * MIB) < 1.0
    assert 0.0 < hit(32 * MIB) < 0.5
    assert hit(64 * MIB) == pytest.approx(0.0)
    assert hit(65 * MIB) == 0.0
    flat = HitCurve(HALFWAY_SETS, [20.0] * 3)
    assert flat(32 * MIB) == 1.0  # no drop: nothing is lost in a run
    with pytest.raises(ValueError, match="as many rates as sizes"):
        HitCurve(HALFWAY_SETS, [20.0])


def test_a_profile_reads_its_cache_off_the_rereads_or_else_the_copies():
    """The re-read rates where the profile has them (the copies here would say no cache at all)."""
    copies = {"working_set_bytes": HALFWAY_SETS, "bandwidth_gbs": [20.0] * 3}
    with_rereads = MemoryModel(**copies, reread_bytes=HALFWAY_SETS, reread_gbs=HALFWAY_RATES)
    assert HitCurve.of(with_rereads)(16 * MIB) == pytest.approx(0.5)
    assert HitCurve.of(MemoryModel(**copies))(16 * MIB) == 1.0


def test_a_growing_network_loses_its_weights_gradually_not_all_at_once():
    """Layers of 2 MiB weights, one more at a time: through an LRU cache of 16 MiB a run loses nothing
    until its weights outgrow it and then every byte; through the curve, a share that grows with the
    distance at which each layer's weights come back."""
    hit = HitCurve(HALFWAY_SETS, HALFWAY_RATES)

    def lost(layers: int, curve) -> float:
        return sum(cold_bytes([[Touch(f"weight:{i}", 0, 2 * MIB)] for i in range(layers)], curve)) / (layers * 2 * MIB)

    shares = [lost(layers, hit) for layers in range(2, 40, 2)]
    steps = [later - earlier for earlier, later in zip(shares, shares[1:])]
    assert all(0 <= step < 0.2 for step in steps)
    assert shares[0] < 0.15 and shares[-1] > 0.9  # past 64 MiB all but what a layer misses alone
    assert [lost(layers, lru(16 * MIB)) for layers in (8, 9)] == [0.0, 1.0]  # 16 MiB fit, 18 do not


def test_sizes_as_sysfs_writes_them():
    assert _parse_size("32768K") == 32 * MIB
    assert _parse_size("2M") == 2 * MIB
    assert _parse_size("512") == 512
    with pytest.raises(ValueError):
        _parse_size("lots")


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
    # Copy and re-read rates that fall past 16 MiB, as a 32 MiB L3's do (``HitCurve``).
    sizes, rates = [64 * 1024, 4 * MIB, 16 * MIB, 64 * MIB], [80.0, 30.0, 30.0, 12.0]
    memory = dataclasses.replace(quick_profile.memory, working_set_bytes=sizes, bandwidth_gbs=rates,
                                 reread_bytes=sizes, reread_gbs=rates)  # fmt: skip
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
    """LeNet's weights and activations (under 2 MB) stay from one run to the next in a cache that reads
    8 MiB again at its full rate."""
    sizes, rates = [MIB, 8 * MIB, 64 * MIB], [80.0, 80.0, 12.0]
    memory = dataclasses.replace(quick_profile.memory, reread_bytes=sizes, reread_gbs=rates)
    profile = dataclasses.replace(quick_profile, last_level_cache_bytes=32 * MIB, memory=memory)
    assert estimate(InferenceSession("zoo:lenet"), profile, 1).in_run_ms == 0.0
    squeezed = dataclasses.replace(memory, reread_bytes=[MIB, 2 * MIB, 64 * MIB])
    assert estimate(InferenceSession("zoo:lenet"), dataclasses.replace(profile, memory=squeezed), 1).in_run_ms > 0


def test_profiles_keep_the_cache_size(quick_profile: DeviceProfile, tmp_path):
    assert quick_profile.last_level_cache_bytes == last_level_cache_bytes()
    profile = dataclasses.replace(quick_profile, last_level_cache_bytes=12 * MIB)
    loaded = DeviceProfile.load(profile.save(tmp_path / "p.json"))
    assert loaded.last_level_cache_bytes == 12 * MIB


def test_calibration_reads_weights_again_over_rising_footprints(quick_profile: DeviceProfile, tmp_path):
    memory = quick_profile.memory
    assert memory.reread_bytes == [float(mib * MIB) for mib in (1, 16, 64)]
    assert all(rate > 0 for rate in memory.reread_gbs)
    assert memory.reread_gbs == sorted(memory.reread_gbs, reverse=True)  # never faster past a bigger footprint
    loaded = DeviceProfile.load(quick_profile.save(tmp_path / "p.json"))
    assert loaded.memory.reread_gbs == memory.reread_gbs


def test_a_second_reread_sweep_keeps_the_faster_rate_of_each_footprint(quick_profile: DeviceProfile):
    sizes = [float(mib * MIB) for mib in (1, 16, 64)]
    memory = dataclasses.replace(quick_profile.memory, reread_bytes=sizes, reread_gbs=[70.0, 20.0, 15.0])
    merged = faster_rereads(memory, (sizes, [72.0, 45.0, 14.0]))
    assert merged.reread_gbs == [72.0, 45.0, 15.0]
    assert merged.working_set_bytes == memory.working_set_bytes  # the copies untouched
    assert faster_rereads(memory, (sizes[:2], [99.0, 99.0])) is memory  # another grid: nothing to merge


def test_a_second_copy_sweep_keeps_the_faster_rate_of_each_working_set(quick_profile: DeviceProfile):
    sizes = [float(mib * MIB) for mib in (1, 16, 64)]
    memory = dataclasses.replace(quick_profile.memory, working_set_bytes=sizes, bandwidth_gbs=[90.0, 40.0, 25.0])
    merged = faster_copies(memory, (sizes, [85.0, 60.0, 24.0]))
    assert merged.bandwidth_gbs == [90.0, 60.0, 25.0]
    assert merged.reread_gbs == memory.reread_gbs  # the re-reads untouched
    assert faster_copies(memory, (sizes[1:], [99.0, 99.0])) is memory  # another grid: nothing to merge
