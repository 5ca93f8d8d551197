"""elastic.events on the command line: bad entries are refused before spawn in one paragraph naming the value, and
dry_run=true plans and predicts each change of world beside the recipe's transitions."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.app.app_runs import run_app


def run_cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return run_app(*args, f"hydra.run.dir={tmp_path}", "tracking.wandb_mode=disabled", timeout=300)


CASES = [
    (["elastic.events=[leave@3]", "dry_run=true"], "elastic.events entry 'leave@3' is not an event. Valid forms:"),
    (["elastic.events=[leave:2@3]", "dry_run=true"],
     "elastic.events entry 'leave:2@3' names rank 2, but at step 3 the world has 2 ranks (0..1)"),
    (["elastic.events=[leave:1@30]", "trainer.total_steps=20", "dry_run=true"],
     "changes the world after step 30, but the run has steps 1..20 (trainer.total_steps=20)"),
    (["placement=split", "parallel.world_size=4", "elastic.events=[leave:0-1@2]", "dry_run=true"],
     "ranks 0-1 leave (4 -> 2 ranks) empties the rollout's set [0..1] in generate (placement=split)"),
    (["recipe=grpo_70b", "elastic.events=[leave:120-127@5]", "dry_run=true"],
     "do not split into algorithm.mini_batches=1 x dp=15 equal shards. The global batch stays the same across a "
     "change; use e.g. task.prompts_per_step=240"),
    (["elastic.accept_joins=true", "parallel.world_size=4", "placement=split", "+placement.roles.actor=[0,2]",
      "+placement.roles.rollout=[2,2]"],
     "elastic.accept_joins=true: this run cannot admit joining processes live: the rollout set [2..3] reaches the end "
     "of the world, so joiners would generate"),
    (["elastic.events=[leave:3@2,join@3]", "parallel.world_size=4", "parallel.train.cp=2", "task.prompts_per_step=12"],
     "a live run cannot execute this yet: parallel.train.cp=2 (context parallel does not train live in any run yet"),
    (["elastic.join=/tmp/some_run"], "elastic.join=/tmp/some_run: no such directory"),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_events_are_refused_before_spawn(args, expected, tmp_path):
    proc = run_cli(*args, tmp_path=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("rank*.log"))


DRY_RUNS = {
    # 128 -> 120 GPUs (the last node leaves) and back, then the same through a middle node: dp 16 -> 15, tp stays 8
    "grpo_70b": (["recipe=grpo_70b", "task.prompts_per_step=240",
                  "elastic.events=[leave:120-127@5,join:8@8,leave:56-63@10,join:8@12]"],
                 {"elastic/leave/120-127@5": ("train[dp=16,tp=8,zero=3]@0", "train[dp=15,tp=8,zero=3]@0"),
                  "elastic/join/+8@8": ("train[dp=15,tp=8,zero=3]@0", "train[dp=16,tp=8,zero=3]@0"),
                  "elastic/leave/56-63@10": ("train[dp=16,tp=8,zero=3]@0", "train[dp=15,tp=8,zero=3]@0-55,64-127"),
                  "elastic/join/+8@12": ("train[dp=15,tp=8,zero=3]@0", "train[dp=16,tp=8,zero=3]@0")}),
    # one node of the MoE recipe: the actor, the critic and the reference move; ep 8 still divides dp*tp = 120
    "ppo_235b_moe": (["recipe=ppo_235b_moe", "task.prompts_per_step=240", "elastic.events=[leave:56-63@5,join:8@8]"],
                     {"elastic/leave/56-63@5": ("train[dp=32,tp=4,ep=8,zero=3]@0",
                                                "train[dp=30,tp=4,ep=8,zero=3]@0-55,64-127"),
                      "elastic/join/+8@8": ("train[dp=30,tp=4,ep=8,zero=3]@0", "train[dp=32,tp=4,ep=8,zero=3]@0")}),
}


@pytest.mark.parametrize("recipe", list(DRY_RUNS))
def test_dry_run_plans_a_shrink_and_a_regrow(recipe, tmp_path):
    args, expected = DRY_RUNS[recipe]
    proc = run_cli(*args, "dry_run=true", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "plan_summary.json").read_text())["transitions"]
    assert rows[0]["transition"] == "train_to_rollout"
    changes = {r["transition"]: r for r in rows if r["transition"].startswith("elastic/")}
    assert {name: (r["src"], r["dst"]) for name, r in changes.items()} == expected
    roles = {"actor"} if recipe == "grpo_70b" else {"actor", "critic", "reference"}
    for name, row in changes.items():
        assert name in proc.stdout.replace("│", " ")
        assert set(row["roles"]) == roles and row["world_size"] == 128
        assert row["bytes_moved"] == row["bytes_min"] == sum(r["bytes_min"] for r in row["roles"].values()) > 0
        assert 0 < row["bytes_moved"] < row["bytes_total"] and row["predicted_s"] > 0 and row["rounds"] >= 1
    if recipe == "grpo_70b":  # the 120 GPUs of a shrink hold the same state whichever node left
        last, middle = changes["elastic/leave/120-127@5"], changes["elastic/leave/56-63@10"]
        assert last["bytes_total"] == middle["bytes_total"]
