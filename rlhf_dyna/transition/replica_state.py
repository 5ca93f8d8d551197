"""Host-memory snapshots of a training role's state and its replica on the next rank, and the rebuild of the role on
the survivors of lost ranks from them (the pure plans: elastic/replicas.py; docs/elastic/recovery.md).

    snap = take_snapshot(engine, files, "actor", slot)    # local: this rank's shard into its own slot file (mapped)
    moved = send_replicas({"actor": snap}, group, peers, files, key)   # collective: own -> the next rank's replica
    ...  ranks are lost; the survivors enter a new world and build empty engines on its mesh ...
    moved = restore_role(snap, engine, dst_spec, served)   # collective over the new world: the served plan

The own copy is what the snapshot sends (so a background send never reads tensors that training is changing) and what
a survivor restores from: rolling back to the snapshot needs it where the live state moved past it (an optimizer
step after the snapshot). Only this rank reads it, and only to roll back, so it lives in a file on node-local disk
(launch/scratch.py names the directory), mapped: one of two slots per role and dtype, the other one holding the
committed snapshot (transition/snapshot_files.py). Both copies are flat, one tensor per dtype
(transition/flat_shards.py): the ring layout gives the next rank exactly this rank's buffers
(elastic/replicas.ring_spec), so the replica is one copy per role and dtype, from the predecessor's slot file where the
holder sees it (the same node), else one message over gloo; a restore reads them as views by name. Each rank holds
one shard per role in host memory, its predecessor's replica; while a snapshot is sent, two (the new replica and the
previous one, which a loss then falls back to).
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from ..elastic.replicas import REPLICA, Served, holder_of, replica_source, ring_spec, served_rank_plan
from ..train.engine import TrainEngine, refresh_fsdp_shards
from ..vps.layout import build_layout
from ..vps.model import ModelCatalog
from ..vps.plan import build_plan
from ..vps.schedule import build_schedule
from ..vps.spec import ParallelSpec, placed_on
from ..vps.tensor import Kind
from .bind_train import bind_train_buffers, buffer_name, local_tensor, state_kinds, train_spec
from .executor import execute, prepare
from .flat_shards import ShardIndex, empty, pack, shard_index, unpack
from .snapshot_files import PeerDir, SnapshotFiles
from .relayout import bind_train_state
from .trace import TraceRecorder
from .role_move import optimizer_step, prepare_optimizer, role_catalog
from .views import peer_rank
from .vps_plans import DEFAULT_BUDGET_BYTES, ranks_per_node


@dataclass
class RoleSnapshot:
    """One role's state at a step boundary on this rank: its own shard and (after send_replicas) the replica of the
    previous rank's shard, both flat copies keyed by dtype (flat_shards; own_state and replica_state name them)."""

    spec: ParallelSpec  # the role's training spec in the world of the snapshot
    world_size: int
    kinds: tuple[Kind, ...]
    adam_step: float  # AdamW's step counter (-1: no moments yet)
    catalog: ModelCatalog
    own: dict[str, Tensor]  # mapped on the own slot's files (`slot`), or in host memory (slot None)
    replica: dict[str, Tensor] = field(default_factory=dict)
    slot: int | None = None  # the own slot file (snapshot_files.SnapshotFiles.own) that holds `own`
    kept: bool = False  # a frozen role's committed snapshot kept: its own copy and its replica not made again

    def own_state(self, rank: int) -> dict[str, Tensor]:
        """This rank's own copy by VPS buffer name (`rank`: its number in the snapshot's world)."""
        return unpack(shard_index(self.catalog, self.spec, self.kinds, rank), self.own)

    def replica_state(self, rank: int) -> dict[str, Tensor]:
        """The replica of the previous rank's shard by VPS buffer name: the ring layout's buffers on `rank` (none
        before send_replicas: a restore from the own copies alone)."""
        if not self.replica:
            return {}
        return unpack(self.ring_index(rank), self.replica)

    def ring_index(self, rank: int) -> ShardIndex:
        """`rank`'s buffers of the ring layout: its predecessor's shard (what its replica holds)."""
        return shard_index(self.catalog, ring_spec(self.spec, self.world_size), self.kinds, rank)


@dataclass(frozen=True)
class Bound:
    """An engine's live state as the last snapshot bound it: reused while it is the same tensors in the same world."""

    live: tuple[weakref.ref, ...]  # the state's tensors and their local shards (weak: an engine's old state may go)
    world: tuple[int, int]  # (rank, world size)
    names: tuple[str | None, ...]  # each state entry's buffer name (None: an empty trailing FSDP chunk)
    spec: ParallelSpec
    catalog: ModelCatalog
    kinds: tuple[Kind, ...]
    index: ShardIndex

    def holds(self, tensors: tuple[Tensor, ...], world: tuple[int, int]) -> bool:
        return world == self.world and len(tensors) == len(self.live) and all(
            r() is t for r, t in zip(self.live, tensors))


_BOUND: weakref.WeakKeyDictionary[TrainEngine, Bound] = weakref.WeakKeyDictionary()


def take_snapshot(engine: TrainEngine, files: SnapshotFiles | None = None, role: str = "",
                  slot: int = 0, keep: RoleSnapshot | None = None) -> RoleSnapshot:
    """This rank's shard of `engine`'s state copied (local) into `role`'s own slot `slot` of `files` (one that holds
    no committed snapshot: a snapshot in progress never overwrites the one a recovery would fall back to), or into
    new host tensors (`files` None). The binding (spec, catalog, layout index, checks) is the last snapshot's while
    the engine holds the same tensors: a relayout, a move or the first moments bind anew. `keep`: the role's
    committed snapshot on the current ring; a frozen engine (no optimizer) still bound to the same tensors keeps its
    own copy, slot and (send_replicas) replica."""
    state, world = bind_train_state(engine), (dist.get_rank(), dist.get_world_size())
    tensors = (*state.values(), *map(local_tensor, state.values()))
    bound = _BOUND.get(engine)
    if bound is not None and bound.holds(tensors, world) and engine.optimizer is None and keep is not None \
            and keep.slot is not None and files is not None and (keep.spec, keep.world_size) == (bound.spec, world[1]):
        return RoleSnapshot(bound.spec, world[1], bound.kinds, keep.adam_step, bound.catalog, keep.own, slot=keep.slot,
                            kept=True)
    if bound is None or not bound.holds(tensors, world):
        kinds = state_kinds(state)
        spec, catalog = train_spec(state), role_catalog(engine)
        index = shard_index(catalog, spec, kinds, world[0])
        live = bind_train_buffers({k: t for k, t in state.items() if k[1] in {x.value for x in kinds}}, index.layout,
                                  world[0], expected=index.buffers)
        names = tuple(buffer_name(k) if buffer_name(k) in live else None for k in state)
        bound = _BOUND[engine] = Bound(tuple(map(weakref.ref, tensors)), world, names, spec, catalog, kinds, index)
    shards = {name: t for name, t in zip(bound.names, tensors[len(state):]) if name is not None}
    out = files.own(role, slot, bound.index.sizes) if files is not None else None
    return RoleSnapshot(bound.spec, world[1], bound.kinds, optimizer_step(engine), bound.catalog,
                        pack(bound.index, shards, out), slot=slot if files is not None else None)


def send_replicas(snaps: Mapping[str, RoleSnapshot], group: dist.ProcessGroup, peers: list[PeerDir] | None = None,
                  files: SnapshotFiles | None = None, key: int = 0, recorder: TraceRecorder | None = None,
                  committed: Mapping[str, RoleSnapshot] | None = None) -> int:
    """Collective over `group` (the snapshot's world, in its order; every rank with its roles in the same order):
    every rank's own copies into new replica buffers on the next rank; the bytes moved between ranks over the world
    (the same on every rank). Each rank first tells its holder snapshot `key`'s slots and which roles it kept
    (take_snapshot's `keep`): a kept role's replica is the holder's `committed` one (the last commit on this ring).
    `peers` (each rank's PeerDir, in `group`'s order) and `files` (this rank's): a holder that sees its predecessor's
    files copies the other roles' slots from them; any other takes one message per role and dtype over gloo."""
    rank, began, works, moved, sent, read = dist.get_rank(group), time.time(), [], 0, 0, 0
    world = dist.get_world_size(group)
    holder, source = holder_of(rank, world), replica_source(rank, world)
    local_to = peers is not None and files is not None and peers[holder].same_files(peers[rank])
    local_from = peers is not None and files is not None and peers[source].same_files(peers[rank])
    told = torch.tensor([key, *(-1 if s.slot is None else s.slot for s in snaps.values()),
                         *(int(s.kept) for s in snaps.values())], dtype=torch.int64)
    heard = told.clone()  # a world of one: its own
    if holder != rank:
        works.append(dist.isend(told, peer_rank(group, holder), group, tag=0))
        dist.irecv(heard, peer_rank(group, source), group, tag=0).wait()
        if int(heard[0]) != key:
            raise RuntimeError(f"rank {source} announced snapshot {int(heard[0])} to its replica holder, not {key}")
    slots, kept = heard[1:1 + len(snaps)].tolist(), heard[1 + len(snaps):].tolist()
    for i, ((role, snap), slot, theirs_kept) in enumerate(zip(snaps.items(), slots, kept), start=1):
        if not snap.kept:
            for j, flat in enumerate(snap.own.values()):  # the dtypes in the order the holder's replica has them
                if holder != rank and not local_to:
                    works.append(dist.isend(flat, peer_rank(group, holder), group, tag=16 * i + j))
                    sent += flat.nbytes
            moved += sum(shard_index(snap.catalog, snap.spec, snap.kinds, r).nbytes for r in snap.spec.ranks
                         if holder_of(r, world) != r)
        if theirs_kept:
            if committed is None or role not in committed:
                raise RuntimeError(f"rank {source} kept its {role} snapshot, and this rank has no committed replica "
                                   f"of it on this ring")
            snap.replica = committed[role].replica
            continue
        if not snap.replica:  # made here unless the caller made them (replica_buffers)
            snap.replica = empty(snap.ring_index(rank))
        if holder == rank:  # a world of one: its own replica
            for dtype, flat in snap.own.items():
                snap.replica[dtype].copy_(flat)
        elif local_from:
            for dtype, flat in files.peer(peers[source].directory, role, slot, snap.ring_index(rank).sizes).items():
                snap.replica[dtype].copy_(flat)
                read += flat.nbytes
        else:
            works += [dist.irecv(flat, peer_rank(group, source), group, tag=16 * i + j)
                      for j, flat in enumerate(snap.replica.values())]
    messages = len(works) + (holder != rank)
    for work in works:
        work.wait()
    if recorder is not None:
        received = sum(t.nbytes for s, k in zip(snaps.values(), kept) if not k for t in s.replica.values())
        recorder.add("elastic/snapshot", 0, began, time.time() - began, dict(
            bytes_sent=sent, bytes_received=received - read, bytes_read_from_files=read, messages=messages))
    return moved


def replica_buffers(snaps: Mapping[str, RoleSnapshot], rank: int) -> None:
    """Each snapshot's replica buffers made now, on the loop's thread, for send_replicas to fill: glibc's main arena
    hands back the pages of the replicas freed at the last commit, where a thread's arena maps fresh ones to fault in.
    A kept role gets none (its holder's predecessor keeps it too, as every rank binds anew at the same changes)."""
    for snap in snaps.values():
        if not snap.kept:
            snap.replica = empty(snap.ring_index(rank))


@dataclass(frozen=True)
class Restored:
    seconds: float
    bytes_moved: int  # between ranks of the new world, summed over the world
    local_bytes: int  # copied on this rank: its own pieces, and the replica it held of a lost rank


def shell_of(snap: RoleSnapshot) -> RoleSnapshot:
    """`snap` without shards: what a rank that holds none of the role (split's rollout ranks) takes part in the ring
    and the restore with (the next rank's replica may be its to hold, and to serve)."""
    return RoleSnapshot(snap.spec, snap.world_size, snap.kinds, snap.adam_step, snap.catalog, {})


def restore_role(snap: RoleSnapshot, destination: TrainEngine | None, dst_spec: ParallelSpec, served: Served,
                 budget_bytes: int = DEFAULT_BUDGET_BYTES, recorder: TraceRecorder | None = None) -> Restored:
    """Collective over the new world: `destination` (an empty engine on the new world's mesh, this rank's new number
    in `served`) filled with the snapshot's state, the survivors' own pieces and the lost ranks' replicas, by the leave's
    plan with the lost ranks' sends served by their holders. `dst_spec`: the new layout in the old world's numbering
    (on the survivors). `destination` None: this rank holds none of the role in the new world (it may serve)."""
    start, new = time.perf_counter(), dist.get_rank()
    src_layout = build_layout(snap.catalog, snap.spec, snap.kinds)
    dst_layout = build_layout(snap.catalog, dst_spec, snap.kinds)
    schedule = build_schedule(build_plan(src_layout, dst_layout, ranks_per_node()), budget_bytes)
    plan = served_rank_plan(schedule, served, new)
    prepared = prepare(plan)
    plain = placed_on(dst_spec, [served.survivors.index(r) for r in dst_spec.ranks])  # the same spec over 0..n-1
    dst = {}
    if destination is not None:
        prepare_optimizer(destination, snap.adam_step)
        names = {k.value for k in snap.kinds}
        state = {k: t for k, t in bind_train_state(destination).items() if k[1] in names}
        dst = bind_train_buffers(state, build_layout(snap.catalog, plain, snap.kinds), new)
    old = served.survivors[new]  # this rank's number in the snapshot's world
    src = {**snap.own_state(old), **{REPLICA + n: t for n, t in snap.replica_state(old).items()}}
    execute(prepared, src, dst, trace=recorder, trace_name="elastic/recovery/rounds")
    if destination is not None:
        refresh_fsdp_shards(destination.model)
        if destination.zero < 3:
            destination.materialize_replicas()
    moved = torch.tensor([sum(s.nbytes for s in plan.sends.values())], dtype=torch.float64)
    dist.all_reduce(moved)
    local = sum(t.nbytes for t in plan.copies)
    return Restored(time.perf_counter() - start, int(moved.item()), local)


def snapshot_bytes(snaps: dict[str, RoleSnapshot]) -> tuple[int, int]:
    """(own, replica) bytes this rank holds in host memory for its snapshots (own: 0 where they are mapped files)."""
    own = sum(t.nbytes for s in snaps.values() if s.slot is None for t in s.own.values())
    return own, sum(t.nbytes for s in snaps.values() for t in s.replica.values())


def held_bytes(*snaps: dict[str, RoleSnapshot]) -> int:
    """Host memory this rank holds for the snapshots of `snaps`: own copies not in files, and replicas, each tensor
    once (a kept role's replica is shared with the committed snapshot's)."""
    tensors = {id(t): t for group in snaps for s in group.values()
               for t in (*s.replica.values(), *(s.own.values() if s.slot is None else ()))}
    return sum(t.nbytes for t in tensors.values())


def memory_metrics(snaps: dict[str, RoleSnapshot], peak: int, disk: int) -> dict[str, float]:
    """A committed snapshot's memory on this rank: elastic/snapshot/host_bytes (held from now on: the replica, the own
    copy being in its file), replica_bytes, disk_bytes (`disk`: the own slot files, both slots), and peak_host_bytes
    (`peak`: held while it was sent)."""
    own, replica = snapshot_bytes(snaps)
    return {"elastic/snapshot/host_bytes": float(own + replica), "elastic/snapshot/replica_bytes": float(replica),
            "elastic/snapshot/disk_bytes": float(disk), "elastic/snapshot/peak_host_bytes": float(peak)}
