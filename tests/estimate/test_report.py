"""Reports: the JSON schema scripts rely on, CSV, plots (well-formed SVG / HTML), the memory verdict, CLI."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetflow.cli import main
from hetflow.errors import HetflowError
from hetflow.estimate.predict import estimate, parse_bytes
from hetflow.estimate.report import CSV_COLUMNS, format_table, plot_svg, write_plot
from tests.helpers import make_model

SVG = "{http://www.w3.org/2000/svg}"
LAYER_KEYS = {"name", "op", "output_shape", "params", "macs", "gemm", "bytes", "predicted_ms"}
TOTAL_KEYS = {"params", "macs", "weights_bytes", "data_bytes", "workspace_bytes", "predicted_ms"}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """conv 3x3 (+ReLU) -> max pool -> flatten -> FC -> softmax on [N, 4, 16, 16], saved as .onnx."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["g"], name="fc", transB=1),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax"),
    ]
    inits = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "b": np.zeros(8, np.float32),
             "fw": rng.standard_normal((10, 512)).astype(np.float32), "fb": np.zeros(10, np.float32)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 4, 16, 16])], [("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path_factory.mktemp("models") / "small.onnx"
    onnx.save(model, str(path))
    return path


def test_json_has_exactly_the_documented_schema(model_path, profile_path, capsys):
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"model", "batch", "device", "layers", "totals"}
    assert report["model"] == str(model_path) and report["batch"] == 2 and isinstance(report["device"], str)
    assert set(report["totals"]) == TOTAL_KEYS
    # The session's optimised graph: the ReLU is fused into the convolution.
    assert [layer["op"] for layer in report["layers"]] == ["Conv", "MaxPool", "Flatten", "Gemm", "Softmax"]
    for layer in report["layers"]:
        assert set(layer) == LAYER_KEYS
        assert isinstance(layer["output_shape"], list) and layer["output_shape"][0] == 2
        assert layer["gemm"] is None or set(layer["gemm"]) == {"n", "m", "k"}
        assert layer["predicted_ms"] > 0
    conv = report["layers"][0]
    assert conv["gemm"] == {"n": 8, "m": 256, "k": 36} and conv["macs"] == 2 * 8 * 256 * 36
    assert report["layers"][2]["gemm"] is None
    # The layers plus the run's in-run losses and overhead (which a run replayed whole may make negative).
    result = estimate(str(model_path), str(profile_path), 2)
    total = sum(layer["predicted_ms"] for layer in report["layers"])
    assert report["totals"]["predicted_ms"] == pytest.approx(result.predicted_ms)
    assert result.predicted_ms == pytest.approx(total + result.in_run_ms + result.overhead_ms)
    assert report["totals"]["params"] == 8 * 36 + 8 + 5120 + 10


def test_validated_json_adds_measured_ms_everywhere(model_path, profile_path, capsys):
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--json", "--validate"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["totals"]) == TOTAL_KEYS | {"measured_ms"}
    assert report["totals"]["measured_ms"] > 0
    for layer in report["layers"]:
        assert set(layer) == LAYER_KEYS | {"measured_ms"} and layer["measured_ms"] > 0


def test_csv_has_one_row_per_layer(model_path, profile_path, tmp_path):
    out = tmp_path / "layers.csv"
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--csv", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [row["name"] for row in rows] == ["conv", "pool", "flatten", "fc", "softmax"]
    assert rows[0]["gemm_n"] == "8" and rows[0]["gemm_k"] == "36" and rows[2]["gemm_n"] == ""
    assert all(float(row["predicted_ms"]) > 0 and row["measured_ms"] == "" for row in rows)


def test_table_lists_layers_op_shares_and_memory(model_path, profile_path, capsys):
    assert main(["estimate", str(model_path), "--device", str(profile_path)]) == 0
    out = capsys.readouterr().out
    for text in ("conv", "8x256x36", "time by op type", "Augur's accounting", "hetflow planned peak", "predicted"):
        assert text in out


def _svg_root(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    return root


def test_plot_svg_is_well_formed_with_bars(model_path, profile_path, tmp_path):
    out = tmp_path / "plot.svg"
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--plot", str(out)]) == 0
    root = ET.parse(out).getroot()
    assert root.tag == f"{SVG}svg"
    rects = root.findall(f".//{SVG}rect")
    assert len(rects) >= 5 + 5  # one bar per op type and one per layer
    texts = "".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "Conv" in texts and "%" in texts


def test_validated_plot_has_scatter_and_identity_line(model_path, quick_profile, tmp_path):
    result = estimate(str(model_path), quick_profile, validate=True)
    root = _svg_root(plot_svg(result))
    assert len(root.findall(f".//{SVG}circle")) >= 2 * len(result.layers)  # layer dots + scatter points
    assert any(line.get("stroke-dasharray") == "4,3" for line in root.iter(f"{SVG}line"))  # y = x
    page = write_plot(result, tmp_path / "plot.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    _svg_root(page[page.index("<svg"):page.index("</svg>") + len("</svg>")])


def test_plot_refuses_unknown_extension(model_path, quick_profile, tmp_path):
    result = estimate(str(model_path), quick_profile)
    with pytest.raises(HetflowError, match="svg"):
        write_plot(result, tmp_path / "plot.gif")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512MB", 512_000_000), ("1.5GiB", int(1.5 * 2**30)), ("1024", 1024), ("64 KiB", 65536), ("2gb", 2 * 10**9),
     ("100k", 100_000), ("3MiB", 3 * 2**20)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "12XB", "", "-1MB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_memory_limit_verdict(model_path, quick_profile, profile_path, capsys):
    result = estimate(str(model_path), quick_profile, batch=4, memory_limit="1GiB")
    assert result.memory.limit_bytes == 2**30 and result.memory.fits() is True
    tight = estimate(str(model_path), quick_profile, batch=4, memory_limit=result.memory.planned_total_bytes - 1)
    assert tight.memory.fits() is False
    assert result.memory.planned_total_bytes == (result.memory.weights_bytes + result.memory.cache_bytes
                                                 + result.memory.input_bytes + result.memory.peak_bytes)
    assert "FITS" in format_table(result) and "DOES NOT FIT" in format_table(tight)
    # The command says so, and its exit status (3) lets scripts test it.
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--memory-limit", "1KB"]) == 3
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--memory-limit", "1.5GiB"]) == 0
    assert main(["estimate", str(model_path), "--device", str(profile_path), "--memory-limit", "huge"]) == 1
    assert "memory-limit" in capsys.readouterr().err
