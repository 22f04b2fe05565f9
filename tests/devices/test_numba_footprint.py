"""numba's fixed cost made smaller (``hetflow.devices.cpu.numba_footprint``): its array registry loaded
without SciPy's BLAS bindings, its runtime loaded from object code kept by an earlier process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_leaves_scipy_linalg_unloaded_and_numba_still_compiles_dot():
    pytest.importorskip("scipy", reason="the bindings this hides come with SciPy")
    found = _run(
        """
        import json, sys
        import numba, numpy as np
        from hetflow import InferenceSession, zoo
        session = InferenceSession(str(zoo.model_path("lenet")))
        session.run(None, {session.get_inputs()[0].name: np.ones((1, 1, 28, 28), np.float32)})
        after_run = "scipy.linalg" in sys.modules

        @numba.njit
        def product(a, b):
            return np.dot(a, b)

        total = float(product(np.ones((3, 3)), np.ones((3, 3))).sum())
        print(json.dumps({"after_run": after_run, "dot": total, "hidden_left": [
            name for name in ("scipy.linalg.cython_blas", "scipy.linalg.cython_lapack") if sys.modules.get(name, 0) is None
        ]}))
        """
    )
    assert found == {"after_run": False, "dot": 27.0, "hidden_left": []}


def test_scipy_loaded_first_is_left_alone():
    pytest.importorskip("scipy", reason="the bindings this hides come with SciPy")
    found = _run(
        """
        import json
        import scipy.linalg.cython_blas
        import hetflow
        import numba.np.arraymath
        print(json.dumps({"blas": numba.np.arraymath._HAVE_BLAS}))
        """
    )
    assert found == {"blas": True}


_RUNTIME_USER = """
    import json
    import numba, numpy as np
    from hetflow.devices.cpu import numba_footprint
    from numba.core.runtime import nrtdynmod

    compiled = []
    keep = numba_footprint._compile_and_keep
    numba_footprint._compile_and_keep = lambda ctx, path: compiled.append(path.name) or keep(ctx, path)

    @numba.njit
    def allocate_and_sum(n):
        return np.arange(n).sum()  # an array the runtime allocates and frees

    total = int(allocate_and_sum(100))
    folder = nrtdynmod.compile_nrt_functions.hetflow_folder
    kept = sorted(p.name for p in folder.iterdir() if p.name.startswith(numba_footprint.RUNTIME_PREFIX))
    print(json.dumps({"total": total, "compiled": compiled, "kept": kept}))
"""


def test_numba_runtime_is_compiled_once_then_loaded(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first = _run(_RUNTIME_USER, env)
    second = _run(_RUNTIME_USER, env)
    assert first["total"] == second["total"] == 4950
    assert len(first["compiled"]) == 1 and first["kept"] == first["compiled"]
    assert second["compiled"] == [] and second["kept"] == first["kept"]


def test_a_damaged_runtime_file_is_compiled_again(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first = _run(_RUNTIME_USER, env)
    (kept,) = [path for path in tmp_path.rglob(first["kept"][0])]
    kept.write_bytes(b"not a pickle")
    again = _run(_RUNTIME_USER, env)
    assert again["total"] == 4950 and again["compiled"] == first["kept"]
