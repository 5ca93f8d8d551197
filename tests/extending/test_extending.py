"""docs/extending.md, followed step by step: a toy advantage estimator, a toy architecture and a toy placement policy,
each added through its documented steps only (a function or class and its registration), then used for real."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rlhf_dyna.algos.estimators import ESTIMATORS, SEQUENCE, register_estimator
from rlhf_dyna.algos.grpo import group_advantages
from rlhf_dyna.checks import ConfigError, check_config
from rlhf_dyna.config import Config
from rlhf_dyna.elastic.policies import POLICIES, colocate, register_policy
from rlhf_dyna.models.architectures import ARCHITECTURES, Architecture, register_architecture
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.orchestrator.runtimes import RUNTIMES, register_runtime
from rlhf_dyna.orchestrator.runtimes.colocate import ColocateRuntime
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import relayout
from rlhf_dyna.transition.vps_mover import make_vps_mover
from tests.engines._common import random_batch
from tests.engines._dist import run_ranks


# --- an advantage estimator: one function and its registration ------------------------------------------------------
def sign_advantages(rewards: torch.Tensor, n: int, alg) -> torch.Tensor:
    """+1 above the prompt's mean reward, -1 below, 0 at it."""
    return torch.sign(group_advantages(rewards, n, norm_by_std=False))


def register_sign() -> None:
    register_estimator("sign", SEQUENCE, group_baseline=True)(sign_advantages)


def test_a_toy_estimator_is_one_function_and_its_registration():
    register_sign()
    cfg = Config()
    cfg.algorithm.adv_estimator, cfg.dry_run = "sign", True
    check_config(cfg)  # the checks know it from its registration
    cfg.rollout.n = 1
    with pytest.raises(ConfigError, match="adv_estimator=sign with rollout.n=1"):
        check_config(cfg)  # group_baseline=True: it needs other samples of the prompt
    est = ESTIMATORS["sign"]
    assert est.fn(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, cfg.algorithm).tolist() == [1.0, -1.0, 0.0, 0.0]


# --- an architecture: one entry of the table ------------------------------------------------------------------------
class ToyConfig(LlamaConfig):
    model_type = "toy_llama"


class ToyForCausalLM(LlamaForCausalLM):
    config_class = ToyConfig


def register_toy_architecture() -> None:
    if "toy_llama" not in ARCHITECTURES:
        AutoConfig.register("toy_llama", ToyConfig)
        AutoModelForCausalLM.register(ToyConfig, ToyForCausalLM)
    register_architecture(Architecture("toy_llama", "ToyForCausalLM"))


def toy_config() -> ToyConfig:
    return ToyConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, architectures=["ToyForCausalLM"])


def _toy_relayout(rank: int, world: int) -> None:
    register_toy_architecture()
    torch.manual_seed(0)
    model = ToyForCausalLM(toy_config())
    engine = TrainEngine(model, build_mesh(ParallelLayout(1, world)), lr=1e-2)  # tp over both ranks: the TP plan
    batch = random_batch(seed=1, batch=2)
    before = engine.logprobs(batch["input_ids"], batch["attention_mask"])
    engine, _ = relayout(engine, ParallelLayout(world, 1), mover=make_vps_mover(engine.model.config, verify=True))
    assert engine.mesh["dp"].size() == world  # every piece the catalog names checksummed on arrival (verify)
    torch.testing.assert_close(engine.logprobs(batch["input_ids"], batch["attention_mask"]), before)


def test_a_toy_architecture_is_one_table_entry():
    register_toy_architecture()
    config = toy_config()
    names = sorted(t.name for t in catalog_from_config(config).tensors)
    assert names == sorted(n for n, _ in ToyForCausalLM(config).named_parameters())  # the catalog is the model's
    run_ranks(_toy_relayout, 2)  # its TP plan shards it, and a VPS relayout tp2 -> dp2 keeps its outputs


# --- a placement policy: a runtime in a file of its own, and its registration -------------------------------------
class CountingRuntime(ColocateRuntime):
    """Colocate's placement, and a count of the steps it finished, logged as toy/steps."""

    name = "counting"

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        self.steps = getattr(self, "steps", 0) + 1
        return {**super().finish_step(step, metrics, started), "toy/steps": float(self.steps)}


def register_counting() -> None:
    register_policy("counting", colocate)  # where its roles sit: colocate's sets
    register_runtime(CountingRuntime)  # how the loop runs it


def _run_loop(rank: int, world: int, cfg: Config, out_dir: str, register: bool) -> None:
    from rlhf_dyna.launch import init_distributed
    from rlhf_dyna.orchestrator.loop import run_training

    if register:
        register_counting()
    run_training(cfg, Path(out_dir), init_distributed())


def tiny_run(policy: str) -> Config:
    cfg = Config()
    cfg.placement.policy = policy
    cfg.trainer.total_steps, cfg.trainer.sft_warmup_steps, cfg.trainer.save_last = 2, 0, False
    cfg.trainer.export_policy = False
    cfg.task.prompts_per_step, cfg.task.eval_size, cfg.task.eval_every = 4, 8, 1
    cfg.rollout.n = 4
    cfg.model.hidden_size, cfg.model.num_attention_heads, cfg.model.num_key_value_heads = 64, 2, 2  # head_dim 32
    cfg.tracking = replace(cfg.tracking, wandb_mode="disabled", console="off", transition_trace=False)
    return cfg


@pytest.mark.timeout(600)
def test_a_toy_placement_policy_is_a_runtime_and_its_registration(tmp_path):
    register_counting()
    cfg = tiny_run("counting")
    check_config(cfg)  # the checks know it from its placement's registration
    assert "counting" in POLICIES and "counting" in RUNTIMES
    runs = {}
    for policy in ("colocate", "counting"):
        run_ranks(_run_loop, 2, tiny_run(policy), str(tmp_path / policy), policy == "counting")
        runs[policy] = [json.loads(line) for line in (tmp_path / policy / "metrics.jsonl").read_text().splitlines()]
    assert [row.get("toy/steps") for row in runs["counting"]] == [None, 1.0, 2.0]
    for plain, toy in zip(runs["colocate"], runs["counting"]):
        for key in plain:
            if not key.startswith(("timing_s/", "perf/")) and not key.endswith("seconds"):
                assert toy[key] == plain[key], key  # a placement changes only time
