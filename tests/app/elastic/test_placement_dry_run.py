"""dry_run=true plans every placement change of a recipe at cluster scale, with predicted times."""
from __future__ import annotations

import json

import pytest

from tests.app.app_runs import run_app

CASES = {
    "grpo_70b split": (["recipe=grpo_70b", "placement=split"], ["train_to_rollout"]),
    "ppo_235b_moe lend": (["recipe=ppo_235b_moe", "placement=lend"], [
        "train_to_rollout", "reshard/actor/train_critic_to_generate", "reshard/critic/train_critic_to_generate",
        "reshard/actor/prepare_to_train_actor", "reshard/critic/prepare_to_train_actor"]),
    # re-balancing: the first moves the manager may make from 64+64, to the nearest valid split on each side
    "grpo_70b split rebalance": (["recipe=grpo_70b", "placement=split", "placement.rebalance=true",
                                  "task.prompts_per_step=48"], [
        "train_to_rollout", "reshard/actor/rebalance/64+64_to_32+96", "reshard/actor/rebalance/64+64_to_96+32"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dry_run_plans_placement_changes(case, tmp_path):
    args, names = CASES[case]
    proc = run_app(*args, "dry_run=true", f"hydra.run.dir={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "plan_summary.json").read_text())["transitions"]
    assert [r["transition"] for r in rows] == names
    for row in rows:
        assert row["bytes_moved"] == row["bytes_min"] > 0 and row["predicted_s"] > 0 and row["rounds"] >= 1
    sync = rows[0]
    if case.startswith("grpo_70b"):  # split: training on ranks 64..127 feeds rollout on 0..63
        assert sync["src"].endswith("@64") and sync["dst"].endswith("@0") and "vllm_dp=8" in sync["dst"]
    if case.endswith("rebalance"):  # the train set grows to ranks 32..127 (dp 12) or shrinks to 96..127 (dp 4)
        assert [(r["src"], r["dst"]) for r in rows[1:]] == [
            ("train[dp=8,tp=8,zero=3]@64", "train[dp=12,tp=8,zero=3]@32"),
            ("train[dp=8,tp=8,zero=3]@64", "train[dp=4,tp=8,zero=3]@96")]
    if case.endswith("lend"):  # the actor trains on ranks 0..63, the critic on 64..127, both come back onto all 128
        assert rows[2]["src"].endswith("@64") and "dp=32" in rows[2]["dst"]
    assert not list(tmp_path.rglob("rank*.log")), "a dry run must not spawn ranks"
