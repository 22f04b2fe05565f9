"""The ``hetflow`` command: a thin front end over the public API."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetflow.errors import FeedError, HetflowError
from hetflow.graph import Graph
from hetflow.graph.dtypes import onnx_name
from hetflow.graph.shapes import format_shape
from hetflow.runtime.profiler import Profiler
from hetflow.runtime.session import InferenceSession
from hetflow_lite import package

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
    run.add_argument("--device", default="cpu", help="cpu | opencl:N | auto (cpu)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random input (0)")
    run.add_argument("--threads", type=int, help="BLAS threads (every core this process may use)")
    run.add_argument("--execution-mode", choices=["sequential", "parallel"], default="sequential",
                     help="parallel also runs independent branches at once (sequential)")
    run.add_argument("--no-optimize", action="store_true", help="run the graph without optimisation passes")
    run.set_defaults(handler=_cmd_run)

    info = commands.add_parser("info", help="inputs, outputs, op counts, parameters, weight bytes")
    info.add_argument("model", help="model path or zoo:NAME")
    info.add_argument("--memory", action="store_true",
                      help="also the memory plan: weights, planned activation peak (arena) and workspace")
    info.add_argument("--batch", type=int, default=1, help="batch size of the memory plan (1)")
    info.set_defaults(handler=_cmd_info)

    tune = commands.add_parser("tune", help="measure every Conv layer's algorithms, and a batch's images per run, "
                                            "into the tuning cache")
    tune.add_argument("model", help="model path or zoo:NAME")
    tune.add_argument("--batch", type=int, default=1, help="batch size the layers are measured at (1)")
    tune.add_argument("--effort", choices=("none", "fast", "full"), default="fast",
                      help="none: measure nothing, report the cache; fast: >= 3 timed rounds, >= 30 ms per "
                           "candidate; full: >= 10, >= 0.2 s, and OpenCL GEMMs search the whole space (fast)")
    tune.add_argument("--device", default="cpu", help="cpu | opencl:N (cpu)")
    tune.add_argument("--threads", type=int,
                      help="the session thread count the layers are measured for (every core)")
    tune.set_defaults(handler=_cmd_tune)

    _add_profile_parser(commands)
    _add_compile_parser(commands)
    _add_bench_parser(commands)
    _add_estimate_parsers(commands)
    _add_devices_parser(commands)
    _add_train_parser(commands)

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
    if Path(args.model, package.MANIFEST).is_file():
        return _run_package(args)
    loaded = time.perf_counter()
    session = InferenceSession(
        args.model,
        device=args.device,
        threads=args.threads,
        execution_mode=args.execution_mode,
        optimize=not args.no_optimize,
    )
    load_seconds = time.perf_counter() - loaded
    feeds = _make_feeds(session, args.input, args.batch, args.seed)
    labels = _demo_feeds(args, session, feeds)
    print(f"model   {args.model}  (loaded in {load_seconds:.2f} s, device {', '.join(session.get_providers())})")
    _print_inputs(feeds)

    outputs = session.run(None, feeds)  # warm-up, and the outputs we print
    latencies = _time_runs(session, feeds, args.repeat)
    profiler = Profiler()
    _warm_observed_runs(session, feeds)
    session.run(None, feeds, observer=profiler.observe)

    for arg, array in zip(session.get_outputs(), outputs):
        _print_output(arg.name, array)
    if labels is not None:
        predicted = outputs[0].reshape(len(labels), -1).argmax(axis=1)
        print(f"real examples: predicted {' '.join(map(str, predicted))}")
        print(f"               true      {' '.join(map(str, labels))}  "
              f"({int(np.sum(predicted == labels))}/{len(labels)} correct)")
    _print_latency(latencies, f" (batch {args.batch})")
    print("time share by op type (one profiled run):")
    for op_type, seconds, share in profiler.op_type_shares():
        print(f"  {op_type:<22} {seconds * 1e3:9.3f} ms  {share * 100:5.1f}%  {_bar(share)}")
    return 0


def _warm_observed_runs(session: InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    """One observed run, untimed: it calls every kernel from Python, which a captured run replays without
    (``hetflow.runtime.replay``), so a profiled run after it does not pay for loading their compiled code."""
    session.run(None, feeds, observer=lambda step, seconds: None)


def _demo_feeds(args: argparse.Namespace, session: InferenceSession, feeds: dict[str, np.ndarray]):
    """A demo model run without ``--input`` (``zoo:lenet-digits``) gets real held-out examples instead
    of random data (``--batch`` of them, 8 by default); returns their labels, else None."""
    from hetflow.zoo.demos import demo_inputs

    if args.input:
        return None
    sample = demo_inputs(args.model, args.batch if args.batch > 1 else 8)
    if sample is None:
        return None
    feeds[session.get_inputs()[0].name], labels = sample
    args.batch = len(labels)  # what the latency line reports
    return labels


def _run_package(args: argparse.Namespace) -> int:
    """``hetflow run`` of a compiled package (``hetflow compile``), through ``hetflow_lite``."""
    from hetflow_lite import CompiledSession

    loaded = time.perf_counter()
    session = CompiledSession(args.model, threads=args.threads)
    load_seconds = time.perf_counter() - loaded
    inputs = [(t.name, t.shape, np.dtype(t.dtype)) for t in session.manifest.inputs]
    feeds = _feeds_for(inputs, args.input, args.batch, args.seed)
    print(f"package {args.model}  (loaded in {load_seconds * 1e3:.1f} ms, {len(session.nodes)} jobs, hetflow_lite)")
    _print_inputs(feeds)
    outputs = session.run(None, feeds)
    latencies = _time_runs(session, feeds, args.repeat)
    session.close()
    for tensor, array in zip(session.manifest.outputs, outputs):
        _print_output(tensor.name, array)
    _print_latency(latencies)
    return 0


def _print_inputs(feeds: dict[str, np.ndarray]) -> None:
    for name, array in feeds.items():
        print(f"input   {name}: {onnx_name(array.dtype)} {list(array.shape)}")


def _print_latency(latencies: list[float], suffix: str = "") -> None:
    """The latency line: min and median over the timed runs (nothing when none was timed)."""
    if latencies:
        print(f"latency min {min(latencies) * 1e3:.3f} ms, median {float(np.median(latencies)) * 1e3:.3f} ms "
              f"over {len(latencies)} runs{suffix}")


def _time_runs(session: Any, feeds: dict[str, np.ndarray], repeat: int) -> list[float]:
    from tqdm import tqdm

    latencies = []
    for _ in tqdm(range(repeat), desc="timing", unit="run", disable=not sys.stderr.isatty(), leave=False):
        started = time.perf_counter()
        session.run(None, feeds)
        latencies.append(time.perf_counter() - started)
    return latencies


#: An input to make a feed for: its name, shape (symbolic dimensions take the batch) and dtype.
InputSpec = tuple[str, Sequence[int | str | None], np.dtype]


def _make_feeds(
    session: InferenceSession, specs: list[str], batch: int, seed: int
) -> dict[str, np.ndarray]:
    inputs = [(arg.name, arg.shape, session.graph.values[arg.name].dtype) for arg in session.get_inputs()]
    return _feeds_for(inputs, specs, batch, seed)


def _feeds_for(inputs: list[InputSpec], specs: list[str], batch: int, seed: int) -> dict[str, np.ndarray]:
    """A feed per input: read from the --input files ``specs`` where given, else seeded random values."""
    given = _read_inputs(specs, [name for name, _, _ in inputs])
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, dims, dtype in inputs:
        if name in given:
            feeds[name] = given[name]
            continue
        shape = [d if isinstance(d, int) else batch for d in dims]
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, 10, size=shape).astype(dtype)
        else:
            feeds[name] = np.zeros(shape, dtype=dtype)
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


# -- compile -----------------------------------------------------------------------------------------
def _add_compile_parser(commands: argparse._SubParsersAction) -> None:
    compile_ = commands.add_parser(
        "compile", help="save a model's captured run as a package that hetflow_lite runs without numba or onnx",
        description="The model's run on seeded inputs is captured and saved (kernels, weights, arena) to a "
                    "folder that hetflow_lite.CompiledSession loads with numpy and ctypes only, then checked "
                    "against the session on other inputs. "
                    "Needs a C compiler (cc) to link the kernels; the package runs on this CPU model, at "
                    "the batch it was compiled for.",
    )
    compile_.add_argument("model", help="model path or zoo:NAME")
    compile_.add_argument("-o", "--output", type=Path, required=True, help="the package folder to write")
    compile_.add_argument("--batch", type=int, default=1, help="batch size for symbolic batch dimensions (1)")
    compile_.add_argument("--threads", type=int, default=2, help="threads the package's runs split over (2)")
    compile_.set_defaults(handler=_cmd_compile)


def _cmd_compile(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from hetflow.runtime.compile_package import compile_package

    bar = None

    def progress(index: int, count: int, name: str) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=count, desc="kernels", unit="kernel")
        bar.set_postfix_str(name)
        bar.update(1)

    started = time.perf_counter()
    try:
        compiled = compile_package(args.model, args.output, batch=args.batch, threads=args.threads, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    manifest = compiled.manifest
    size = sum(path.stat().st_size for path in compiled.folder.iterdir())
    print(f"wrote {compiled.folder} in {time.perf_counter() - started:.1f} s: {len(manifest.script)} jobs, "
          f"{len(manifest.kernels)} kernels, {len(manifest.regions)} regions, {size / 2**20:.1f} MiB")
    for tensor in manifest.inputs:
        print(f"input   {tensor.name}: {tensor.dtype} {list(tensor.shape)}")
    for tensor in manifest.outputs:
        print(f"output  {tensor.name}: {tensor.dtype} {list(tensor.shape)}")
    print(f"run it: python -c \"from hetflow_lite import CompiledSession; s = CompiledSession('{compiled.folder}')\"")
    return 0


# -- profile -----------------------------------------------------------------------------------------
def _add_profile_parser(commands: argparse._SubParsersAction) -> None:
    profile = commands.add_parser(
        "profile", help="where each node ran, its time and the bytes copied to and from devices",
        description="Values stay on a device between the nodes it runs; a node is charged the bytes "
                    "moved for it (its inputs brought where it runs, its returned outputs brought back). "
                    "Unified-memory devices map instead of copying (the 'mapped' column: the copies a "
                    "discrete GPU would make); HETFLOW_OPENCL_UNIFIED=0 makes them copy.",
    )
    profile.add_argument("model", help="model path or zoo:NAME")
    profile.add_argument("--batch", type=int, default=1, help="batch size for symbolic batch dimensions (1)")
    profile.add_argument("--device", default="cpu", help="cpu | opencl:N | auto (cpu)")
    profile.add_argument("--placement", action="append", default=[], metavar="NODE_OR_OP=DEVICE",
                         help="pin a node or an op type to a device, e.g. Conv=cpu (repeatable)")
    profile.add_argument("--repeat", type=int, default=5, help="profiled runs after one warm-up (5)")
    profile.add_argument("--top", type=int, metavar="K", help="show only the K slowest nodes")
    profile.add_argument("--json", action="store_true", help="print the per-node records as JSON")
    profile.set_defaults(handler=_cmd_profile)


def _parse_placement(specs: list[str]) -> dict[str, str]:
    rules = {}
    for spec in specs:
        key, sep, device = spec.partition("=")
        if not sep or not key or not device:
            raise HetflowError(f"--placement {spec!r}: expected NODE_OR_OP=DEVICE, e.g. Conv=cpu")
        rules[key] = device
    return rules


def _cmd_profile(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    session = InferenceSession(args.model, device=args.device, placement=_parse_placement(args.placement))
    feeds = _make_feeds(session, [], args.batch, seed=0)
    session.run(None, feeds)  # warm-up: plans, kernel builds, caches
    _warm_observed_runs(session, feeds)
    profiler = Profiler(devices=session.devices)
    for _ in range(max(args.repeat, 1)):
        session.run(None, feeds, observer=profiler.observe)
    runs = max(args.repeat, 1)
    records = sorted(profiler.nodes.values(), key=lambda r: -r.seconds)
    if args.json:
        print(json.dumps({"model": args.model, "batch": args.batch, "runs": runs,
                          "nodes": [asdict(r) for r in records]}, indent=2))
        return 0
    print(f"model   {args.model}  batch {args.batch}, {runs} profiled runs, devices {', '.join(session.get_providers())}")
    print(f"{'node':<28} {'op':<18} {'device':<10} {'algorithm':<13} {'ms/run':>9} {'in KiB':>9} "
          f"{'out KiB':>9} {'mapped KiB':>11}")
    for record in records[: args.top] if args.top else records:
        print(f"{record.name[:28]:<28} {record.op_type:<18} {record.device:<10} {record.algorithm:<13} "
              f"{record.seconds / runs * 1e3:9.3f} {record.copied_in_bytes / runs / 1024:9.1f} "
              f"{record.copied_out_bytes / runs / 1024:9.1f} {record.mapped_bytes / runs / 1024:11.1f}")
    moved = [r for r in records if r.copied_bytes or r.mapped_bytes]
    copied_in = sum(r.copied_in_bytes for r in records) / runs
    copied_out = sum(r.copied_out_bytes for r in records) / runs
    mapped = sum(r.mapped_bytes for r in records) / runs
    print(f"transfers per run: {len(moved)} of {len(records)} nodes move data; copied {copied_in / 1024:.1f} KiB "
          f"in, {copied_out / 1024:.1f} KiB out; mapped instead of copied {mapped / 1024:.1f} KiB")
    tuning = ", ".join(f"{name} " + " ".join(f"{k} {v}" for k, v in counts.items())
                       for name, counts in session.tuning_report().items())
    print(f"tuning cache: {tuning}")
    replay = session.replay_report()
    if replay["replayed"]:
        called = ", ".join(replay["called"]) or "none"
        print(f"captured runs: {len(replay['replayed'])} nodes replayed from compiled code (unprofiled runs); "
              f"called from Python: {called}")
    print("per device:")
    for device, count, seconds, copied, mapped in profiler.device_totals():
        print(f"  {device:<10} {count:4d} nodes {seconds / runs * 1e3:10.3f} ms/run  copied "
              f"{copied / runs / 2**20:8.2f} MiB/run  mapped (zero-copy) {mapped / runs / 2**20:8.2f} MiB/run")
    return 0


# -- bench -------------------------------------------------------------------------------------------
def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="reproduce the seed papers' experiments (tables and plots)")
    bench.add_argument("targets", nargs="*", metavar="TARGET",
                       help="matmul, conv, placements, lstm, cnndroid, train, train-scaling, or all "
                            "(default: list them)")
    bench.add_argument("--out", type=Path, default=Path("bench-results"),
                       help="folder for TARGET.md, TARGET.json and the plot (bench-results)")
    bench.add_argument("--repeat", type=int, default=10, help="timed calls per configuration (10)")
    bench.add_argument("--threads", type=int, help="BLAS threads (every core this process may use)")
    bench.add_argument("--quick", action="store_true", help="a reduced sweep, for a smoke test")
    bench.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from hetflow.bench import TARGETS, Options, run_target

    if not args.targets:
        for target in TARGETS.values():
            print(f"{target.name:<12} {target.reproduces:<22} {target.description}")
        return 0
    names = list(TARGETS) if args.targets == ["all"] else args.targets
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise HetflowError(f"unknown bench target(s) {unknown}; targets: {', '.join(TARGETS)}")
    options = Options(repeat=args.repeat, quick=args.quick, threads=args.threads)
    for name in names:
        print(f"# {name} ({TARGETS[name].reproduces})", file=sys.stderr, flush=True)
        result = run_target(name, options)
        written = result.write(args.out)
        print(result.markdown())
        print(f"written: {', '.join(str(p) for p in written)}\n", flush=True)
    return 0


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
    if args.memory:
        _print_memory(session, args.batch)
    return 0


def _print_memory(session: InferenceSession, batch: int) -> None:
    report = session.memory_report(batch)
    mib = 2**20
    print(f"memory  (batch {report.batch if report.batch is not None else 'fixed'})")
    print(f"  weights              {report.weights_bytes / mib:10.2f} MiB")
    if report.mapped_bytes:
        print(f"    mapped from a file {report.mapped_bytes / mib:10.2f} MiB  (not held: streamed, or held packed below)")
    print(f"  rearranged weights   {report.transformed_bytes / mib:10.2f} MiB  (Winograd's, blocked, packed; kept after the first run)")
    print(f"  arena                {report.arena_bytes / mib:10.2f} MiB  (activations + workspace, by liveness)")
    print(f"  activation peak      {report.activation_bytes / mib:10.2f} MiB")
    print(f"  largest workspace    {report.workspace_bytes / mib:10.2f} MiB")
    print(f"  without reuse        {report.naive_bytes / mib:10.2f} MiB")


def _weights(graph: Graph) -> tuple[int, int]:
    arrays = graph.initializers.values()
    return sum(int(a.size) for a in arrays), sum(int(a.nbytes) for a in arrays)


# -- tune --------------------------------------------------------------------------------------------
def _cmd_tune(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from hetflow.devices.registry import resolve_devices
    from hetflow.passes import bind_batch
    from hetflow.tuning.cache import cache_path
    from hetflow.tuning.measure import EFFORTS
    from hetflow.tuning.select import Tuner, tune_graph

    session = InferenceSession(args.model, device=args.device)
    graph = session.graph
    symbols = {d for v in graph.input_values() for d in (v.shape or ()) if isinstance(d, str)}
    bound = bind_batch(graph, {name: args.batch for name in symbols})
    device = resolve_devices(args.device)[0]
    tuner = Tuner(tune=True, options=EFFORTS.get(args.effort, EFFORTS["fast"]))

    def progress(items: list) -> tqdm:
        return tqdm(items, desc="tuning", unit="shape", file=sys.stderr, disable=not sys.stderr.isatty())

    if device.kind == "opencl":
        from hetflow.devices.opencl.tuning import report_gemm_tuning

        report_gemm_tuning(bound, device, args.effort, progress)  # type: ignore[arg-type]
    if args.effort == "none":
        print("effort none: nothing else measured")
        return 0

    layers = tune_graph(bound, device, tuner, progress, threads=args.threads)
    print(f"model   {args.model}  (batch {args.batch}, effort {args.effort}, device {device.id})")
    if not layers:
        print("no layer has algorithms to choose from (no Conv)")
        return 0
    algorithms = sorted({a for layer in layers for a in layer.record.candidates})
    name_width = max(len(layer.node.name) for layer in layers)
    print(f"{'layer':<{name_width}}  {'shape':<44} " + " ".join(f"{a:>13}" for a in algorithms)
          + f"  {'chosen':<13} {'cost model':<13}")
    chosen_total = heuristic_total = 0.0
    for layer in layers:
        times = layer.record.candidates
        cells = " ".join(f"{times[a] * 1e3:10.3f} ms" if a in times else f"{'-':>13}" for a in algorithms)
        print(f"{layer.node.name:<{name_width}}  {_layer_shape(layer.workload.params):<44} {cells}  "
              f"{layer.record.chosen:<13} {layer.heuristic:<13}")
        chosen_total += times[layer.record.chosen]
        heuristic_total += times.get(layer.heuristic, times[layer.record.chosen])
    gain = heuristic_total - chosen_total
    print(f"{len(layers)} layers, {len({layer.workload for layer in layers})} distinct shapes measured; "
          f"tuned {chosen_total * 1e3:.2f} ms vs cost model {heuristic_total * 1e3:.2f} ms: predicted gain "
          f"{gain * 1e3:.2f} ms per run ({gain / heuristic_total * 100 if heuristic_total else 0:.1f}%)")
    _tune_sub_batch(args)
    print(f"records appended to {tuner.path or cache_path()}")
    return 0


def _tune_sub_batch(args: argparse.Namespace) -> None:
    """Whole runs of the batch at once against runs of fewer images (``InferenceSession``'s ``sub_batch``),
    recorded in the tuning cache, where the model computes its images apart."""
    if args.device != "cpu":
        return
    session = InferenceSession(args.model, tune=True, threads=args.threads)
    record = session.sub_batch_record(args.batch)
    if record is None:
        return
    times = "  ".join(f"{images} {seconds * 1e3:.2f} ms" for images, seconds in
                      sorted(record.candidates.items(), key=lambda item: -int(item[0])))  # fmt: skip
    print(f"images per run (a batch of {args.batch}): {times}; chosen {record.chosen}")


def _layer_shape(params: dict) -> str:
    x, w = params.get("x", []), params.get("w", [])
    text = f"{'x'.join(map(str, x))} * {'x'.join(map(str, w))}"
    if any(s != 1 for s in params.get("strides", [])):
        text += f" s{max(params['strides'])}"
    if params.get("group", 1) != 1:
        text += f" g{params['group']}"
    return text


# -- estimate / calibrate ----------------------------------------------------------------------------
def _add_estimate_parsers(commands: argparse._SubParsersAction) -> None:
    estimate = commands.add_parser(
        "estimate", help="predict per-layer time and memory on a device (Augur); --validate measures")
    estimate.add_argument("model", help="model path (.onnx, .prototxt) or zoo:NAME")
    estimate.add_argument("--batch", type=int, default=1, help="batch size for symbolic batch dimensions (1)")
    estimate.add_argument("--device", default="cpu",
                          help="cpu (its calibrated profile) or a profile .json for a what-if (cpu)")
    estimate.add_argument("--memory-limit", metavar="SIZE", help="verdict against a limit such as 512MB or 1.5GiB")
    estimate.add_argument("--validate", action="store_true",
                          help="run the model here and compare measured with predicted times and memory")
    estimate.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    estimate.add_argument("--csv", type=Path, metavar="FILE", help="write the per-layer table as CSV")
    estimate.add_argument("--plot", type=Path, metavar="FILE",
                          help="write a plot: .svg, .html (inline SVG) or .png (needs matplotlib)")
    estimate.add_argument("--top", type=int, metavar="K", help="show only the K slowest layers in the table")
    estimate.add_argument("--train", action="store_true",
                          help="training memory instead: weights, gradients, optimizer state, activations")
    estimate.add_argument("--optimizer", default="adam", choices=["sgd", "momentum", "adam", "adamw"],
                          help="optimizer whose state --train counts (adam)")
    estimate.set_defaults(handler=_cmd_estimate)

    calibrate = commands.add_parser(
        "calibrate", help="measure a device with amortised micro-benchmarks and save its profile")
    calibrate.add_argument("--device", default="cpu", help="device to calibrate (cpu)")
    calibrate.add_argument("-o", "--output", type=Path, metavar="FILE",
                           help="where to write the profile (the device's default profile under HETFLOW_HOME)")
    calibrate.add_argument("--quick", action="store_true", help="a reduced calibration of a few seconds")
    calibrate.add_argument("--threads", type=int, help="BLAS threads, as a session's threads (every core)")
    calibrate.set_defaults(handler=_cmd_calibrate)


def _cmd_estimate(args: argparse.Namespace) -> int:
    if args.train:
        return _cmd_estimate_train(args)
    from hetflow.estimate import parse_bytes
    from hetflow.estimate.predict import estimate
    from hetflow.estimate.report import format_table, to_csv, to_json, write_plot

    try:
        limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    except ValueError as error:
        raise HetflowError(f"--memory-limit: {error}") from error
    if args.batch < 1:
        raise HetflowError(f"--batch must be >= 1; got {args.batch}")
    result = estimate(args.model, args.device, args.batch, memory_limit=limit, validate=args.validate)
    if args.csv:
        args.csv.write_text(to_csv(result), encoding="utf-8")
    if args.plot:
        write_plot(result, args.plot)
    if args.json:
        print(to_json(result))
    else:
        print(format_table(result, args.top), end="")
        for written in (args.csv, args.plot):
            if written:
                print(f"wrote {written}")
    fits = result.memory.fits()
    return 3 if fits is False else 0


def _busy_warning() -> str | None:
    """A description of the machine's load when other processes compete for its cores, else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    return f"the load average is {load:.1f} on {cores} core(s)" if load > 0.75 * cores else None


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from hetflow.devices.registry import get_device
    from hetflow.estimate.calibrate import calibrate
    from hetflow.estimate.profile import default_profile_path

    started = time.perf_counter()
    busy = _busy_warning()
    profile = calibrate(args.device, quick=args.quick, threads=args.threads)
    busy = busy or _busy_warning()
    if busy:
        print(f"hetflow: warning: {busy}; timings taken now are noisy, calibrate again on an idle machine",
              file=sys.stderr)
    device = get_device(args.device)
    path = profile.save(args.output or default_profile_path(device.id, device.fingerprint()))
    print(f"calibrated {profile.describe()} in {time.perf_counter() - started:.1f} s")
    print(f"  GEMM peak {profile.gemm.peak_gflops:.1f} GFLOP/s, grid fit error {profile.gemm.fit_mape * 100:.1f}% "
          f"before its residual correction")
    print(f"  memory {max(profile.memory.bandwidth_gbs):.1f} GB/s in cache, {min(profile.memory.bandwidth_gbs):.1f} "
          f"GB/s from DRAM; executor {profile.dispatch_s * 1e6:.1f} us per node, "
          f"{profile.run_overhead_s * 1e6:.1f} us per run")
    if profile.transfer.to_device_gbs > 0:
        print(f"  transfers {profile.transfer.to_device_gbs:.1f} GB/s to the device, "
              f"{profile.transfer.to_host_gbs:.1f} GB/s back, {profile.transfer.latency_s * 1e6:.1f} us latency")
    for key, model in sorted(profile.ops.items()):
        print(f"  {key:<32} {model.samples:3d} samples, fit error {model.fit_mape * 100:5.1f}%")
    print(f"wrote {path}")
    return 0


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


# -- devices -----------------------------------------------------------------------------------------
def _add_devices_parser(commands: argparse._SubParsersAction) -> None:
    devices = commands.add_parser("devices", help="the devices hetflow can run on: cpu, then every OpenCL device")
    devices.add_argument("--json", action="store_true", help="print a list of objects (id, kind, name, ...)")
    devices.set_defaults(handler=_cmd_devices)


#: Columns of ``hetflow devices``: (heading, info key).
_DEVICE_COLUMNS = (
    ("id", "id"), ("name", "name"), ("vendor", "vendor"), ("CUs", "compute_units"), ("MHz", "max_clock_mhz"),
    ("global mem", "global_memory_bytes"), ("local mem", "local_memory_bytes"),
    ("unified", "host_unified_memory"), ("OpenCL", "opencl_version"), ("driver", "driver_version"),
)  # fmt: skip


def _device_rows() -> list[dict[str, object]]:
    from hetflow.devices.cpu import CPUDevice
    from hetflow.devices.opencl import list_opencl_devices

    cpu = CPUDevice()
    fingerprint = cpu.fingerprint()
    rows: list[dict[str, object]] = [{
        "id": cpu.id, "kind": cpu.kind, "name": fingerprint["processor"], "vendor": None,
        "compute_units": os.cpu_count(), "max_clock_mhz": None, "global_memory_bytes": None,
        "local_memory_bytes": None, "host_unified_memory": True, "opencl_version": None, "driver_version": None,
    }]  # fmt: skip
    rows.extend(device.info() for device in list_opencl_devices())
    return rows


def _cmd_devices(args: argparse.Namespace) -> int:
    import json

    rows = _device_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[_device_cell(key, row.get(key)) for _, key in _DEVICE_COLUMNS] for row in rows]
    headings = [heading for heading, _ in _DEVICE_COLUMNS]
    widths = [max(len(str(c)) for c in column) for column in zip(headings, *table)]
    for line in [headings, *table]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    from hetflow.devices.opencl import OpenCLDevice

    reason = OpenCLDevice.is_available()
    if reason is not None:
        print(f"OpenCL: {reason}")
    return 0


def _device_cell(key: str, value: object) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**10:.0f} KiB"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


# -- train -------------------------------------------------------------------------------------------
def _add_train_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser(
        "train", help="train a model on a real data set (on the CPU or --device opencl:N) and export it as .onnx"
    )
    train.add_argument("model", help="model path or zoo:NAME (trained from its current weights)")
    train.add_argument("--data", default="digits", choices=["digits"],
                       help="data set: digits = scikit-learn's handwritten digits at 1x28x28 (digits)")
    train.add_argument("--epochs", type=int, default=8, help="passes over the training split (8)")
    train.add_argument("--batch-size", type=int, default=32, help="examples per step (32)")
    train.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate, cosine-decayed (0.002)")
    train.add_argument("--seed", type=int, default=0, help="seed of the split, shuffling and augmentation (0)")
    train.add_argument("--device", default="cpu",
                       help="cpu | opencl:N | auto: where the steps run; the CPU takes the nodes the device "
                            "has no kernels for (cpu)")
    train.add_argument("--out", type=Path, help="write the trained model here (.onnx)")
    train.add_argument("--json", action="store_true",
                       help='end with one JSON line {"epochs", "seconds", "train_loss", "test_accuracy"}')
    train.set_defaults(handler=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    import json

    from hetflow.train.recipes import train_classifier

    def report(stats) -> None:
        line = f"epoch {stats.epoch}/{args.epochs}  loss {stats.train_loss:.4f}  accuracy {stats.train_accuracy:.4f}"
        print(f"{line}  ({stats.seconds:.1f} s)", flush=True)

    try:
        result = train_classifier(args.model, data=args.data, epochs=args.epochs, batch_size=args.batch_size,
                                  lr=args.lr, seed=args.seed, on_epoch=report, device=args.device)
    except ImportError as error:
        print(f"hetflow: error: {error}", file=sys.stderr)
        return 1
    print(f"trained {args.model} on {args.data} with {result.trainer.device} in {result.seconds:.1f} s: "
          f"test accuracy {result.test_accuracy:.4f} on {len(result.dataset.y_test)} held-out examples")
    if args.out is not None:
        result.trainer.export(args.out)
        print(f"wrote {args.out}")
    if args.json:
        print(json.dumps({"epochs": args.epochs, "seconds": round(result.seconds, 3),
                          "train_loss": result.history.last.train_loss,
                          "test_accuracy": result.test_accuracy}))
    return 0



def _cmd_estimate_train(args: argparse.Namespace) -> int:
    from hetflow.estimate.training import training_memory

    try:
        report = training_memory(args.model, args.batch, args.optimizer)
    except ValueError as error:
        raise HetflowError(str(error)) from error
    print(report.to_json() if args.json else report.table(), end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
