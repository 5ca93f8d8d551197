"""PPO advantage estimation: per-token rewards, GAE, whitening. All tensors are [B, T] over
response positions, with a 0/1 response mask (right padding; gaps inside are skipped too)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def token_rewards(
    scores: Tensor,
    response_mask: Tensor,
    ref_kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> Tensor:
    """Per-token rewards: the outcome score [B] on each sequence's last response token, minus
    kl_coef * ref_kl [B, T] on every response token. Sequences with an empty mask get no score.
    """
    mask = response_mask.float()
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = (positions * mask).argmax(dim=-1)  # index of the last masked token
    rows = (mask.sum(dim=-1) > 0).nonzero().squeeze(-1)
    rewards = torch.zeros_like(mask)
    rewards[rows, last[rows]] = scores.to(rewards.device, torch.float32)[rows]
    if ref_kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * ref_kl.float() * mask
    return rewards


def gae(
    rewards_per_token: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens -> (advantages, returns), both [B, T]
    and zero outside the mask. The value after the last response token is 0 (episode ends), and
    values at masked positions are ignored, so padding never leaks into the estimates.
    """
    mask = response_mask.float()
    rewards = rewards_per_token.float()
    values = values.float().detach()
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        # Masked positions pass the next response token's state through unchanged.
        next_adv = m * adv_t + (1.0 - m) * next_adv
        next_value = m * values[:, t] + (1.0 - m) * next_value
        advantages[:, t] = adv_t * m
    returns = (advantages + values) * mask
    return advantages, returns


def whiten(advantages: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8,
           reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Normalise to zero mean and unit (population) variance over masked tokens; zero outside.
    With shift_mean=False the mean is added back (only the scale changes). For a batch split over ranks,
    `reduce` sums a tensor of partial sums over them, so that mean and variance are the whole batch's."""
    reduce = reduce or (lambda t: t)
    mask_f = mask.float()
    count, total = reduce(torch.stack([mask_f.sum(), (advantages * mask_f).sum()]))
    count = count.clamp(min=1.0)
    mean = total / count
    var = reduce((((advantages - mean) * mask_f) ** 2).sum()) / count
    whitened = (advantages - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask_f
