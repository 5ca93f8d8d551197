"""dry_run=true plans every transition of every recipe without devices and writes plan_summary.json."""
from __future__ import annotations

import json

import pytest

from tests.app.app_runs import run_app

FIELDS = ("transition", "bytes_total", "bytes_moved", "bytes_min", "rounds", "peak_extra_bytes", "predicted_s", "planning_s")


@pytest.mark.parametrize("recipe", ["grpo_tiny", "ppo_tiny", "grpo_7b", "grpo_70b", "ppo_235b_moe"])
def test_dry_run_plans_every_recipe(recipe, tmp_path):
    proc = run_app(f"recipe={recipe}", "dry_run=true", f"hydra.run.dir={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "train_to_rollout" in proc.stdout
    rows = json.loads((tmp_path / "plan_summary.json").read_text())["transitions"]
    assert [r["transition"] for r in rows][0] == "train_to_rollout"
    for row in rows:
        for field in FIELDS:
            assert field in row
        assert row["bytes_moved"] == row["bytes_min"] > 0
        assert row["predicted_s"] >= 0 and row["rounds"] >= 1
    assert not list(tmp_path.rglob("rank*.log")), "a dry run must not spawn ranks"
