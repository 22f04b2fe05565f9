"""Compiled packages (``hetflow compile``, ``hetflow_lite``): a package computes what the session computes,
in a process that never imports numba, llvmlite or onnx; feeds it was not compiled for, damaged
packages and other CPUs' packages are refused; a run that is not wholly captured, or a job that points at
memory the package would not carry, cannot be compiled."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hetflow
from hetflow import zoo
from hetflow.devices.cpu import native_library
from hetflow.devices.cpu.spin_pool import Job
from hetflow.errors import HetflowError
from hetflow.runtime.compile_package import _Kernels, _Memory, compile_package
from hetflow_lite import CompiledSession, PackageError
from hetflow_lite.package import MANIFEST
from tests.helpers import prelu_softmax_model


@pytest.fixture(scope="module")
def lenet_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("packages") / "lenet-b2"
    compile_package(str(zoo.model_path("lenet")), folder, batch=2, threads=2)
    return folder


def _lenet_feed(seed: int) -> dict[str, np.ndarray]:
    session = hetflow.InferenceSession(str(zoo.model_path("lenet")), threads=2)
    value = session.get_inputs()[0]
    shape = [2 if isinstance(d, str) else d for d in value.shape]
    return {value.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def test_a_package_computes_what_the_session_computes_on_new_feeds(lenet_package):
    session = hetflow.InferenceSession(str(zoo.model_path("lenet")), threads=2)
    lite = CompiledSession(lenet_package)
    try:
        for seed in (1, 2, 3):
            feed = _lenet_feed(seed)
            np.testing.assert_allclose(lite.run(None, feed)[0], session.run(None, feed)[0], rtol=1e-5, atol=1e-6)
    finally:
        lite.close()


def test_a_package_reads_a_contiguous_feed_in_place_and_copies_any_other(lenet_package):
    session = hetflow.InferenceSession(str(zoo.model_path("lenet")), threads=2)
    lite = CompiledSession(lenet_package)
    try:
        ((_, feed),) = lite._inputs
        assert feed.pointers  # the jobs that read the input, found through the relocations
        for seed in (5, 6):
            feeds = _lenet_feed(seed)
            (array,) = feeds.values()
            kept = array.copy()
            np.testing.assert_allclose(lite.run(None, feeds)[0], session.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
            assert feed.pointed == array.ctypes.data  # read where it lies...
            np.testing.assert_array_equal(array, kept)  # ...and never written
        ((name, array),) = _lenet_feed(7).items()
        wide = np.repeat(array, 2, axis=-1)
        strided = {name: wide[..., ::2]}  # the same values, every other float of a wider array
        np.testing.assert_allclose(lite.run(None, strided)[0], session.run(None, {name: array})[0], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
        assert feed.pointed == feed.buffer.ctypes.data  # copied into the package's own buffer
    finally:
        lite.close()


def test_a_package_runs_on_any_thread_count_to_the_same_outputs(lenet_package):
    feed = _lenet_feed(4)
    outputs = []
    for threads in (1, 2, 3):
        lite = CompiledSession(lenet_package, threads=threads)
        outputs.append(lite.run(None, feed)[0])
        lite.close()
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_a_package_runs_in_a_process_without_numba_llvmlite_or_onnx(lenet_package, tmp_path):
    feed = _lenet_feed(5)
    (name, value), = feed.items()
    np.save(tmp_path / "x.npy", value)
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from hetflow_lite import CompiledSession
        session = CompiledSession({str(lenet_package)!r})
        y = session.run(None, {{{name!r}: np.load({str(tmp_path / 'x.npy')!r})}})[0]
        np.save({str(tmp_path / 'y.npy')!r}, y)
        print(sorted(m for m in ("numba", "llvmlite", "onnx", "hetflow") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    expected = hetflow.InferenceSession(str(zoo.model_path("lenet")), threads=2).run(None, feed)[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-6)


def test_feeds_it_was_not_compiled_for_are_refused(lenet_package):
    lite = CompiledSession(lenet_package, threads=1)
    (name, value), = _lenet_feed(6).items()
    with pytest.raises(ValueError, match="as compiled"):
        lite.run(None, {name: value[:1]})
    with pytest.raises(ValueError, match="as compiled"):
        lite.run(None, {name: value.astype(np.float64)})
    with pytest.raises(ValueError, match="missing input"):
        lite.run(None, {})
    with pytest.raises(ValueError, match="unknown inputs"):
        lite.run(None, {name: value, "other": value})
    with pytest.raises(ValueError, match="unknown outputs"):
        lite.run(["nope"], {name: value})


def _edited_copy(package: Path, folder: Path, edit) -> Path:  # noqa: ANN001
    copy = folder / "copy"
    copy.mkdir()
    for path in package.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((copy / MANIFEST).read_text())
    edit(manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(version=99), "version 99"),
        (lambda m: m["target"].update(processor="another CPU"), "compiled for 'another CPU'"),
        (lambda m: m.pop("regions"), "damaged"),
        (lambda m: m["regions"][-1].update(size=m["regions"][-1]["size"] + 4096), "shorter"),
        (lambda m: m["regions"][0].update(page_offset=(m["regions"][0]["page_offset"] + 8) % 4096), "page offset"),
    ],
)
def test_a_package_of_another_version_processor_or_damaged_is_refused(lenet_package, tmp_path, edit, message):
    with pytest.raises(PackageError, match=message):
        CompiledSession(_edited_copy(lenet_package, tmp_path, edit))


def test_a_folder_without_a_package_is_refused(tmp_path):
    with pytest.raises(PackageError, match="not a compiled package"):
        CompiledSession(tmp_path)


def test_a_run_that_still_calls_steps_from_python_cannot_be_compiled(tmp_path):
    model = prelu_softmax_model()  # PRelu has no compiled job: called from Python before the replayed Softmax
    with pytest.raises(HetflowError, match=r"1 steps .* still run from Python.*\(prelu\)"):
        compile_package(model, tmp_path / "package", threads=1)
    assert not (tmp_path / "package").exists()


def test_a_run_that_is_not_captured_cannot_be_compiled(tmp_path):
    # Two threads on a network without Convs: its runs split on BLAS's threads and are never captured.
    with pytest.raises(HetflowError, match="not captured.*try threads=1"):
        compile_package(prelu_softmax_model(), tmp_path / "package", threads=2)


@pytest.mark.parametrize("name", ["mentee", "cifar10-quick"])
def test_other_zoo_networks_compile_to_the_sessions_outputs(name, tmp_path):
    path = str(zoo.model_path(name))
    compile_package(path, tmp_path / name, batch=3)
    session = hetflow.InferenceSession(path, threads=2)
    lite = CompiledSession(tmp_path / name)
    (value,) = lite.get_inputs()
    x = np.random.default_rng(9).standard_normal(value.shape).astype(np.float32)
    try:
        np.testing.assert_allclose(lite.run(None, {value.name: x})[0], session.run(None, {value.name: x})[0],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
    finally:
        lite.close()


@pytest.mark.parametrize("batch", [1, 16])
def test_lstm_gesture_compiles_its_steps_to_the_sessions_outputs(batch, tmp_path):
    """An LSTM's spinning steps, each a job (one column's on W and R packed in the package's memory), and
    the layout Transpose as a job: every new feed gives the session's outputs."""
    path = str(zoo.model_path("lstm-gesture"))
    compile_package(path, tmp_path / "lstm", batch=batch, threads=2)
    session = hetflow.InferenceSession(path, threads=2)
    lite = CompiledSession(tmp_path / "lstm")
    (value,) = lite.get_inputs()
    try:
        for seed in (1, 2):
            x = np.random.default_rng(seed).standard_normal(value.shape).astype(np.float32)
            np.testing.assert_allclose(lite.run(None, {value.name: x})[0], session.run(None, {value.name: x})[0],
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
    finally:
        lite.close()


def test_an_existing_folder_that_is_not_a_package_is_not_overwritten(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(HetflowError, match="not a compiled package"):
        compile_package(str(zoo.model_path("lenet")), tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_kept_arrays_merge_into_regions_and_block_addresses_become_relocations():
    arena = np.zeros(64, np.float32)
    weights = np.ones(16, np.float32)
    block = np.zeros(6, np.int64)
    block[:] = [arena[8:].ctypes.data, 56, weights.ctypes.data, 16, 7, 0]
    job = Job(1, block, 1, (arena[:32], arena[8:], weights))
    memory = _Memory([job.block, arena[:32], arena[8:], weights])
    assert len(memory.regions) == 3  # the two views of the arena are one region
    relocations = memory.relocations([job], ["node"], _Kernels())
    block_region, block_offset = memory.locate(block.ctypes.data)
    arena_region, _ = memory.locate(arena.ctypes.data)
    weights_region, _ = memory.locate(weights.ctypes.data)
    assert sorted(relocations) == sorted([(block_region, block_offset, arena_region, 32),
                                          (block_region, block_offset + 16, weights_region, 0)])  # fmt: skip


def test_a_job_pointing_outside_what_it_keeps_cannot_be_compiled():
    kept, elsewhere = np.zeros(8, np.float32), np.zeros(8, np.float32)
    block = np.array([kept.ctypes.data, 8, elsewhere.ctypes.data, 8], np.int64)
    job = Job(1, block, 1, (kept,))
    with pytest.raises(HetflowError, match="'conv3'.*outside every array"):
        _Memory([block, kept]).relocations([job], ["conv3"], _Kernels())


@pytest.fixture(scope="module")
def bare_library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    path = tmp_path_factory.mktemp("library") / "kernels.so"
    native_library.build_library(native_library.job_entries([]), path)
    return ctypes.CDLL(str(path))


@pytest.mark.parametrize(
    ("shape", "view", "new_shape"),
    [
        ((4, 6), np.s_[:, :], (24,)),
        ((4, 6), np.s_[:, :], (2, 2, 3, 2)),
        ((4, 6, 5), np.s_[:, 1:4, :], (4, 15)),  # rows of a strided slice stay together
        ((4, 6, 5), np.s_[:, 1:4, :], (2, 2, 3, 5)),
        ((1, 8, 1, 3), np.s_[:, ::2, :, :], (4, 3, 1)),
        ((4, 6, 5), np.s_[:, 1:4, :], (12, 5)),  # needs a copy: 0
        ((6, 4), np.s_[::2, ::2], (6,)),  # needs a copy: 0
        ((0,), np.s_[:], (-1,)),  # no elements: any strides (a job's empty scratch, reshaped)
        ((4, 0, 3), np.s_[:, :, :], (0, 12)),
    ],
)
def test_the_librarys_no_copy_reshape_agrees_with_numpy(bare_library, shape, view, new_shape):
    source = np.zeros(shape, np.float32)[view]
    function = bare_library.numba_attempt_nocopy_reshape
    function.restype = ctypes.c_int32
    dims = np.array(source.shape, np.int64)
    strides = np.array(source.strides, np.int64)
    new_shape = np.empty(source.shape, np.int8).reshape(new_shape).shape  # (-1 resolved)
    new_dims = np.array(new_shape, np.int64)
    new_strides = np.zeros(len(new_shape), np.int64)
    ok = function(ctypes.c_int64(len(dims)), ctypes.c_void_p(dims.ctypes.data), ctypes.c_void_p(strides.ctypes.data),
                  ctypes.c_int64(len(new_dims)), ctypes.c_void_p(new_dims.ctypes.data),
                  ctypes.c_void_p(new_strides.ctypes.data), ctypes.c_int64(4), ctypes.c_int32(0))  # fmt: skip
    try:
        reshaped = np.reshape(source, new_shape, copy=False)  # numpy's own: raises where a copy is needed
    except ValueError:
        assert ok == 0
    else:
        assert ok == 1
        if source.size == 0:
            return
        # (an axis of length 1 may have any stride)
        assert [s for s, n in zip(new_strides, new_shape) if n > 1] == [
            s for s, n in zip(reshaped.strides, new_shape) if n > 1
        ]
