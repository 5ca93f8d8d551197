"""scripts/rm_pipeline.py, shortened: the classic pipeline learns what it is taught. Pairs made in code prefer the
completion with more sevens; the reward model trained on them reaches >= 90 % held-out pair accuracy; PPO rewarded by
it (critic from it) raises both reward/rm/mean and the sevens per completion, measured by the rule, not the model."""
from __future__ import annotations

import pytest

from rm_pipeline import run_pipeline


@pytest.mark.bench
@pytest.mark.timeout(1500)
def test_pipeline_raises_the_preference_the_pairs_encode(tmp_path):
    result = run_pipeline(tmp_path, rm_steps=40, ppo_steps=15)
    s = result["summary"]
    assert s["rm_heldout_accuracy_start"] < 0.75 <= 0.9 <= s["rm_heldout_accuracy_end"], s
    assert s["ppo_rm_mean_last5"] > s["ppo_rm_mean_first5"] + 0.5, s
    assert s["ppo_sevens_per_completion_last5"] > 1.5 * s["ppo_sevens_per_completion_first5"], s
    assert [r["step"] for r in result["ppo"]] == list(range(16))
