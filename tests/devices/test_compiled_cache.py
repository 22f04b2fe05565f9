"""numba's kernel caches are cleared when any CPU-device source changes (``compiled_cache``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hetflow.devices.cpu import compiled_cache
from hetflow.devices.cpu.compiled_cache import STAMP_NAME, cache_folder, clear_stale


def _package(root: Path) -> Path:
    """A folder of two modules with an in-tree cache holding entries of one of them and of a stranger."""
    (root / "caller.py").write_text("X = 1\n")
    (root / "helper.py").write_text("Y = 2\n")
    cache = root / "__pycache__"
    cache.mkdir()
    for name in ("caller.run-3.py311.nbi", "caller.run-3.py311.1.nbc", "stranger.f-1.py311.nbi",
                 "caller.cpython-311.pyc"):  # fmt: skip
        (cache / name).write_bytes(b"x")
    return cache


@pytest.fixture(autouse=True)
def _in_tree_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's rules as without NUMBA_CACHE_DIR (caches beside the sources), whatever the caller's
    environment sets: these tests build their cache folders there."""
    monkeypatch.setattr(compiled_cache.numba.config, "CACHE_DIR", "")


def test_cache_folder_is_numbas_in_tree_pycache(tmp_path: Path) -> None:
    (tmp_path / "module.py").write_text("")
    assert cache_folder(tmp_path / "module.py") == tmp_path / "__pycache__"


def test_cache_folder_follows_numba_cache_dir(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    (tmp_path / "module.py").write_text("")
    monkeypatch.setattr(compiled_cache.numba.config, "CACHE_DIR", str(tmp_path / "elsewhere"))
    folder = cache_folder(tmp_path / "module.py")
    assert folder is not None and folder.parent == tmp_path / "elsewhere"


def test_first_look_clears_only_this_folders_numba_entries(tmp_path: Path) -> None:
    cache = _package(tmp_path)
    deleted = clear_stale(tmp_path)
    assert sorted(path.name for path in deleted) == ["caller.run-3.py311.1.nbc", "caller.run-3.py311.nbi"]
    assert sorted(path.name for path in cache.iterdir()) == [
        "caller.cpython-311.pyc", STAMP_NAME, "stranger.f-1.py311.nbi"]  # fmt: skip


def test_unchanged_sources_keep_their_entries(tmp_path: Path) -> None:
    cache = _package(tmp_path)
    clear_stale(tmp_path)
    (cache / "caller.run-3.py311.nbi").write_bytes(b"x")  # compiled again from these sources
    assert clear_stale(tmp_path) == []
    assert (cache / "caller.run-3.py311.nbi").exists()


def test_a_changed_helper_clears_its_callers_entries(tmp_path: Path) -> None:
    cache = _package(tmp_path)
    clear_stale(tmp_path)
    (cache / "caller.run-3.py311.nbi").write_bytes(b"x")
    (tmp_path / "helper.py").write_text("Y = 3\n")
    assert [path.name for path in clear_stale(tmp_path)] == ["caller.run-3.py311.nbi"]
    assert clear_stale(tmp_path) == []


def test_a_new_numba_clears_the_entries(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    cache = _package(tmp_path)
    clear_stale(tmp_path)
    (cache / "caller.run-3.py311.nbi").write_bytes(b"x")
    monkeypatch.setattr(compiled_cache.numba, "__version__", "99.0")
    assert [path.name for path in clear_stale(tmp_path)] == ["caller.run-3.py311.nbi"]


_HELPER = """
import numba

@numba.njit(cache=True)
def offset(x):
    return {value}
"""

_CALLER = """
import numba
from helper import offset

@numba.njit(cache=True)
def run(x):
    return x + offset(x)
"""


def _run_caller(folder: Path, guarded: bool) -> int:
    """``run(1)`` in a fresh process (loading numba's cache of the caller), after ``clear_stale`` if
    ``guarded``."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(folder)!r})
        if {guarded}:
            from hetflow.devices.cpu.compiled_cache import clear_stale
            clear_stale(Path({str(folder)!r}))
        import caller
        print(caller.run(1))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def test_a_cached_caller_sees_its_edited_helper(tmp_path: Path) -> None:
    """numba keys the caller's cache on caller.py alone: after helper.py changes, only the guard makes
    the caller compile again."""
    (tmp_path / "caller.py").write_text(_CALLER)
    (tmp_path / "helper.py").write_text(_HELPER.format(value=1))
    assert _run_caller(tmp_path, guarded=True) == 2
    (tmp_path / "helper.py").write_text(_HELPER.format(value=10))
    assert _run_caller(tmp_path, guarded=True) == 11


def test_the_cpu_device_stamps_its_kernel_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the CPU device ran the guard: its kernel cache folder holds the current stamp."""
    monkeypatch.undo()  # the folder numba really uses, NUMBA_CACHE_DIR included
    import hetflow.devices.cpu  # noqa: F401

    root = Path(compiled_cache.__file__).resolve().parent
    sources = compiled_cache.package_sources(root)
    folder = cache_folder(root / "kernels" / "conv.py")
    assert folder is not None
    assert (folder / STAMP_NAME).read_text().strip() == compiled_cache.source_digest(sources, root)
