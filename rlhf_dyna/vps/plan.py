"""Plans: for every destination shard, which source rank provides each region, computed once per class.

A class is a (source geometry, destination geometry, item size) triple; every logical tensor in it
(the same projection in every layer of a stage, every Adam moment of it) shares the class's regions,
source choices and rank pairs, so global statistics are class results times the member count.
Source choice: same rank (local copy) > a holder on the destination's node > the source replicas
in rotation, so that replicated sources share the load evenly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .geometry import Geometry
from .layout import Layout
from .regions import region_pairs
from .tensor import LogicalTensor


@dataclass(frozen=True, eq=False)
class Member:
    tensor: LogicalTensor
    src_buffers: tuple[str, ...]
    dst_buffers: tuple[str, ...]


@dataclass(eq=False)
class ClassPlan:
    src: Geometry
    dst: Geometry
    itemsize: int
    members: list[Member] = field(default_factory=list)
    region_src: np.ndarray = None  # [R] src shard index
    region_dst: np.ndarray = None  # [R] dst shard index
    lo: np.ndarray = None  # [R, ndim] region box, logical coordinates
    hi: np.ndarray = None
    vol: np.ndarray = None  # [R] elements
    send_region: np.ndarray = None  # remote transfers: region, source rank, destination rank
    send_src: np.ndarray = None
    send_dst: np.ndarray = None
    copy_region: np.ndarray = None  # local copies: region, rank
    copy_rank: np.ndarray = None
    min_elements: int = 0  # elements the destination lacks, whatever the source choice

    @property
    def weight(self) -> int:
        """Bytes per element summed over members: turns element counts into class bytes."""
        return self.itemsize * len(self.members)


def shard_of_rank(geo: Geometry, world: int) -> np.ndarray:
    """rank -> index of the shard it holds (-1: none); a rank holds at most one shard of a tensor."""
    ptr, flat = geo.holder_arrays()
    out = np.full(world, -1, dtype=np.int64)
    owners = np.repeat(np.arange(len(geo.shards)), np.diff(ptr))
    if len(np.unique(flat)) != len(flat):
        raise ValueError("a rank holds two shards of one tensor; layouts give each rank one box per tensor")
    out[flat] = owners
    return out


def plan_class(c: ClassPlan, world: int, ranks_per_node: int) -> None:
    rs, rd, lo, hi = region_pairs(c.src, c.dst)
    c.region_src, c.region_dst, c.lo, c.hi = rs, rd, lo, hi
    c.vol = np.prod(hi - lo, axis=1) if lo.shape[1] else np.ones(len(rs), dtype=np.int64)
    dptr, dflat = c.dst.holder_arrays()
    counts = dptr[rd + 1] - dptr[rd]
    pr = np.repeat(np.arange(len(rd)), counts)
    within = np.arange(len(pr)) - np.repeat(np.cumsum(counts) - counts, counts)
    pd = dflat[dptr[rd][pr] + within]
    local = shard_of_rank(c.src, world)[pd] == rs[pr]
    c.copy_region, c.copy_rank = pr[local], pd[local]
    need_r, need_d = pr[~local], pd[~local]
    c.min_elements = int((c.vol * counts).sum() - c.vol[c.copy_region].sum())
    c.send_region, c.send_dst = need_r, need_d
    c.send_src = choose_sources(c.src, rs[need_r], need_r, need_d, ranks_per_node, world)


def choose_sources(src: Geometry, shard: np.ndarray, region: np.ndarray, dst: np.ndarray,
                   ranks_per_node: int, world: int) -> np.ndarray:
    sptr, sflat = src.holder_arrays()
    replicas = sptr[shard + 1] - sptr[shard]
    if len(replicas) == 0 or replicas.max() == 1:  # unreplicated sources: nothing to choose
        return sflat[sptr[shard]]
    nodes = -(-world // ranks_per_node)
    on_node = np.full((len(src.shards), nodes), -1, dtype=np.int64)
    on_node[np.repeat(np.arange(len(src.shards)), np.diff(sptr)), sflat // ranks_per_node] = sflat
    same_node = on_node[shard, dst // ranks_per_node]
    run_start = np.flatnonzero(np.r_[True, region[1:] != region[:-1]])  # region is sorted: one run each
    position = np.arange(len(region)) - np.repeat(run_start, np.diff(np.r_[run_start, len(region)]))
    rotated = sflat[sptr[shard] + (position + region) % np.maximum(replicas, 1)]
    return np.where(same_node >= 0, same_node, rotated)


@dataclass(eq=False)
class Plan:
    """All transfers of one transition, by class; identical on every rank (pure function of the inputs)."""

    src: Layout
    dst: Layout
    world_size: int
    ranks_per_node: int
    classes: list[ClassPlan]

    @property
    def moved_bytes(self) -> int:
        return int(sum(c.vol[c.send_region].sum() * c.weight for c in self.classes))

    @property
    def min_bytes(self) -> int:
        return int(sum(c.min_elements * c.weight for c in self.classes))

    @property
    def local_bytes(self) -> int:
        return int(self.local_bytes_by_rank().sum())

    @property
    def state_bytes(self) -> int:
        """Logical bytes of the state that the transition moves (each tensor counted once)."""
        return int(sum(int(np.prod(c.dst.shape)) * c.weight for c in self.classes))

    def local_bytes_by_rank(self) -> np.ndarray:
        """[world] bytes each rank copies from its own source shard (what it already held; no wire)."""
        out = np.zeros(self.world_size)
        for c in self.classes:
            np.add.at(out, c.copy_rank, c.vol[c.copy_region] * c.weight)
        return out

    def pair_bytes(self) -> np.ndarray:
        """[world, world] bytes each source rank sends to each destination rank."""
        w = self.world_size
        keys = [c.send_src * w + c.send_dst for c in self.classes]
        weights = [c.vol[c.send_region].astype(np.float64) * c.weight for c in self.classes]
        flat = np.bincount(np.concatenate(keys), np.concatenate(weights), minlength=w * w) if keys else np.zeros(w * w)
        return flat.reshape(w, w)


def build_plan(src: Layout, dst: Layout, ranks_per_node: int = 8) -> Plan:
    """Plan moving every (tensor, kind) of `dst` that `src` also holds; kinds only one side keeps are skipped."""
    world = max(src.spec.rank_bound, dst.spec.rank_bound)
    by_key = {(e.tensor.name, e.tensor.kind): e for e in src.entries}
    classes: dict[tuple[int, int, int], ClassPlan] = {}
    for e in dst.entries:
        s = by_key.get((e.tensor.name, e.tensor.kind))
        if s is None:
            continue
        if s.tensor.shape != e.tensor.shape:
            raise ValueError(f"{e.tensor.name}: shape {s.tensor.shape} in source, {e.tensor.shape} in destination")
        key = (id(s.geometry), id(e.geometry), e.tensor.itemsize)
        if key not in classes:
            classes[key] = ClassPlan(s.geometry, e.geometry, e.tensor.itemsize)
        classes[key].members.append(Member(e.tensor, s.buffers, e.buffers))
    for c in classes.values():
        plan_class(c, world, ranks_per_node)
    return Plan(src, dst, world, ranks_per_node, list(classes.values()))
