"""The snapshots' own copies in mapped slot files on node-local disk, and the replica that comes from them
(transition/snapshot_files.py, replica_state.take_snapshot and send_replicas; real gloo ranks).

- Every role's own shard (the actor's and the critic's parameters and AdamW moments, the reference's parameters) is
  written into its slot's files bit for bit, with no host memory held for it; writing the other slot leaves the first
  as it was; the same files and mappings serve every later snapshot; a rollback from the files, after the live state
  moved past the snapshot, rebuilds an engine that trains on exactly as the live one did; files of other sizes go at
  keep_only, the directory at the end.
- A replica holder gets its predecessor's shard exactly, whether it copies it from the predecessor's files (the same
  node) or receives it over gloo (a holder on another filesystem), and the two ways agree to the bit; a frozen role
  (the reference) still bound to the same tensors keeps its committed snapshot, own copy and replica, while a
  trained one is copied and sent again."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.elastic.replicas import Served, replica_source
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import empty_engine_like, meta_skeleton
from rlhf_dyna.transition.replica_state import held_bytes, restore_role, send_replicas, take_snapshot
from rlhf_dyna.transition.role_move import optimizer_step
from rlhf_dyna.transition.snapshot_files import PeerDir, SnapshotFiles
from tests.multirank import run_ranks
from tests.ranks.tiny_models import random_batch
from tests.ranks.transition.test_relayout import SPEC
from tests.ranks.transition.test_role_move import _read, _step, policy_loss, value_loss

LOSSES = {"actor": policy_loss, "critic": value_loss}


def _engines(world: int, batch: int = 4) -> tuple[ParallelLayout, object, dict[str, TrainEngine]]:
    layout = ParallelLayout(world, 1)
    mesh = build_mesh(layout)
    engines = {"actor": TrainEngine(build_policy(SPEC, seed=3), mesh, lr=1e-2),
               "critic": TrainEngine(build_critic(SPEC, seed=4), mesh, lr=1e-2),
               "reference": TrainEngine(build_policy(SPEC, seed=5), mesh, trainable=False)}
    for role, loss in LOSSES.items():
        _step(engines[role], random_batch(seed=1, batch=batch), loss)
    return layout, mesh, engines


def _slots_and_roll_back(rank: int, world: int, root: str) -> None:
    layout, mesh, engines = _engines(world)
    b2, b3 = random_batch(seed=2, batch=4), random_batch(seed=3, batch=4)
    files = SnapshotFiles(Path(root) / f"rank{rank}")
    snaps = {role: take_snapshot(engine, files, role, 0) for role, engine in engines.items()}
    assert {k.value for k in snaps["actor"].kinds} > {k.value for k in snaps["reference"].kinds}  # moments too
    in_memory = {role: take_snapshot(engine).own_state(rank) for role, engine in engines.items()}
    assert held_bytes(snaps) == 0  # the own copies are the files' pages, not host memory of the rank
    names = sorted(p.name for p in files.directory.iterdir())
    assert names == sorted(f"{role}.0.float32.{t.numel()}" for role, s in snaps.items() for t in s.own.values())
    for role, snap in snaps.items():
        assert all(torch.equal(snap.own_state(rank)[n], t) for n, t in in_memory[role].items()), role

    for role, loss in LOSSES.items():  # the live state moves past the snapshot; the other slot takes the next one
        _step(engines[role], b2, loss)
    newer = {role: take_snapshot(engine, files, role, 1) for role, engine in engines.items()}
    assert not torch.equal(newer["actor"].own["float32"], snaps["actor"].own["float32"])
    for role, snap in snaps.items():  # slot 0 as it was
        assert all(torch.equal(snap.own_state(rank)[n], t) for n, t in in_memory[role].items()), role
    again = take_snapshot(engines["actor"], files, "actor", 0)  # slot 0 again: the same file, the same mapping
    assert again.own["float32"].data_ptr() == snaps["actor"].own["float32"].data_ptr()
    assert torch.equal(again.own["float32"], newer["actor"].own["float32"])

    snaps = {role: take_snapshot(engine, files, role, 0) for role, engine in engines.items()}  # rolls back to this
    for role, loss in LOSSES.items():
        live = engines[role]
        _step(live, b2, loss)
        back = empty_engine_like(live, layout, mesh, meta_skeleton(live.model))
        restore_role(snaps[role], back, snaps[role].spec, Served((), world))
        assert optimizer_step(back) == 2.0
        _step(back, b2, loss)  # the moments came back too: the same step as the live engine's
        torch.testing.assert_close(_read(back, b3), _read(live, b3), rtol=1e-6, atol=1e-7)

    files.keep_only({"actor": {"float32": 7}}, {})  # a snapshot of other sizes committed: these files go
    assert sorted(p.name for p in files.directory.iterdir()) == []
    files.remove()
    assert not files.directory.exists()


@pytest.mark.timeout(180)
def test_own_copies_live_in_two_mapped_slot_files_and_roll_back(tmp_path: Path) -> None:
    run_ranks(_slots_and_roll_back, 2, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _replica_both_ways(rank: int, world: int, root: str) -> dict[str, dict[str, torch.Tensor]]:
    _, _, engines = _engines(world, batch=6)
    files = SnapshotFiles(Path(root) / f"rank{rank}")
    here = PeerDir.of(files.directory)
    peers: list = [None] * world
    dist.all_gather_object(peers, here)
    assert all(p.same_files(here) for p in peers)
    apart = [PeerDir(p.directory, f"node{r}") for r, p in enumerate(peers)]  # each rank its own filesystem
    side = dist.new_group(backend="gloo")
    got = {}
    for way, seen in (("files", peers), ("network", apart)):
        snaps = {role: take_snapshot(engine, files, role, 0) for role, engine in engines.items()}
        send_replicas(snaps, side, seen, files, key=7)
        dist.barrier(group=side)  # the commit's: no rank writes its slot again before its holder has read it
        got[way] = {role: {n: t.clone() for n, t in s.replica_state(rank).items()} for role, s in snaps.items()}
    own = {role: snap.own_state(rank) for role, snap in snaps.items()}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, own)
    theirs = everyone[replica_source(rank, world)]
    for role in engines:
        assert got["files"][role].keys() == got["network"][role].keys() == theirs[role].keys()
        for name, t in theirs[role].items():
            assert torch.equal(got["files"][role][name], t) and torch.equal(got["network"][role][name], t)

    _step(engines["actor"], random_batch(seed=2, batch=6), policy_loss)  # the actor moves on; the frozen ones do not
    for way, seen in (("files", peers), ("network", apart)):  # the next snapshot keeps the frozen reference's
        nxt = {role: take_snapshot(engine, files, role, 1, keep=snaps[role]) for role, engine in engines.items()}
        assert nxt["reference"].kept and nxt["reference"].own is snaps["reference"].own
        assert not nxt["actor"].kept and nxt["actor"].slot == 1  # trained: copied into the other slot
        send_replicas(nxt, side, seen, files, key=8, committed=snaps)
        dist.barrier(group=side)
        assert nxt["reference"].replica is snaps["reference"].replica  # kept by the holder too, nothing moved
        assert not any(torch.equal(a, b) for a, b in zip(nxt["actor"].replica.values(), snaps["actor"].replica.values()))
        mine: list = [None] * world
        dist.all_gather_object(mine, nxt["actor"].own_state(rank))
        assert all(torch.equal(nxt["actor"].replica_state(rank)[n], t) for n, t in mine[replica_source(rank, world)].items())
    files.remove()
    return {"files": {r: sum(t.numel() for t in v.values()) for r, v in got["files"].items()}}


@pytest.mark.timeout(180)
def test_a_replica_is_the_predecessors_shard_from_its_files_or_over_gloo(tmp_path: Path) -> None:
    sizes = run_ranks(_replica_both_ways, 3, str(tmp_path))
    assert all(s["files"]["actor"] > 0 and s["files"]["reference"] > 0 for s in sizes)
