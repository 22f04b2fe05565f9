"""Shapes with symbolic dimensions (the batch is a name, e.g. ``"N"``) and the arithmetic on them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Dim = int | str
Shape = tuple[Dim, ...]


def is_static(shape: Sequence[Dim]) -> bool:
    """True when every dimension is a concrete integer."""
    return all(isinstance(d, int) for d in shape)


def symbols(shape: Sequence[Dim]) -> set[str]:
    """The symbolic dimension names a shape mentions."""
    return {d for d in shape if isinstance(d, str)}


def bind(shape: Sequence[Dim], bindings: Mapping[str, int]) -> Shape:
    """Replace symbolic dimensions by the integers ``bindings`` gives them (unknown names stay)."""
    return tuple(bindings.get(d, d) if isinstance(d, str) else d for d in shape)


class Monomial:
    """A product of an integer and symbolic dimensions: ``numel`` of a shape with a symbolic batch.

    Enough algebra to infer Reshape's ``-1`` and Flatten when the batch is symbolic.
    """

    def __init__(self, coefficient: int = 1, names: Iterable[str] = ()):
        self.coefficient = coefficient
        self.names = tuple(sorted(names))

    @classmethod
    def of(cls, dims: Iterable[Dim]) -> Monomial:
        coefficient, names = 1, []
        for d in dims:
            if isinstance(d, str):
                names.append(d)
            else:
                coefficient *= d
        return cls(coefficient, names)

    def divide(self, other: Monomial) -> Dim:
        """``self / other`` as a dimension; raises ValueError when it is not a whole dimension."""
        remaining = list(self.names)
        for name in other.names:
            if name not in remaining:
                raise ValueError(f"cannot divide {self} by {other}")
            remaining.remove(name)
        if other.coefficient == 0 or self.coefficient % other.coefficient:
            raise ValueError(f"{self} is not divisible by {other}")
        quotient = self.coefficient // other.coefficient
        if not remaining:
            return quotient
        if len(remaining) == 1 and quotient == 1:
            return remaining[0]
        raise ValueError(f"{self} / {other} is not a single dimension")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Monomial)
            and self.coefficient == other.coefficient
            and self.names == other.names
        )

    def __hash__(self) -> int:
        return hash((self.coefficient, self.names))

    def __repr__(self) -> str:
        return "*".join([str(self.coefficient), *self.names])


def broadcast(*shapes: Sequence[Dim]) -> Shape:
    """Numpy (multidirectional) broadcasting of shapes that may hold symbolic dimensions."""
    rank = max((len(s) for s in shapes), default=0)
    result: list[Dim] = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        non_one = {d for d in dims if d != 1}
        if not non_one:
            result.append(1)
        elif len(non_one) == 1:
            result.append(non_one.pop())
        else:
            ints = {d for d in non_one if isinstance(d, int)}
            if len(ints) > 1:
                raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
            # NOTE: a symbol broadcast against an integer > 1 must equal it at run time; keep the integer.
            result.append(ints.pop() if ints else sorted(str(d) for d in non_one)[0])
    return tuple(result)


def check_broadcasts_to(source: Sequence[Dim], target: Sequence[Dim], what: str = "shape") -> None:
    """Raise ValueError unless ``source`` broadcasts unidirectionally to ``target`` (leaving it unchanged).

    This is ONNX's "unidirectional broadcasting" (Gemm's C, PRelu's slope).
    """
    try:
        result: Shape | None = broadcast(source, target)
    except ValueError:
        result = None
    if result is None or len(source) > len(target) or tuple(result) != tuple(target):
        raise ValueError(
            f"{what} of shape {format_shape(source)} does not broadcast to {format_shape(target)}"
        )


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative axis into ``[0, rank)``; raises ValueError when out of range."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def format_shape(shape: Sequence[Dim] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join(str(d) for d in shape) + "]"
