"""Data movement and shape ops: ONNX Runtime parity (dtypes, attributes, old opsets), symbolic shape
inference, object-array kernels, errors and cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices.cpu.table import CPU_KERNELS
from hetflow.errors import InvalidModelError
from hetflow.graph import Node, dtypes
from hetflow.ops import registry
from hetflow.ops.attrs import parse_attrs
from hetflow.ops.base import TensorInfo
from tests.helpers import make_model, run_onnxruntime
from tests.ops.node_oracle import node_cost

RNG = np.random.default_rng(7)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


# -- helpers --------------------------------------------------------------------------------------
def one_node(
    op_type: str,
    inputs: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    consts: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[tuple[str, Any]] | None = None,
    shapes: Mapping[str, Sequence[int | str]] | None = None,
    opset: int = 21,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model with one node; ``outputs`` are (name, numpy dtype), default one ``y`` of the first feed's."""
    shapes = shapes or {}
    if outputs is None:
        outputs = [("y", next(iter(feeds.values())).dtype)]
    node = helper.make_node(op_type, list(inputs), [n for n, _ in outputs], name="node", **attrs)
    model = make_model(
        [node],
        [(n, dtypes.to_onnx(a.dtype), list(shapes.get(n, a.shape))) for n, a in feeds.items()],
        [(n, dtypes.to_onnx(np.dtype(t)), None) for n, t in outputs],
        dict(consts or {}),
        opset,
    )
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    return model


def run_both(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run in hetflow and ONNX Runtime; assert same dtypes, shapes and values; return hetflow's."""
    actual = hetflow.InferenceSession(model).run(None, dict(feeds))
    expected = run_onnxruntime(model, dict(feeds))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        e = np.asarray(e)
        assert a.shape == e.shape, f"shape {a.shape} != onnxruntime's {e.shape}"
        if e.dtype.kind in "OUS":
            assert a.tolist() == e.tolist()
        else:
            assert a.dtype == e.dtype, f"dtype {a.dtype} != onnxruntime's {e.dtype}"
            np.testing.assert_array_equal(a, e)
    return actual


def check(
    op_type: str, inputs: Sequence[str], feeds: Mapping[str, np.ndarray], **kwargs: Any
) -> list[np.ndarray]:
    return run_both(one_node(op_type, inputs, feeds, **kwargs), feeds)


def inferred(model: onnx.ModelProto, name: str = "y") -> tuple:
    return tuple(hetflow.load_model(model).values[name].shape)


def infer_node(op_type: str, infos: Sequence[TensorInfo | None], consts=None, outputs=("y",), **attrs):
    """``OpDef.infer`` of one node straight from TensorInfos (no model)."""
    opdef = registry.get(op_type)
    names = [f"in{i}" if info is not None else "" for i, info in enumerate(infos)]
    node = Node(
        op_type, "n", names, list(outputs), parse_attrs(opdef.Attrs, attrs, op_type=op_type, node_name="n")
    )
    return opdef.infer(node, list(infos), list(consts) if consts is not None else [None] * len(infos))


def kernel(op_type: str, inputs: Sequence[np.ndarray | None], outputs=("y",), **attrs) -> list:
    opdef = registry.get(op_type)
    node = Node(
        op_type,
        "n",
        [f"in{i}" for i in range(len(inputs))],
        list(outputs),
        parse_attrs(opdef.Attrs, attrs, op_type=op_type, node_name="n"),
    )
    found = CPU_KERNELS.lookup(node)
    assert found is not None
    return list(found.fn(node, list(inputs)))


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
]


def sample(shape: Sequence[int], dtype: Any) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(0, 100, shape).astype(dtype)


def strings(shape: Sequence[int]) -> np.ndarray:
    return np.array([f"s{i}" for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)


# -- Concat ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat_axes(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, _ in enumerate(shapes):
        shapes[i][axis] = i + 1
    feeds = {f"x{i}": sample(s, np.float32) for i, s in enumerate(shapes)}
    check("Concat", list(feeds), feeds, axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat_dtypes(dtype):
    feeds = {"a": sample((2, 3), dtype), "b": sample((2, 1), dtype)}
    check("Concat", ["a", "b"], feeds, axis=1)


def test_concat_strings_and_constant_input():
    feeds = {"a": strings((2, 2))}
    model = one_node(
        "Concat", ["a", "c"], feeds, consts={"c": np.array([["x"], ["y"]], dtype=object)}, axis=-1
    )
    run_both(model, feeds)


def test_concat_symbolic_and_errors():
    model = one_node(
        "Concat",
        ["a", "b"],
        {"a": sample((2, 3), np.float32), "b": sample((2, 5), np.float32)},
        shapes={"a": ["N", 3], "b": ["N", 5]},
        axis=1,
    )
    assert inferred(model) == ("N", 8)
    (out,) = infer_node("Concat", [TensorInfo(("N", 3), np.dtype(np.float32))] * 2, axis=0)
    assert out.shape == ("n_d0", 3)
    with pytest.raises(ValueError, match="differ"):
        infer_node(
            "Concat",
            [TensorInfo((2, 3), np.dtype(np.float32)), TensorInfo((3, 3), np.dtype(np.float32))],
            axis=1,
        )
    bad = one_node(
        "Concat", ["a", "b"], {"a": sample((2, 3), np.float32), "b": sample((2, 3), np.int32)}, axis=0
    )
    with pytest.raises(InvalidModelError, match="dtypes"):
        hetflow.InferenceSession(bad)


# -- Split ----------------------------------------------------------------------------------------
def split_model(x, outputs, split=None, opset=21, axis=0, **attrs):
    consts = {} if split is None else {"s": split}
    inputs = ["x"] if split is None else ["x", "s"]
    return one_node(
        "Split",
        inputs,
        {"x": x},
        consts,
        [(f"y{i}", x.dtype) for i in range(outputs)],
        opset=opset,
        axis=axis,
        **attrs,
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_sizes_input(axis):
    x = sample((6, 7, 5), np.int32)
    dim = x.shape[axis]
    run_both(split_model(x, 3, i64(1, dim - 3, 2), axis=axis), {"x": x})


@pytest.mark.parametrize("length,parts", [(7, 3), (10, 4), (6, 3), (5, 5), (11, 4)])
def test_split_num_outputs_uneven_last_chunk(length, parts):
    x = sample((2, length), np.float32)
    model = split_model(x, parts, axis=1, num_outputs=parts)
    outs = run_both(model, {"x": x})
    chunk = -(-length // parts)
    assert [o.shape[1] for o in outs[:-1]] == [chunk] * (parts - 1)
    np.testing.assert_array_equal(np.concatenate(outs, axis=1), x)


def test_split_equal_by_output_count_and_old_attribute_form():
    x = sample((6, 4), np.float16)
    run_both(split_model(x, 3, opset=13), {"x": x})
    old = one_node(
        "Split", ["x"], {"x": x}, outputs=[("a", x.dtype), ("b", x.dtype)], opset=11, axis=0, split=[2, 4]
    )
    a, b = run_both(old, {"x": x})
    assert a.shape == (2, 4) and b.shape == (4, 4)


def test_split_symbolic_and_errors():
    x = sample((6, 4), np.float32)
    model = one_node(
        "Split",
        ["x", "s"],
        {"x": x},
        {"s": i64(2, 4)},
        [("a", x.dtype), ("b", x.dtype)],
        shapes={"x": [6, "N"]},
        axis=0,
    )
    graph = hetflow.load_model(model)
    assert graph.values["a"].shape == (2, "N") and graph.values["b"].shape == (4, "N")
    with pytest.raises(InvalidModelError, match="add up"):
        hetflow.InferenceSession(split_model(x, 2, i64(2, 3)))
    with pytest.raises(InvalidModelError, match="num_outputs"):
        hetflow.InferenceSession(split_model(x, 2, num_outputs=3))


# -- Slice ----------------------------------------------------------------------------------------
SLICE_CASES = [
    # starts, ends, axes, steps
    ((0, 1), (3, 4), None, None),
    ((1,), (-1,), (1,), None),
    ((-2, 0), (INT64_MAX, 3), (0, 2), None),
    ((INT64_MAX,), (INT64_MIN,), (1,), (-1,)),
    ((-1,), (INT64_MIN,), (-1,), (-2,)),
    ((4, 10), (1, -100), (0, 1), (-1, -3)),
    ((100,), (200,), (0,), None),  # start beyond the end: empty
    ((-100, 0), (100, 6), (2, 1), (2, 3)),
    ((0,), (INT64_MAX,), (0,), (1,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICE_CASES)
def test_slice_matches_onnxruntime(starts, ends, axes, steps):
    x = sample((5, 7, 6), np.float32)
    consts = {"s": i64(*starts), "e": i64(*ends)}
    inputs = ["x", "s", "e"]
    if axes is not None or steps is not None:
        consts["a"] = i64(*(axes if axes is not None else range(len(starts))))
        inputs.append("a")
    if steps is not None:
        consts["t"] = i64(*steps)
        inputs.append("t")
    model = one_node("Slice", inputs, {"x": x}, consts)
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape


def test_slice_runtime_starts_int32_and_old_attribute_form():
    x = sample((4, 5), np.int64)
    feeds = {"x": x, "s": np.array([1, -3], np.int32), "e": np.array([3, INT64_MAX // 2**32], np.int32)}
    model = one_node("Slice", ["x", "s", "e"], feeds)
    run_both(model, feeds)
    old = one_node("Slice", ["x"], {"x": x}, opset=9, starts=[1], ends=[1000], axes=[1])
    (y,) = run_both(old, {"x": x})
    assert y.shape == (4, 4)


def test_slice_symbolic_batch():
    x = sample((3, 8), np.float32)
    consts = {"s": i64(0, 2), "e": i64(INT64_MAX, 6), "a": i64(0, 1)}
    model = one_node("Slice", ["x", "s", "e", "a"], {"x": x}, consts, shapes={"x": ["N", 8]})
    assert inferred(model) == ("N", 4)
    partial = one_node(
        "Slice", ["x", "s", "e", "a"], {"x": x}, {**consts, "s": i64(1, 2)}, shapes={"x": ["N", 8]}
    )
    assert inferred(partial) == ("node_d0", 4)
    session = hetflow.InferenceSession(partial)
    for batch in (2, 5):
        xb = sample((batch, 8), np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": xb})[0], xb[1:, 2:6])


def test_slice_zero_step_is_rejected():
    x = sample((3, 4), np.float32)
    model = one_node(
        "Slice", ["x", "s", "e", "a", "t"], {"x": x}, {"s": i64(0), "e": i64(2), "a": i64(0), "t": i64(0)}
    )
    with pytest.raises(InvalidModelError, match="steps"):
        hetflow.InferenceSession(model)


# -- Reshape / Flatten ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 2, 3), (0, -1), (-1,), (2, 0, 4), (6, -1, 2), (1, 1, 24, 1)])
def test_reshape_matches_onnxruntime(shape):
    x = sample((2, 3, 4), np.float32)
    model = one_node("Reshape", ["x", "s"], {"x": x}, {"s": i64(*shape)})
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape


def test_reshape_allowzero_and_runtime_shape():
    x = np.zeros((0, 3, 4), np.float32)
    model = one_node("Reshape", ["x", "s"], {"x": x}, {"s": i64(3, 4, 0)}, allowzero=1)
    (y,) = run_both(model, {"x": x})
    assert y.shape == (3, 4, 0)
    x = sample((2, 3, 4), np.int8)
    feeds = {"x": x, "s": i64(4, 0, -1)}
    model = one_node("Reshape", ["x", "s"], feeds)
    run_both(model, feeds)
    # A shape that is not a constant: the rank comes from its length, the dimensions are fresh symbols.
    assert inferred(model) == ("node_d0", "node_d1", "node_d2")


@pytest.mark.parametrize(
    "target,expected",
    [
        ((0, -1), ("N", 9216)),
        ((-1, 9216), ("N", 9216)),
        ((0, 256, 36), ("N", 256, 36)),
        ((0, -1, 6), ("N", 1536, 6)),
    ],
)
def test_reshape_symbolic_batch(target, expected):
    x = sample((1, 256, 6, 6), np.float32)
    model = one_node("Reshape", ["x", "s"], {"x": x}, {"s": i64(*target)}, shapes={"x": ["N", 256, 6, 6]})
    assert inferred(model) == expected
    session = hetflow.InferenceSession(model)
    for batch in (1, 3):
        xb = sample((batch, 256, 6, 6), np.float32)
        y = session.run(None, {"x": xb})[0]
        assert y.shape == tuple(batch if d == "N" else d for d in expected)


def test_reshape_errors():
    x = sample((2, 3), np.float32)
    for target, message in [((4, 2), "cannot reshape"), ((-1, -1), "more than one"), ((5, -1), "divide")]:
        with pytest.raises(InvalidModelError, match=message):
            hetflow.InferenceSession(one_node("Reshape", ["x", "s"], {"x": x}, {"s": i64(*target)}))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -2, -3, -4])
def test_flatten_axes(axis):
    x = sample((2, 3, 4, 5), np.uint16)
    model = one_node("Flatten", ["x"], {"x": x}, axis=axis)
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape


def test_flatten_symbolic_batch():
    x = sample((1, 256, 6, 6), np.float32)
    model = one_node("Flatten", ["x"], {"x": x}, shapes={"x": ["N", 256, 6, 6]})
    assert inferred(model) == ("N", 9216)
    assert inferred(one_node("Flatten", ["x"], {"x": x}, shapes={"x": ["N", 256, 6, 6]}, axis=0)) == (
        1,
        "node_d1",
    )
    assert inferred(one_node("Flatten", ["x"], {"x": x}, shapes={"x": ["N", 256, 1, 1]}, axis=2)) == (
        "node_d0",
        1,
    )
    with pytest.raises(InvalidModelError, match="out of range"):
        hetflow.InferenceSession(one_node("Flatten", ["x"], {"x": x}, axis=5))


# -- Transpose / Squeeze / Unsqueeze ----------------------------------------------------------------
@pytest.mark.parametrize("perm", [None, (0, 1, 2, 3), (3, 1, 0, 2), (0, 2, 3, 1), (1, 0, 3, 2)])
def test_transpose(perm):
    x = sample((2, 3, 4, 5), np.float64)
    attrs = {} if perm is None else {"perm": list(perm)}
    model = one_node("Transpose", ["x"], {"x": x}, shapes={"x": ["N", 3, 4, 5]}, **attrs)
    run_both(model, {"x": x})
    expected = tuple(np.array(["N", 3, 4, 5], dtype=object)[list(perm or (3, 2, 1, 0))])
    assert inferred(model) == expected
    with pytest.raises(InvalidModelError, match="permutation"):
        hetflow.InferenceSession(one_node("Transpose", ["x"], {"x": x}, perm=[0, 0, 1, 2]))


@pytest.mark.parametrize("axes", [None, (0,), (-1,), (0, 3), (3, 0)])
def test_squeeze(axes):
    x = sample((1, 3, 4, 1), np.bool_)
    consts = {} if axes is None else {"a": i64(*axes)}
    model = one_node("Squeeze", ["x"] if axes is None else ["x", "a"], {"x": x}, consts)
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape
    old = one_node("Squeeze", ["x"], {"x": x}, opset=11, **({} if axes is None else {"axes": list(axes)}))
    run_both(old, {"x": x})


def test_squeeze_symbolic_and_error():
    x = sample((1, 3, 1), np.float32)
    model = one_node("Squeeze", ["x", "a"], {"x": x}, {"a": i64(1)}, shapes={"x": ["N", 1, 1]})
    assert inferred(model) == ("N", 1)
    with pytest.raises(InvalidModelError, match="cannot squeeze"):
        hetflow.InferenceSession(one_node("Squeeze", ["x", "a"], {"x": x}, {"a": i64(1)}))


@pytest.mark.parametrize("axes", [(0,), (1,), (3,), (-1,), (0, 4), (4, 0, 2), (-1, -5), (1, -2)])
def test_unsqueeze(axes):
    x = sample((2, 3, 4), np.int16)
    model = one_node("Unsqueeze", ["x", "a"], {"x": x}, {"a": i64(*axes)})
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape
    old = one_node("Unsqueeze", ["x"], {"x": x}, opset=11, axes=list(axes))
    run_both(old, {"x": x})


def test_unsqueeze_symbolic_and_errors():
    x = sample((2, 3), np.float32)
    model = one_node("Unsqueeze", ["x", "a"], {"x": x}, {"a": i64(-1, 0)}, shapes={"x": ["N", 3]})
    assert inferred(model) == (1, "N", 3, 1)
    for axes, message in [((0, 0), "repeat"), ((4,), "out of range")]:
        with pytest.raises(InvalidModelError, match=message):
            hetflow.InferenceSession(one_node("Unsqueeze", ["x", "a"], {"x": x}, {"a": i64(*axes)}))


# -- Pad ------------------------------------------------------------------------------------------
PADS = [
    (1, 2, 0, 2, 1, 0),
    (0, 0, 0, 0, 0, 0),
    (2, 0, 1, 0, 3, 2),
    (-1, 1, 0, 1, -2, 1),
    (0, -1, 2, 0, 1, -2),
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
def test_pad_modes(mode, pads):
    x = sample((3, 4, 5), np.float32)
    model = one_node("Pad", ["x", "p"], {"x": x}, {"p": i64(*pads)}, mode=mode)
    if mode == "wrap" and any(p < 0 for p in pads):
        # ONNX Runtime rejects negative pads in wrap mode; the reference is "crop, then wrap-pad".
        (y,) = hetflow.InferenceSession(model).run(None, {"x": x})
        np.testing.assert_array_equal(y, _numpy_pad_with_crop(x, pads, "wrap"))
    else:
        (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape


def _numpy_pad_with_crop(x: np.ndarray, pads: tuple[int, ...], mode: str) -> np.ndarray:
    rank = x.ndim
    begins, ends = pads[:rank], pads[rank:]
    crop = tuple(slice(max(-b, 0), x.shape[axis] - max(-e, 0)) for axis, (b, e) in enumerate(zip(begins, ends)))
    grow = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    return np.pad(x[crop], grow, mode=mode)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float16, np.float64, np.bool_])
def test_pad_constant_value_and_dtypes(dtype):
    x = sample((2, 3), dtype)
    value = np.array(True if dtype == np.bool_ else 7, dtype=dtype)
    model = one_node("Pad", ["x", "p", "v"], {"x": x}, {"p": i64(1, 0, 0, 2), "v": value})
    run_both(model, {"x": x})


def test_pad_axes_input_and_runtime_pads():
    x = sample((2, 3, 4), np.float32)
    model = one_node(
        "Pad", ["x", "p", "", "a"], {"x": x}, {"p": i64(1, 2, 3, 0), "a": i64(-1, 0)}, mode="edge"
    )
    (y,) = run_both(model, {"x": x})
    assert y.shape == (4, 3, 8) and inferred(model) == (4, 3, 8)
    feeds = {"x": x, "p": i64(0, 1, 0, 0, 2, 1)}
    model = one_node("Pad", ["x", "p"], feeds, mode="reflect", shapes={"x": ["N", 3, 4]})
    run_both(model, feeds)
    assert inferred(model) == ("node_d0", "node_d1", "node_d2")


def test_pad_old_attribute_form_and_symbolic_batch():
    x = sample((2, 3, 4), np.float32)
    old = one_node("Pad", ["x"], {"x": x}, opset=10, pads=[0, 1, 0, 0, 2, 1], value=1.5)
    (y,) = run_both(old, {"x": x})
    assert y[0, 0, 0] == np.float32(1.5)
    model = one_node("Pad", ["x", "p"], {"x": x}, {"p": i64(0, 1, 1, 0, 1, 1)}, shapes={"x": ["N", 3, 4]})
    assert inferred(model) == ("N", 5, 6)
    with pytest.raises(InvalidModelError, match="mode"):
        hetflow.InferenceSession(
            one_node("Pad", ["x", "p"], {"x": x}, {"p": i64(0, 0, 0, 0, 0, 0)}, mode="nope")
        )
    with pytest.raises(InvalidModelError, match="pads"):
        hetflow.InferenceSession(one_node("Pad", ["x", "p"], {"x": x}, {"p": i64(0, 0)}))


# -- Dropout / Identity ---------------------------------------------------------------------------
def test_dropout_inference_is_identity_with_true_mask():
    x = sample((3, 4, 5), np.float32)
    model = one_node(
        "Dropout",
        ["x", "r"],
        {"x": x},
        {"r": np.array(0.3, np.float32)},
        outputs=[("y", np.float32), ("mask", np.bool_)],
        seed=3,
    )
    y, mask = run_both(model, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()
    old = one_node("Dropout", ["x"], {"x": x}, opset=10, ratio=0.2)
    run_both(old, {"x": x})


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_dropout_training_drops_and_scales_deterministically(ratio):
    x = (RNG.random((40, 50)) + 0.5).astype(np.float32)
    feeds = {"x": x, "r": np.array(ratio, np.float32), "t": np.array(True)}
    model = one_node(
        "Dropout", ["x", "r", "t"], feeds, outputs=[("y", np.float32), ("mask", np.bool_)], seed=5
    )
    session = hetflow.InferenceSession(model)
    y, mask = session.run(None, feeds)
    assert y.dtype == np.float32 and mask.dtype == np.bool_
    np.testing.assert_allclose(y, np.where(mask, x / (1 - ratio), 0), rtol=1e-6)
    assert abs((~mask).mean() - ratio) < 0.05
    again, again_mask = session.run(None, feeds)
    np.testing.assert_array_equal(again, y)
    np.testing.assert_array_equal(again_mask, mask)
    other = one_node(
        "Dropout", ["x", "r", "t"], feeds, outputs=[("y", np.float32), ("mask", np.bool_)], seed=6
    )
    assert not np.array_equal(hetflow.InferenceSession(other).run(None, feeds)[1], mask)
    feeds["t"] = np.array(False)
    y, mask = session.run(None, feeds)
    np.testing.assert_array_equal(y, x)
    assert mask.all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_identity(dtype):
    x = sample((2, 3), dtype)
    (y,) = check("Identity", ["x"], {"x": x})
    assert not np.shares_memory(x, y)
    check("Identity", ["x"], {"x": strings((3,))})


# -- Shape / Gather / ConstantOfShape -------------------------------------------------------------
@pytest.mark.parametrize(
    "start,end", [(None, None), (1, None), (-1, None), (0, -1), (1, 3), (-10, 10), (3, 1)]
)
def test_shape(start, end):
    x = sample((2, 3, 4, 5), np.float32)
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    model = one_node("Shape", ["x"], {"x": x}, outputs=[("y", np.int64)], **attrs)
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather(axis, index_dtype):
    x = sample((4, 5, 6), np.float32)
    indices = np.array([[0, -1], [2, -3]], dtype=index_dtype)
    model = one_node("Gather", ["x", "i"], {"x": x}, {"i": indices}, shapes={"x": [4, 5, 6]}, axis=axis)
    (y,) = run_both(model, {"x": x})
    assert inferred(model) == y.shape
    scalar = one_node("Gather", ["x", "i"], {"x": x}, {"i": np.array(-1, index_dtype)}, axis=axis)
    run_both(scalar, {"x": x})


def test_gather_symbolic_and_errors():
    x = sample((2, 5), np.int32)
    model = one_node("Gather", ["x", "i"], {"x": x}, {"i": i64(1, 2, 3)}, shapes={"x": ["N", 5]}, axis=1)
    assert inferred(model) == ("N", 3)
    with pytest.raises(InvalidModelError, match="out of range"):
        hetflow.InferenceSession(one_node("Gather", ["x", "i"], {"x": x}, {"i": i64(5)}, axis=1))


@pytest.mark.parametrize(
    "value",
    [
        None,
        np.array([1.5], np.float32),
        np.array([3], np.int32),
        np.array([True]),
        np.array([2], np.float64),
        np.array([9], np.uint8),
    ],
)
def test_constant_of_shape(value):
    feeds = {"s": i64(2, 3, 0) if value is not None and value.dtype == np.float64 else i64(2, 3)}
    dtype = np.float32 if value is None else value.dtype
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    model = one_node("ConstantOfShape", ["s"], feeds, outputs=[("y", dtype)], **attrs)
    (y,) = run_both(model, feeds)
    assert y.dtype == dtype
    assert inferred(model) == ("node_d0", "node_d1") + (("node_d2",) if y.ndim == 3 else ())


def test_constant_of_shape_rejects_many_values():
    bad = one_node(
        "ConstantOfShape", ["s"], {"s": i64(2)}, value=onnx.numpy_helper.from_array(np.ones(2, np.float32))
    )
    with pytest.raises(InvalidModelError, match="one element"):
        hetflow.InferenceSession(bad)


# -- Cast -----------------------------------------------------------------------------------------
NUMERIC = [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8, np.uint32, np.bool_]


@pytest.mark.parametrize("source", NUMERIC)
@pytest.mark.parametrize("target", NUMERIC)
def test_cast_numeric(source, target):
    x = sample((3, 4), source)
    if np.dtype(source).kind == "f":
        x = (x * 20).astype(source)
        if np.dtype(target).kind == "u":
            x = np.abs(x)  # negative floats to unsigned is undefined behaviour in C and in ONNX
    model = one_node("Cast", ["x"], {"x": x}, outputs=[("y", target)], to=dtypes.to_onnx(np.dtype(target)))
    run_both(model, {"x": x})


def test_cast_strings():
    x = np.array([["1.5", "-2", "NaN"], ["INF", "-INF", "1e3"]], dtype=object)
    model = one_node("Cast", ["x"], {"x": x}, outputs=[("y", np.float32)], to=TensorProto.FLOAT)
    (y,) = hetflow.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.array([[1.5, -2, np.nan], [np.inf, -np.inf, 1000]], np.float32))
    ints = np.array(["12", "-7"], dtype=object)
    model = one_node("Cast", ["x"], {"x": ints}, outputs=[("y", np.int64)], to=TensorProto.INT64)
    np.testing.assert_array_equal(hetflow.InferenceSession(model).run(None, {"x": ints})[0], [12, -7])
    f = np.array([0.5, -3.25, 100.0], np.float32)
    model = one_node("Cast", ["x"], {"x": f}, outputs=[("y", object)], to=TensorProto.STRING)
    (text,) = hetflow.InferenceSession(model).run(None, {"x": f})
    assert text.dtype == object and [float(t) for t in text] == f.tolist()


def test_cast_float8_saturates():
    import ml_dtypes

    x = np.array([1e6, -1e6, 1.0, np.nan], np.float32)
    model = one_node("Cast", ["x"], {"x": x}, outputs=[("y", np.float32)], to=TensorProto.FLOAT8E4M3FN)
    (y,) = hetflow.InferenceSession(model).run(None, {"x": x})
    assert y.dtype == ml_dtypes.float8_e4m3fn
    assert y.astype(np.float32)[:3].tolist() == [448.0, -448.0, 1.0] and np.isnan(y.astype(np.float32)[3])


def test_cast_unknown_type_is_rejected():
    x = sample((2,), np.float32)
    with pytest.raises(InvalidModelError, match="COMPLEX64|no numpy"):
        hetflow.InferenceSession(one_node("Cast", ["x"], {"x": x}, to=TensorProto.UNDEFINED))


# -- kernels on object arrays (symbolic shape vectors) ---------------------------------------------
def test_kernels_work_on_object_arrays():
    shape = np.array(["N", 256, 6, 6], dtype=object)
    (first,) = kernel("Gather", [shape, np.array(0, np.int64)])
    assert first.tolist() == "N"
    (vec,) = kernel("Unsqueeze", [np.array(first, dtype=object), i64(0)])
    (joined,) = kernel("Concat", [vec, i64(-1)], axis=0)
    assert joined.tolist() == ["N", -1]
    (tail,) = kernel("Slice", [shape, i64(1), i64(INT64_MAX)])
    assert tail.tolist() == [256, 6, 6]
    (back,) = kernel("Squeeze", [vec, i64(0)])
    assert back.tolist() == "N"
    (same,) = kernel("Identity", [shape])
    (flat,) = kernel("Flatten", [shape.reshape(2, 2)], axis=0)
    (re,) = kernel("Reshape", [shape, i64(2, -1)])
    assert same.tolist() == shape.tolist() and flat.tolist() == [shape.tolist()] and re.shape == (2, 2)


# -- cost -----------------------------------------------------------------------------------------
def test_cost():
    assert node_cost("Reshape", [(2, 3, 4), (2,)], consts=[None, i64(6, 4)]).bytes_written == 0
    assert node_cost("Flatten", [(2, 3, 4)]).bytes_read == 0
    shape_cost = node_cost("Shape", [(2, 3, 4)])
    assert shape_cost.bytes_read == 0 and shape_cost.bytes_written == 3 * 8
    transpose = node_cost("Transpose", [(2, 3, 4)])
    assert transpose.bytes_read == transpose.bytes_written == 24 * 4
    concat = node_cost("Concat", [(2, 3), (2, 5)], axis=1)
    assert concat.bytes_read == concat.bytes_written == 16 * 4 and concat.macs == 0
    cast = node_cost("Cast", [(10,)], to=TensorProto.DOUBLE)
    assert cast.bytes_read == 40 and cast.bytes_written == 80
