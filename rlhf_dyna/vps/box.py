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

    def relative_to(self, outer: "Box") -> "Box":
        """This box in the coordinates of `outer` (which must contain it)."""
        return Box(tuple(l - o for l, o in zip(self.lo, outer.lo)), tuple(h - o for h, o in zip(self.hi, outer.lo)))

    def slice_dim(self, dim: int, lo: int, hi: int) -> "Box":
        """Restrict dimension `dim` to [lo, hi) in absolute coordinates."""
        new_lo, new_hi = list(self.lo), list(self.hi)
        new_lo[dim], new_hi[dim] = max(lo, self.lo[dim]), min(hi, self.hi[dim])
        return Box(tuple(new_lo), tuple(new_hi))
