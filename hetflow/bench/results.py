"""What a benchmark target returns, and how it is written: Markdown table, JSON, PNG or SVG plot."""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Cell = str | int | float | None


@dataclass
class Series:
    """One line of a plot: ``values[i]`` belongs to the result's ``x_values[i]`` (None: not measured)."""

    label: str
    values: list[float | None]


@dataclass
class BenchResult:
    """A benchmark target's measurements.

    Attributes:
        target: the target's name.
        title: what was measured, as a caption.
        columns: table header.
        rows: table cells, one list per row.
        x_label / y_label: plot axes; x_values: the plot's x positions (labels when strings).
        series: the plot's lines (or bar groups when x_values are strings).
        log_y: plot y on a log scale.
        notes: lines printed under the table (machine, protocol, caveats).
    """

    target: str
    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    x_label: str = ""
    y_label: str = ""
    x_values: list[Any] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    log_y: bool = False
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """The table as Markdown, with the title above and the notes below."""
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def write(self, folder: str | Path) -> list[Path]:
        """Write ``TARGET.md``, ``TARGET.json`` and ``TARGET.png`` (``.svg`` without matplotlib)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / f"{self.target}.md", out / f"{self.target}.json"]
        written[0].write_text(self.markdown(), encoding="utf-8")
        written[1].write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        if self.series:
            written.append(write_plot(self, out / f"{self.target}.png"))
        return written


def _cell(value: Cell) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def write_plot(result: BenchResult, path: Path) -> Path:
    """PNG through matplotlib when it is installed, else the same figure as SVG beside ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        target = path.with_suffix(".svg")
        target.write_text(_svg(result), encoding="utf-8")
        return target
    figure, axes = plt.subplots(figsize=(8, 4.5))
    categorical = any(isinstance(x, str) for x in result.x_values)
    positions = list(range(len(result.x_values))) if categorical else result.x_values
    width = 0.8 / max(len(result.series), 1)
    for index, series in enumerate(result.series):
        points = [(p, v) for p, v in zip(positions, series.values) if v is not None]
        if categorical:
            axes.bar([p + (index - (len(result.series) - 1) / 2) * width for p, _ in points],
                     [v for _, v in points], width, label=series.label)
        else:
            axes.plot([p for p, _ in points], [v for _, v in points], "o-", label=series.label)
    if categorical:
        axes.set_xticks(positions, [str(x) for x in result.x_values], rotation=30, ha="right", fontsize=8)
    elif result.x_values and min(result.x_values) > 0 and max(result.x_values) / min(result.x_values) > 16:
        axes.set_xscale("log", base=2)
    if result.log_y:
        axes.set_yscale("log")
    axes.set_xlabel(result.x_label)
    axes.set_ylabel(result.y_label)
    axes.set_title(result.title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#b07aa1")


def _svg(result: BenchResult) -> str:
    """A minimal grouped-bar chart (one group per x value), enough to read the result without matplotlib."""
    width, height, left, top, bottom = 900, 420, 70, 40, 90
    values = [v for s in result.series for v in s.values if v is not None and v > 0]
    high = max(values, default=1.0)
    low = min(values, default=1.0)
    log = result.log_y and high / low > 10

    def scale(value: float) -> float:
        if log:
            return (math.log10(value) - math.log10(low) + 0.1) / (math.log10(high) - math.log10(low) + 0.1)
        return value / high

    plot_h = height - top - bottom
    group = (width - left - 20) / max(len(result.x_values), 1)
    bar = group * 0.8 / max(len(result.series), 1)
    parts = [f'<text x="{left}" y="20" font-size="13" font-weight="bold">{html.escape(result.title)}</text>']
    for gi, x in enumerate(result.x_values):
        gx = left + gi * group
        parts.append(f'<text x="{gx + group / 2:.1f}" y="{height - bottom + 14}" font-size="9" '
                     f'text-anchor="middle">{html.escape(str(x))}</text>')
        for si, series in enumerate(result.series):
            value = series.values[gi]
            if value is None or value <= 0:
                continue
            h = plot_h * scale(value)
            parts.append(f'<rect x="{gx + si * bar:.1f}" y="{top + plot_h - h:.1f}" width="{bar * 0.95:.1f}" '
                         f'height="{h:.1f}" fill="{_COLOURS[si % len(_COLOURS)]}"><title>{html.escape(series.label)}'
                         f": {value:.4g}</title></rect>")
    for si, series in enumerate(result.series):
        parts.append(f'<rect x="{left + si * 160}" y="{height - 30}" width="10" height="10" '
                     f'fill="{_COLOURS[si % len(_COLOURS)]}"/><text x="{left + si * 160 + 14}" y="{height - 21}" '
                     f'font-size="11">{html.escape(series.label)}</text>')
    parts.append(f'<text x="12" y="{top + plot_h / 2}" font-size="11" transform="rotate(-90 12 {top + plot_h / 2})">'
                 f"{html.escape(result.y_label)}{' (log)' if log else ''}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
            + "".join(parts) + "</svg>")
