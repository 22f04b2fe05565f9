"""Amortised timing, Augur's way: warm up, run many iterations, synchronise once, divide.

Calibration and validation time kernels the same way, so a prediction and the measurement it is
checked against mean the same thing: the steady-state time of one call with its inputs in place. On the
CPU the rounds are short and the fastest counts (``layer_rounds``), as a whole run is its fastest run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.graph import Graph, Node

#: Default total time spent in one timed round of iterations.
MIN_ROUND_SECONDS = 0.05

#: Seconds of untimed calls before the rounds of a call that splits on hetflow's Python pool
#: (``timed_first_call``). Its worker thread must take its share on the other core, where OpenBLAS's
#: workers spin for ~0.1 s after a multi-threaded product, and a vCPU that idled takes tens of
#: milliseconds of work to run at full speed again. A direct Conv at batch 16 (cifar10-quick's 32 -> 32
#: 5x5 at 16x16) took 1.56-1.61 ms timed right after a BLAS product, 1.32-1.42 after a 0.3 s sleep, and
#: 0.87-0.93 after 50 calls of its own, as it runs inside back-to-back session runs. With 0.06 s of
#: settling it still measured 1.55: the settle must outlast OpenBLAS's spin.
SETTLE_SECONDS = 0.1


def amortised_seconds(
    fn: Callable[[], object],
    *,
    min_time: float = MIN_ROUND_SECONDS,
    rounds: int = 3,
    max_iterations: int = 100_000,
    synchronize: Callable[[], None] | None = None,
    first_seconds: float | None = None,
    settle: float = 0.0,
    round_seconds: float | None = None,
) -> float:
    """Seconds per call of ``fn``: the minimum over ``rounds`` of (round time / iterations).

    One warm-up call sizes the rounds so each lasts about ``min_time`` (pass ``first_seconds`` when
    the caller has just run ``fn`` and timed it: the warm-up is skipped); then, with ``settle``, ``fn``
    runs untimed for that many seconds (see ``SETTLE_SECONDS``). A call slower than
    ``min_time`` runs once per round, and one slower than ten times ``min_time`` gets two rounds only
    (its own duration already drowns any timer overhead). ``synchronize`` (a device's) is called once
    at the end of each round, never per iteration. With ``round_seconds``, rounds last about that long
    instead, as many as the same ``min_time * rounds`` holds, the fastest counting (``layer_rounds``).
    """
    sync = synchronize or _no_sync
    if first_seconds is None:
        started = time.perf_counter()
        fn()
        sync()
        first_seconds = time.perf_counter() - started
    short = round_seconds is not None and first_seconds <= 10 * min_time
    length = round_seconds if short and round_seconds is not None else min_time
    iterations = max(1, min(max_iterations, int(length / max(first_seconds, 1e-9))))
    if first_seconds > 10 * min_time:
        rounds = min(rounds, 2)
    settled = time.perf_counter() + settle
    while time.perf_counter() < settled:
        fn()
    # Short rounds run until the long ones' time is spent (``rounds`` of them at least).
    budget_end = time.perf_counter() + (min_time * rounds if short else 0.0)
    best = float("inf")
    done = 0
    while done < max(1, rounds) or time.perf_counter() < budget_end:
        started = time.perf_counter()
        for _ in range(iterations):
            fn()
        sync()
        best = min(best, (time.perf_counter() - started) / iterations)
        done += 1
    return best


#: A synchronous device's layer is timed in rounds of about this long, as many as ``min_time * rounds``
#: holds (``amortised_seconds``' ``round_seconds``): the fastest is what a whole run's fastest run is made
#: of. Rounds of ``min_time`` each took in whatever the VM did meanwhile: in a disturbed minute the mentee's
#: batch-16 layers read 7-40% over their fastest calls, their sum 4-11% over the whole run's fastest.
SHORT_ROUND_SECONDS = 50e-6


def layer_rounds(device: object) -> float | None:
    """The ``round_seconds`` a layer on ``device`` is timed with: short rounds on a synchronous device (the
    CPU, where a call's end is its kernel's), the long ones elsewhere (a queue drained once a round)."""
    return SHORT_ROUND_SECONDS if getattr(device, "kind", None) == "cpu" else None


def timed_call(fn: Callable[[], object], synchronize: Callable[[], None] | None = None) -> tuple[object, float]:
    """Run ``fn`` once; return its result and the seconds it took (synchronised)."""
    started = time.perf_counter()
    result = fn()
    (synchronize or _no_sync)()
    return result, time.perf_counter() - started


def _no_sync() -> None:
    return None


def timed_first_call(fn: Callable[[], object], synchronize: Callable[[], None] | None = None) -> tuple[float, float]:
    """Run ``fn`` once: the seconds it took, and the ``settle`` its ``amortised_seconds`` needs:
    ``SETTLE_SECONDS`` when the call split its work on hetflow's Python pool, else 0."""
    from hetflow.devices.cpu.threads import pool_handoffs

    before = pool_handoffs()
    _, seconds = timed_call(fn, synchronize)
    return seconds, SETTLE_SECONDS if pool_handoffs() != before else 0.0


def weight_positions(node: Node, graph: Graph) -> tuple[int, ...]:
    """Positions of ``node``'s inputs that are ``graph``'s initializers: a run's resident weights, which
    its kernels are bound to as such (a Gemm at a batch then multiplies a packed copy of them,
    ``kernels.dense``). Timed as plain arrays, LeNet's 800 -> 500 layer at batch 16 ran on OpenBLAS in
    0.20-0.39 ms, where the run's own took 0.08."""
    return tuple(position for position, name in enumerate(node.inputs) if name and name in graph.initializers)


#: ``visit(index, node, kernel, inputs)`` returns the node's outputs (it usually computes them while
#: timing the kernel) or None to let ``replay`` compute them.
LayerVisitor = Callable[[int, Node, Kernel, list[np.ndarray | None]], Sequence[np.ndarray | None] | None]


def replay(
    graph: Graph,
    steps: Sequence[tuple[Node, Kernel]],
    feeds: Mapping[str, np.ndarray],
    visit: LayerVisitor,
) -> None:
    """Run ``steps`` in order on real data, handing each layer's actual inputs to ``visit`` first.

    This is how a layer is timed "alone on its real inputs": one forward pass supplies every layer's
    inputs, and a value is dropped after its last reader so memory stays at the executor's level.
    """
    env: dict[str, np.ndarray | None] = dict(graph.initializers)
    env.update(feeds)
    last_reader: dict[str, int] = {}
    for index, (node, _) in enumerate(steps):
        for name in node.present_inputs():
            last_reader[name] = index
    pinned = set(graph.initializers) | set(graph.outputs)
    for index, (node, kernel) in enumerate(steps):
        inputs = [env[name] if name else None for name in node.inputs]
        outputs = visit(index, node, kernel, inputs)
        if outputs is None:
            outputs = kernel.fn(node, inputs)
        for name, array in zip(node.outputs, outputs):
            if name:
                env[name] = array
        del inputs, outputs
        for name in node.present_inputs():
            if last_reader.get(name) == index and name not in pinned:
                env.pop(name, None)


@contextlib.contextmanager
def threads_held(count: int | None) -> Iterator[int]:
    """Run the body with the BLAS pool (and the kernels that split their own work) at ``count`` threads,
    as ``session.run`` does; None means every core. Yields the count in force."""
    from hetflow.devices.cpu.threads import available_cores, blas_threads

    wanted = available_cores() if count is None else count
    with blas_threads(wanted):
        yield wanted
