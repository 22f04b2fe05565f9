"""Large fully connected weights held once, as the dense kernel's panels.

The dense kernel (``kernels.dense``) reads B from panels of 64 columns. For a large weight (AlexNet's,
ZFNet's and VGG-19's 16-411 MB layers) a packed copy beside the raw array would double the model in
memory, so a session packs those weights when it is made and, where a weight was read from the model
file (``onnx_lean.file_origin``), puts a read-only mapping of the file in the raw array's place: the raw
array is freed before its panels are made, the panels are read from the file a block at a time, and a
reader of the graph's initializers (an export, another device's kernel) still finds the values, paged
in from the file on demand. ONNX Runtime prepacks such weights and drops the originals the same way.

The mapping lies where the tensor's raw_data lies in the file, often not 4-byte aligned, and numpy
multiplies an unaligned array without BLAS (a 1 x 4096 x 1000 product: 17 ms against 0.2): nothing in a
run reads it (``DenseCall`` copies an odd A rather than falling back to BLAS on the raw weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from hetflow.devices.cpu.kernels import jit_lane_gemm
from hetflow.devices.cpu.kernels.dense import PANELS, holds_packed, runs_dense
from hetflow.frontends.onnx_lean import file_origin
from hetflow.graph import Graph
from hetflow.ops.base import planned_infos


def hold_packed(graphs: Sequence[Graph]) -> None:
    """Pack the large weights (``dense.holds_packed``) of the dense layers of ``graphs[0]`` now, and map
    those read from the model file in place of their raw arrays in every graph of ``graphs`` that holds
    them. Weights given in memory keep their raw array beside the panels."""
    graph = graphs[0]
    for node in graph.nodes:
        if node.op_type != "Gemm":
            continue
        infos = planned_infos(node, graph.values, graph.initializers)
        if infos is None or not runs_dense(node, infos) or not holds_packed(infos[1]):  # type: ignore[arg-type]
            continue
        name, trans_b = node.inputs[1], int(node.attrs.transB)
        raw = graph.initializers[name]
        origin = file_origin(raw)
        if origin is None:
            PANELS.get(raw, trans_b)
            continue
        mapped = origin.mapped(raw)
        for holder in graphs:
            if holder.initializers.get(name) is raw:
                holder.initializers[name] = mapped
        del raw  # NOTE: freed here (nothing else holds it) before its panels are made
        columns, depth = mapped.shape if trans_b else mapped.shape[::-1]
        panels = jit_lane_gemm.panels_from_rows(partial(origin.rows, mapped), columns, depth, bool(trans_b))
        PANELS.put(mapped, trans_b, panels)
