"""Advantage estimators, each registered with what it needs: a function and its registration is all a new one takes.

Sequence-level estimators (`SEQUENCE`) map the step's rewards [num_prompts * n], a prompt's n samples contiguous, to
one advantage per sample: fn(rewards, n, alg). Token-level ones (`TOKEN`) map this rank's per-token rewards (the
outcome score on the last response token, minus the KL penalty where it is in the reward) to per-token advantages
and returns: fn(TokenInputs). `needs_critic`: it reads the critic's values, so only algorithm.name=ppo can run it
(and a critic is read by nothing else); `group_baseline`: its baseline is the other samples of the same prompt, so it
needs rollout.n >= 2 (a token-level one subtracts the group's mean score first). The config checks and the prepare
phase (orchestrator/advantages.py) read these registrations; `algorithm.adv_estimator` names one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .grpo import group_advantages
from .ppo import gae, whiten

SEQUENCE, TOKEN = "sequence", "token"


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable
    level: str  # SEQUENCE or TOKEN
    needs_critic: bool = False
    group_baseline: bool = False


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, level: str, needs_critic: bool = False, group_baseline: bool = False):
    """Decorator: registers `fn` as the estimator `name` (see the module doc for the two signatures)."""
    if level not in (SEQUENCE, TOKEN):
        raise ValueError(f"estimator {name}: level={level!r}; valid: {SEQUENCE}, {TOKEN}")

    def add(fn: Callable) -> Callable:
        ESTIMATORS[name] = Estimator(name, fn, level, needs_critic, group_baseline)
        return fn

    return add


@dataclass(frozen=True)
class TokenInputs:
    """What a token-level estimator reads, all [B, T] over this rank's rows (right padding)."""

    rewards: Tensor  # per-token rewards
    mask: Tensor  # 1 on response tokens
    values: Tensor | None  # the critic's value of the state before each token (needs_critic), else None
    gamma: float
    lam: float
    reduce: Callable[[Tensor], Tensor]  # sums a tensor of partial sums over the dp group: whole-batch statistics


@register_estimator("grpo", SEQUENCE, group_baseline=True)
def grpo_advantages(rewards: Tensor, n: int, alg) -> Tensor:
    """GRPO (Shao et al. 2024): the reward minus its group's mean, divided by the group's std (norm_adv_by_std)."""
    return group_advantages(rewards, n, alg.norm_adv_by_std, unbiased=alg.grpo_std == "unbiased")


@register_estimator("dr_grpo", SEQUENCE, group_baseline=True)
def dr_grpo_advantages(rewards: Tensor, n: int, alg=None) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): the reward minus its group's mean, without dividing by the group's std
    (the std makes easy and hard prompts weigh more). Pair with loss_agg=seq_mean_token_sum_norm."""
    return group_advantages(rewards, n, norm_by_std=False)


@register_estimator("rloo", SEQUENCE, group_baseline=True)
def rloo_advantages(rewards: Tensor, n: int, alg=None) -> Tensor:
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
    """REINFORCE++ (Hu 2025): discounted returns of the per-token rewards, whitened over every response token of the
    batch (`reduce` sums partial sums over dp ranks, so the statistics are the whole batch's). -> (advantages, returns)"""
    returns = discounted_returns(rewards_per_token, response_mask, gamma)
    return whiten(returns, response_mask, reduce=reduce), returns


@register_estimator("reinforce_plus_plus", TOKEN)
def reinforce_pp(x: TokenInputs) -> tuple[Tensor, Tensor]:
    return reinforce_plus_plus(x.rewards, x.mask, x.gamma, reduce=x.reduce)


@register_estimator("reinforce_plus_plus_baseline", TOKEN, group_baseline=True)
def reinforce_pp_baseline(x: TokenInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: REINFORCE++ on scores minus their group's mean (the prepare phase centres them)."""
    return reinforce_plus_plus(x.rewards, x.mask, x.gamma, reduce=x.reduce)


@register_estimator("gae", TOKEN, needs_critic=True)
def generalized_advantages(x: TokenInputs) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016) with the critic's values, advantages whitened over the whole batch."""
    advantages, returns = gae(x.rewards, x.values, x.mask, x.gamma, x.lam)
    return whiten(advantages, x.mask, reduce=x.reduce), returns


def group_centred_scores(scores: Tensor, n: int) -> Tensor:
    """A group baseline for token-level estimators: each score minus its prompt group's mean (no std)."""
    return group_advantages(scores, n, norm_by_std=False)
