"""Replicas of the training state as a VPS layout, and the recovery from a lost rank as a VPS plan (pure; the live part
is orchestrator/recovery.py and transition/replica_state.py; docs/elastic/recovery.md).

With elastic.replicas=1 every rank's shard of each training role's state (a train `ParallelSpec`) is also held, in
host memory, by the next rank of the world (a ring: rank r's shard lives on r + 1 mod W too). That copy is the same
spec placed on the rotated ranks:

    ring = ring_spec(spec)                      # train[dp=4]@0 -> its boxes on ranks 1, 2, 3, 0

The ring layout gives each holder exactly its predecessor's buffers (names, shapes, offsets), so the snapshot sends
every rank's buffers whole, one flat message per role and dtype (transition/replica_state.send_replicas), the boxes
the holder also holds itself (a tp-replicated norm) included: a few small tensors more on the wire, for no plan to
run. When ranks are lost, the survivors hold their own pieces (their snapshot copy) and the replicas of the lost
ranks' pieces. The recovery is the leave's plan (old spec over the old world -> the new world's spec on the survivors,
both in the old numbering: elastic.membership) with every transfer a lost rank would have sent served by its replica
holder instead:

    served = served_rank_plans(schedule, lost=(2,), world_size=4)    # new rank -> RankPlan over the new world

Served transfers read the holder's replica buffers, whose names carry REPLICA in front of the lost rank's buffer names
(the ring layout gives the holder the lost rank's buffers, shapes and offsets). The plans are single-round: the state of
the tiny models this runs with fits one round (a bigger model would cut the streams by the schedule's budget).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..vps.rank_plan import PeerStream, RankPlan, RankRound, Transfer, append, for_rank
from ..vps.schedule import Schedule
from ..vps.spec import ParallelSpec, placed_on

REPLICA = "replica:"  # prefix of a buffer served from the replica a rank holds of its predecessor's shard


def holder_of(rank: int, world_size: int) -> int:
    """The rank that holds `rank`'s replica: the next one (one node's loss never takes both copies on one machine
    only if consecutive ranks are on different nodes; on this machine every rank is)."""
    return (rank + 1) % world_size


def replica_source(rank: int, world_size: int) -> int:
    """Whose shard `rank` holds a replica of: the previous rank."""
    return (rank - 1) % world_size


def ring_spec(spec: ParallelSpec, world_size: int) -> ParallelSpec:
    """`spec` placed one rank further on the ring: where the replica of each rank's shard lives."""
    return placed_on(spec, [holder_of(r, world_size) for r in spec.ranks])


def recovers_from_checkpoint(replicas: int, recover_from_checkpoint: bool | None) -> bool:
    """elastic.recover_from_checkpoint resolved: null follows elastic.replicas (the fallback of a run with replicas)."""
    return bool(replicas) if recover_from_checkpoint is None else bool(recover_from_checkpoint)


def unrecoverable(lost: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    """The lost ranks whose replica holder is lost too (their pieces are gone from host memory)."""
    gone = set(lost)
    return tuple(sorted(r for r in lost if holder_of(r, world_size) in gone))


@dataclass(frozen=True)
class Served:
    """Who plays which old rank in the new world: survivors themselves, lost ranks by their replica holders."""

    lost: tuple[int, ...]
    world_size: int

    def __post_init__(self) -> None:
        if unrecoverable(self.lost, self.world_size):
            raise ValueError(f"ranks {list(unrecoverable(self.lost, self.world_size))} lost with their replica holders")

    @property
    def survivors(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world_size) if r not in self.lost)

    def new_rank(self, old: int) -> int:
        """The new world's rank that serves old rank `old` (a survivor itself, a lost rank's replica holder)."""
        return self.survivors.index(holder_of(old, self.world_size) if old in self.lost else old)

    def played_by(self, new: int) -> tuple[int, ...]:
        """Old ranks whose sends new rank `new` makes, in stream order: its own, then the lost one it holds."""
        own = self.survivors[new]
        return (own, *(r for r in self.lost if holder_of(r, self.world_size) == own))


def _from_replica(transfers: list[Transfer]) -> list[Transfer]:
    return [replace(t, src_buffer=REPLICA + t.src_buffer) for t in transfers]


def served_rank_plan(schedule: Schedule, served: Served, new: int) -> RankPlan:
    """New rank `new`'s share of `schedule` (a plan over the old world whose destination lies on the survivors), with
    the lost ranks' sends made by their holders from their replicas; peers are new ranks, and everything runs in one
    round. Both ends order a stream by the old ranks its sender plays (Served.played_by)."""
    old_plans = {old: for_rank(schedule, old) for old in served.played_by(new)}
    me = served.survivors[new]
    copies = list(old_plans[me].copies)
    sends: dict[int, PeerStream] = {}
    for old, plan in old_plans.items():
        from_replica = old != me
        for peer, stream in plan.sends.items():
            items = _from_replica(stream.transfers) if from_replica else stream.transfers
            if served.new_rank(peer) == new:  # the holder receives its lost predecessor's pieces: a local copy
                copies += items
            else:
                append(sends.setdefault(served.new_rank(peer), PeerStream(served.new_rank(peer))), items)
    recvs: dict[int, PeerStream] = {}
    mine = old_plans[me].recvs
    for sender in range(len(served.survivors)):
        if sender == new:
            continue
        for old in served.played_by(sender):
            stream = mine.get(old)
            if stream is not None:
                append(recvs.setdefault(sender, PeerStream(sender)), stream.transfers)
    rounds = [RankRound({p: (0, s.nbytes) for p, s in sends.items() if s.nbytes},
                        {p: (0, s.nbytes) for p, s in recvs.items() if s.nbytes})]
    return RankPlan(new, copies, sends, recvs, rounds)


def served_rank_plans(schedule: Schedule, lost: tuple[int, ...], world_size: int) -> list[RankPlan]:
    """Every new rank's served plan (tests, and the recovery's byte counts: each rank builds only its own)."""
    served = Served(tuple(lost), world_size)
    return [served_rank_plan(schedule, served, new) for new in range(len(served.survivors))]


def bytes_between_ranks(plans: list[RankPlan]) -> int:
    """Bytes the served plans send from one rank of the new world to another."""
    return sum(s.nbytes for p in plans for s in p.sends.values())


def restored_from(plans: list[RankPlan]) -> dict[tuple[int, str], set[int]]:
    """(new rank, destination buffer) -> the new ranks its bytes come from (itself for local copies)."""
    out: dict[tuple[int, str], set[int]] = {}
    for p in plans:
        for t in p.copies:
            out.setdefault((p.rank, t.dst_buffer), set()).add(p.rank)
        for peer, stream in p.recvs.items():
            for t in stream.transfers:
                out.setdefault((p.rank, t.dst_buffer), set()).add(peer)
    return out
