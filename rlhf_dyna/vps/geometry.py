"""Geometry: how one logical tensor is spread over ranks, as a grid of shards each held by a rank group.

A geometry is shared by every logical tensor with the same shape and sharding pattern (the same
projection in every layer of a pipeline stage, every Adam moment of it), so plans are computed once
per geometry pair and reused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from .box import Box


@dataclass(frozen=True, eq=False)
class Holding:
    """A rank group that holds a shard, and where: buffer slot, buffer shape, element offset and strides.

    `slot` indexes the per-tensor tuple of live buffer names (e.g. 0: qkv_proj.weight), so that one
    geometry serves tensors whose buffers have different names but the same placement.
    """

    ranks: tuple[int, ...]
    slot: int
    buffer_shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Shard:
    box: Box
    holdings: tuple[Holding, ...]
    ranks: frozenset[int] = field(default=frozenset())  # union over holdings, derived


@dataclass(eq=False)
class Geometry:
    """A partition of the tensor into boxes; per dimension the boxes' edges form sorted cuts."""

    shape: tuple[int, ...]
    shards: tuple[Shard, ...]
    cuts: tuple[tuple[int, ...], ...] = ()
    cell_of: dict[tuple[int, ...], int] = field(default_factory=dict)
    _table: np.ndarray | None = field(default=None, repr=False)
    _holders: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        cuts = []
        for d, n in enumerate(self.shape):
            edges = {0, n}
            for s in self.shards:
                edges.add(s.box.lo[d])
                edges.add(s.box.hi[d])
            cuts.append(tuple(sorted(edges)))
        self.cuts = tuple(cuts)
        index = [{c: i for i, c in enumerate(dim_cuts)} for dim_cuts in self.cuts]
        covered = 0
        for k, s in enumerate(self.shards):
            cell = tuple(index[d][s.box.lo[d]] for d in range(len(self.shape)))
            if any(index[d][s.box.hi[d]] != cell[d] + 1 for d in range(len(self.shape))):
                raise ValueError(f"shard {s.box} spans several grid cells; layouts must be per-dimension splits")
            if cell in self.cell_of:
                raise ValueError(f"two shards cover the same box {s.box}")
            self.cell_of[cell] = k
            covered += s.box.volume
        if covered != prod(self.shape):
            raise ValueError(f"shards cover {covered} of {prod(self.shape)} elements of shape {self.shape}")

    @staticmethod
    def from_pieces(shape: tuple[int, ...], pieces: list[tuple[Box, Holding]]) -> "Geometry":
        """Group (box, holding) pairs by box; empty boxes are dropped."""
        by_box: dict[Box, list[Holding]] = {}
        for box, holding in pieces:
            if not box.empty:
                by_box.setdefault(box, []).append(holding)
        shards = []
        for box in sorted(by_box, key=lambda b: (b.lo, b.hi)):
            hs = tuple(by_box[box])
            shards.append(Shard(box, hs, frozenset(r for h in hs for r in h.ranks)))
        if not shards and prod(shape) == 0:
            return Geometry(shape, ())
        return Geometry(shape, tuple(shards))

    def cell_table(self) -> np.ndarray:
        """Flat (row-major over the cut grid) cell -> shard index table, -1 for none; cached."""
        if self._table is None:
            dims = tuple(len(c) - 1 for c in self.cuts)
            self._table = np.full(int(np.prod(dims)), -1, dtype=np.int64)
            for cell, k in self.cell_of.items():
                self._table[np.ravel_multi_index(cell, dims)] = k
        return self._table

    def holder_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of shard holders: ranks of shard k are flat[ptr[k]:ptr[k+1]] (sorted); cached."""
        if self._holders is None:
            ranks = [sorted(s.ranks) for s in self.shards]
            ptr = np.zeros(len(ranks) + 1, dtype=np.int64)
            ptr[1:] = np.cumsum([len(r) for r in ranks])
            flat = np.fromiter((r for rs in ranks for r in rs), dtype=np.int64, count=int(ptr[-1]))
            self._holders = (ptr, flat)
        return self._holders

    def holding_of(self, shard: Shard, rank: int) -> Holding:
        for h in shard.holdings:
            if rank in h.ranks:
                return h
        raise KeyError(rank)
