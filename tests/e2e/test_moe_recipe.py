"""grpo_tiny_moe end to end on 4 spawned CPU ranks: FSDP2 dp4 (ep=1), vLLM tp4 rollout, VPS sync into w13/w2,
the router's aux loss logged; and the MoE configurations that cannot run live refused before spawn."""
from __future__ import annotations

import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_dyna.config import Config
from rlhf_dyna.validate import ConfigError, check_runs_live
from tests.e2e.test_recipes import SHORT, read_metrics, run_app


@pytest.mark.timeout(400)
def test_grpo_tiny_moe_runs_live_on_four_ranks(tmp_path):
    run_dir = tmp_path / "moe"
    proc = run_app("recipe=grpo_tiny_moe", *SHORT, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "recipe grpo_tiny_moe, 4 local ranks" in proc.stdout
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    last = rows[-1]
    # Switch-style balance loss of top-2 over 4 experts: 2.0 when perfectly balanced, up to 4.0 when collapsed
    assert math.isfinite(last["actor/aux_loss"]) and 1.0 <= last["actor/aux_loss"] <= 4.0, last["actor/aux_loss"]
    assert last["reshard/train_to_rollout/bytes_moved"] > 0
    policy = AutoModelForCausalLM.from_pretrained(run_dir / "policy")  # exported with per-expert checkpoint names
    assert policy.config.num_experts == 4
    assert torch.isfinite(policy.model.layers[0].mlp.experts.gate_up_proj).all()


def _moe_cfg(**changes) -> Config:
    cfg = Config()
    cfg.model.arch, cfg.model.num_experts, cfg.model.num_experts_per_tok = "qwen3_moe", 4, 2
    cfg.model.moe_intermediate_size = 128
    cfg.parallel.world_size, cfg.parallel.device, cfg.rollout.tp = 4, "cpu", 4
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section) if section != "train" else cfg.parallel.train, name, value)
    return cfg


@pytest.mark.parametrize("changes", [{}, dict(rollout__expert_parallel=True), dict(rollout__sync="naive")])
def test_moe_at_ep1_passes_the_live_check(changes):
    check_runs_live(_moe_cfg(**changes))


def test_rollout_expert_parallel_on_a_dense_model_is_refused():
    cfg = Config()
    cfg.rollout.expert_parallel = True
    with pytest.raises(ConfigError, match="rollout.expert_parallel=true with model.arch=llama and no experts"):
        check_runs_live(cfg)


@pytest.mark.parametrize("changes,message", [
    (dict(train__ep=2), "parallel.train.ep=2: expert parallel training"),
    (dict(train__tp=2), "parallel.train.tp=2 with model.arch=qwen3_moe"),
    (dict(rollout__tp=2), "rollout.tp=2 on 4 CPU ranks gives vLLM data_parallel_size=2"),
    (dict(model__moe_intermediate_size=64), "model.moe_intermediate_size / rollout.tp = 64 / 4 is not a multiple of 32"),
    (dict(rollout__expert_parallel=True, model__moe_intermediate_size=48),
     "model.moe_intermediate_size = 48 is not a multiple of 32"),
    (dict(rollout__expert_parallel=True, model__num_experts=2), "model.num_experts=2 on 4 rollout ranks"),
    (dict(rollout__expert_parallel=True, placement__policy="lend"), "only the colocated rollout"),
])
def test_moe_configs_that_cannot_run_live_are_refused(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_runs_live(_moe_cfg(**changes))
