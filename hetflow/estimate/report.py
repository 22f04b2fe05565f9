"""Estimate reports: a readable table, CSV, the JSON document, and plots (SVG, HTML; PNG with matplotlib).

Plots are written without any plotting library: an SVG document (or an HTML page embedding it) with the
time share by op type, per-layer bars, and — after validation — predicted against measured per layer on
log axes with the y = x line (Augur's Figs. 7-8).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from hetflow.errors import HetflowError
from hetflow.estimate.predict import Estimate, LayerEstimate

MIB = float(1 << 20)
#: Where the table sections write to (``io.StringIO.write``).
Writer = Callable[[str], object]


# -- accuracy --------------------------------------------------------------------------------------
def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else float("inf")


def dominant_layers(layers: Sequence[LayerEstimate], coverage: float = 0.9) -> list[LayerEstimate]:
    """The slowest measured layers that together take ``coverage`` of the measured layer time."""
    timed = sorted((la for la in layers if la.measured_ms is not None), key=lambda la: -(la.measured_ms or 0.0))
    total = sum(la.measured_ms or 0.0 for la in timed)
    chosen, running = [], 0.0
    for layer in timed:
        if running >= coverage * total:
            break
        chosen.append(layer)
        running += layer.measured_ms or 0.0
    return chosen


def layer_accuracy(result: Estimate, tolerance: float = 0.2, coverage: float = 0.9) -> tuple[float, int]:
    """(share of the dominant layers predicted within ``tolerance``, how many dominant layers)."""
    chosen = dominant_layers(result.layers, coverage)
    if not chosen:
        return 0.0, 0
    within = sum(1 for la in chosen if abs(la.error() or 0.0) <= tolerance)
    return within / len(chosen), len(chosen)


# -- table -----------------------------------------------------------------------------------------
def _count(value: int) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return str(value)


def _gemm(layer: LayerEstimate) -> str:
    if layer.gemm is None:
        return "-"
    text = f"{layer.gemm.n}x{layer.gemm.m}x{layer.gemm.k}"
    return text if layer.gemm.count == 1 else f"{text} *{layer.gemm.count}"


def format_table(result: Estimate, max_layers: int | None = None) -> str:
    """The human-readable report: layers, totals, time by op type, memory and the verdict."""
    out = io.StringIO()
    write = out.write
    write(f"model   {result.model}   batch {result.batch}\n")
    write(f"device  {result.profile.describe()}\n")
    for note in result.notes:
        write(f"note    {note}\n")
    measured = result.validated
    header = (f"{'layer':<28} {'op':<18} {'algorithm':<13} {'output shape':<18} {'params':>8} {'MACs':>8} "
              f"{'GEMM n x m x k':<22} {'MB moved':>9} {'pred ms':>9}")
    if measured:
        header += f" {'meas ms':>9} {'error':>7}"
    write("\n" + header + "\n" + "-" * len(header) + "\n")
    layers = result.layers if max_layers is None else sorted(result.layers, key=lambda la: -la.predicted_ms)[:max_layers]
    for layer in layers:
        shape = "x".join(str(d) for d in layer.output_shape) or "-"
        row = (f"{layer.name[:28]:<28} {layer.op[:18]:<18} {layer.algorithm[:13]:<13} {shape[:18]:<18} "
               f"{_count(layer.params):>8} {_count(layer.macs):>8} {_gemm(layer)[:22]:<22} "
               f"{layer.bytes / 1e6:>9.2f} {layer.predicted_ms:>9.3f}")
        if measured:
            error = layer.error()
            row += f" {layer.measured_ms or 0.0:>9.3f} {'' if error is None else f'{error * 100:+6.1f}%':>7}"
        write(row + "\n")
    if max_layers is not None and len(result.layers) > max_layers:
        write(f"... {len(result.layers) - max_layers} faster layers not shown\n")
    _write_totals(result, write)
    _write_op_types(result, write)
    _write_memory(result, write)
    return out.getvalue()


def _write_totals(result: Estimate, write: Writer) -> None:
    totals = result.totals()
    layer_ms = sum(la.predicted_ms for la in result.layers)
    write(f"\ntotal   {len(result.layers)} layers, {_count(totals['params'])} params, "
          f"{_count(totals['macs'])} MACs\n")
    in_run = f" + in-run {result.in_run_ms:.3f}" if result.in_run_ms else ""
    write(f"time    predicted {result.predicted_ms:.3f} ms (layers {layer_ms:.3f}{in_run} + executor "
          f"{result.overhead_ms:.3f})")
    if result.measured_ms is not None:
        error = relative_error(result.predicted_ms, result.measured_ms)
        write(f", measured {result.measured_ms:.3f} ms, error {error * 100:+.1f}%")
        share, count = layer_accuracy(result)
        timed = [la for la in result.layers if la.measured_ms]
        layer_mape = sum(abs(la.error() or 0.0) for la in timed) / max(1, len(timed))
        write(f"\nlayers  {share * 100:.0f}% of the {count} layers making 90% of the measured time within "
              f"+-20%; per-layer MAPE {layer_mape * 100:.1f}%")
    write("\n")


def _write_op_types(result: Estimate, write: Writer) -> None:
    write("\ntime by op type (predicted" + (", measured)" if result.validated else ")") + "\n")
    measured = {op: (ms, share) for op, ms, share in result.op_type_times(measured=True)} if result.validated else {}
    for op, ms, share in result.op_type_times():
        line = f"  {op:<22} {ms:10.3f} ms {share * 100:5.1f}%"
        if op in measured:
            line += f"   {measured[op][0]:10.3f} ms {measured[op][1] * 100:5.1f}%"
        write(line + f"  {'#' * max(1, round(share * 30)) if share > 0 else ''}\n")


def _write_memory(result: Estimate, write: Writer) -> None:
    mem = result.memory
    write("\nmemory (MiB)\n")
    write(f"  Augur's accounting    weights+biases {mem.weights_bytes / MIB:.2f}, every blob {mem.data_bytes / MIB:.2f}, "
          f"all im2col/workspace buffers {mem.workspace_bytes / MIB:.2f}: total {mem.augur_total_bytes / MIB:.2f}\n")
    caches = f" + kernel caches {mem.cache_bytes / MIB:.2f}" if mem.cache_bytes else ""
    held = mem.weights_bytes - mem.mapped_bytes
    mapped = f" (of {mem.weights_bytes / MIB:.2f}: {mem.mapped_bytes / MIB:.2f} mapped, held packed)" if mem.mapped_bytes else ""
    write(f"  hetflow planned peak  weights {held / MIB:.2f}{mapped}{caches} + inputs {mem.input_bytes / MIB:.2f} + "
          f"activations and scratch {mem.peak_bytes / MIB:.2f} (at {mem.peak_layer or '-'}): "
          f"total {mem.planned_total_bytes / MIB:.2f}\n")
    if mem.measured_peak_bytes is not None:
        error = relative_error(mem.peak_bytes, mem.measured_peak_bytes) if mem.measured_peak_bytes else 0.0
        write(f"  measured run peak     activations and scratch {mem.measured_peak_bytes / MIB:.2f} "
              f"(prediction error {error * 100:+.1f}%)\n")
    fits = mem.fits()
    if fits is not None and mem.limit_bytes is not None:
        use = mem.planned_total_bytes / mem.limit_bytes if mem.limit_bytes else float("inf")
        verdict = "FITS" if fits else "DOES NOT FIT"
        write(f"  limit {mem.limit_bytes / MIB:.2f} MiB: {verdict} ({use * 100:.0f}% of the limit)\n")


# -- CSV and JSON ----------------------------------------------------------------------------------
CSV_COLUMNS = ("name", "op", "algorithm", "output_shape", "params", "macs", "gemm_n", "gemm_m", "gemm_k",
               "gemm_count", "bytes", "workspace_bytes", "predicted_ms", "measured_ms")


def to_csv(result: Estimate) -> str:
    """One row per layer (``measured_ms`` empty unless validated)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for la in result.layers:
        gemm = (la.gemm.n, la.gemm.m, la.gemm.k, la.gemm.count) if la.gemm else ("", "", "", "")
        writer.writerow([la.name, la.op, la.algorithm, "x".join(str(d) for d in la.output_shape), la.params, la.macs,
                         *gemm, la.bytes, la.workspace_bytes, f"{la.predicted_ms:.6f}",
                         "" if la.measured_ms is None else f"{la.measured_ms:.6f}"])
    return out.getvalue()


def to_json(result: Estimate) -> str:
    return json.dumps(result.to_dict(), indent=1)


# -- plots -----------------------------------------------------------------------------------------
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac")
_WIDTH = 960


def write_plot(result: Estimate, path: str | os.PathLike[str]) -> Path:
    """Write the plot to ``path``: ``.svg``, ``.html`` (inline SVG), or ``.png`` (needs matplotlib).

    Raises:
        HetflowError: an unknown extension, or PNG without matplotlib.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix == ".png":
        _write_png(result, target)
        return target
    svg = plot_svg(result)
    if suffix == ".svg":
        target.write_text(svg, encoding="utf-8")
    elif suffix in (".html", ".htm"):
        title = html.escape(f"hetflow estimate: {result.model}, batch {result.batch}")
        target.write_text(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>"
                          f"<body style=\"font-family:sans-serif\">\n{svg}\n</body></html>\n", encoding="utf-8")
    else:
        raise HetflowError(f"cannot plot to '{target.name}': use a .svg, .html or .png file")
    return target


def plot_svg(result: Estimate) -> str:
    """The whole figure as one SVG document."""
    panels = [_op_share_panel(result), _layer_panel(result)]
    if result.validated:
        panels.append(_scatter_panel(result))
    height = sum(h for h, _ in panels) + 20
    body, y = [], 10
    for panel_height, content in panels:
        body.append(f'<g transform="translate(0,{y})">{content}</g>')
        y += panel_height
    title = html.escape(f"{result.model}  batch {result.batch}  on {result.device}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
            f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="11">'
            f"<title>{title}</title>" + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11, weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
            f'font-weight="{weight}">{html.escape(text)}</text>')


def _op_share_panel(result: Estimate) -> tuple[int, str]:
    rows = result.op_type_times()[:10]
    bar_height, top, left, width = 18, 30, 170, _WIDTH - 290
    parts = [_text(10, 18, "Predicted time share by op type", size=13, weight="bold")]
    longest = max((ms for _, ms, _ in rows), default=1.0) or 1.0
    for index, (op, ms, share) in enumerate(rows):
        y = top + index * (bar_height + 4)
        length = width * ms / longest
        parts.append(_text(left - 8, y + 13, op, anchor="end"))
        parts.append(f'<rect x="{left}" y="{y}" width="{max(length, 1):.1f}" height="{bar_height}" '
                     f'fill="{_PALETTE[index % len(_PALETTE)]}"><title>{html.escape(op)}: {ms:.3f} ms</title></rect>')
        parts.append(_text(left + length + 6, y + 13, f"{share * 100:.1f}%  ({ms:.2f} ms)"))
    return top + len(rows) * (bar_height + 4) + 20, "".join(parts)


def _layer_panel(result: Estimate) -> tuple[int, str]:
    layers = result.layers
    top, left, height = 30, 60, 220
    width = _WIDTH - left - 20
    parts = [_text(10, 18, "Per-layer time (ms): predicted" + (" (bars) and measured (dots)" if result.validated
                                                                    else ""), size=13, weight="bold")]
    values = [la.predicted_ms for la in layers] + [la.measured_ms or 0.0 for la in layers]
    longest = max(values, default=1.0) or 1.0
    step = width / max(1, len(layers))
    colours = {op: _PALETTE[i % len(_PALETTE)] for i, (op, _, _) in enumerate(result.op_type_times())}
    parts.append(f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#333"/>')
    for fraction in (0.0, 0.5, 1.0):
        y = top + height * (1 - fraction)
        parts.append(_text(left - 6, y + 4, f"{longest * fraction:.3g}", anchor="end"))
    for index, layer in enumerate(layers):
        x = left + index * step
        bar = height * layer.predicted_ms / longest
        parts.append(f'<rect x="{x:.2f}" y="{top + height - bar:.2f}" width="{max(step * 0.8, 0.5):.2f}" '
                     f'height="{bar:.2f}" fill="{colours.get(layer.op, "#888")}"><title>'
                     f"{html.escape(layer.name)} ({html.escape(layer.op)}): {layer.predicted_ms:.3f} ms"
                     "</title></rect>")
        if layer.measured_ms is not None:
            y = top + height - height * layer.measured_ms / longest
            parts.append(f'<circle cx="{x + step * 0.4:.2f}" cy="{y:.2f}" r="2" fill="#000"/>')
    parts.append(_text(left + width / 2, top + height + 16, f"{len(layers)} layers in execution order",
                       anchor="middle"))
    return top + height + 34, "".join(parts)


def _scatter_panel(result: Estimate) -> tuple[int, str]:
    points = [(la.predicted_ms, la.measured_ms, la) for la in result.layers
              if la.measured_ms and la.measured_ms > 0 and la.predicted_ms > 0]
    size, top, left = 360, 30, 80
    parts = [_text(10, 18, "Predicted vs measured per layer (ms, log-log; dashed: y = x, +-20%)", size=13,
                   weight="bold")]
    if not points:
        return top + 20, "".join(parts)
    values = [p for p, _, _ in points] + [m for _, m, _ in points]
    low = 10 ** math.floor(math.log10(min(values)))
    high = 10 ** math.ceil(math.log10(max(values)))
    span = math.log10(high / low) or 1.0

    def position(value: float) -> float:
        return size * math.log10(value / low) / span

    parts.append(f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="none" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top + size}" x2="{left + size}" y2="{top}" stroke="#333" '
                 'stroke-dasharray="4,3"/>')
    for factor in (0.8, 1.2):
        offset = size * math.log10(factor) / span
        parts.append(f'<line x1="{left + max(0.0, -offset):.1f}" y1="{top + size - max(0.0, offset):.1f}" '
                     f'x2="{left + size - max(0.0, offset):.1f}" y2="{top + max(0.0, -offset):.1f}" stroke="#bbb" '
                     'stroke-dasharray="2,3"/>')
    decade = low
    while decade <= high * 1.0001:
        offset = position(decade)
        parts.append(_text(left + offset, top + size + 14, f"{decade:g}", anchor="middle"))
        parts.append(_text(left - 6, top + size - offset + 4, f"{decade:g}", anchor="end"))
        decade *= 10
    parts.append(_text(left + size / 2, top + size + 30, "measured ms", anchor="middle"))
    parts.append(_text(left - 50, top + size / 2, "predicted ms", anchor="middle"))
    colours = {op: _PALETTE[i % len(_PALETTE)] for i, (op, _, _) in enumerate(result.op_type_times())}
    for predicted, measured, layer in points:
        parts.append(f'<circle cx="{left + position(measured):.1f}" cy="{top + size - position(predicted):.1f}" '
                     f'r="3" fill="{colours.get(layer.op, "#888")}" fill-opacity="0.8"><title>'
                     f"{html.escape(layer.name)}: predicted {predicted:.3f} ms, measured {measured:.3f} ms"
                     "</title></circle>")
    legend_x = left + size + 30
    for index, (op, colour) in enumerate(list(colours.items())[:10]):
        parts.append(f'<circle cx="{legend_x}" cy="{top + 10 + index * 16}" r="4" fill="{colour}"/>')
        parts.append(_text(legend_x + 10, top + 14 + index * 16, op))
    if result.measured_ms:
        error = relative_error(result.predicted_ms, result.measured_ms)
        parts.append(_text(legend_x, top + size - 10, f"whole model: predicted {result.predicted_ms:.2f} ms, "
                           f"measured {result.measured_ms:.2f} ms ({error * 100:+.1f}%)"))
    return top + size + 44, "".join(parts)


def _write_png(result: Estimate, target: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise HetflowError("a .png plot needs matplotlib, which is not installed; write a .svg or .html "
                           "plot instead") from error
    shares = result.op_type_times()[:10]
    rows = 3 if result.validated else 2
    figure, axes = plt.subplots(rows, 1, figsize=(10, 4 * rows))
    axes[0].barh([op for op, _, _ in shares][::-1], [ms for _, ms, _ in shares][::-1])
    axes[0].set_title("Predicted time by op type (ms)")
    axes[1].bar(range(len(result.layers)), [la.predicted_ms for la in result.layers])
    axes[1].set_title("Per-layer predicted time (ms)")
    if result.validated:
        pairs = [(la.measured_ms, la.predicted_ms) for la in result.layers if la.measured_ms]
        axes[2].loglog([m for m, _ in pairs], [p for _, p in pairs], "o", markersize=3)
        low = min(min(pairs)) if pairs else 1e-3
        high = max(max(pairs)) if pairs else 1.0
        axes[2].loglog([low, high], [low, high], "--")
        axes[2].set_xlabel("measured ms")
        axes[2].set_ylabel("predicted ms")
    figure.tight_layout()
    figure.savefig(target)
    plt.close(figure)
