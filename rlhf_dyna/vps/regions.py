"""Intersecting two geometries of one tensor by interval arithmetic per dimension (no all-pairs over pieces)."""
from __future__ import annotations

import numpy as np

from .geometry import Geometry


def dim_overlaps(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Merge two sorted cut lists: (cell in a, cell in b, lo, hi) for every non-empty overlap."""
    out, i, j = [], 0, 0
    while i < len(a) - 1 and j < len(b) - 1:
        lo, hi = max(a[i], b[j]), min(a[i + 1], b[j + 1])
        if lo < hi:
            out.append((i, j, lo, hi))
        if a[i + 1] <= b[j + 1]:
            i += 1
        else:
            j += 1
    return out


def region_pairs(src: Geometry, dst: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src shard, dst shard, lo [R, ndim], hi [R, ndim]) of every region where a src and a dst shard overlap."""
    per_dim = [dim_overlaps(a, b) for a, b in zip(src.cuts, dst.cuts)]
    if not per_dim:  # a scalar: one region
        return np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64)
    arrays = [np.array(ov, dtype=np.int64).reshape(-1, 4) for ov in per_dim]
    grids = np.meshgrid(*[np.arange(len(a)) for a in arrays], indexing="ij")
    picks = [g.ravel() for g in grids]
    src_cells = [arrays[d][picks[d], 0] for d in range(len(arrays))]
    dst_cells = [arrays[d][picks[d], 1] for d in range(len(arrays))]
    lo = np.stack([arrays[d][picks[d], 2] for d in range(len(arrays))], axis=1)
    hi = np.stack([arrays[d][picks[d], 3] for d in range(len(arrays))], axis=1)
    src_shard = cells_to_shards(src, src_cells)
    dst_shard = cells_to_shards(dst, dst_cells)
    return src_shard, dst_shard, lo, hi


def cells_to_shards(geo: Geometry, cells: list[np.ndarray]) -> np.ndarray:
    """Shard index of each grid cell (every non-empty cell of a geometry is exactly one shard)."""
    dims = tuple(len(c) - 1 for c in geo.cuts)
    out = geo.cell_table()[np.ravel_multi_index(tuple(cells), dims)]
    assert (out >= 0).all(), "geometry has an uncovered cell"
    return out
