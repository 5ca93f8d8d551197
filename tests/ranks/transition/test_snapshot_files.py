"""The snapshots' own copies on node-local disk (transition/replica_state.spill_own; 2 gloo ranks): every role's own
shard (the actor's and the critic's parameters and AdamW moments, the reference's parameters), written once the
snapshot is committed, reads back bit for bit with no host memory left held for it; a rollback from the file, after
the live state moved past the snapshot, rebuilds an engine that trains on exactly as the live one did from there; the
older snapshot's files go at the next commit, and the directory at the end."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhf_dyna.elastic.replicas import Served
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import empty_engine_like, meta_skeleton
from rlhf_dyna.transition.replica_state import held_bytes, remove_own_files, restore_role, spill_own, take_snapshot
from rlhf_dyna.transition.role_move import optimizer_step
from tests.multirank import run_ranks
from tests.ranks.tiny_models import random_batch
from tests.ranks.transition.test_relayout import SPEC
from tests.ranks.transition.test_role_move import _read, _step, policy_loss, value_loss

FILES = ["5-actor.safetensors", "5-critic.safetensors", "5-reference.safetensors"]


def _spill_and_roll_back(rank: int, world: int, root: str) -> None:
    layout = ParallelLayout(world, 1)
    mesh = build_mesh(layout)
    b1, b2, b3 = (random_batch(seed=s, batch=4) for s in (1, 2, 3))
    engines = {"actor": TrainEngine(build_policy(SPEC, seed=3), mesh, lr=1e-2),
               "critic": TrainEngine(build_critic(SPEC, seed=4), mesh, lr=1e-2),
               "reference": TrainEngine(build_policy(SPEC, seed=5), mesh, trainable=False)}
    losses = {"actor": policy_loss, "critic": value_loss}
    for role, loss in losses.items():
        _step(engines[role], b1, loss)
    snaps = {role: take_snapshot(engine) for role, engine in engines.items()}
    assert {k.value for k in snaps["actor"].kinds} > {k.value for k in snaps["reference"].kinds}  # moments too
    copies = {role: {n: t.clone() for n, t in snap.own_state(rank).items()} for role, snap in snaps.items()}
    directory = Path(root) / f"rank{rank}"

    disk = spill_own(snaps, directory, key=5)
    assert held_bytes(snaps) == 0 and all(not snap.own for snap in snaps.values())  # no host memory for own copies
    assert sorted(p.name for p in directory.iterdir()) == FILES
    assert disk >= sum(t.nbytes for c in copies.values() for t in c.values()) > 0
    for role, snap in snaps.items():
        back = snap.own_state(rank)
        assert back.keys() == copies[role].keys()
        assert all(torch.equal(back[n], t) and back[n].dtype == t.dtype for n, t in copies[role].items()), role

    for role, loss in losses.items():  # the live state moves past the snapshot; a survivor rolls back from the file
        live = engines[role]
        _step(live, b2, loss)
        back = empty_engine_like(live, layout, mesh, meta_skeleton(live.model))
        restore_role(snaps[role], back, snaps[role].spec, Served((), world))
        assert optimizer_step(back) == 1.0
        _step(back, b2, loss)  # the moments came back too: the same second step as the live engine's
        torch.testing.assert_close(_read(back, b3), _read(live, b3), rtol=1e-6, atol=1e-7)
    reference = empty_engine_like(engines["reference"], layout, mesh, meta_skeleton(engines["reference"].model))
    restore_role(snaps["reference"], reference, snaps["reference"].spec, Served((), world))
    torch.testing.assert_close(_read(reference, b3), _read(engines["reference"], b3), rtol=0, atol=0)

    newer = {role: take_snapshot(engine) for role, engine in engines.items()}
    actor = engines["actor"]
    first, param = next(actor.model.named_parameters())
    param._local_tensor = param._local_tensor.clone().add_(1)  # a shard replaced, as an adoption does: copied as it is now
    again = take_snapshot(actor).own_state(rank)
    assert torch.equal(again[f"{first}:param"], param._local_tensor)
    assert all(torch.equal(t, newer["actor"].own_state(rank)[n]) for n, t in again.items() if n != f"{first}:param")
    spill_own(newer, directory, key=6)
    assert sorted(p.name for p in directory.iterdir()) == [f.replace("5-", "6-") for f in FILES]  # the older gone
    remove_own_files(directory)
    assert not directory.exists()


@pytest.mark.timeout(180)
def test_own_copies_round_trip_through_node_local_files_and_are_removed(tmp_path: Path) -> None:
    run_ranks(_spill_and_roll_back, 2, str(tmp_path))
    assert list(tmp_path.iterdir()) == []
