"""Sliding-window geometry shared by Conv and the pooling ops (definitions and kernels alike).

One place decides how ``kernel_shape``, ``strides``, ``dilations``, ``pads``, ``auto_pad`` and
``ceil_mode`` turn an input's spatial size into an output size and the padding actually applied, so that
shape inference, cost and every device's kernel agree.

Conventions (ONNX's): ``pads`` is ``(x1_begin, x2_begin, ..., x1_end, x2_end, ...)``; the effective
(dilated) window is ``(kernel - 1) * dilation + 1``. With ``ceil_mode`` the last window may hang past the
end padding: that *overhang* is padded as well, but is never counted as padding (AveragePool's divisor
with ``count_include_pad=1`` excludes it), and a window that would start inside the end padding is dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from hetflow.graph.shapes import Dim

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class WindowSpec:
    """A node's window attributes resolved for its spatial rank (defaults filled in, lengths checked).

    Attributes:
        kernel: window size per spatial axis.
        strides: step per axis.
        dilations: spacing between window taps per axis.
        pads: ``begin... + end...`` explicit padding (ignored unless ``auto_pad`` is ``"NOTSET"``).
        auto_pad: ``"NOTSET"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``"VALID"``.
        ceil_mode: round the output size up (pooling only).
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def effective_kernel(self) -> tuple[int, ...]:
        """The dilated window extent per axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def taps(self) -> int:
        """Number of window positions (``prod(kernel)``)."""
        return int(np.prod(self.kernel, dtype=np.int64))


def window_spec(attrs: Any, kernel: Sequence[int], *, ceil_mode: bool = False) -> WindowSpec:
    """Resolve ``attrs`` (with fields strides, dilations, pads, auto_pad) for a given kernel.

    Args:
        attrs: the op's attrs object; missing list attributes mean "the ONNX default".
        kernel: the window size per spatial axis (``kernel_shape`` or, for Conv, W's spatial dims).
        ceil_mode: pooling's ``ceil_mode``.

    Raises:
        ValueError: attribute lengths do not match the spatial rank, or values are out of range.
    """
    rank = len(kernel)
    strides = _per_axis(attrs.strides, rank, 1, "strides")
    dilations = _per_axis(getattr(attrs, "dilations", None), rank, 1, "dilations")
    pads = tuple(int(p) for p in attrs.pads) if attrs.pads else (0,) * (2 * rank)
    if len(pads) != 2 * rank:
        raise ValueError(f"pads has {len(pads)} values; expected {2 * rank} (begin and end per axis)")
    if attrs.auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad is '{attrs.auto_pad}'; expected one of {', '.join(AUTO_PADS)}")
    if any(k < 1 for k in kernel):
        raise ValueError(f"kernel shape {tuple(kernel)} must be positive")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise ValueError(f"strides {strides} and dilations {dilations} must be positive")
    if any(p < 0 for p in pads):
        raise ValueError(f"pads {pads} must not be negative")
    return WindowSpec(tuple(int(k) for k in kernel), strides, dilations, pads, attrs.auto_pad, ceil_mode)


def _per_axis(values: Sequence[int] | None, rank: int, default: int, name: str) -> tuple[int, ...]:
    if not values:
        return (default,) * rank
    if len(values) != rank:
        raise ValueError(f"{name} has {len(values)} values; the input has {rank} spatial axes")
    return tuple(int(v) for v in values)


@dataclass(frozen=True)
class AxisGeometry:
    """How one spatial axis is windowed.

    Attributes:
        size: input length.
        out: output length.
        pad_begin: padding before the input.
        pad_end: padding after the input (counted as padding).
        overhang: extra padding ceil_mode needs past ``pad_end`` (never counted as padding).
        kernel: taps along the axis.
        stride: step between windows.
        dilation: step between taps.
    """

    size: int
    out: int
    pad_begin: int
    pad_end: int
    overhang: int
    kernel: int
    stride: int
    dilation: int

    @property
    def padded(self) -> int:
        """Length of the padded input every window fits in."""
        return self.pad_begin + self.size + self.pad_end + self.overhang

    def tap_slice(self, tap: int) -> slice:
        """The slice of the padded input that tap ``tap`` of every window reads, in output order."""
        start = tap * self.dilation
        return slice(start, start + (self.out - 1) * self.stride + 1, self.stride)

    def window_counts(self, include_pad: bool) -> np.ndarray:
        """Per output position, how many taps land on real input (or on input or padding)."""
        lo, hi = (-self.pad_begin, self.size + self.pad_end) if include_pad else (0, self.size)
        starts = np.arange(self.out, dtype=np.int64) * self.stride - self.pad_begin
        taps = starts[:, None] + np.arange(self.kernel, dtype=np.int64)[None, :] * self.dilation
        return ((taps >= lo) & (taps < hi)).sum(axis=1)


def axis_geometry(size: int, spec: WindowSpec, axis: int) -> AxisGeometry:
    """The geometry of spatial axis ``axis`` of length ``size``.

    Raises:
        ValueError: the window does not fit (no output position).
    """
    kernel, stride, dilation = spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
    extent = (kernel - 1) * dilation + 1
    if spec.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + extent - size)
        # NOTE: an odd total puts the extra element at the end for SAME_UPPER, at the start for SAME_LOWER.
        begin = total // 2 if spec.auto_pad == "SAME_UPPER" else total - total // 2
        end = total - begin
    else:
        begin, end = (0, 0) if spec.auto_pad == "VALID" else (spec.pads[axis], spec.pads[spec.rank + axis])
        span = size + begin + end - extent
        if span < 0:
            raise ValueError(
                f"window {extent} (kernel {kernel}, dilation {dilation}) is larger than the padded "
                f"input {size + begin + end} on spatial axis {axis}"
            )
        out = span // stride + 1
        if spec.ceil_mode and spec.auto_pad == "NOTSET":
            out = -(-span // stride) + 1
            # A window that would start in the end padding is dropped.
            if (out - 1) * stride >= size + begin:
                out -= 1
    if out < 1:
        raise ValueError(f"spatial axis {axis} of size {size} gives an empty output")
    overhang = max(0, (out - 1) * stride + extent - (size + begin + end))
    return AxisGeometry(size, out, begin, end, overhang, kernel, stride, dilation)


@dataclass(frozen=True)
class Geometry:
    """The windowing of every spatial axis of one concrete input."""

    axes: tuple[AxisGeometry, ...]

    @property
    def out(self) -> tuple[int, ...]:
        return tuple(a.out for a in self.axes)

    @property
    def pads_begin(self) -> tuple[int, ...]:
        return tuple(a.pad_begin for a in self.axes)

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(a.kernel for a in self.axes)

    @property
    def needs_padding(self) -> bool:
        """Whether any tap reads outside the input (so the input must be copied into a padded one)."""
        return any(a.pad_begin or a.padded > a.pad_begin + a.size for a in self.axes)

    @property
    def covers_input(self) -> bool:
        """Whether there is one window and it holds the whole input (with or without padding around it):
        a pool that is a global reduction."""
        return all(a.out == 1 and a.dilation == 1 and a.kernel - a.pad_begin >= a.size for a in self.axes)

    def taps(self) -> Iterator[tuple[int, ...]]:
        """Every window tap, row-major (the order ONNX's reference scans windows in)."""
        return product(*(range(a.kernel) for a in self.axes))

    def tap_slices(self, tap: Sequence[int]) -> tuple[slice, ...]:
        """Spatial slices of the padded input read by ``tap`` of every window."""
        return tuple(a.tap_slice(t) for a, t in zip(self.axes, tap))

    def pad(self, x: np.ndarray, value: float | int = 0) -> np.ndarray:
        """``x`` (``[N, C, *spatial]``) padded so every window fits; ``x`` itself when none is needed."""
        if not self.needs_padding:
            return x
        shape = x.shape[:2] + tuple(a.padded for a in self.axes)
        # NOTE: np.zeros gets lazily zeroed pages from the allocator; only the interior is written.
        padded = np.zeros(shape, x.dtype) if value == 0 else np.full(shape, value, x.dtype)
        interior = tuple(slice(a.pad_begin, a.pad_begin + a.size) for a in self.axes)
        padded[(..., *interior)] = x
        return padded

    def window_counts(self, include_pad: bool) -> np.ndarray:
        """Per output position (shape ``out``), the number of taps counted by AveragePool."""
        counts = np.ones((), dtype=np.int64)
        for a in self.axes:
            counts = np.multiply.outer(counts, a.window_counts(include_pad))
        return counts

    def windows(self, padded: np.ndarray) -> np.ndarray:
        """A read-only strided view ``[N, C, *kernel, *out]`` of ``padded`` (no copy): im2col's source."""
        spatial = padded.strides[2:]
        shape = padded.shape[:2] + self.kernel + self.out
        strides = (
            padded.strides[:2]
            + tuple(s * a.dilation for s, a in zip(spatial, self.axes))
            + tuple(s * a.stride for s, a in zip(spatial, self.axes))
        )
        return np.lib.stride_tricks.as_strided(padded, shape, strides, writeable=False)


def geometry(spec: WindowSpec, spatial: Sequence[int]) -> Geometry:
    """The geometry of an input with concrete spatial sizes ``spatial`` (memoised per shape)."""
    return _geometry_cached(spec, tuple(int(size) for size in spatial))


@functools.lru_cache(maxsize=4096)
def _geometry_cached(spec: WindowSpec, spatial: Sequence[int]) -> Geometry:
    """The geometry of an input with concrete spatial sizes ``spatial``."""
    if len(spatial) != spec.rank:
        raise ValueError(f"input has {len(spatial)} spatial axes; the window has {spec.rank}")
    return Geometry(tuple(axis_geometry(int(size), spec, axis) for axis, size in enumerate(spatial)))


def output_dims(spec: WindowSpec, spatial: Sequence[Dim]) -> tuple[Dim, ...]:
    """Output spatial sizes; a symbolic input size gives a symbol (unchanged when the size is kept)."""
    if len(spatial) != spec.rank:
        raise ValueError(f"input has {len(spatial)} spatial axes; the window has {spec.rank}")
    return tuple(
        axis_geometry(size, spec, axis).out if isinstance(size, int) else _symbolic_out(size, spec, axis)
        for axis, size in enumerate(spatial)
    )


def _symbolic_out(size: str, spec: WindowSpec, axis: int) -> str:
    # NOTE: only the batch is symbolic in most models; a symbolic spatial size gets a readable derived
    # name (equal inputs give equal names, so later shape checks still line up).
    stride, extent = spec.strides[axis], spec.effective_kernel[axis]
    if spec.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return size if stride == 1 else f"ceil({size}/{stride})"
    total = 0 if spec.auto_pad == "VALID" else spec.pads[axis] + spec.pads[spec.rank + axis]
    span = total - extent
    if stride == 1:
        shift = span + 1
        return size if shift == 0 else f"{size}{shift:+d}"
    rounding = "ceil" if spec.ceil_mode and spec.auto_pad == "NOTSET" else "floor"
    inner = size if span == 0 else f"{size}{span:+d}"
    return f"{rounding}(({inner})/{stride})+1"
