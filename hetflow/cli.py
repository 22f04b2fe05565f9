"""The ``hetflow`` command: a thin front end over the public API."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hetflow.errors import FeedError, HetflowError
from hetflow.graph import Graph
from hetflow.graph.dtypes import onnx_name
from hetflow.graph.shapes import format_shape
from hetflow.runtime.profiler import Profiler
from hetflow.runtime.session import InferenceSession

DEFAULT_MODEL = "zoo:googlenet"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hetflow`` command; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except HetflowError as error:
        print(f"hetflow: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetflow", description="Run neural networks on whatever compute this machine has."
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    run = commands.add_parser("run", help="run a model and report outputs, latency and op-type time share")
    run.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"model path or zoo:NAME ({DEFAULT_MODEL})")
    run.add_argument("--input", action="append", default=[], metavar="[NAME=]FILE.npy",
                     help="input tensor(s) as .npy; random data of the declared shape when omitted")
    run.add_argument("--batch", type=int, default=1, help="batch size for symbolic batch dimensions (1)")
    run.add_argument("--repeat", type=int, default=10, help="timed runs after one warm-up (10)")
    run.add_argument("--device", default="cpu", help="cpu | auto (cpu)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random input (0)")
    run.set_defaults(handler=_cmd_run)

    info = commands.add_parser("info", help="inputs, outputs, op counts, parameters, weight bytes")
    info.add_argument("model", help="model path or zoo:NAME")
    info.set_defaults(handler=_cmd_info)

    zoo = commands.add_parser("zoo", help="built-in models with seeded weights")
    zoo_commands = zoo.add_subparsers(title="zoo commands", metavar="ZOO_COMMAND")
    zoo_list = zoo_commands.add_parser("list", help="list the built-in models")
    zoo_list.set_defaults(handler=_cmd_zoo_list)
    zoo_build = zoo_commands.add_parser("build", help="build a model and write it as .onnx")
    zoo_build.add_argument("name")
    zoo_build.add_argument("-o", "--output", type=Path, help="where to write (NAME.onnx)")
    zoo_build.add_argument("--seed", type=int, default=0)
    zoo_build.set_defaults(handler=_cmd_zoo_build)
    return parser


# -- run ---------------------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    loaded = time.perf_counter()
    session = InferenceSession(args.model, device=args.device)
    load_seconds = time.perf_counter() - loaded
    feeds = _make_feeds(session, args.input, args.batch, args.seed)
    print(f"model   {args.model}  (loaded in {load_seconds:.2f} s, device {', '.join(session.get_providers())})")
    for name, array in feeds.items():
        print(f"input   {name}: {onnx_name(array.dtype)} {list(array.shape)}")

    outputs = session.run(None, feeds)  # warm-up, and the outputs we print
    latencies = _time_runs(session, feeds, args.repeat)
    profiler = Profiler()
    session.run(None, feeds, observer=profiler.observe)

    for arg, array in zip(session.get_outputs(), outputs):
        _print_output(arg.name, array)
    if latencies:
        print(f"latency min {min(latencies) * 1e3:.3f} ms, median {float(np.median(latencies)) * 1e3:.3f} ms "
              f"over {len(latencies)} runs (batch {args.batch})")
    print("time share by op type (one profiled run):")
    for op_type, seconds, share in profiler.op_type_shares():
        print(f"  {op_type:<22} {seconds * 1e3:9.3f} ms  {share * 100:5.1f}%  {_bar(share)}")
    return 0


def _time_runs(session: InferenceSession, feeds: dict[str, np.ndarray], repeat: int) -> list[float]:
    from tqdm import tqdm

    latencies = []
    for _ in tqdm(range(repeat), desc="timing", unit="run", disable=not sys.stderr.isatty(), leave=False):
        started = time.perf_counter()
        session.run(None, feeds)
        latencies.append(time.perf_counter() - started)
    return latencies


def _make_feeds(
    session: InferenceSession, specs: list[str], batch: int, seed: int
) -> dict[str, np.ndarray]:
    inputs = session.get_inputs()
    given = _read_inputs(specs, [arg.name for arg in inputs])
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for arg in inputs:
        if arg.name in given:
            feeds[arg.name] = given[arg.name]
            continue
        shape = [d if isinstance(d, int) else batch for d in arg.shape]
        dtype = session.graph.values[arg.name].dtype
        if dtype.kind == "f":
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[arg.name] = rng.integers(0, 10, size=shape).astype(dtype)
        else:
            feeds[arg.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _read_inputs(specs: list[str], names: list[str]) -> dict[str, np.ndarray]:
    given: dict[str, np.ndarray] = {}
    for position, spec in enumerate(specs):
        name, sep, path = spec.partition("=")
        if not sep:
            if position >= len(names):
                raise FeedError(f"--input {spec}: the model has only {len(names)} input(s) {names}")
            name, path = names[position], spec
        try:
            given[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise FeedError(f"--input {spec}: cannot read a .npy array: {error}") from error
    return given


def _print_output(name: str, array: np.ndarray) -> None:
    print(f"output  {name}: {onnx_name(array.dtype)} {list(array.shape)}")
    if _looks_like_class_scores(array):
        scores = array.reshape(-1, array.shape[-1])
        for row, values in enumerate(scores[:4]):
            top = np.argsort(values)[::-1][:5]
            ranked = ", ".join(f"{int(c)}:{values[c]:.4f}" for c in top)
            print(f"  item {row} top-5 (class:score) {ranked}")
        if len(scores) > 4:
            print(f"  ... {len(scores) - 4} more items")
    else:
        flat = array.ravel()
        print(f"  first values {np.array2string(flat[:8], precision=4)}")


def _looks_like_class_scores(array: np.ndarray) -> bool:
    """(batch, classes) floats that are probabilities, or many classes: worth a top-5."""
    if array.ndim != 2 or array.dtype.kind != "f" or array.shape[-1] < 2:
        return False
    is_distribution = bool(np.all(array >= 0)) and np.allclose(array.sum(axis=-1), 1.0, atol=1e-3)
    return is_distribution or array.shape[-1] >= 10


def _bar(share: float, width: int = 30) -> str:
    return "#" * max(1, round(share * width)) if share > 0 else ""


# -- info --------------------------------------------------------------------------------------------
def _cmd_info(args: argparse.Namespace) -> int:
    session = InferenceSession(args.model)
    graph = session.graph
    print(f"model   {args.model}  (graph '{graph.name}', opset {graph.opset})")
    for value in graph.input_values():
        print(f"input   {value.name}: {onnx_name(value.dtype)} {format_shape(value.shape)}")
    for value in graph.output_values():
        print(f"output  {value.name}: {onnx_name(value.dtype)} {format_shape(value.shape)}")
    params, weight_bytes = _weights(graph)
    print(f"nodes   {len(graph.nodes)}")
    print(f"params  {params:,} ({weight_bytes / 2**20:.2f} MiB of weights and constants)")
    print("op counts:")
    for op_type, count in Counter(n.op_type for n in graph.nodes).most_common():
        print(f"  {op_type:<22} {count}")
    return 0


def _weights(graph: Graph) -> tuple[int, int]:
    arrays = graph.initializers.values()
    return sum(int(a.size) for a in arrays), sum(int(a.nbytes) for a in arrays)


# -- zoo ---------------------------------------------------------------------------------------------
def _cmd_zoo_list(args: argparse.Namespace) -> int:
    from hetflow import zoo

    entries = zoo.list_models()
    width = max(len(e.name) for e in entries)
    for entry in entries:
        print(f"{entry.name:<{width}}  {format_shape(entry.input_shape):<18} {entry.description}")
    return 0


def _cmd_zoo_build(args: argparse.Namespace) -> int:
    import onnx

    from hetflow import zoo

    output = args.output or Path(f"{args.name}.onnx")
    model = zoo.build(args.name, seed=args.seed)
    onnx.save(model, str(output))
    print(f"wrote {output} ({output.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
