"""Advantage estimators beyond GRPO's group normalisation: Dr. GRPO, RLOO, REINFORCE++ (plain and with a group
baseline). GRPO itself is `grpo.group_advantages`, GAE is `ppo.gae`. Pure functions; the orchestrator picks one by
`algorithm.adv_estimator` (orchestrator/advantages.py).

Sequence-level estimators take the step's rewards [num_prompts * n] in prompt-major order (a prompt's n samples
contiguous) and return one advantage per sample. Token-level ones take [B, T] tensors over response positions.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .grpo import group_advantages
from .ppo import whiten


def dr_grpo_advantages(rewards: Tensor, n: int) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): the reward minus its group's mean, without dividing by the group's std
    (the std makes easy and hard prompts weigh more). Pair with loss_agg=seq_mean_token_sum_norm."""
    return group_advantages(rewards, n, norm_by_std=False)


def rloo_advantages(rewards: Tensor, n: int) -> Tensor:
    """RLOO (Ahmadian et al. 2024): each sample's reward minus the mean of the *other* n - 1 samples of its prompt,
    = n / (n - 1) * (r - group mean). Needs n >= 2."""
    if n < 2 or rewards.numel() % n:
        raise ValueError(f"RLOO needs n >= 2 samples per prompt dividing the {rewards.numel()} rewards, got n={n}")
    groups = rewards.float().view(-1, n)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (n - 1)
    return (groups - others_mean).view(-1)


def discounted_returns(rewards_per_token: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} over response tokens ([B, T]; padding passes G through and reads 0)."""
    mask = response_mask.float()
    rewards = rewards_per_token.float()
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        m = mask[:, t]
        running = m * (rewards[:, t] + gamma * running) + (1.0 - m) * running
        returns[:, t] = running * m
    return returns


def reinforce_plus_plus(rewards_per_token: Tensor, response_mask: Tensor, gamma: float,
                        reduce: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted returns of the per-token rewards (outcome score on the last token, minus
    the KL penalty on every token when it is in the reward), whitened over every response token of the batch
    (`reduce` sums partial sums over dp ranks, so the statistics are the whole batch's). -> (advantages, returns)."""
    returns = discounted_returns(rewards_per_token, response_mask, gamma)
    return whiten(returns, response_mask, reduce=reduce), returns


def group_centred_scores(scores: Tensor, n: int) -> Tensor:
    """REINFORCE++-baseline's first step: each score minus its prompt group's mean (no std)."""
    return group_advantages(scores, n, norm_by_std=False)
