"""Host-memory snapshots of a training role's state and its replica on the next rank, and the rebuild of the role on
the survivors of lost ranks from them (the pure plans: elastic/replicas.py; docs/elastic/recovery.md).

    snap = take_snapshot(engine)                  # local: this rank's shard copied to host memory (own)
    moved = send_replicas({"actor": snap}, group) # collective over `group`: own -> the next rank's replica
    ...  ranks are lost; the survivors enter a new world and build empty engines on its mesh ...
    moved = restore_role(snap, engine, dst_spec, served)   # collective over the new world: the served plan

    spill_own(snaps, directory, key)              # committed: own copies to node-local disk, their memory freed

The own copy is what the snapshot sends (so a background send never reads tensors that training is changing) and what
a survivor restores from: rolling back to the snapshot needs it where the live state moved past it (an optimizer
step after the snapshot). Both copies are flat, one host tensor per dtype (transition/flat_shards.py): the ring
layout gives the next rank exactly this rank's buffers (elastic/replicas.ring_spec), so the send is one message per
role and dtype, and a restore reads them as views by name. Once the snapshot is committed (every rank has its
replica), only this rank reads its own copy, and only to roll back: it goes to a safetensors file on node-local disk
(launch/scratch.py names the directory) and is read back from there. Each rank then holds one shard per role in host
memory, its predecessor's replica; while a snapshot is sent, three (its own copy and replica, and the previous
snapshot's replica, which a loss then falls back to).
"""
from __future__ import annotations

import os
import shutil
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
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
from .relayout import bind_train_state
from .trace import TraceRecorder
from .role_move import optimizer_step, prepare_optimizer, role_catalog
from .views import peer_rank
from .vps_plans import DEFAULT_BUDGET_BYTES, ranks_per_node


@dataclass
class RoleSnapshot:
    """One role's state at a step boundary on this rank: its own shard and (after send_replicas) the replica of the
    previous rank's shard, both flat host copies keyed by dtype (flat_shards; own_state and replica_state name them)."""

    spec: ParallelSpec  # the role's training spec in the world of the snapshot
    world_size: int
    kinds: tuple[Kind, ...]
    adam_step: float  # AdamW's step counter (-1: no moments yet)
    catalog: ModelCatalog
    own: dict[str, Tensor]  # empty once written to `own_file`
    replica: dict[str, Tensor] = field(default_factory=dict)
    own_file: Path | None = None

    def own_state(self, rank: int) -> dict[str, Tensor]:
        """This rank's own copy by VPS buffer name (`rank`: its number in the snapshot's world): in host memory until
        the snapshot is committed, then read back from its file."""
        flat = load_file(self.own_file) if self.own_file is not None else self.own
        return unpack(shard_index(self.catalog, self.spec, self.kinds, rank), flat)

    def replica_state(self, rank: int) -> dict[str, Tensor]:
        """The replica of the previous rank's shard by VPS buffer name: the ring layout's buffers on `rank` (none
        before send_replicas: a restore from the own copies alone)."""
        if not self.replica:
            return {}
        return unpack(shard_index(self.catalog, ring_spec(self.spec, self.world_size), self.kinds, rank), self.replica)


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


def take_snapshot(engine: TrainEngine) -> RoleSnapshot:
    """This rank's shard of `engine`'s state copied to new host buffers (local): a snapshot in progress never
    overwrites the one a recovery would fall back to. The binding (spec, catalog, layout index, checks) is the last
    snapshot's while the engine holds the same tensors: a relayout, a move or the first moments bind anew."""
    state, world = bind_train_state(engine), (dist.get_rank(), dist.get_world_size())
    tensors = (*state.values(), *map(local_tensor, state.values()))
    bound = _BOUND.get(engine)
    if bound is None or not bound.holds(tensors, world):
        kinds = state_kinds(state)
        spec, catalog = train_spec(state), role_catalog(engine)
        index = shard_index(catalog, spec, kinds, world[0])
        live = bind_train_buffers({k: t for k, t in state.items() if k[1] in {x.value for x in kinds}}, index.layout,
                                  world[0], expected=index.buffers)
        names = tuple(buffer_name(k) if buffer_name(k) in live else None for k in state)
        bound = _BOUND[engine] = Bound(tuple(map(weakref.ref, tensors)), world, names, spec, catalog, kinds, index)
    shards = {name: t for name, t in zip(bound.names, tensors[len(state):]) if name is not None}
    return RoleSnapshot(bound.spec, world[1], bound.kinds, optimizer_step(engine), bound.catalog,
                        pack(bound.index, shards))


def send_replicas(snaps: Mapping[str, RoleSnapshot], group: dist.ProcessGroup | None = None,
                  recorder: TraceRecorder | None = None) -> int:
    """Collective over `group` (the snapshot's world, in its order; every rank with its roles in the same order):
    every rank's own copies into new replica buffers on the next rank, one message per role and dtype; the bytes sent
    between ranks over the world (the same on every rank)."""
    rank, began, works, moved, sent = dist.get_rank(group), time.time(), [], 0, 0
    for i, snap in enumerate(snaps.values()):
        world = snap.world_size
        holder, source = holder_of(rank, world), replica_source(rank, world)
        snap.replica = empty(shard_index(snap.catalog, ring_spec(snap.spec, world), snap.kinds, rank))
        for j, (dtype, flat) in enumerate(snap.own.items()):  # the dtypes in the order the holder's replica has them
            if holder == rank:  # a world of one: its own replica
                snap.replica[dtype].copy_(flat)
            else:
                works.append(dist.isend(flat, peer_rank(group, holder), group, tag=16 * i + j))
                sent += flat.nbytes
        if source != rank:
            works += [dist.irecv(flat, peer_rank(group, source), group, tag=16 * i + j)
                      for j, flat in enumerate(snap.replica.values())]
        moved += sum(shard_index(snap.catalog, snap.spec, snap.kinds, r).nbytes for r in snap.spec.ranks
                     if holder_of(r, world) != r)
    for work in works:
        work.wait()
    if recorder is not None:
        recorder.add("elastic/snapshot", 0, began, time.time() - began, dict(
            bytes_sent=sent, bytes_received=sum(t.nbytes for s in snaps.values() for t in s.replica.values()),
            messages=len(works)))
    return moved


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


def spill_own(snaps: dict[str, RoleSnapshot], directory: Path, key: int) -> int:
    """Every role's own copy of the committed snapshot `key` written to `directory` (whole or absent: a temporary name,
    then renamed) and its host memory freed; the files of older snapshots removed. The bytes on disk."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for role, snap in snaps.items():
        path, partial = directory / f"{key}-{role}.safetensors", directory / f"{key}-{role}.partial"
        save_file(snap.own, partial)  # one flat tensor per dtype
        os.replace(partial, path)
        snap.own, snap.own_file = {}, path
        written.append(path)
    for old in directory.iterdir():
        if old not in written:
            old.unlink(missing_ok=True)
    return sum(p.stat().st_size for p in written)


def remove_own_files(directory: Path | None) -> None:
    """The end of the run: this process's snapshot files gone (the launcher removes a killed rank's: launch/scratch)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def snapshot_bytes(snaps: dict[str, RoleSnapshot]) -> tuple[int, int]:
    """(own, replica) bytes this rank holds in host memory for its snapshots (own: 0 once written to disk)."""
    own = sum(t.numel() * t.element_size() for s in snaps.values() for t in s.own.values())
    rep = sum(t.numel() * t.element_size() for s in snaps.values() for t in s.replica.values())
    return own, rep


def held_bytes(snaps: dict[str, RoleSnapshot]) -> int:
    """Host memory this rank holds for `snaps`: own copies not yet on disk and replicas."""
    return sum(snapshot_bytes(snaps))


def memory_metrics(snaps: dict[str, RoleSnapshot], disk: int, peak: int) -> dict[str, float]:
    """A committed snapshot's memory on this rank: elastic/snapshot/host_bytes (held from now on: the replica, the own
    copy being on disk), replica_bytes, disk_bytes, and peak_host_bytes (`peak`: held while it was sent)."""
    own, replica = snapshot_bytes(snaps)
    return {"elastic/snapshot/host_bytes": float(own + replica), "elastic/snapshot/replica_bytes": float(replica),
            "elastic/snapshot/disk_bytes": float(disk), "elastic/snapshot/peak_host_bytes": float(peak)}

