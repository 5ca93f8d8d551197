"""End to end: a rank leaves and one joins a live placement=lend run (PPO, 4 gloo ranks: every rank generates and
prepares, the actor trains on ranks 0-1 and the critic on ranks 2-3 at once), `elastic.events=[leave:3@2,join@4]`.

At a step boundary every role is at home on every rank, so a change is colocate's (each role's parameters and AdamW
moments move by VPS plan into the new world's home layout) and lend's two sets are re-planned over the new world: half
of 3 ranks is 1, so the actor trains on rank 0 and the critic on ranks 1-2 in steps 3-4 (dp 1 and 2), and the join
gives back the halves of 4. The run ends with exit code 0, leaves no process and no weight file behind, logs the world
size 4, 4, 3, 3, 4, moves both roles out and back in every step, and logs the same per-step losses, grad norms,
rewards and eval as the lend run whose world never changed (relative 1e-5). The bytes each change moved equal the dry
run's planned minimum of the same command.

With elastic.replicas=1 (snapshots at every step's end, where every role is at home), launched rank 2 kills itself
(`kill -9`, elastic/faults.kill_point `lend/move/step_6`) inside step 6's placement move, just before the actor's state
moves to its set: the survivors rebuild every role from their own shards and rank 3's replica of rank 2's, re-plan
lend's sets over 3 ranks, roll back to step 5 and finish; exit code 0, no process and no /dev/shm entry of the run
left, each step once in metrics.jsonl, and steps 6-7 equal the run's own step-5 checkpoint resumed on 3 ranks under
lend by `trainer.resume`.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import KILL_TEXT
from rlhf_dyna.launch.shm import SHM_DIR
from tests.app.app_runs import read_metrics
from tests.app.elastic.live_runs import resumed_reference, run_with_kill_point, with_and_without
from tests.app.elastic.test_live_split import planned
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, weight_files

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
    fixed, rows = with_and_without(tmp_path, ARGS, EVENTS)
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


@pytest.mark.timeout(900)
def test_a_rank_killed_in_lends_placement_move_is_survived_from_the_replicas(tmp_path: Path) -> None:
    steps, kill_in = 7, 6
    args = [a for a in ARGS if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={steps}"]
    run_dir = tmp_path / "killed"
    code, out, err, _ = run_with_kill_point(run_dir, *args, "elastic.replicas=1", "elastic.snapshot_every=1",
                                            f"trainer.save_every={kill_in - 1}", "trainer.keep_checkpoints=0",
                                            kill_at=f"lend/move/step_{kill_in}@2")
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir))
    ident = (run_dir / "logs" / "rank2.log").read_text().split(KILL_TEXT)[1].split(", run ")[1].split(",")[0]
    assert [p.name for p in SHM_DIR.iterdir() if ident in p.name] == [], "the run left /dev/shm entries"
    assert "rank 2 of 4 lost" in err, err[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))  # each step once: step 6 redone on 3 ranks
    assert [r["elastic/world_size"] for r in rows[1:]] == [4.0] * (kill_in - 1) + [3.0] * (steps - kill_in + 1)
    recovered = rows[kill_in]
    assert recovered["elastic/recovery/source"] == 1.0 and recovered["elastic/recovery/steps_lost"] == 1.0
    assert recovered["elastic/recovery/bytes_moved"] > 0
    assert all(r[move] > 0 for r in rows[1:] for move in MOVES), "a step did not lend both roles out and back"
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"rank 2 of 4 lost during step {kill_in}" in log and f"rolled back to step {kill_in - 1}" in log, log[-3000:]
    assert "placement=lend over 3 ranks: the actor trains on [0], the critic on [1..2]" in log

    resumed = resumed_reference(tmp_path, run_dir, args, 3, kill_in - 1)
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in resumed), "no learning signal: equality is vacuous"
    assert_same_metrics(resumed, rows[kill_in:])
