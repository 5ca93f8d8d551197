"""End to end: a rank leaves and one joins a live placement=lend run (PPO, 4 gloo ranks: every rank generates and
prepares, the actor trains on ranks 0-1 and the critic on ranks 2-3 at once), `elastic.events=[leave:3@2,join@4]`.

At a step boundary every role is at home on every rank, so a change is colocate's (each role's parameters and AdamW
moments move by VPS plan into the new world's home layout) and lend's two sets are re-planned over the new world: half
of 3 ranks is 1, so the actor trains on rank 0 and the critic on ranks 1-2 in steps 3-4 (dp 1 and 2), and the join
gives back the halves of 4. The run ends with exit code 0, leaves no process and no weight file behind, logs the world
size 4, 4, 3, 3, 4, moves both roles out and back in every step, and logs the same per-step losses, grad norms,
rewards and eval as the lend run whose world never changed (relative 1e-5). The bytes each change moved equal the dry
run's planned minimum of the same command.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.elastic.test_live_split import planned
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run, weight_files

STEPS = 5
# micro-batches of 4 rows (as test_live_join's PPO run): the actor's 24 rows a mini-batch at dp 1 are 6 of them
ARGS = ["recipe=ppo_tiny" if a == "recipe=grpo_tiny" else a.replace("micro_batch_size=16", "micro_batch_size=4")
        for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}",
                                                                       "placement=lend"]
EVENTS = "elastic.events=[leave:3@2,join@4]"
MOVES = [f"reshard/{role}/{change}/bytes_moved" for role in ("actor", "critic")
         for change in ("prepare_to_train_actor", "train_critic_to_generate")]


@pytest.mark.timeout(900)
def test_lend_replans_its_sets_at_a_leave_and_a_join_and_nothing_changes_but_the_world(tmp_path: Path) -> None:
    before = weight_files()
    try:
        fixed = run(tmp_path / "fixed", *ARGS)
        rows = run(tmp_path / "changed", *ARGS, EVENTS)
    finally:
        kill_marked(tmp_path / "fixed")
        kill_marked(tmp_path / "changed")
    assert not marked_processes(str(tmp_path)), "engine or rank processes outlived the runs"
    assert weight_files() - before == set(), "the runs left weight files in /dev/shm"
    assert [r.get("elastic/world_size") for r in rows[1:]] == [4.0, 4.0, 3.0, 3.0, 4.0]
    assert all(r[move] > 0 for r in rows[1:] for move in MOVES), "a step did not lend both roles out and back"
    assert any(abs(r["critic/vf_loss"]) > 1e-3 for r in fixed[3:]), "no learning signal: equality is vacuous"
    assert_same_metrics(fixed, rows)
    log = (tmp_path / "changed" / "logs" / "rank0.log").read_text()
    assert "placement=lend over 3 ranks: the actor trains on [0], the critic on [1..2]" in log, log[-3000:]
    assert "placement=lend over 4 ranks: the actor trains on [0..1], the critic on [2..3]" in log
    plans = planned(tmp_path, ARGS, EVENTS)
    leave, join = plans["elastic/leave/3@2"], plans["elastic/join/+1@4"]
    assert set(leave["roles"]) == set(join["roles"]) == {"actor", "critic", "reference"}
    assert rows[3]["elastic/leave/bytes_moved"] == leave["bytes_min"] == leave["bytes_moved"] > 0
    assert rows[5]["elastic/join/bytes_moved"] == join["bytes_min"] == join["bytes_moved"] > 0
