"""grpo_tiny_moe end to end on 4 spawned CPU ranks: expert parallel ep2 x dp2 for step 1, then an online switch to
FSDP2 dp4 (ep=1) for step 2, vLLM tp4 rollout, VPS sync into w13/w2 from both layouts, the router's aux loss logged
(the MoE configurations that cannot run live are refused by the checks: tests/unit/checks/test_moe_layouts.py)."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.app.app_runs import SHORT, read_metrics, run_app


@pytest.mark.timeout(400)
def test_grpo_tiny_moe_runs_live_on_four_ranks(tmp_path):
    run_dir = tmp_path / "moe"
    proc = run_app("recipe=grpo_tiny_moe", *SHORT, "parallel.train.ep=2", "parallel.schedule=[{step: 2, ep: 1}]",
                   f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "recipe grpo_tiny_moe, 4 local ranks" in proc.stdout
    assert "training layout dp4xtp1-ep2-zero3 -> dp4xtp1-zero3" in proc.stdout
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2]["reshard/train_relayout/bytes_moved"] > 0  # the experts regrouped from ep2 x dp2 to dp4
    for row in rows[1:]:  # step 1 trains with ep=2, step 2 with ep=1
        # Switch-style balance loss of top-2 over 4 experts: 2.0 when perfectly balanced, up to 4.0 when collapsed
        assert math.isfinite(row["actor/aux_loss"]) and 1.0 <= row["actor/aux_loss"] <= 4.0, row["actor/aux_loss"]
        assert row["reshard/train_to_rollout/bytes_moved"] > 0
        # one mini-batch: the ratio is 1 iff the forward-only log-probs agree with the training forward
        assert abs(row["actor/ratio_mean"] - 1.0) < 1e-5, row
    policy = AutoModelForCausalLM.from_pretrained(run_dir / "policy")  # exported with per-expert checkpoint names
    assert policy.config.num_experts == 4
    assert torch.isfinite(policy.model.layers[0].mlp.experts.gate_up_proj).all()
