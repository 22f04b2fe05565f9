"""The architecture-only "light" models the onnx package ships, against the outputs shipped beside them.

Their weights are ConstantOfShape nodes, folded into initializers at load; ONNX Runtime reproduces the
shipped outputs when fed all-ones input of the declared shape, and so must hetflow.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import hetflow

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT_DIR.glob("light_*.onnx"))


def test_the_onnx_package_ships_the_nine_light_models():
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_shipped_output(name):
    session = hetflow.InferenceSession(LIGHT_DIR / f"light_{name}.onnx")
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT_DIR / f"light_{name}_output_0.pb")))
    feeds = {
        arg.name: np.ones([d if isinstance(d, int) else 1 for d in arg.shape], np.float32)
        for arg in session.get_inputs()
    }
    (actual,) = session.run(None, feeds)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-5)
