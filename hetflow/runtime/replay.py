"""Captured runs: a sequential run's compiled work replayed with no Python between its layers.

Why: at batch 1 a small network's layers take microseconds, and the Python around each kernel call (the
bound call's checks, numba's dispatch, the argument blocks, interpreter code that is cold by the time
the next layer runs) costs as much again. LeNet's eight layers took 65 us called one at a time in
loops and 106 us called in a row, in a run of 150-190 us, where ONNX Runtime ran the whole network in
90 us.

How: the first sequential run of an arena under a thread arrangement is a capture. Each step's bound
call is asked to ``capture`` itself (``devices.base.CaptureFn``): the outputs it would return and the
compiled jobs (``spin_pool.Job``) that compute them. A step that captures and reads only memory that
stays put from run to run (the weights, the feeds, captured in buffers the replay owns, and the outputs
of captured steps) runs through its jobs; consecutive such steps form a segment, which later runs
replay in one compiled call (``SpinPool.replay``). View steps (Flatten, Reshape ...) whose outputs are
views of their whole input capture with no job. Every other step is called as usual between segments;
where a captured step reads a value such a step makes, a later run that returns another array for it
has it copied into the array seen at capture (a guard), so that the jobs' addresses still hold.

A feed is read where the caller's array lies when it can be (C-contiguous, of the captured dtype and
shape): the jobs' argument blocks are pointed at it (``hetflow_lite.feeds``) rather than the array
copied into the replay's buffer.

A capture takes the weights as they are, and what kernels derived from them (blocked, packed or folded
copies), as the kernels' weight caches do (``weight_cache.WeightCache``): weights changed in place after
a session's first run are not seen by its replays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.base import BoundCall
from hetflow.devices.cpu.spin_pool import Job, JobScript, SpinPool, replay_on
from hetflow.devices.cpu.threads import BLAS
from hetflow.errors import HetflowError
from hetflow.graph import Node
from hetflow_lite.feeds import InPlaceFeed, pointers_into

#: Op types whose CPU kernels return views of their input: such a step captures with no job where its
#: outputs are views of the whole of its first input.
VIEW_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity"})

#: One step as the executor's sequential loop holds it: (call, node, input slots, output slots, slots
#: released after it).
HotStep = tuple[BoundCall, Node, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class _Segment:
    """Consecutive captured steps: their jobs, the values they leave, the slots released after them, and
    the node each job computes (in the script's order).

    ``left`` and ``cleared`` are what a replay does to the environment after the jobs: the values made
    and not released, and the slots released that were made before. A value made and released inside
    the segment is never seen, and every statement run after a large network's jobs is slow (their data
    has pushed the interpreter's out of the caches): MobileNet v2 makes and releases 56 of them.
    """

    script: JobScript
    results: tuple[tuple[int, np.ndarray], ...]
    release: tuple[int, ...]
    owners: tuple[str, ...]
    left: tuple[tuple[int, np.ndarray], ...] = field(init=False)
    cleared: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        made = {slot for slot, _ in self.results}
        released = set(self.release)
        object.__setattr__(self, "left", tuple(item for item in self.results if item[0] not in released))
        object.__setattr__(self, "cleared", tuple(slot for slot in self.release if slot not in made))


@dataclass
class _Called:
    """A step a replay calls as usual, with the values it makes that captured steps read (``guards``:
    slot, the array seen at capture)."""

    step: HotStep
    guards: list[tuple[int, np.ndarray]] = field(default_factory=list)


class StepFailed(Exception):
    """A step's kernel raised during a capture or a replay (the error is the ``__cause__``)."""

    def __init__(self, node: Node):
        super().__init__(node.name)
        self.node = node


def _call(step: HotStep, env: list[Any]) -> None:
    """Call a step as the executor's loop does, its outputs stored and its dead values released."""
    call, node, inputs, outputs, release = step
    try:
        results = call([env[slot] for slot in inputs])
    except HetflowError:
        raise
    except Exception as error:  # noqa: BLE001  (re-raised with the node by the executor)
        raise StepFailed(node) from error
    for slot, value in zip(outputs, results):
        env[slot] = value
    for slot in release:
        env[slot] = None


def kept_arrays(jobs: Sequence[Job]) -> Iterator[np.ndarray]:
    """Every array the jobs' blocks may point into: the blocks and what the jobs keep (tuples and lists
    walked through)."""
    pending: list[object] = [item for job in jobs for item in (job.block, *job.keep)]
    while pending:
        item = pending.pop()
        if isinstance(item, np.ndarray):
            yield item
        elif isinstance(item, (tuple, list)):
            pending.extend(item)


@dataclass(frozen=True)
class _Feed:
    """A graph input of a captured run: its slot, and its buffer with the jobs' pointers into it."""

    slot: int
    place: InPlaceFeed


class Replay:
    """A captured sequential run (see the module docstring): ``run`` repeats it on new feeds."""

    def __init__(self, feeds: tuple[tuple[int, np.ndarray], ...], entries: tuple[_Segment | _Called, ...],
                 held: frozenset[int], replayed: tuple[str, ...]):  # fmt: skip
        self.entries = entries
        jobs = [job for entry in entries if isinstance(entry, _Segment) for job in entry.script.jobs]
        arrays = list(kept_arrays(jobs))
        self._feeds = tuple(_Feed(slot, InPlaceFeed(buffer, pointers_into(buffer, arrays))) for slot, buffer in feeds)
        #: Slots whose values the replay owns (it writes them again on the next run).
        self.held = held
        #: The names of the nodes replayed from compiled code, in run order.
        self.replayed_nodes = replayed
        #: Whether a replay calls BLAS: a step called from Python may, and so may a job (``Job.calls_blas``).
        self.calls_blas = any(isinstance(entry, _Called) for entry in entries) or any(job.calls_blas for job in jobs)

    @property
    def feeds(self) -> tuple[tuple[int, np.ndarray], ...]:
        """The buffers the feeds are captured in, by slot (the jobs read them again after ``rest``)."""
        return tuple((feed.slot, feed.place.buffer) for feed in self._feeds)

    def rest(self) -> None:
        """Point every job that reads a feed at the feed's buffer, as at capture: a run may have pointed
        them at the caller's arrays, which a compiled package cannot carry."""
        for feed in self._feeds:
            feed.place.rest()

    @property
    def called_nodes(self) -> tuple[str, ...]:
        """The names of the nodes a replay still calls from Python, in run order."""
        return tuple(entry.step[1].name for entry in self.entries if isinstance(entry, _Called))

    @property
    def whole_script(self) -> JobScript | None:
        """The jobs of a run replayed whole from compiled code (one segment: no step called from Python),
        else None."""
        if len(self.entries) == 1 and isinstance(self.entries[0], _Segment):
            return self.entries[0].script
        return None

    @property
    def jobs(self) -> int:
        """How many jobs a replay runs from compiled code."""
        return sum(len(entry.script) for entry in self.entries if isinstance(entry, _Segment))

    @property
    def scripts(self) -> list[tuple[JobScript, tuple[str, ...]]]:
        """Each replayed segment's jobs, in run order, with the node each job computes."""
        return [(entry.script, entry.owners) for entry in self.entries if isinstance(entry, _Segment)]

    @property
    def made(self) -> dict[int, np.ndarray]:
        """The arrays the replayed steps leave, by slot (each slot's last), and the feeds' copies."""
        values = dict(self.feeds)
        for entry in self.entries:
            if isinstance(entry, _Segment):
                values.update(entry.results)
        return values

    @property
    def called(self) -> int:
        """How many steps a replay still calls from Python."""
        return sum(isinstance(entry, _Called) for entry in self.entries)

    def run(self, env: list[Any], pool: SpinPool | None) -> None:
        """The captured run on the feeds in ``env`` (its values left in ``env`` as a run leaves them)."""
        for feed in self._feeds:
            env[feed.slot] = feed.place.take(env[feed.slot])
        for entry in self.entries:
            if isinstance(entry, _Segment):
                replay_on(entry.script, pool)
                for slot, value in entry.left:
                    env[slot] = value
                for slot in entry.cleared:
                    env[slot] = None
                continue
            # NOTE: a guarded value is read after its step: its last reader, a captured step, comes later.
            _call(entry.step, env)
            for slot, expected in entry.guards:
                value = env[slot]
                if value is not expected:
                    np.copyto(expected, value)
                    env[slot] = expected


class DirectReplay:
    """A captured run whose jobs are all its steps, run with as little Python around them as can be: the
    feeds pointed at, one compiled call on the spinning pool, the outputs copied (``SteadyRun``).

    Why: a steady ``InferenceSession.run`` spent 0.12-0.20 ms around MobileNet v2's 4.3 ms of jobs at
    batch 1, in the thread arrangement's objects, the environment list, the replay's bookkeeping: every
    statement run after the jobs pays for their having pushed the interpreter out of the caches.
    """

    def __init__(self, replay: Replay, pool: SpinPool, feeds: tuple[tuple[str, InPlaceFeed], ...],
                 outputs: tuple[np.ndarray, ...], blas_threads: int | None):  # fmt: skip
        script = replay.whole_script
        assert script is not None, "a direct replay is of a run replayed whole (``of``)"
        self.script = script
        self.pool = pool
        self.feeds = feeds
        self.outputs = outputs
        #: BLAS's thread count during the call, where jobs call BLAS and the arrangement holds it (None: as is).
        self.blas_threads = blas_threads

    @classmethod
    def of(
        cls, replay: Replay, pool: SpinPool, slots: Mapping[str, int], outputs: Sequence[int], blas_threads: int | None
    ) -> DirectReplay | None:
        """``replay`` as a direct one for the graph inputs and output slots given, BLAS held at
        ``blas_threads`` where its jobs call BLAS (``Replay.calls_blas``); None where it calls a step from
        Python (more than one entry) or does not make every output itself."""
        if replay.whole_script is None:
            return None
        made = dict(replay.entries[0].results)  # type: ignore[union-attr]
        if not all(slot in made and slot in replay.held for slot in outputs):
            return None
        names = {slot: name for name, slot in slots.items()}
        feeds = tuple((names[feed.slot], feed.place) for feed in replay._feeds)
        return cls(replay, pool, feeds, tuple(made[slot] for slot in outputs),
                   blas_threads if replay.calls_blas else None)  # fmt: skip

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The run's outputs on ``feeds`` (which hold every graph input the jobs read, as captured)."""
        for name, place in self.feeds:
            place.take(feeds[name])
        pool = self.pool
        previous = BLAS.hold(self.blas_threads) if self.blas_threads is not None else None
        pool.spin()
        try:
            pool.replay(self.script)
        finally:
            pool.rest()
            BLAS.restore(previous)
        return [output.copy() for output in self.outputs]


def capture(
    steps: Sequence[HotStep], env: list[Any], feeds: Sequence[int], stable: set[int], pool: SpinPool | None
) -> Replay | None:
    """Run ``steps`` on ``env`` as a capture (see the module docstring) and return the replay, or None
    where no step captured. ``feeds``: the graph inputs' slots; ``stable``: slots whose values stay put
    from run to run (weights, the empty slot)."""
    stable = set(stable)
    buffers = []
    for slot in feeds:
        value = env[slot]
        if isinstance(value, np.ndarray):
            env[slot] = buffer = np.array(value, order="C", copy=True)
            buffers.append((slot, buffer))
            stable.add(slot)
    read: set[int] = set()  # the slots captured steps read
    held: set[int] = set()  # the slots whose values the replay owns
    made_by: dict[int, _Called] = {}
    entries: list[_Segment | _Called] = []
    replayed: list[str] = []
    jobs: list[Job] = []
    owners: list[str] = []
    results: list[tuple[int, np.ndarray]] = []
    released: list[int] = []
    captured = False

    def close_segment() -> None:
        if results or jobs:
            entries.append(_Segment(JobScript(jobs), tuple(results), tuple(released), tuple(owners)))
        jobs.clear()
        owners.clear()
        results.clear()
        released.clear()

    for step in steps:
        inputs, outputs, release = step[2], step[3], step[4]
        values = [env[slot] for slot in inputs]
        found = _captured(step, values) if all(s in stable or s in made_by for s in inputs) else None
        if found is None:
            close_segment()
            called = _Called(step)
            entries.append(called)
            _call(step, env)
            made_by.update((slot, called) for slot in outputs if isinstance(env[slot], np.ndarray))
            continue
        captured = True
        replayed.append(step[1].name)
        read.update(inputs)
        for slot in inputs:
            if slot not in stable:  # made by a called step: guarded from now on
                made_by[slot].guards.append((slot, env[slot]))
                stable.add(slot)
                held.add(slot)
        made, step_jobs = found
        for job in step_jobs:
            job.run(pool)
        jobs.extend(step_jobs)
        owners.extend(step[1].name for _ in step_jobs)
        for slot, value in zip(outputs, made):
            env[slot] = value
            results.append((slot, value))
            stable.add(slot)
            held.add(slot)
        released.extend(release)
        for slot in release:
            env[slot] = None
    close_segment()
    # NOTE: a feed that only called steps read is handed to them as it is: no copy.
    kept = tuple((slot, buffer) for slot, buffer in buffers if slot in read)
    held.update(slot for slot, _ in kept)
    return Replay(kept, tuple(entries), frozenset(held), tuple(replayed)) if captured else None


def _captured(step: HotStep, values: list[Any]) -> tuple[Sequence[Any], Sequence[Job]] | None:
    """The step's capture (outputs, jobs), or None where it has none for these inputs."""
    call, node = step[0], step[1]
    try:
        capture = getattr(call, "capture", None)
        if capture is not None:
            return capture(values)
        if node.op_type in VIEW_OPS and values and isinstance(values[0], np.ndarray):
            made = call(values)
            if all(_whole_view(value, values[0]) for value in made):
                return made, ()
    except HetflowError:
        raise
    except Exception as error:  # noqa: BLE001  (re-raised with the node by the executor)
        raise StepFailed(node) from error
    return None


def _whole_view(value: Any, source: np.ndarray) -> bool:
    """Whether ``value`` is a view of all of ``source``'s memory (no copy was made)."""
    return (
        isinstance(value, np.ndarray)
        and value.nbytes == source.nbytes
        and value.__array_interface__["data"][0] == source.__array_interface__["data"][0]
    )
