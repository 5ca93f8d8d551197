"""Boxes: half-open integer hyper-rectangles in a logical tensor's coordinates."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True, slots=True)
class Box:
    lo: tuple[int, ...]
    hi: tuple[int, ...]

    @staticmethod
    def full(shape: tuple[int, ...]) -> "Box":
        return Box(tuple(0 for _ in shape), tuple(shape))

    @property
    def ndim(self) -> int:
        return len(self.lo)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, h - l) for l, h in zip(self.lo, self.hi))

    @property
    def volume(self) -> int:
        return prod(self.shape)

    @property
    def empty(self) -> bool:
        return any(h <= l for l, h in zip(self.lo, self.hi))

    def intersect(self, other: "Box") -> "Box | None":
        lo = tuple(max(a, b) for a, b in zip(self.lo, other.lo))
        hi = tuple(min(a, b) for a, b in zip(self.hi, other.hi))
        if any(h <= l for l, h in zip(lo, hi)):
            return None
        return Box(lo, hi)

    def contains(self, other: "Box") -> bool:
        return all(a <= c and d <= b for a, b, c, d in zip(self.lo, self.hi, other.lo, other.hi))
