"""PPO policy and value losses, and the masked reductions they share."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossAgg = Literal["token_mean", "seq_mean"]
LOSS_AGGS: tuple[str, ...] = ("token_mean", "seq_mean")


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def aggregate(loss_mat: Tensor, mask: Tensor, agg: LossAgg) -> Tensor:
    """Reduce a per-token [B, T] loss to a scalar.

    token_mean: mean over every response token of the batch (long responses weigh more).
    seq_mean: mean over sequences of each sequence's token mean; sequences with no response
    token are left out (0 if all are empty).
    """
    if agg == "token_mean":
        return masked_mean(loss_mat, mask)
    if agg == "seq_mean":
        has_tokens = (mask.sum(dim=-1) > 0).to(loss_mat.dtype)
        per_seq = masked_mean(loss_mat, mask, dim=-1)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    raise ValueError(f"agg must be one of {LOSS_AGGS}, got {agg!r}")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    agg: LossAgg,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss (to minimise), with ratio clipped to [1-low, 1+high].

    logprobs, old_logprobs, response_mask: [B, T]. advantages: [B, T] per token, or [B] per
    sequence (GRPO), broadcast here to every token of the sequence.
    Metrics (detached 0-dim tensors; call .item() when logging): pg_loss, pg_clipfrac (fraction
    of response tokens whose gradient the clip removed), ppo_kl (k1 estimate of
    KL(old || new), mean of old - new), ratio_mean.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    mask = response_mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss_mat = torch.maximum(unclipped, clipped)
    loss = aggregate(loss_mat, mask, agg)
    with torch.no_grad():
        metrics = {
            "pg_loss": loss.detach(),
            "pg_clipfrac": masked_mean((clipped > unclipped).to(logprobs.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float,
    agg: LossAgg,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: 0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped within clip_eps of
    the rollout-time value. All inputs [B, T]. Metrics: vf_loss, vf_clipfrac (fraction of tokens
    where the clipped error is the larger one), value_mean.
    """
    mask_f = mask.to(values.dtype)
    values_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    err_unclipped = (values - returns) ** 2
    err_clipped = (values_clipped - returns) ** 2
    loss_mat = 0.5 * torch.maximum(err_unclipped, err_clipped)
    loss = aggregate(loss_mat, mask_f, agg)
    with torch.no_grad():
        metrics = {
            "vf_loss": loss.detach(),
            "vf_clipfrac": masked_mean((err_clipped > err_unclipped).to(values.dtype), mask_f),
            "value_mean": masked_mean(values, mask_f),
        }
    return loss, metrics
