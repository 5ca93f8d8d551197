"""The prepare phase's advantages: log-probs of the rollouts, then the estimator `algorithm.adv_estimator` picks.

Sequence-level estimators (grpo, dr_grpo, rloo) see every sample of the step (all ranks hold them) and each rank
keeps its rows; token-level ones (reinforce_plus_plus[_baseline], gae) work on this rank's rows and whiten with
whole-batch statistics summed over the dp group, so every layout computes the same advantages.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..algos.choices import SEQUENCE_LEVEL
from ..algos.estimators import dr_grpo_advantages, group_centred_scores, reinforce_plus_plus, rloo_advantages
from ..algos.grpo import group_advantages
from ..algos.kl import kl_penalty
from ..algos.ppo import gae, token_rewards, whiten
from ..config import AlgorithmConfig, Config
from .batch import Sample, rank_rows
from .objectives import old_logprobs_needed


def sequence_advantages(alg: AlgorithmConfig, rewards: Tensor, n: int) -> Tensor:
    if alg.adv_estimator == "grpo":
        return group_advantages(rewards, n, alg.norm_adv_by_std, unbiased=alg.grpo_std == "unbiased")
    if alg.adv_estimator == "dr_grpo":
        return dr_grpo_advantages(rewards, n)
    if alg.adv_estimator == "rloo":
        return rloo_advantages(rewards, n)
    raise ValueError(f"{alg.adv_estimator!r} is not a sequence-level estimator; those are {SEQUENCE_LEVEL}")


def compute_advantages(cfg: Config, batch: dict, samples: list[Sample], ctx, actor, ref, critic,
                       kl_coef: float) -> dict[str, float]:
    """Adds old_logprobs (where `old_logprobs_needed`), ref_logprobs, (old_values, returns) and advantages to this
    rank's batch shard, in place; returns advantage (and return) statistics over the whole batch, the same on every
    rank. Log-probs are 0 outside the response mask's columns (the LM head runs on response positions only)."""
    alg = cfg.algorithm
    rows = (batch["input_ids"], batch["attention_mask"], cfg.rollout.temperature, batch["response_mask"])
    if old_logprobs_needed(alg):
        batch["old_logprobs"] = actor.logprobs(*rows)
    if ref is not None:
        batch["ref_logprobs"] = ref.logprobs(*rows)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    mine = lambda per_sample: rank_rows({"x": per_sample}, ctx.dp_rank, ctx.dp, alg.mini_batches)["x"]
    if alg.adv_estimator in SEQUENCE_LEVEL:
        advantages = sequence_advantages(alg, rewards, cfg.rollout.n)
        batch["advantages"] = mine(advantages)
        return _stats("advantage", advantages)
    mask = batch["response_mask"]
    scores = group_centred_scores(rewards, cfg.rollout.n) if alg.adv_estimator == "reinforce_plus_plus_baseline" else rewards
    ref_kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], "k1") if ref is not None and alg.kl_in_reward else None
    rewards_per_token = token_rewards(mine(scores), mask, ref_kl, kl_coef)
    engine = critic if alg.adv_estimator == "gae" else actor
    if alg.adv_estimator == "gae":
        values = critic.values(batch["input_ids"], batch["attention_mask"])
        # value of the state before token t is read at t-1 (the prefix that predicts token t)
        values = torch.nn.functional.pad(values[:, :-1], (1, 0)) * mask
        advantages, returns = gae(rewards_per_token, values, mask, alg.gamma, alg.lam)
        advantages = whiten(advantages, mask, reduce=critic.dp_sum)  # whole-batch statistics, whatever the layout
        batch.update(old_values=values, returns=returns)
    else:
        advantages, returns = reinforce_plus_plus(rewards_per_token, mask, alg.gamma, reduce=actor.dp_sum)
    batch["advantages"] = advantages
    return {**_stats("advantage", advantages, mask, engine), **_stats("return", returns, mask, engine)}


def _stats(name: str, values: Tensor, mask: Tensor | None = None, engine=None) -> dict[str, float]:
    """mean / std / max / min of `values` (where `mask` is 1), over the dp group when an engine is given."""
    if mask is None:
        mask = torch.ones_like(values)
    m = mask.float()
    v = values.float()
    sums = torch.stack([m.sum(), (v * m).sum(), (v * v * m).sum()]).double()
    big = torch.finfo(torch.float32).max
    extremes = torch.stack([torch.where(m > 0, v, -big).max(), -torch.where(m > 0, v, big).min()]).double()
    if engine is not None:
        sums = engine.dp_sum(sums)
        extremes = extremes.to(engine.device)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=engine.mesh["dp"].get_group())
        extremes = extremes.cpu()
    count = sums[0].clamp(min=1.0)
    mean = sums[1] / count
    std = (sums[2] / count - mean**2).clamp(min=0.0).sqrt()
    empty = float(sums[0]) == 0.0
    return {f"{name}/mean": float(mean), f"{name}/std": float(std),
            f"{name}/max": 0.0 if empty else float(extremes[0]), f"{name}/min": 0.0 if empty else float(-extremes[1])}
