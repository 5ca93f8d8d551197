"""Host-memory snapshots of a training role's state and its replica on the next rank, and the rebuild of the role on
the survivors of lost ranks from them (the pure plans: elastic/replicas.py; docs/elastic/recovery.md).

    snap = take_snapshot(engine, step)            # local: this rank's shard copied to host memory (own)
    stats = send_replica(snap, group)             # collective over `group`: the ring plan, own -> next rank's replica
    ...  ranks are lost; the survivors enter a new world and build empty engines on its mesh ...
    moved = restore_role(snap, engine, dst_spec, served)   # collective over the new world: the served plan

    spill_own(snaps, directory, key)              # committed: own copies to node-local disk, their memory freed

The own copy is what the snapshot sends (so a background send never reads tensors that training is changing) and what
a survivor restores from: rolling back to the snapshot needs it where the live state moved past it (an optimizer
step after the snapshot). Once the snapshot is committed (every rank has its replica), only this rank reads it, and
only to roll back: it goes to a safetensors file on node-local disk (launch/scratch.py names the directory) and is
read back from there. Each rank then holds one shard per role in host memory, its predecessor's replica; while a
snapshot is sent, three (its own copy and replica, and the previous snapshot's replica, which a loss then falls back
to).
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..elastic.replicas import REPLICA, Served, ring_spec, served_rank_plan
from ..train.engine import TrainEngine, refresh_fsdp_shards
from ..vps.layout import build_layout
from ..vps.model import ModelCatalog
from ..vps.plan import build_plan
from ..vps.schedule import build_schedule
from ..vps.spec import ParallelSpec, placed_on
from ..vps.tensor import Kind
from .bind_train import bind_train_buffers, state_kinds, train_spec
from .executor import execute, prepare
from .relayout import bind_train_state
from .trace import TraceRecorder
from .role_move import optimizer_step, prepare_optimizer, role_catalog
from .views import TORCH_DTYPES
from .vps_plans import DEFAULT_BUDGET_BYTES, planned, ranks_per_node


@dataclass
class RoleSnapshot:
    """One role's state at a step boundary on this rank: its own shard and (after send_replica) the replica of the
    previous rank's shard, both host copies keyed by VPS buffer name."""

    spec: ParallelSpec  # the role's training spec in the world of the snapshot
    world_size: int
    kinds: tuple[Kind, ...]
    adam_step: float  # AdamW's step counter (-1: no moments yet)
    catalog: ModelCatalog
    own: dict[str, Tensor]  # empty once written to `own_file`
    replica: dict[str, Tensor] = field(default_factory=dict)
    own_file: Path | None = None

    def own_state(self) -> dict[str, Tensor]:
        """This rank's own copy: in host memory until the snapshot is committed, then read back from its file."""
        return load_file(self.own_file) if self.own_file is not None else self.own


def take_snapshot(engine: TrainEngine) -> RoleSnapshot:
    """This rank's shard of `engine`'s state copied to new host buffers (local): a snapshot in progress never
    overwrites the one a recovery would fall back to."""
    state = bind_train_state(engine)
    kinds = state_kinds(state)
    spec, catalog, rank = train_spec(state), role_catalog(engine), dist.get_rank()
    live = bind_train_buffers({k: t for k, t in state.items() if k[1] in {x.value for x in kinds}},
                              build_layout(catalog, spec, kinds), rank)
    with torch.no_grad():
        own = {n: t.detach().to("cpu", copy=True) for n, t in live.items()}
    return RoleSnapshot(spec, dist.get_world_size(), kinds, optimizer_step(engine), catalog, own)


def send_replica(snap: RoleSnapshot, group: dist.ProcessGroup | None = None,
                 budget_bytes: int = DEFAULT_BUDGET_BYTES, recorder: TraceRecorder | None = None) -> int:
    """Collective over `group` (the world's ranks, in the world's order): every rank's own copy into the next rank's
    replica buffers by the ring plan; the bytes the plan moves between ranks (the same on every rank)."""
    rank = dist.get_rank(group)
    t = planned(snap.catalog, snap.spec, snap.catalog, ring_spec(snap.spec, snap.world_size), snap.kinds,
                budget_bytes, rank)
    snap.replica = {n: torch.empty(b.shape, dtype=TORCH_DTYPES[b.dtype]) for n, b in t.dst_buffers.items()}
    execute(t.rank_plan, snap.own, snap.replica, group=group, trace=recorder, trace_name="elastic/snapshot")
    return t.bytes_between_ranks


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
    src = {**snap.own_state(), **{REPLICA + n: t for n, t in snap.replica.items()}}
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
        save_file({n: t.contiguous() for n, t in snap.own.items()}, partial)
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

