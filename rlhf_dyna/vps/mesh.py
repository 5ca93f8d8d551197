"""Build geometries from a rank mesh and per-dimension split steps (outer step first, inner nested inside)."""
from __future__ import annotations

from itertools import product
from typing import Callable

import numpy as np

from .box import Box
from .geometry import Holding
from .layout_types import contiguous_strides
from .split import Rule

# (axis name, rule) applied in order; later steps split the interval chosen by earlier ones.
Steps = list[tuple[str, Rule]]
# Local placement of a box: (buffer shape, element offset, strides); None = the box alone, contiguous.
Placer = Callable[[Box], tuple[tuple[int, ...], int, tuple[int, ...]]]


def mesh_pieces(
    shape: tuple[int, ...],
    mesh: np.ndarray,
    axes: tuple[str, ...],
    splits: dict[int, Steps],
    slot: int = 0,
    place: Placer | None = None,
) -> list[tuple[Box, Holding]]:
    """One (box, holding) per distinct box: ranks along axes that no step uses replicate the box."""
    split_axes = sorted({a for steps in splits.values() for a, _ in steps}, key=axes.index)
    sizes = {a: mesh.shape[axes.index(a)] for a in axes}
    boxes: dict[Box, list[int]] = {}
    memo: dict[tuple, list] = {}  # a rule's intervals depend only on (rule, length, parts)

    def intervals(rule: Rule, n: int, parts: int) -> list:
        key = (rule, n, parts)
        if key not in memo:
            memo[key] = rule(n, parts)
        return memo[key]

    for coords in product(*(range(sizes[a]) for a in split_axes)):
        at = dict(zip(split_axes, coords))
        lo, hi = [], []
        for d, n in enumerate(shape):
            a, b = 0, n
            for axis, rule in splits.get(d, []):
                x, y = intervals(rule, b - a, sizes[axis])[at[axis]]
                a, b = a + x, a + y
            lo.append(a)
            hi.append(b)
        index = tuple(at[a] if a in at else slice(None) for a in axes)
        boxes.setdefault(Box(tuple(lo), tuple(hi)), []).extend(mesh[index].ravel().tolist())
    out = []
    for box, ranks in boxes.items():
        shape_ = tuple(h - l for l, h in zip(box.lo, box.hi))
        if 0 in shape_ and shape_:
            continue
        bshape, offset, strides = place(box) if place else (shape_, 0, contiguous_strides(shape_))
        out.append((box, Holding(tuple(sorted(ranks)), slot, bshape, offset, strides)))
    return out


def fused_placer(buffer_shape: tuple[int, ...], dim: int, start: int) -> Placer:
    """The box sits in a fused buffer at position `start` of dimension `dim` (e.g. k inside qkv_proj)."""
    strides = contiguous_strides(buffer_shape)

    def place(box: Box) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
        return buffer_shape, start * strides[dim], strides

    return place
