"""The Device interface and the per-device kernel table."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.host_memory import CACHE_LINE, aligned_empty
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo, array_infos

#: A kernel computes a node's outputs from its inputs (``None`` for omitted optional inputs) and
#: returns one array per output the op defines (``None`` allowed for an output the node omits).
#: Kernels that declare ``writes_out`` also accept ``(node, inputs, out, workspace)``: see ``Kernel``.
KernelFn = Callable[..., Sequence[np.ndarray | None]]
#: What is known of a node's inputs: one TensorInfo per input (None for an omitted one), or None as a
#: whole when they are not known. Shapes may hold symbols (a batch not bound yet); dtypes are known.
InputInfos = Sequence[TensorInfo | None] | None
#: ``supports(node, inputs)`` returns None when the kernel can run ``node``, else the reason it cannot.
#: A kernel whose constraints depend on shapes answers with a reason when ``inputs`` is None or the
#: dimensions it needs are symbols.
SupportsFn = Callable[[Node, InputInfos], str | None]
#: ``workspace(node, inputs)``: scratch bytes the kernel wants for concrete input shapes.
WorkspaceFn = Callable[[Node, Sequence[TensorInfo | None]], int]
#: A kernel call bound to one node, its input shapes and the runtime's buffers: ``call(inputs)`` returns
#: what ``fn(node, inputs, out, workspace)`` would.
BoundCall = Callable[[Sequence[Any]], Sequence[Any]]
#: A bound call may also carry ``capture(inputs)``: for these very input arrays, the outputs the call
#: would return and the compiled jobs (``spin_pool.Job``) that would compute them, nothing else being
#: done (no Python work, no allocation a later call would repeat); None where the call cannot be
#: captured. The executor replays captured steps without calling them (``executor._Replay``).
CaptureFn = Callable[[Sequence[Any]], tuple[Sequence[Any], Sequence[Any]] | None]
#: ``prepare(node, inputs, out, workspace)``: a ``BoundCall`` for concrete ``inputs`` (TensorInfos), or
#: None where the kernel has nothing to gain from binding this node (see ``Kernel.prepare``).
PrepareFn = Callable[[Node, Sequence[TensorInfo | None], Any, Any], BoundCall | None]
#: ``inplace(node, inputs)``: the indices of the node's inputs whose memory the kernel may write its output
#: over, for inputs of these shapes (``InputInfos``).
InplaceFn = Callable[[Node, InputInfos], Sequence[int]]


@dataclass(frozen=True)
class Kernel:
    """One way a device computes one op.

    Attributes:
        op_type: the op it implements.
        fn: the computation.
        algorithm: name of the method (``"default"``, ``"im2col"``, ``"winograd"`` ...).
        supports: optional constraint check; None means "every node of this op".
        writes_out: the kernel can write into buffers the runtime provides. It is then called as
            ``fn(node, inputs, out, workspace)`` (both arguments optional, so ``fn(node, inputs)`` still
            works): ``out`` holds one array or None per node output, ``workspace`` a 1-D uint8 array
            of ``workspace(node, inputs)`` bytes, or None. An ``out`` entry may be a strided view (a
            slice of a Concat's output); the kernel writes its result there when the entry's shape and
            dtype are the output's, otherwise allocates. It returns its outputs either way, and never
            returns a view of an input (the runtime reuses input memory once the step has run).
        inplace: with ``writes_out``: an ``out`` entry may be the very memory of an input of the same
            shape and dtype, so the planner may hand it a dying input's buffer. True: any input
            (elementwise kernels, which read each element only where they write it); a function
            (``InplaceFn``): only the inputs it names for a node and its input shapes (a Conv's folded
            residual, where its tiles read it as they store their sums), and only where no other
            input of the node shares that memory.
        workspace: scratch bytes the kernel carves from ``workspace`` (None: it needs none).
        prepare: optional; binds the kernel to a node with concrete input shapes and to the buffers a
            session's memory plan gives it (``out``, ``workspace``, as above), once, when the session
            lays out its memory. Everything a call would otherwise work out again on every run (window
            geometry, algorithm variant, thread split, scratch carving, converted attributes) is done
            there, so that a run pays little more than the compiled loop: at LeNet's sizes that work
            cost more than the layers' arithmetic. The bound call must give what ``fn`` gives, and
            falls back to ``fn`` when its inputs do not have the shapes and dtypes it was bound to.

    Kernels without ``writes_out`` are called as ``fn(node, inputs)``; the runtime assumes their
    outputs may alias their inputs (Reshape, Slice and the other view kernels return views).
    """

    op_type: str
    fn: KernelFn
    algorithm: str = "default"
    supports: SupportsFn | None = None
    writes_out: bool = False
    inplace: bool | InplaceFn = False
    workspace: WorkspaceFn | None = None
    prepare: PrepareFn | None = None

    def inplace_inputs(self, node: Node, inputs: InputInfos = None) -> Sequence[int]:
        """The indices of ``node``'s inputs (of shapes ``inputs``, when known) whose memory this kernel may
        write its output over."""
        if callable(self.inplace):
            return self.inplace(node, inputs)
        return range(len(node.inputs)) if self.inplace else ()

    def reason_unsupported(self, node: Node, inputs: InputInfos = None) -> str | None:
        return None if self.supports is None else self.supports(node, inputs)

    def bind(
        self, node: Node, inputs: Sequence[TensorInfo | None] | None, out: Any = None, workspace: Any = None
    ) -> BoundCall:
        """This kernel's call on ``node`` as ``call(inputs)``: the prepared call where the kernel has one
        for these (concrete) input shapes, else ``fn`` with ``out`` and ``workspace`` passed along."""
        fallback = unbound(self, node, out, workspace)
        if self.prepare is not None and inputs and inputs[0] is not None and _concrete(inputs):
            bound = self.prepare(node, inputs, out, workspace)
            if bound is not None:
                return guarded(bound, fallback, inputs[0])
        return fallback

    def steady_call(
        self,
        node: Node,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray | None] | None = None,
        weights: Collection[int] = (),
    ) -> Callable[[], Sequence[np.ndarray | None]]:
        """A call of this kernel on ``inputs`` as a session's steady-state run makes it.

        A ``writes_out`` kernel is handed output buffers and a workspace allocated and touched once
        here, as the memory plan's arena is; without them every call would allocate its results
        afresh, and on big layers the page faults of that memory cost up to 1.7x the computation
        (VGG-19 at batch 16, a 925 MB Winograd workspace). Tuning, calibration and validation time
        this call, so a measured time is what a run pays. ``outputs``: a result of this call already
        computed (its shapes size the buffers; otherwise the kernel runs once here). ``weights``: the
        positions of the inputs a plan keeps resident (its initializers), bound as ``WeightInfo`` as a
        plan binds them, so that a kernel that keeps a packed copy of its weights is timed with it.
        """
        inputs = aligned_inputs(inputs, weights)
        return functools.partial(self.steady_bound(node, inputs, outputs, weights), inputs)

    def steady_bound(
        self,
        node: Node,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray | None] | None = None,
        weights: Collection[int] = (),
    ) -> BoundCall:
        """The bound call ``steady_call`` makes on ``inputs`` (see there), to be called with them."""
        infos = array_infos(inputs, weights)
        if not self.writes_out:
            return self.bind(node, infos)
        if outputs is None:
            outputs = self.fn(node, inputs)
        out = [None if y is None else _touched(_like(y)) for y in outputs]
        scratch = None
        if self.workspace is not None:
            nbytes = int(self.workspace(node, infos))
            scratch = _touched(aligned_empty((nbytes,), np.uint8)) if nbytes > 0 else None
        return self.bind(node, infos, out, scratch)


def aligned_inputs(inputs: Sequence[Any], weights: Collection[int] = ()) -> list[Any]:
    """``inputs`` with every array that is not a weight (``weights``: positions) on a cache line: a run
    hands a kernel activations from its arena, whose buffers start on lines (``MemoryPlan.new_arena``),
    and a timed call should see the same (numpy starts an array on any 16 bytes)."""
    return [
        _like(x, copy=True) if isinstance(x, np.ndarray) and i not in weights and x.ctypes.data % CACHE_LINE else x
        for i, x in enumerate(inputs)
    ]


def _like(array: np.ndarray, copy: bool = False) -> np.ndarray:
    """An array of ``array``'s shape and dtype starting on a cache line (C-contiguous ones; others as
    ``np.empty_like``), holding a copy of it with ``copy``."""
    fresh = aligned_empty(array.shape, array.dtype) if array.flags.c_contiguous else np.empty_like(array)
    if copy:
        fresh[...] = array
    return fresh


def unbound(kernel: Kernel, node: Node, out: Any = None, workspace: Any = None) -> BoundCall:
    """``kernel.fn`` on ``node`` as a ``BoundCall`` (with ``out`` and ``workspace`` for a ``writes_out``
    kernel that has them): the call a prepared kernel falls back to."""
    fn = kernel.fn
    if out is None and workspace is None:
        return lambda inputs: fn(node, inputs)
    return lambda inputs: fn(node, inputs, out, workspace)


def guarded(bound: BoundCall, fallback: BoundCall, first: TensorInfo) -> BoundCall:
    """``bound``, or ``fallback`` for a call whose first input has not ``first``'s shape and dtype.

    NOTE: only the first input is checked (a shape tuple and a dtype compared, ~0.2 us): the others of
    the nodes that prepare are weights, whose shapes a plan fixes.
    """
    shape, dtype = tuple(first.shape), np.dtype(first.dtype)

    def call(inputs: Sequence[Any]) -> Sequence[Any]:
        x = inputs[0]
        if x.shape == shape and x.dtype == dtype:
            return bound(inputs)
        return fallback(inputs)

    capture: CaptureFn | None = getattr(bound, "capture", None)
    if capture is not None:

        def capture_guarded(inputs: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]] | None:
            x = inputs[0]
            return capture(inputs) if x.shape == shape and x.dtype == dtype else None

        call.capture = capture_guarded  # type: ignore[attr-defined]
    return call


def with_capture(call: BoundCall, capture: CaptureFn) -> BoundCall:
    """``call`` carrying ``capture`` (see ``CaptureFn``)."""
    call.capture = capture  # type: ignore[attr-defined]
    return call


def _concrete(inputs: Sequence[TensorInfo | None]) -> bool:
    return all(info is None or all(isinstance(d, int) for d in info.shape) for info in inputs)


def _touched(array: np.ndarray) -> np.ndarray:
    """``array`` with every page written once, so later writes find its memory mapped."""
    array.fill(0)
    return array


@dataclass
class KernelTable:
    """The kernels one device has, by op type, in preference order."""

    kernels: dict[str, list[Kernel]] = field(default_factory=dict)

    def register(
        self,
        *op_types: str,
        algorithm: str = "default",
        supports: SupportsFn | None = None,
        writes_out: bool = False,
        inplace: bool | InplaceFn = False,
        workspace: WorkspaceFn | None = None,
        prepare: PrepareFn | None = None,
    ) -> Callable[[KernelFn], KernelFn]:
        """Decorator: register ``fn`` as the kernel for each of ``op_types`` (see ``Kernel``)."""

        def decorate(fn: KernelFn) -> KernelFn:
            for op_type in op_types:
                kernel = Kernel(op_type, fn, algorithm, supports, writes_out, inplace, workspace, prepare)
                self.kernels.setdefault(op_type, []).append(kernel)
            return fn

        return decorate

    def candidates(self, node: Node, inputs: InputInfos = None) -> list[Kernel]:
        """Every kernel of this device that can run ``node`` (with inputs ``inputs`` when known)."""
        return [k for k in self.kernels.get(node.op_type, []) if k.reason_unsupported(node, inputs) is None]

    def lookup(self, node: Node, inputs: InputInfos = None) -> Kernel | None:
        """The preferred kernel for ``node`` or None."""
        found = self.candidates(node, inputs)
        return found[0] if found else None

    def reason_unsupported(self, node: Node, inputs: InputInfos = None) -> str | None:
        """Why no kernel here runs ``node`` (None when one does)."""
        kernels = self.kernels.get(node.op_type)
        if not kernels:
            return f"no kernel for {node.op_type}"
        reasons = [k.reason_unsupported(node, inputs) for k in kernels]
        if any(r is None for r in reasons):
            return None
        return "; ".join(r for r in reasons if r)

    def op_types(self) -> list[str]:
        return sorted(self.kernels)

    def all_kernels(self) -> list[Kernel]:
        """Every kernel of this device, op by op."""
        return [kernel for op_type in sorted(self.kernels) for kernel in self.kernels[op_type]]


class Device(abc.ABC):
    """A place where kernels run.

    Subclasses provide their kernel table, availability probe and fingerprint; devices whose memory
    is not the host's also override the transfer methods.
    """

    #: stable identifier as users write it: ``"cpu"``, ``"opencl:0"``.
    id: str
    #: ``"cpu"``, ``"opencl"``, ``"null"``.
    kind: str
    kernels: KernelTable

    @abc.abstractmethod
    def name(self) -> str:
        """Human-readable device name."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, str]:
        """What identifies this device for tuning caches and profiles (vendor, model, driver...)."""

    @classmethod
    def is_available(cls) -> str | None:
        """None when the device can start on this machine, else the reason it cannot."""
        return None

    def to_device(self, array: np.ndarray) -> object:
        """Copy a host array into device memory (identity for host-memory devices)."""
        return array

    def to_host(self, buffer: object) -> np.ndarray:
        """Copy a device buffer back to a host array (identity for host-memory devices)."""
        assert isinstance(buffer, np.ndarray)
        return buffer

    def synchronize(self) -> None:
        """Wait until every queued kernel has finished (no-op for synchronous devices)."""
        return None

    def timed_call(
        self, kernel: Kernel, node: Node, inputs: Sequence[Any], outputs: Sequence[Any] | None = None,
        weights: Collection[int] = (),
    ) -> Callable[[], None]:
        """One call of ``kernel`` on host ``inputs`` as a run makes it, waited for: what tuning,
        calibration and validation time. ``outputs``: a result of the kernel on these inputs already
        in hand (a warm-up's), which saves a call to size its buffers. ``weights``: the positions of the
        inputs a run holds as resident weights (``Kernel.steady_call``).

        Host-memory devices call the kernel with its outputs and workspace in place
        (``Kernel.steady_call``). A device with its own memory stages the inputs a
        run would hand over already on the device, so that a measurement holds the kernel and not the
        transfers a run between device nodes never makes.
        """
        return kernel.steady_call(node, inputs, outputs, weights)
