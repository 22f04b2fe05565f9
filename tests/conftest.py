"""Project-wide pytest hooks: summary tables that tests report through ``user_properties``."""

from __future__ import annotations

from typing import Any

#: ``user_properties`` key under which tests/test_zoo.py reports (model, batch, mse, max error).
ZOO_MSE_PROPERTY = "zoo_mse"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the zoo models' hetflow-vs-ONNX Runtime errors, one row per model and batch."""
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == ZOO_MSE_PROPERTY and getattr(report, "when", "call") == "call":
                    rows.append(value)
    if not rows:
        return
    terminalreporter.section("zoo: hetflow vs ONNX Runtime")
    terminalreporter.write_line(f"{'model':16s} {'batch':>5s} {'MSE':>12s} {'max|diff|':>12s} {'max|ORT|':>12s}")
    for name, batch, mse, max_error, scale in sorted(rows):
        terminalreporter.write_line(f"{name:16s} {batch:5d} {mse:12.3e} {max_error:12.3e} {scale:12.3e}")
