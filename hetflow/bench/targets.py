"""The benchmark targets: each builds its configurations, times them side by side, returns a result."""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hetflow.bench.results import BenchResult, Cell, Series
from hetflow.bench.timing import Timing, side_by_side
from hetflow.errors import HetflowError
from hetflow.runtime.session import InferenceSession

#: The accelerator the targets compare against the CPU.
ACCELERATOR = "opencl:0"
#: RSTensorFlow's "MatMul+Conv" and "MatMul only" configurations as placement rules.
OFFLOAD_MATMUL = {"Gemm": ACCELERATOR, "MatMul": ACCELERATOR}
OFFLOAD_MATMUL_CONV = {**OFFLOAD_MATMUL, "Conv": ACCELERATOR}


@dataclass(frozen=True)
class Options:
    """How much to measure.

    Attributes:
        repeat: timed calls per configuration (interleaved).
        quick: a reduced sweep (smaller sizes, fewer batches) for smoke tests.
        threads: BLAS threads of every session (CNNdroid's sequential mode always uses 1).
    """

    repeat: int = 10
    quick: bool = False
    threads: int | None = None


@dataclass(frozen=True)
class Target:
    """A named experiment: what it reproduces and the function that runs it."""

    name: str
    reproduces: str
    description: str
    run: Callable[[Options], BenchResult]


# -- shared helpers ------------------------------------------------------------------------------
def _accelerator_reason() -> str | None:
    """None when ``ACCELERATOR`` can start, else why not (its columns are then left empty)."""
    from hetflow.devices.registry import get_device

    try:
        get_device(ACCELERATOR)
    except HetflowError as error:
        return str(error)
    return None


def _session(model: onnx.ModelProto | str, options: Options, **settings: object) -> InferenceSession:
    settings.setdefault("threads", options.threads)
    return InferenceSession(model, **settings)  # type: ignore[arg-type]


def _random_feeds(session: InferenceSession, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        shape = [batch if isinstance(d, str) else d for d in arg.shape]
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _time_sessions(
    sessions: Mapping[str, InferenceSession | None], feeds: dict[str, np.ndarray], repeat: int
) -> dict[str, Timing | None]:
    """Side-by-side timing of the sessions that exist (None: that configuration could not be built)."""
    calls = {label: _runner(s, feeds) for label, s in sessions.items() if s is not None}
    timings: dict[str, Timing | None] = dict.fromkeys(sessions)
    timings.update(side_by_side(calls, repeat))
    return timings


def _required(sessions: Mapping[str, InferenceSession | None], label: str) -> InferenceSession:
    """The baseline configuration's session: without it the target has nothing to compare against."""
    session = sessions[label]
    if session is None:
        raise HetflowError(f"the baseline configuration '{label}' could not be built")
    return session


def _runner(session: InferenceSession, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    return lambda: session.run(None, feeds)


def _ms(timing: Timing | None, per: int = 1) -> float | None:
    return None if timing is None else timing.min_ms / per


def _median_ms(timing: Timing | None, per: int = 1) -> float | None:
    return None if timing is None else timing.median_ms / per


def _ratio(numerator: Timing | None, denominator: Timing | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    return numerator.min / denominator.min


def _notes(options: Options, accelerator_reason: str | None) -> list[str]:
    from hetflow.devices.cpu.threads import available_cores

    notes = [
        f"{platform.machine()}, {time.strftime('%Y-%m-%d')}, {options.threads or available_cores()} BLAS "
        f"threads; {options.repeat} interleaved repetitions after a warm-up, minimum per configuration",
    ]
    if accelerator_reason is not None:
        notes.append(f"no {ACCELERATOR} columns: {accelerator_reason}")
    return notes


def _configured(
    result: BenchResult,
    label: str,
    model: onnx.ModelProto | str,
    options: Options,
    accelerator_reason: str | None,
    **settings: object,
) -> InferenceSession | None:
    """The session of one configuration, or None (with a note on ``result``) when it cannot be built:
    its accelerator is missing, or a node it pins there has no kernel there."""
    uses_accelerator = settings.get("device") in (ACCELERATOR, "auto") or "placement" in settings
    if uses_accelerator and accelerator_reason is not None:
        return None
    try:
        return _session(model, options, **settings)
    except HetflowError as error:
        note = f"{label}: not run ({type(error).__name__}: {str(error).splitlines()[0]})"
        if note not in result.notes:
            result.notes.append(note)
        return None


# -- matmul: RSTensorFlow Fig. 2 ------------------------------------------------------------------
def _matmul_model(size: int) -> onnx.ModelProto:
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [size, size]) for n in ("a", "b", "c")]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul")], "matmul",
                              value[:2], value[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bench_matmul(options: Options) -> BenchResult:
    """Square MatMul, end to end through a session (transfers included, as RSTensorFlow measured)."""
    sizes = (64, 128) if options.quick else (64, 128, 256, 512, 1024, 2048)
    reason = _accelerator_reason()
    result = BenchResult(
        "matmul", "Square MatMul C = A B, CPU device vs OpenCL device (RSTensorFlow Fig. 2)",
        ["n", "CPU ms", "CPU GFLOP/s", "OpenCL ms", "OpenCL GFLOP/s", "OpenCL / CPU"],
        x_label="matrix size n", y_label="GFLOP/s", x_values=list(sizes), notes=_notes(options, reason),
    )
    cpu_rates, cl_rates = [], []
    for size in sizes:
        model = _matmul_model(size)
        sessions = {"cpu": _session(model, options),
                    "cl": _configured(result, "OpenCL", model, options, reason, device=ACCELERATOR)}
        rng = np.random.default_rng(size)
        feeds = {n: rng.standard_normal((size, size)).astype(np.float32) for n in ("a", "b")}
        timings = _time_sessions(sessions, feeds, options.repeat)
        flop = 2 * size**3 / 1e9
        cpu_rate = flop / timings["cpu"].min if timings["cpu"] else None
        cl_rate = flop / timings["cl"].min if timings["cl"] else None
        cpu_rates.append(cpu_rate)
        cl_rates.append(cl_rate)
        result.rows.append([size, _ms(timings["cpu"]), cpu_rate, _ms(timings["cl"]), cl_rate,
                            _ratio(timings["cl"], timings["cpu"])])
    result.series = [Series("CPU (numpy/BLAS)", cpu_rates), Series(f"OpenCL ({ACCELERATOR})", cl_rates)]
    return result


# -- conv: RSTensorFlow Fig. 3 --------------------------------------------------------------------
@dataclass(frozen=True)
class ConvShape:
    """One convolution layer's geometry (batch 1)."""

    channels: int
    size: int
    kernels: int
    kernel: int
    stride: int
    pad: int

    def label(self) -> str:
        return f"{self.channels}x{self.size}² → {self.kernels} k{self.kernel}s{self.stride}"

    def gflop(self) -> float:
        out = (self.size + 2 * self.pad - self.kernel) // self.stride + 1
        return 2 * self.kernels * self.channels * self.kernel**2 * out * out / 1e9

    def model(self) -> onnx.ModelProto:
        rng = np.random.default_rng(self.kernels * 31 + self.channels)
        w = (rng.standard_normal((self.kernels, self.channels, self.kernel, self.kernel))
             * np.sqrt(2.0 / (self.channels * self.kernel**2))).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[self.kernel] * 2,
                                strides=[self.stride] * 2, pads=[self.pad] * 4)
        graph = helper.make_graph(
            [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", self.channels, self.size,
                                                                                     self.size])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def googlenet_conv_shapes() -> list[ConvShape]:
    """GoogLeNet's distinct convolution layers (batch 1; the first reads the 224x224 image)."""
    from hetflow import zoo
    from hetflow.frontends import load_model
    from hetflow.passes import bind_batch

    graph = bind_batch(load_model(zoo.model_path("googlenet")), {"N": 1})
    shapes: dict[ConvShape, None] = {}
    for node in graph.nodes:
        if node.op_type != "Conv" or node.attrs.group != 1:
            continue
        x = graph.values[node.inputs[0]].shape
        w = graph.values[node.inputs[1]].shape
        pads = node.attrs.pads or (0,) * 4
        strides = node.attrs.strides or (1, 1)
        shapes[ConvShape(int(x[1]), int(x[2]), int(w[0]), int(w[2]), int(strides[0]), int(pads[0]))] = None
    return list(shapes)


def bench_conv(options: Options) -> BenchResult:
    shapes = googlenet_conv_shapes()
    if options.quick:
        shapes = shapes[:2]
    reason = _accelerator_reason()
    result = BenchResult(
        "conv", "GoogLeNet's convolution layers (the first on the 224x224 image), CPU vs OpenCL (RSTensorFlow Fig. 3)",
        ["layer (C x H² → K kernel stride)", "GFLOP", "CPU ms", "OpenCL ms", "OpenCL / CPU"],
        x_label="layer", y_label="ms (min)", x_values=[s.label() for s in shapes], log_y=True,
        notes=_notes(options, reason),
    )
    cpu_ms, cl_ms = [], []
    for shape in shapes:
        model = shape.model()
        sessions = {"cpu": _session(model, options),
                    "cl": _configured(result, "OpenCL", model, options, reason, device=ACCELERATOR)}
        timings = _time_sessions(sessions, _random_feeds(_required(sessions, "cpu"), 1), options.repeat)
        cpu_ms.append(_ms(timings["cpu"]))
        cl_ms.append(_ms(timings["cl"]))
        result.rows.append([shape.label(), round(shape.gflop(), 4), cpu_ms[-1], cl_ms[-1],
                            _ratio(timings["cl"], timings["cpu"])])
    result.series = [Series("CPU", cpu_ms), Series(f"OpenCL ({ACCELERATOR})", cl_ms)]
    return result


# -- placements: RSTensorFlow Table 2 --------------------------------------------------------------
def bench_placements(options: Options, model: str = "zoo:googlenet") -> BenchResult:
    """``model`` at batch 1-5 in RSTensorFlow's three placements, the accelerator alone, and hetflow's
    measured ``auto`` with its ratio to the best single device (the issue's 1.05 bound)."""
    batches = (1, 2) if options.quick else (1, 2, 3, 4, 5)
    reason = _accelerator_reason()
    configs: dict[str, dict[str, object]] = {
        "CPU only": {"device": "cpu"},
        "OpenCL MatMul+Conv": {"device": "cpu", "placement": OFFLOAD_MATMUL_CONV},
        "OpenCL MatMul only": {"device": "cpu", "placement": OFFLOAD_MATMUL},
        "OpenCL only": {"device": ACCELERATOR},
        "auto": {"device": "auto"},
    }
    labels = list(configs)
    result = BenchResult(
        "placements", f"{model} forward pass per batch size in three placements (RSTensorFlow Table 2) and auto",
        ["batch", *[f"{label} ms" for label in labels], "auto on accelerator (nodes)", "auto / best single"],
        x_label="batch", y_label="ms (min)", x_values=list(batches), notes=_notes(options, reason),
    )
    sessions = {label: _configured(result, label, model, options, reason, **settings)
                for label, settings in configs.items()}
    per_label: dict[str, list[float | None]] = {label: [] for label in labels}
    for batch in batches:
        feeds = _random_feeds(_required(sessions, "CPU only"), batch, seed=batch)
        timings = _time_sessions(sessions, feeds, options.repeat)
        for label in labels:
            per_label[label].append(_ms(timings[label]))
        auto = sessions["auto"]
        offloaded = None
        if auto is not None:
            offloaded = sum(d != "cpu" for d in auto.placement(batch=batch).values())
            result.notes.append(_auto_note(auto, batch))
        best_single = _fastest(timings["CPU only"], timings["OpenCL only"])
        result.rows.append([batch, *[_ms(timings[label]) for label in labels], offloaded,
                            _ratio(timings["auto"], best_single)])
    result.series = [Series(label, values) for label, values in per_label.items()]
    return result


def _fastest(*timings: Timing | None) -> Timing | None:
    """The timing with the lowest minimum among those measured (None when none was)."""
    measured = [t for t in timings if t is not None]
    return min(measured, key=lambda t: t.min) if measured else None


def _auto_note(session: InferenceSession, batch: int) -> str:
    """What ``auto`` timed at ``batch`` before it chose (its whole-run candidates), for the notes."""
    timed = session.placement_seconds(batch=batch)
    fastest_first = sorted(timed.items(), key=lambda kv: kv[1])
    chosen = ", ".join(f"{label} {seconds * 1e3:.3g}" for label, seconds in fastest_first)
    return f"auto at batch {batch} timed (ms, fastest first): {chosen or 'nothing (one device)'}"


# -- lstm: RSTensorFlow Table 3 --------------------------------------------------------------------
def bench_lstm(options: Options) -> BenchResult:
    batches = (1,) if options.quick else (1, 64)
    reason = _accelerator_reason()
    configs = {"CPU": {"device": "cpu"}, "OpenCL": {"device": ACCELERATOR}, "auto": {"device": "auto"}}
    result = BenchResult(
        "lstm", "lstm-gesture (100 steps x 6 features, 512 units, 11 classes), CPU vs OpenCL (RSTensorFlow Table 3)",
        ["batch", *[f"{label} ms" for label in configs], *[f"{label} median ms" for label in configs],
         "OpenCL / CPU", "auto / best single"],
        x_label="batch", y_label="ms (min)", x_values=[str(b) for b in batches], notes=_notes(options, reason),
    )
    sessions = {label: _configured(result, label, "zoo:lstm-gesture", options, reason, **settings)
                for label, settings in configs.items()}
    values: dict[str, list[float | None]] = {label: [] for label in configs}
    for batch in batches:
        timings = _time_sessions(sessions, _random_feeds(_required(sessions, "CPU"), batch), options.repeat)
        for label in configs:
            values[label].append(_ms(timings[label]))
        if sessions["auto"] is not None:
            result.notes.append(_auto_note(sessions["auto"], batch))
        result.rows.append([batch, *[_ms(timings[label]) for label in configs],
                            *[_median_ms(timings[label]) for label in configs],
                            _ratio(timings["OpenCL"], timings["CPU"]),
                            _ratio(timings["auto"], _fastest(timings["CPU"], timings["OpenCL"]))])
    result.series = [Series(label, v) for label, v in values.items()]
    return result


# -- cnndroid: CNNdroid Fig. 8 ---------------------------------------------------------------------
def bench_cnndroid(options: Options, models: Sequence[str] = ("lenet", "cifar10-quick", "alexnet")) -> BenchResult:
    """Per-image time at batch 16: sequential (1 thread), parallel (every thread, branches at once),
    and the OpenCL device."""
    batch = 4 if options.quick else 16
    reason = _accelerator_reason()
    configs: dict[str, dict[str, object]] = {
        "sequential": {"threads": 1, "execution_mode": "sequential"},
        "parallel": {"execution_mode": "parallel"},
        "OpenCL": {"device": ACCELERATOR},
    }
    result = BenchResult(
        "cnndroid", f"Per-image time at batch {batch}: sequential vs parallel vs OpenCL (CNNdroid Fig. 8)",
        ["model", *[f"{label} ms/image" for label in configs], "parallel speed-up", "OpenCL speed-up"],
        x_label="model", y_label="ms per image (min)", x_values=list(models), log_y=True,
        notes=_notes(options, reason),
    )
    values: dict[str, list[float | None]] = {label: [] for label in configs}
    for name in models:
        sessions = {label: _configured(result, f"{name} {label}", f"zoo:{name}", options, reason, **settings)
                    for label, settings in configs.items()}
        timings = _time_sessions(sessions, _random_feeds(_required(sessions, "sequential"), batch), options.repeat)
        for label in configs:
            values[label].append(_ms(timings[label], per=batch))
        speedup = _ratio(timings["sequential"], timings["parallel"])
        cl_speedup = _ratio(timings["sequential"], timings["OpenCL"])
        result.rows.append([name, *[_ms(timings[label], per=batch) for label in configs], speedup, cl_speedup])
    result.series = [Series(label, v) for label, v in values.items()]
    return result


# -- train: TensorFlow+ (mentee step split into phases, peak memory) -------------------------------
#: The phases ``Trainer.train_step(timings=)`` reports, in order, then their sum.
PHASES = ("forward", "backward", "update", "step")


#: A training step that fills a dict with its phases' seconds.
PhasedStep = Callable[[dict[str, float]], object]


def _phase_timings(steps: Mapping[str, PhasedStep], repeat: int) -> dict[str, dict[str, Timing]]:
    """Per configuration and phase, min and median seconds: the steps are timed side by side, and every
    call (warm-up and settling calls included: all are real steps on warm caches) records its phases."""
    recorded: dict[str, list[dict[str, float]]] = {label: [] for label in steps}

    def recorder(label: str) -> Callable[[], object]:
        def call() -> object:
            phases: dict[str, float] = {}
            loss = steps[label](phases)
            phases["step"] = phases["forward"] + phases["backward"] + phases["update"]
            recorded[label].append(phases)
            return loss

        return call

    side_by_side({label: recorder(label) for label in steps}, repeat)
    return {
        label: {
            phase: Timing(min(r[phase] for r in runs), float(np.median([r[phase] for r in runs])))
            for phase in PHASES
        }
        for label, runs in recorded.items()
    }


def _torch_note() -> str | None:
    """None when PyTorch can be the peer, else the note saying why its columns are empty."""
    from hetflow.bench.torch_peer import torch_available

    if torch_available():
        return None
    return "no PyTorch columns: torch is not installed (pip install torch; a benchmark peer only)"


def _thread_limit(options: Options):
    """A context limiting BLAS threads to ``options.threads`` (hetflow's training calls numpy directly)."""
    from contextlib import nullcontext

    if options.threads is None:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(options.threads)


def _training_steps(
    model: onnx.ModelProto | str, batch: int, options: Options, devices: Mapping[str, str]
) -> tuple[dict[str, PhasedStep], dict[str, Any]]:
    """hetflow's SGD step of ``model`` on each of ``devices`` (label -> device id) and, when installed,
    PyTorch's, on one random CIFAR-10-shaped batch with the same weights; returns the steps by label and
    the hetflow Trainers by label."""
    from hetflow.bench.torch_peer import torch_available, torch_train_step
    from hetflow.train import SGD, Trainer

    trainers = {
        label: Trainer(model, optimizer=SGD(0.01, momentum=0.9), device=device)
        for label, device in devices.items()
    }
    first = next(iter(trainers.values()))
    shape = [batch if isinstance(d, str) else d for d in first.graph.values[first.input_name].shape]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, batch)
    steps: dict[str, PhasedStep] = {
        label: functools.partial(_phased_step, trainer, x, y) for label, trainer in trainers.items()
    }
    if torch_available():
        steps["PyTorch"] = torch_train_step(
            first.graph, first.training.scores, x, y, lr=0.01, momentum=0.9, threads=options.threads
        )
    return steps, trainers


def _phased_step(trainer: Any, x: np.ndarray, y: np.ndarray, timings: dict[str, float]) -> object:
    return trainer.train_step(x, y, timings)


def _traced_peak(step: PhasedStep) -> int:
    """Peak bytes numpy allocates during one call of ``step`` (tracemalloc). On a host-unified-memory
    OpenCL device (PoCL) its buffers are numpy allocations too, so CPU and OpenCL compare like for like;
    a discrete GPU's own memory is not seen."""
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        step({})
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _step_memory(step: PhasedStep, trainer: Any) -> int:
    """``_traced_peak`` of one step plus the free buffers of its device's pool, which the step may
    reuse without allocating (an upper bound for OpenCL, exact for the CPU)."""
    pool = getattr(trainer.devices.primary, "pool", None)
    held = pool.free_bytes if pool is not None else 0
    return _traced_peak(step) + held


#: The hetflow configurations of the ``train`` target: label -> device.
TRAIN_DEVICES = {"hetflow": "cpu", "hetflow OpenCL": ACCELERATOR}


def bench_train(options: Options, model: str = "zoo:mentee") -> BenchResult:
    """One SGD step of the mentee at batch 128 on CIFAR-10-shaped data, split into forward (with the
    loss), backward and update: hetflow on the CPU, hetflow on ``opencl:0`` (every node forward and
    backward, and the update, on the device) and PyTorch on the CPU; and each one's peak step memory."""
    batch = 8 if options.quick else 128
    torch_note = _torch_note()
    accelerator_reason = _accelerator_reason()
    devices = {label: device for label, device in TRAIN_DEVICES.items()
               if device == "cpu" or accelerator_reason is None}  # fmt: skip
    result = BenchResult(
        "train", f"{model.removeprefix('zoo:')} training step at batch {batch}: forward / backward / update, "
        f"hetflow CPU vs hetflow {ACCELERATOR} vs PyTorch CPU (TensorFlow+)",
        ["phase", "hetflow ms", "hetflow median ms", "OpenCL ms", "OpenCL median ms", "OpenCL / CPU",
         "PyTorch ms", "PyTorch median ms", "hetflow / PyTorch"],
        x_label="phase", y_label="ms (min)", x_values=list(PHASES), notes=_notes(options, accelerator_reason),
    )  # fmt: skip
    with _thread_limit(options):
        steps, trainers = _training_steps(model, batch, options, devices)
        timings = _phase_timings(steps, options.repeat)
        peaks = {label: _step_memory(steps[label], trainer) for label, trainer in trainers.items()}
    ours, accelerated, theirs = timings["hetflow"], timings.get("hetflow OpenCL"), timings.get("PyTorch")
    for phase in PHASES:
        cl_phase = None if accelerated is None else accelerated[phase]
        peer = None if theirs is None else theirs[phase]
        result.rows.append([phase, _ms(ours[phase]), _median_ms(ours[phase]), _ms(cl_phase), _median_ms(cl_phase),
                            _ratio(cl_phase, ours[phase]), _ms(peer), _median_ms(peer),
                            _ratio(ours[phase], peer)])  # fmt: skip
    result.series = [Series(label, [t[phase].min_ms for phase in PHASES]) for label, t in timings.items()]
    trainer = trainers["hetflow"]
    report = trainer.memory_report(batch)
    measured = trainer.tape.peak_bytes
    result.notes.append(
        f"hetflow peak step memory: {measured / 2**20:.1f} MiB measured (kept activations and gradients), "
        f"{report['step_bound_bytes'] / 2**20:.1f} MiB bound with kernel scratch, plus "
        f"{report['fixed_bytes'] / 2**20:.1f} MiB of weights and optimizer state"
    )
    result.notes.append(
        "peak bytes allocated during one step (tracemalloc; on a host-unified OpenCL device its buffers "
        "included, plus the pooled buffers a step reuses): "
        + ", ".join(f"{label} {peak / 2**20:.1f} MiB" for label, peak in peaks.items())
    )
    if "hetflow OpenCL" in trainers:
        placement = trainers["hetflow OpenCL"].tape.placement
        forward_cpu = [name for name, (fwd, _) in placement.items() if fwd == "cpu"]
        backward_cpu = [name for name, (_, bwd) in placement.items() if bwd == "cpu"]
        result.notes.append(
            f"hetflow OpenCL: forward, backward and the SGD update on {ACCELERATOR}, except forward on the "
            f"CPU: {', '.join(forward_cpu) or 'none'}; numpy backward rule: {', '.join(backward_cpu) or 'none'}"
        )
    if torch_note is not None:
        result.notes.append(torch_note)
    return result


# -- train-scaling: TensorFlow+ Fig. 2 -------------------------------------------------------------
def conv_stack_model(depth: int, width: int, size: int = 32, classes: int = 10) -> onnx.ModelProto:
    """A convolution-only network: ``depth`` 3x3 Conv+Relu layers of ``width`` channels on a
    ``3 x size x size`` input, then a global AveragePool and a Gemm to ``classes`` scores (the loss's
    input), batch dimension symbolic."""
    rng = np.random.default_rng(depth * 1000 + width)
    nodes, weights = [], []
    previous, channels = "x", 3
    for layer in range(depth):
        w = (rng.standard_normal((width, channels, 3, 3)) * np.sqrt(2.0 / (channels * 9))).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"conv{layer}_W"),
                    numpy_helper.from_array(np.zeros(width, np.float32), f"conv{layer}_B")]
        nodes += [helper.make_node("Conv", [previous, f"conv{layer}_W", f"conv{layer}_B"], [f"conv{layer}"],
                                   name=f"conv{layer}", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"conv{layer}"], [f"relu{layer}"], name=f"relu{layer}")]
        previous, channels = f"relu{layer}", width
    fc = (rng.standard_normal((classes, width)) * np.sqrt(1.0 / width)).astype(np.float32)
    weights += [numpy_helper.from_array(fc, "fc_W"),
                numpy_helper.from_array(np.zeros(classes, np.float32), "fc_B")]
    nodes += [helper.make_node("AveragePool", [previous], ["pooled"], name="pool", kernel_shape=[size, size]),
              helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_W", "fc_B"], ["scores"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, f"conv-d{depth}-w{width}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def bench_train_scaling(options: Options) -> BenchResult:
    """Seconds per SGD step of convolution-only networks of growing depth and width, hetflow vs PyTorch."""
    depths, widths = ((1, 2), (8,)) if options.quick else ((1, 2, 4, 8), (16, 32, 64))
    size, batch = (16, 4) if options.quick else (32, 32)
    torch_note = _torch_note()
    result = BenchResult(
        "train-scaling", f"Training step of conv-only networks ({size}x{size} input, batch {batch}) by depth "
        "and width, hetflow CPU vs PyTorch CPU (TensorFlow+ Fig. 2)",
        ["depth", "width", "hetflow ms", "hetflow median ms", "PyTorch ms", "PyTorch median ms",
         "hetflow / PyTorch"],
        x_label="depth (3x3 conv layers)", y_label="ms per step (min)", x_values=[str(d) for d in depths],
        notes=_notes(options, None),
    )
    values: dict[str, list[float | None]] = {}
    with _thread_limit(options):
        for width in widths:
            for depth in depths:
                steps, _ = _training_steps(conv_stack_model(depth, width, size), batch, options, {"hetflow": "cpu"})
                timings = _phase_timings(steps, options.repeat)
                ours, theirs = timings["hetflow"]["step"], timings.get("PyTorch", {}).get("step")
                values.setdefault(f"hetflow w{width}", []).append(_ms(ours))
                if theirs is not None:
                    values.setdefault(f"PyTorch w{width}", []).append(_ms(theirs))
                result.rows.append([depth, width, _ms(ours), _median_ms(ours), _ms(theirs),
                                    _median_ms(theirs), _ratio(ours, theirs)])
    result.series = [Series(label, v) for label, v in values.items()]
    if torch_note is not None:
        result.notes.append(torch_note)
    return result


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target("matmul", "RSTensorFlow Fig. 2", "square MatMul 64...2048, CPU vs OpenCL", bench_matmul),
        Target("conv", "RSTensorFlow Fig. 3", "GoogLeNet's conv layers from the 224x224 image, CPU vs OpenCL",
               bench_conv),
        Target("placements", "RSTensorFlow Table 2",
               "googlenet batch 1-5: CPU only, OpenCL MatMul+Conv, OpenCL MatMul only, auto", bench_placements),
        Target("lstm", "RSTensorFlow Table 3", "lstm-gesture at batch 1 and 64, CPU vs OpenCL vs auto", bench_lstm),
        Target("cnndroid", "CNNdroid Fig. 8",
               "lenet, cifar10-quick, alexnet per image at batch 16: sequential, parallel, OpenCL", bench_cnndroid),
        Target("train", "TensorFlow+",
               "mentee SGD step at batch 128: forward / backward / update, CPU vs OpenCL vs PyTorch, peak memory",
               bench_train),
        Target("train-scaling", "TensorFlow+ Fig. 2",
               "conv-only networks, depth 1-8 x width 16-64, batch 32: step time, hetflow vs PyTorch",
               bench_train_scaling),
    )
}


def run_target(name: str, options: Options | None = None) -> BenchResult:
    """Run the target called ``name``.

    Raises:
        HetflowError: no such target (the message lists them).
    """
    target = TARGETS.get(name)
    if target is None:
        raise HetflowError(f"unknown bench target '{name}'; targets: {', '.join(TARGETS)}")
    return target.run(options or Options())


__all__ = ["TARGETS", "Cell", "Options", "Target", "run_target"]
