"""Placement overrides on the command line: bad ones are refused before spawn, naming the wrong number."""
from __future__ import annotations


import pytest

from tests.app.app_runs import run_app

CASES = [
    (["placement=split", "parallel.world_size=4", "parallel.train.pp=2"], "but not with: parallel.train.pp=2 (use 1)"),
    (["placement=split", "parallel.world_size=4", "rollout.tp=2"],
     "rollout.tp=2 (each rollout rank runs one tp=1 engine; use 1)"),
    (["recipe=ppo_tiny", "placement=lend", "parallel.schedule=[{step: 2, dp: 1, tp: 2}]"],
     "does not change the training layout as well"),
    (["recipe=ppo_tiny", "placement=lend", "parallel.world_size=4", "parallel.train.pp=2"],
     "placement=lend with parallel.train.pp=2"),
    (["placement=lend", "dry_run=true"], "nothing to lend"),
    (["placement=split", "placement.rollout_ranks=2", "dry_run=true"], "placement set of actor has 0 ranks"),
    (["placement=split", "+placement.roles.rollout=[1,2]", "dry_run=true"], "ranks 1..2 (first=1, size=2)"),
    (["placement=split", "parallel.world_size=4", "placement.rollout_ranks=3", "rollout.tp=2", "dry_run=true"],
     "rollout.tp=2 does not divide the 3 ranks of the rollout set"),
    (["recipe=ppo_tiny", "placement=lend", "+placement.roles.actor=[0,2]", "+placement.roles.critic=[1,1]",
      "dry_run=true"], "share ranks [1]"),
    (["placement.rebalance=true", "dry_run=true"], "placement.rebalance=true with placement=colocate"),
    (["placement=split", "placement.rebalance=true", "parallel.world_size=4", "task.prompts_per_step=8", "rollout.n=4",
      "algorithm.mini_batches=2", "dry_run=true"],
     "tried and invalid: 1+3: 32 rows do not split into algorithm.mini_batches=2 x dp=3; 3+1: "
     "task.prompts_per_step=8 does not divide over 3 rollout replicas"),
    (["placement=split", "placement.rebalance=true", "+placement.roles.rollout=[0,2]", "dry_run=true"],
     "re-balancing chooses the sets itself"),
    (["placement=split", "parallel.world_size=4", "placement.rollout_ranks=1", "task.prompts_per_step=8", "rollout.n=4",
      "algorithm.mini_batches=2"],
     "cannot run a step: 32 rows do not split into algorithm.mini_batches=2 x dp=3. Splits that can: 2+2"),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_placement_is_refused_before_spawn(args, expected, tmp_path):
    proc = run_app(*args, f"hydra.run.dir={tmp_path}", "tracking.wandb_mode=disabled", timeout=120)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert expected in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("rank*.log")), "refused before any rank spawned"
