"""The MoE configurations grpo_tiny_moe can run live pass the checks; those it cannot are refused naming the key
(the recipe's own run: tests/app/runs/test_moe_recipe.py)."""
from __future__ import annotations

import re

import pytest

from rlhf_dyna.checks import ConfigError
from rlhf_dyna.checks.layouts import check_layouts, check_runs_live
from rlhf_dyna.config import Config, LayoutSwitchConfig


def _moe_cfg(**changes) -> Config:
    cfg = Config()
    cfg.model.arch, cfg.model.num_experts, cfg.model.num_experts_per_tok = "qwen3_moe", 4, 2
    cfg.model.moe_intermediate_size = 128
    cfg.parallel.world_size, cfg.parallel.device, cfg.rollout.tp = 4, "cpu", 4
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section) if section != "train" else cfg.parallel.train, name, value)
    return cfg


@pytest.mark.parametrize("changes", [{}, dict(train__ep=2), dict(train__ep=4), dict(rollout__expert_parallel=True),
                                     dict(rollout__sync="naive")])
def test_moe_layouts_that_run_live_pass_the_live_check(changes):
    check_runs_live(_moe_cfg(**changes))


def test_rollout_expert_parallel_on_a_dense_model_is_refused():
    cfg = Config()
    cfg.rollout.expert_parallel = True
    with pytest.raises(ConfigError, match="rollout.expert_parallel=true with model.arch=llama and no experts"):
        check_runs_live(cfg)


@pytest.mark.parametrize("changes,message", [
    (dict(train__ep=3), "parallel.train.ep=3 does not divide dp=4"),
    (dict(model__num_experts=6, train__ep=4), "parallel.train.ep=4 does not divide model.num_experts=6"),
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


def test_expert_parallel_layouts_in_the_schedule_are_checked():
    cfg = _moe_cfg()
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, ep=2), LayoutSwitchConfig(step=3, ep=1)]
    check_layouts(cfg)
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, ep=3)]
    with pytest.raises(ConfigError, match=r"parallel\.schedule\[0\] \(step 2\) ep=3 does not divide dp=4"):
        check_layouts(cfg)
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, ep=2, tp=2)]
    with pytest.raises(ConfigError, match="ep=2 with tp=2, pp=1: expert parallel runs live over dp ranks only"):
        check_layouts(cfg)
    cfg.model.num_experts, cfg.parallel.schedule = 0, [LayoutSwitchConfig(step=2, ep=2)]
    with pytest.raises(ConfigError, match=r"ep=2 on a dense model \(model.num_experts=0\)"):
        check_layouts(cfg)
