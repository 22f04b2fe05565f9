"""Flat phase planes: the layout the compiled window kernels (depthwise Conv, pools) read their taps from.

A 2-D window op reads, for output (r, c) and tap (i, j), the padded input at row r*sh + i*dh and column
c*sw + j*dw. Split the padded plane into its sh x sw phases (phase (qr, qc) holds padded[qr::sh, qc::sw])
and flatten each with rows of ``span`` elements: tap (i, j) then reads phase ((i*dh) % sh, (j*dw) % sw)
at row r + (i*dh)//sh, column c + (j*dw)//sw, so one tap over a block of output rows is one contiguous
run, a loop the compiler vectorises whatever the map's width (rows of a 14x14 or 7x7 map alone are too
short for the vector loops). The columns past the output's width are computed and dropped.

``layout`` sizes the planes; ``fill_phases`` copies one input plane into them. Their borders are
written once, with the padding value, when the planes are made: each input plane rewrites only X's
part. The loops take no array views (each costs a reference-count update) and add only unsigned
offsets to their indices (numba wraps negative indices around, and that test on a signed sum keeps a
loop from vectorising).
"""

from __future__ import annotations

import numba
import numpy as np

#: Output elements a plane is accumulated in per pass (a block of whole rows): 16 KiB of float32, so
#: the accumulator stays in the L1 cache through the taps' passes.
BLOCK_ELEMENTS = 4096


@numba.njit(nogil=True, cache=True)
def layout(out_h, out_w, kh, kw, sh, sw, dh, dw):  # noqa: ANN001, ANN201
    """(span, depth, block_rows): the phase planes' row length and rows (one extra: the last output
    row's run overflows into it), and the output rows accumulated per pass."""
    span = out_w + ((kw - 1) * dw) // sw
    depth = out_h + ((kh - 1) * dh) // sh + 1
    return span, depth, max(1, min(out_h, BLOCK_ELEMENTS // span))


@numba.njit(nogil=True, cache=True, inline="always")
def tap_start(i, j, first_row, span, sh, sw, dh, dw):  # noqa: ANN001, ANN201
    """(phase, offset): where tap (i, j) reads its run for the block of output rows from ``first_row``
    (the offset unsigned, so the loops that add to it stay vectorised)."""
    phase = ((i * dh) % sh) * sw + (j * dw) % sw
    return phase, np.uint64((first_row + (i * dh) // sh) * span + (j * dw) // sw)


@numba.njit(nogil=True, cache=True, inline="always")
def fill_phases(x, image, channel, phases, sh, sw, pad_top, pad_left, span, depth):  # noqa: ANN001, ANN201
    """Copy plane ``x[image, channel]`` into ``phases`` ``[sh*sw, depth*span]`` (X's part only)."""
    height, width = x.shape[2], x.shape[3]
    step = np.uint64(sw)
    for qr in range(sh):
        for qc in range(sw):
            index = qr * sw + qc
            # Phase column pc reads X's column pc*sw + shift: inside X for lo <= pc < hi.
            shift = qc - pad_left
            lo = 0 if shift >= 0 else min(span, (-shift + sw - 1) // sw)
            hi = max(lo, min(span, (width - shift + sw - 1) // sw))
            source_col = np.uint64(lo * sw + shift) if hi > lo else np.uint64(0)
            for pr in range(depth):
                source_row = pr * sh + qr - pad_top
                if source_row < 0 or source_row >= height:
                    continue
                base = np.uint64(pr * span + lo)
                for t in range(np.uint64(hi - lo)):
                    phases[index, base + t] = x[image, channel, source_row, source_col + t * step]
