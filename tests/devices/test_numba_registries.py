"""numba's array registry loaded without SciPy's BLAS bindings (``hetflow.devices.cpu.numba_registries``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("scipy", reason="the bindings this hides come with SciPy")


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_leaves_scipy_linalg_unloaded_and_numba_still_compiles_dot():
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
