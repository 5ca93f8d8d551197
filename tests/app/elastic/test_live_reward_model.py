"""End to end: a learned reward model (task.reward naming rm) in a live leave and join (placement=colocate, 4 -> 3 -> 4
gloo ranks, `elastic.events=[leave:3@1,join@2]`), PPO with its critic started from the reward model (InstructGPT).

The reward model's parameters are a role's state like the others': at the leave they move by VPS plan to the
survivors, at the join they spread to the joiner (which builds the reward model's skeleton from its config and
holds no engine before), and the samples go on being scored in the new world. The run ends with exit code 0, leaves no
process behind, and logs the same rewards (the rm scores among them), losses, grad norms, lengths and eval
(relative 1e-5) as the run whose world never changed; the leave's bytes equal the dry run's planned minimum, which
counts the reward model's move.

With elastic.replicas=1 the same run survives a `kill -9` of rank 2 just before step 3's generation (the others
generate, then score): the frozen reward model keeps no replica, and the survivors load it again from reward_model.path on their
3-rank world, as the run built it at the start, while the actor, critic and reference come from the replicas. Exit code
0, nothing left, each step once, and steps 3-4 equal the run's step-2 checkpoint resumed on 3 ranks by
`trainer.resume` (relative 1e-5).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint, make_tiny_reward_model
from tests.app.app_runs import read_metrics, run_cli
from tests.app.elastic.live_runs import resumed_reference, run_with_kill_point, with_and_without
from tests.app.marked_processes import marked_processes
from tests.app.runs.test_file_task import chat_rows, write_jsonl
from tests.app.runs.test_reward_model_loop import file_task
from tests.app.runtimes.placed_runs import NO_CLIP, assert_same_metrics

EVENTS = "elastic.events=[leave:3@1,join@2]"
# 12 prompts and 12 eval rows split over 3 and 4 rollout replicas, 24 rows over 2 mini-batches x dp 3 and 4
PPO4 = ["algorithm=ppo", "algorithm.critic_init=reward_model", "parallel.world_size=4", "task.prompts_per_step=12",
        "rollout.n=2", "algorithm.mini_batches=2", "algorithm.micro_batch_size=16", "task.eval_size=12",
        "task.eval_every=2", "trainer.total_steps=4", *NO_CLIP]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rm_live")
    return {"policy": make_tiny_checkpoint(root / "policy"), "rm": make_tiny_reward_model(root / "rm", initializer_range=0.2),
            "train": write_jsonl(root / "train.jsonl", chat_rows(24, 0)),
            "eval": write_jsonl(root / "eval.jsonl", chat_rows(12, 100))}


@pytest.mark.timeout(900)
def test_the_reward_model_moves_at_a_leave_and_a_join_and_scores_the_same(models, tmp_path: Path) -> None:
    args = [a for a in file_task(models, *PPO4) if a != "task.eval_size=4"]
    fixed, changed = with_and_without(tmp_path, args, EVENTS)
    assert not marked_processes(str(tmp_path / "changed"))
    assert [r.get("elastic/world_size") for r in changed[1:]] == [4.0, 3.0, 4.0, 4.0]
    assert len({round(r["reward/rm/mean"], 6) for r in fixed[1:]}) > 1 and all(r["reward/rm/mean"] for r in fixed[1:])
    assert_same_metrics(fixed, changed)
    leave, join = changed[2], changed[3]
    assert join["elastic/join/bytes_moved"] > 0 and join["elastic/join/ready_wait_seconds"] < 5

    dry = run_cli(*args, EVENTS, "dry_run=true", tmp_path=tmp_path / "dry")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    rows = {r["transition"]: r for r in json.loads((tmp_path / "dry" / "run" / "plan_summary.json").read_text())["transitions"]}
    planned = rows["elastic/leave/3@1"]
    assert set(planned["roles"]) == {"actor", "critic", "reference", "reward_model"}
    assert leave["elastic/leave/bytes_moved"] == planned["bytes_min"] == planned["bytes_moved"]


@pytest.mark.timeout(600)
def test_a_rank_lost_in_a_run_with_a_reward_model_is_survived_and_the_reward_model_loaded_again(models, tmp_path):
    kill_in = 3
    args = [a for a in file_task(models, *PPO4) if a != "task.eval_size=4"]
    run_dir = tmp_path / "killed"
    code, out, err, _ = run_with_kill_point(run_dir, *args, "elastic.replicas=1", "elastic.snapshot_every=1",
                                            f"trainer.save_every={kill_in - 1}", "trainer.keep_checkpoints=0",
                                            kill_at=f"generate/step_{kill_in}@2", limit=400)
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir)) and "rank 2 of 4 lost" in err
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # each step once: step 3 redone on 3 ranks
    assert [r["elastic/world_size"] for r in rows[1:]] == [4.0, 4.0, 3.0, 3.0]
    recovered = rows[kill_in]
    assert recovered["elastic/recovery/source"] == 1.0 and recovered["elastic/recovery/bytes_moved"] > 0
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"rolled back to step {kill_in - 1}" in log and f"the reward model loaded again from {models['rm']}" in log

    resumed = resumed_reference(tmp_path, run_dir, args, 3, kill_in - 1)
    assert all(r["reward/rm/mean"] for r in resumed) and any(abs(r["critic/vf_loss"]) > 1e-3 for r in resumed)
    assert_same_metrics(resumed, rows[kill_in:])
