"""The prepare phase's advantages: log-probs of the rollouts, then the estimator `algorithm.adv_estimator` names
(algos.estimators' registry).

Sequence-level estimators see every sample of the step (all ranks hold them) and each rank keeps its rows;
token-level ones work on this rank's rows and whiten with whole-batch statistics summed over the dp group, so every
layout computes the same advantages.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..algos.estimators import ESTIMATORS, SEQUENCE, TokenInputs, group_centred_scores
from ..algos.kl import kl_penalty
from ..algos.ppo import token_rewards
from ..config import Config
from .batch import Sample, rank_rows
from .objectives import old_logprobs_needed


def compute_advantages(cfg: Config, batch: dict, samples: list[Sample], actor, ref, critic,
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
    mine = lambda per_sample: rank_rows({"x": per_sample}, actor.dp_rank, actor.dp_size, alg.mini_batches)["x"]
    est = ESTIMATORS[alg.adv_estimator]
    if est.level == SEQUENCE:
        advantages = est.fn(rewards, cfg.rollout.n, alg)
        batch["advantages"] = mine(advantages)
        return _stats("advantage", advantages)
    mask = batch["response_mask"]
    scores = group_centred_scores(rewards, cfg.rollout.n) if est.group_baseline else rewards
    ref_kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], "k1") if ref is not None and alg.kl_in_reward else None
    rewards_per_token = token_rewards(mine(scores), mask, ref_kl, kl_coef)
    engine, values = (critic, critic_values(critic, batch)) if est.needs_critic else (actor, None)
    advantages, returns = est.fn(TokenInputs(rewards_per_token, mask, values, alg.gamma, alg.lam, engine.dp_sum))
    if values is not None:
        batch.update(old_values=values, returns=returns)
    batch["advantages"] = advantages
    return {**_stats("advantage", advantages, mask, engine), **_stats("return", returns, mask, engine)}


def critic_values(critic, batch: dict) -> Tensor:
    """The critic's value of the state before each token: read at t-1, the prefix that predicts token t."""
    values = critic.values(batch["input_ids"], batch["attention_mask"])
    return torch.nn.functional.pad(values[:, :-1], (1, 0)) * batch["response_mask"]


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
