"""End to end: ranks leave and join a live placement=split run (4 gloo ranks: vLLM engines on ranks 0-1, FSDP2
training of the actor and its reference on ranks 2-3), `elastic.events=[leave:R@2,join@3]`.

A leave shrinks the set the rank left and joiners extend the training set (docs/elastic/placements.md, "Under split"):
- a training rank leaves (`leave:3@2`): its share of the actor's parameters and AdamW moments and of the reference
  moves to the training set's survivor (dp 2 -> 1), the rollout engines stay; the joiner enters the training set again
  (dp 1 -> 2) and starts no vLLM engine of its own;
- a rollout rank leaves (`leave:1@2`, PPO at split's default max_staleness=1): its engine goes with it (one replica
  fewer), the training state stays where it is (the plan moves no byte); the joiner makes the training set 3 ranks
  (dp 3) and receives its shares of the actor, the critic and the reference, and the samples generated ahead (step 4's,
  generated during step 3), the rollout set keeps one engine.
Each run ends with exit code 0, leaves no process and no weight file behind, logs the world size 4, 4, 3, 4 and logs
the same per-step losses, grad norms, rewards and eval as a run whose world never changed (relative 1e-5): at
max_staleness=0 the session's colocate run (split logs colocate's: test_split.py), at 1 the split run without events.
The bytes each change moved equal the dry run's planned minimum of the same command.

With elastic.replicas=1 (max_staleness=0; the ring over the world, so rollout rank 0 holds the replica of training rank
3's shards) a rank killed (`kill -9`, elastic/faults.kill_point) in step 3 is survived: training rank 3 just before the
weight sync, where the rollout ranks wait for it (its shares of the actor and the reference rebuilt on the training
set's survivor, rank 2, from rank 0's replica: a rollout rank serves it), or rollout rank 1 just before the
generation (nothing rebuilt but the set: rank 0's engine generates alone). Exit code 0, no process and no weight
file left, each step once, and steps 3-4 equal the run's step-2 checkpoint resumed by `trainer.resume` on 3 ranks
split as the survivors are (rollout 2 + training 1, or 1 + 2).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.app.app_runs import read_metrics, run_cli
from tests.app.elastic.live_runs import resumed_reference, run_with_kill_point
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, SYNC, assert_same_metrics, kill_marked, run, weight_files

STEPS = 4
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}",
                                                                        "placement=split", "placement.max_staleness=0"]


@pytest.fixture
def fixed(grpo4_colocate) -> list[dict]:
    """The run whose world stays 4 ranks: the session's colocate run (split logs what colocate logs), steps 0-4."""
    return grpo4_colocate[:STEPS + 1]


def planned(tmp_path: Path, args: list[str], events: str) -> dict[str, dict]:
    """The dry run's row of each change of the same command, by its name."""
    dry = run_cli(*args, events, "dry_run=true", tmp_path=tmp_path / "dry")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    rows = json.loads((tmp_path / "dry" / "run" / "plan_summary.json").read_text())["transitions"]
    return {r["transition"]: r for r in rows if r["transition"].startswith("elastic/")}


def left_and_joined(run_dir: Path, args: list[str], events: str) -> list[dict]:
    """The split run with `events` (a leave after step 2, a join after step 3), checked by `left_and_joined_checks`."""
    before = weight_files()
    try:
        rows = run(run_dir, *args, events)
    finally:
        kill_marked(run_dir)
    assert weight_files() - before == set(), "the run left weight files in /dev/shm"
    left_and_joined_checks(run_dir, rows, [4.0, 4.0, 3.0, 4.0], leave_step=3, join_step=4)
    return rows


def left_and_joined_checks(run_dir: Path, rows: list[dict], worlds: list[float], leave_step: int,
                           join_step: int) -> None:
    """What every split run with one leave and one join shows: the world sizes, the change's metrics on their steps
    (the first of each new world) only, every step synced, no process left."""
    assert not marked_processes(str(run_dir)), "engine or rank processes outlived the run"
    assert [r.get("elastic/world_size") for r in rows[1:]] == worlds
    assert rows[leave_step]["elastic/leave/seconds"] > 0 and rows[join_step]["elastic/join/seconds"] > 0
    assert not any(k.startswith("elastic/leave/") for r in rows if r["step"] != leave_step for k in r)
    assert not any(k.startswith("elastic/join/") for r in rows if r["step"] != join_step for k in r)
    assert all(r[f"{SYNC}/bytes_moved"] > 0 for r in rows[1:]), "a step did not sync the rollout set"
    assert f"joiner0 joins after step {join_step - 1} as rank 3 of 4" in (run_dir / "logs" / "rank4.log").read_text()


@pytest.mark.timeout(900)
def test_a_training_rank_leaves_and_a_joiner_trains_in_its_place(fixed, tmp_path: Path) -> None:
    events = "elastic.events=[leave:3@2,join@3]"
    rows = left_and_joined(tmp_path / "train", ARGS, events)
    assert_same_metrics(fixed, rows)
    plans = planned(tmp_path, ARGS, events)
    leave, join = plans["elastic/leave/3@2"], plans["elastic/join/+1@3"]
    assert set(leave["roles"]) == set(join["roles"]) == {"actor", "reference"}
    assert rows[3]["elastic/leave/bytes_moved"] == leave["bytes_min"] == leave["bytes_moved"] > 0
    assert rows[4]["elastic/join/bytes_moved"] == join["bytes_min"] == join["bytes_moved"] > 0
    log = (tmp_path / "train" / "logs" / "rank0.log").read_text()
    assert "training layout dp1xtp1-zero3" in log and "training layout dp2xtp1-zero3" in log
    joiner = (tmp_path / "train" / "logs" / "rank4.log").read_text()
    assert "starting vLLM" not in joiner, "a joiner of the training set started an engine"


@pytest.mark.timeout(900)
def test_a_rollout_rank_leaves_with_its_engine_and_the_joiner_trains(tmp_path: Path) -> None:
    # PPO at split's default max_staleness=1; micro-batches of 4 rows, as test_live_join.py's PPO run
    ppo = ["recipe=ppo_tiny" if a == "recipe=grpo_tiny" else "placement.max_staleness=1" if a.startswith(
        "placement.max_staleness=") else a.replace("micro_batch_size=16", "micro_batch_size=4") for a in ARGS]
    try:
        fixed = run(tmp_path / "fixed", *ppo)
    finally:
        kill_marked(tmp_path / "fixed")
    events = "elastic.events=[leave:1@2,join@3]"
    rows = left_and_joined(tmp_path / "rollout", ppo, events)
    assert [r["placement/staleness"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert {"critic/vf_loss", "critic/grad_norm"} <= rows[4].keys() and rows[4]["elastic/join/rounds"] >= 3
    assert_same_metrics(fixed, rows)
    plans = planned(tmp_path, ppo, events)
    leave, join = plans["elastic/leave/1@2"], plans["elastic/join/+1@3"]
    assert rows[3]["elastic/leave/bytes_moved"] == leave["bytes_min"] == leave["bytes_moved"] == 0  # state stays
    assert rows[4]["elastic/join/bytes_moved"] == join["bytes_min"] == join["bytes_moved"] > 0
    assert "training layout dp3xtp1-zero3" in (tmp_path / "rollout" / "logs" / "rank0.log").read_text()
    assert "rank 1 left the job after sending its state" in (tmp_path / "rollout" / "logs" / "rank1.log").read_text()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lost,point,rollout_after", [(3, "weight_sync", 2), (1, "generate", 1)],
                         ids=["training_rank", "rollout_rank"])
def test_a_rank_lost_under_split_is_survived_from_the_replicas(tmp_path: Path, lost: int, point: str,
                                                                rollout_after: int) -> None:
    kill_in, run_dir, before = 3, tmp_path / "killed", weight_files()
    code, out, err, _ = run_with_kill_point(run_dir, *ARGS, "elastic.replicas=1", "elastic.snapshot_every=1",
                                            f"trainer.save_every={kill_in - 1}", "trainer.keep_checkpoints=0",
                                            kill_at=f"{point}/step_{kill_in}@{lost}", limit=400)
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir)), "engine or rank processes outlived the run"
    assert weight_files() - before == set(), "the run left weight files in /dev/shm"
    assert f"rank {lost} of 4 lost" in err
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # each step once: step 3 redone on 3 ranks
    assert [r["elastic/world_size"] for r in rows[1:]] == [4.0] * (kill_in - 1) + [3.0] * (STEPS - kill_in + 1)
    recovered = rows[kill_in]
    assert recovered["elastic/recovery/source"] == 1.0 and recovered["elastic/recovery/steps_lost"] == 1.0
    assert (recovered["elastic/recovery/bytes_moved"] > 0) == (lost == 3)  # a rollout rank's loss moves nothing
    assert all(r[f"{SYNC}/bytes_moved"] > 0 for r in rows[1:]), "a step did not sync the rollout set"
    log = (run_dir / "logs" / "rank0.log").read_text()
    rebuilt = "rebuilt its state from the replicas on rank 0 " if lost == 3 else "it held no training state"
    assert f"rolled back to step {kill_in - 1}" in log and rebuilt in log, log[-3000:]

    resumed = resumed_reference(tmp_path, run_dir, ARGS, 3, kill_in - 1, f"placement.rollout_ranks={rollout_after}")
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in resumed), "no learning signal: equality is vacuous"
    assert_same_metrics(resumed, rows[kill_in:])
