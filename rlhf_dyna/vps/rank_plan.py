"""One rank's share of a schedule, materialised on demand, for the transition executor.

For rank r: local copies; per peer the ordered transfers of the one packed byte stream it sends to
(or receives from) that peer; per round the byte range [lo, hi) of each peer stream that travels in
that round.  Stream order is global (class, transfer, member), so sender and receiver agree on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .plan import ClassPlan
from .schedule import Schedule
from .tensor import Kind


@dataclass(frozen=True, slots=True)
class Transfer:
    """Copy a region of `shape` elements between two local buffers (strided views at element offsets)."""

    tensor: str
    kind: Kind
    dtype: str
    shape: tuple[int, ...]
    src_buffer: str
    src_offset: int
    src_strides: tuple[int, ...]
    dst_buffer: str
    dst_offset: int
    dst_strides: tuple[int, ...]
    nbytes: int


@dataclass
class PeerStream:
    peer: int
    transfers: list[Transfer] = field(default_factory=list)
    nbytes: int = 0


@dataclass(frozen=True)
class RankRound:
    sends: dict[int, tuple[int, int]]  # peer -> byte range of the stream to that peer
    recvs: dict[int, tuple[int, int]]


@dataclass
class RankPlan:
    rank: int
    copies: list[Transfer]
    sends: dict[int, PeerStream]
    recvs: dict[int, PeerStream]
    rounds: list[RankRound]


def local_view(c: ClassPlan, geo_side: str, region: int, rank: int) -> tuple[int, int, tuple[int, ...]]:
    """(slot, element offset, strides) of region `region` inside `rank`'s buffer on one side."""
    geo = c.src if geo_side == "src" else c.dst
    shard = geo.shards[(c.region_src if geo_side == "src" else c.region_dst)[region]]
    h = geo.holding_of(shard, rank)
    rel = [int(a) - b for a, b in zip(c.lo[region], shard.box.lo)]
    return h.slot, h.offset + sum(x * s for x, s in zip(rel, h.strides)), h.strides


def transfers(c: ClassPlan, region: int, src_rank: int, dst_rank: int) -> list[Transfer]:
    s_slot, s_off, s_str = local_view(c, "src", region, src_rank)
    d_slot, d_off, d_str = local_view(c, "dst", region, dst_rank)
    shape = tuple(int(h - l) for l, h in zip(c.lo[region], c.hi[region]))
    nbytes = int(c.vol[region]) * c.itemsize
    return [Transfer(m.tensor.name, m.tensor.kind, m.tensor.dtype, shape, m.src_buffers[s_slot], s_off, s_str,
                     m.dst_buffers[d_slot], d_off, d_str, nbytes) for m in c.members]


def for_rank(schedule: Schedule, rank: int) -> RankPlan:
    plan = schedule.plan
    copies: list[Transfer] = []
    sends: dict[int, PeerStream] = {}
    recvs: dict[int, PeerStream] = {}
    for c in plan.classes:
        for i in np.nonzero(c.copy_rank == rank)[0]:
            copies += transfers(c, int(c.copy_region[i]), rank, rank)
        for i in np.nonzero(c.send_src == rank)[0]:
            peer = int(c.send_dst[i])
            append(sends.setdefault(peer, PeerStream(peer)), transfers(c, int(c.send_region[i]), rank, peer))
        for i in np.nonzero(c.send_dst == rank)[0]:
            peer = int(c.send_src[i])
            append(recvs.setdefault(peer, PeerStream(peer)), transfers(c, int(c.send_region[i]), peer, rank))
    rounds = []
    for r in schedule.rounds:
        out, inn = np.flatnonzero(r.src == rank), np.flatnonzero(r.dst == rank)
        rounds.append(RankRound({int(r.dst[i]): (int(r.lo[i]), int(r.hi[i])) for i in out},
                                {int(r.src[i]): (int(r.lo[i]), int(r.hi[i])) for i in inn}))
    return RankPlan(rank, copies, sends, recvs, rounds)


def append(stream: PeerStream, items: list[Transfer]) -> None:
    stream.transfers += items
    stream.nbytes += sum(t.nbytes for t in items)
