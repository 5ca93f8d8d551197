"""GRPO outcome advantages: each sample's reward relative to the other samples of its prompt."""
from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, n: int, norm_by_std: bool, eps: float = 1e-6, unbiased: bool = False) -> Tensor:
    """Group-normalised advantages, one per sample.

    `rewards` is 1-D of length num_prompts * n, the n samples of a prompt contiguous
    (prompt-major order, as rollouts are generated). Each reward has its group's mean subtracted;
    with `norm_by_std` the result is divided by (group std + eps). The std is the population std by
    default (divide by n: a group of n=1 is defined and the scale does not depend on n); `unbiased=True`
    divides by n - 1 instead, as veRL and TRL do (advantages smaller by sqrt((n-1)/n)).
    A constant group gets advantages of exactly 0: it carries no learning signal.
    Returns a float tensor shaped like `rewards` (per sequence; see `broadcast_to_tokens`).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (num_prompts * n), got shape {tuple(rewards.shape)}")
    if n < 1 or rewards.numel() % n != 0:
        raise ValueError(f"n={n} must be >= 1 and divide the number of rewards ({rewards.numel()})")
    groups = rewards.float().view(-1, n)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if norm_by_std:
        centered = centered / (groups.std(dim=1, unbiased=unbiased, keepdim=True) + eps)
    # Exact zero for constant groups: mean rounding would otherwise leave ~1e-8 / eps noise.
    constant = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centered), centered).view(-1)


def broadcast_to_tokens(seq_values: Tensor, response_mask: Tensor) -> Tensor:
    """Per-sequence values [B] -> per-token [B, T], zero on padding."""
    return seq_values.float().unsqueeze(-1) * response_mask.float()
