"""Checks of single values and choices: each key's value is in range, or among the names it may take."""
from __future__ import annotations

from ..algos.choices import KL_CONTROLLERS, KL_ESTIMATOR_NAMES, LOSS_AGGS
from ..algos.losses import POLICY_LOSSES
from ..algos.pairwise import PAIR_LOSSES
from ..config import Config
from ..models.architectures import live_architectures
from ..tracking.console import CONSOLE_MODES
from ..errors import ConfigError

CHOICES = {
    "algorithm.name": ("grpo", "ppo", "reward_model"),
    "algorithm.pair_loss": tuple(PAIR_LOSSES),
    "algorithm.loss_agg": (*LOSS_AGGS, "seq_mean"),
    "algorithm.policy_loss": tuple(POLICY_LOSSES),
    "algorithm.kl_estimator": KL_ESTIMATOR_NAMES,
    "algorithm.kl_ctrl": KL_CONTROLLERS,
    "algorithm.grpo_std": ("population", "unbiased"),
    "rollout.engine": ("vllm",),
    "rollout.sync": ("naive", "vps"),
    "task.name": ("arithmetic", "sort_digits", "file", "preference"),
    "tracking.wandb_mode": ("offline", "online", "disabled"),
    "tracking.console": CONSOLE_MODES,
    "trainer.precision": ("fp32", "bf16", "auto"),
    "algorithm.share_prompts": ("on", "off", "auto"),
    "parallel.device": ("auto", "cpu", "cuda"),
    "model.arch": tuple(live_architectures()),
    "model.dtype": ("float32", "bfloat16", "float16"),
}


def _lookup(cfg: Config, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_choices(cfg: Config) -> None:
    for key, valid in CHOICES.items():
        value = _lookup(cfg, key)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not a valid choice; valid: {', '.join(valid)}.")


# key -> (test, what a right value is); each is known before spawn, so none may reach a rank
VALUE_RULES: dict[str, tuple] = {
    "rollout.n": (lambda v: v >= 1, "an integer >= 1 (samples per prompt; GRPO needs >= 2 for a group baseline)"),
    "rollout.temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": (lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    "rollout.max_new_tokens": (lambda v: v >= 1, "an integer >= 1"),
    "rollout.kv_cache_bytes": (lambda v: v >= 0, ">= 0 (0 = vLLM sizes the cache)"),
    "algorithm.lr": (lambda v: v > 0, "> 0, e.g. 1e-6 for a pretrained model"),
    "algorithm.critic_lr": (lambda v: v > 0, "> 0"),
    "algorithm.weight_decay": (lambda v: v >= 0, ">= 0"),
    "algorithm.grad_clip": (lambda v: v > 0, "> 0"),
    "algorithm.clip_eps_low": (lambda v: 0 <= v <= 1, "in [0, 1] (1 = no lower clip)"),
    "algorithm.clip_eps_high": (lambda v: v >= 0, ">= 0"),
    "algorithm.kl_coef": (lambda v: v >= 0, ">= 0 (0 = no reference model)"),
    "algorithm.gamma": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.lam": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.vf_clip": (lambda v: v >= 0, ">= 0"),
    "algorithm.epochs": (lambda v: v >= 1, "an integer >= 1"),
    "algorithm.mini_batches": (lambda v: v >= 1, "an integer >= 1"),
    "algorithm.micro_batch_size": (lambda v: v >= 1, "an integer >= 1 (rows per forward/backward on a rank)"),
    "algorithm.entropy_coef": (lambda v: v >= 0, ">= 0 (0 = no entropy bonus; entropy is logged either way)"),
    "algorithm.clip_ratio_c": (lambda v: v == 0 or v > 1, "0 (dual-clip off) or > 1, e.g. 3.0"),
    "algorithm.kl_target": (lambda v: v > 0, "> 0 (the KL per token the adaptive controller steers to)"),
    "algorithm.kl_horizon": (lambda v: v >= 1, "an integer >= 1 (samples)"),
    "algorithm.loss_norm_len": (lambda v: v >= 0, "an integer >= 0 (0 = rollout.max_new_tokens)"),
    "task.prompts_per_step": (lambda v: v >= 1, "an integer >= 1"),
    "task.eval_size": (lambda v: v >= 1, "an integer >= 1"),
    "task.eval_every": (lambda v: v >= 1, "an integer >= 1 (steps between evaluations)"),
    "trainer.total_steps": (lambda v: v >= 0, "an integer >= 0"),
    "trainer.sft_warmup_steps": (lambda v: v >= 0, "an integer >= 0"),
    "trainer.sft_lr": (lambda v: v > 0, "> 0"),
    "trainer.sft_batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "parallel.train.zero": (lambda v: v in (1, 2, 3), "1, 2 or 3"),
}


def check_values(cfg: Config) -> None:
    for key, (ok, right) in VALUE_RULES.items():
        value = _lookup(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is out of range; it must be {right}.")
    betas = tuple(cfg.algorithm.betas)
    if not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"algorithm.betas={list(betas)} must both lie in [0, 1), e.g. [0.9, 0.999].")
    r = cfg.rollout
    if r.temperature == 0 and r.n > 1:
        raise ConfigError(
            f"rollout.temperature=0 (greedy) with rollout.n={r.n} draws {r.n} identical samples per prompt, so every "
            f"group advantage is 0 and nothing trains; use rollout.temperature > 0 (e.g. 1.0) or rollout.n=1."
        )
    if cfg.algorithm.adv_estimator == "grpo" and r.n < 2:  # other estimators: checks.algorithm
        raise ConfigError(
            f"algorithm.name=grpo with rollout.n={r.n}: GRPO's baseline is the mean reward of a prompt's group, so one "
            f"sample per prompt has advantage 0; use rollout.n >= 2 (e.g. 8), or algorithm=ppo for a learned baseline."
        )
