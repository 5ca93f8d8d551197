"""PPO policy and value losses, and the masked reductions they share.

Loss aggregation (`agg`) turns a per-token [B, T] loss into a scalar:
  token_mean               sum over response tokens / number of response tokens (long responses weigh more)
  seq_mean_token_mean      mean over non-empty sequences of each sequence's token mean (GRPO paper)
  seq_mean_token_sum       mean over non-empty sequences of each sequence's token sum
  seq_mean_token_sum_norm  sum over tokens / (sequences * norm_len), norm_len a constant such as max_new_tokens
                           (Dr. GRPO: no length bias, every sequence counts, empty ones included)
`seq_mean` is accepted as the old name of seq_mean_token_mean. Every mode is numerator / denominator where the
numerator is a sum over rows (`agg_numerator`) and the denominator a count (`agg_denominator`), so a batch split into
micro-batches or dp ranks gives the whole batch's value when each part divides by the *whole batch's* denominator.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .choices import LOSS_AGGS

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "seq_mean"]
AGG_ALIASES = {"seq_mean": "seq_mean_token_mean"}
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: beyond it the ratio carries no information, only overflow


def canonical_agg(agg: str) -> str:
    agg = AGG_ALIASES.get(agg, agg)
    if agg not in LOSS_AGGS:
        raise ValueError(f"agg must be one of {LOSS_AGGS} (or 'seq_mean'), got {agg!r}")
    return agg


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def agg_numerator(loss_mat: Tensor, mask: Tensor, agg: str) -> Tensor:
    """The sum-over-rows part of an aggregate (see the module doc); padding never counts."""
    agg = canonical_agg(agg)
    mask = mask.to(loss_mat.dtype)
    if agg == "seq_mean_token_mean":
        return masked_mean(loss_mat, mask, dim=-1).sum()  # empty rows give 0
    return torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat)).sum()


def agg_denominator(mask: Tensor, agg: str, norm_len: int | None = None) -> Tensor:
    """The count an aggregate divides by, over the rows of `mask`: tokens, non-empty sequences, or rows * norm_len."""
    agg = canonical_agg(agg)
    if agg == "token_mean":
        return mask.float().sum()
    if agg == "seq_mean_token_sum_norm":
        if not norm_len:
            raise ValueError("agg=seq_mean_token_sum_norm needs norm_len (a constant length, e.g. max_new_tokens)")
        return torch.tensor(float(mask.shape[0] * norm_len))
    return (mask.sum(dim=-1) > 0).float().sum()


def aggregate(loss_mat: Tensor, mask: Tensor, agg: str, norm_len: int | None = None) -> Tensor:
    """Reduce a per-token [B, T] loss to a scalar over this batch (0 if it has no response token)."""
    return agg_numerator(loss_mat, mask, agg) / agg_denominator(mask, agg, norm_len).clamp(min=1.0)


def policy_loss_tokens(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO clipped surrogate [B, T] (to minimise) and its per-token masked metrics.

    The ratio is clipped to [1-low, 1+high]; the log-ratio is clamped to +-LOG_RATIO_CLAMP first, so the loss and
    its gradient stay finite for any log-probabilities. Dual-clip (clip_ratio_c > 1, Ye et al. 2020): for negative
    advantages the loss is further capped at -A * clip_ratio_c, so one stale token with a huge ratio cannot dominate.
    Returns (loss_mat, metric tensors [B, T]: clipped upper, clipped lower (dual), log_ratio, ratio).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss_mat = torch.maximum(unclipped, clipped)
    lower = torch.zeros_like(loss_mat, dtype=torch.bool)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        lower = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(lower, cap, loss_mat)
    with torch.no_grad():
        terms = {"pg_clipfrac": (clipped > unclipped) & ~lower, "pg_clipfrac_lower": lower,
                 "ppo_kl": -log_ratio, "ratio_mean": ratio}
    return loss_mat, {k: v.to(logprobs.dtype).detach() for k, v in terms.items()}


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    fn: Callable  # (logprobs, old_logprobs, advantages, alg) -> (per-token loss [B, T], per-token metric terms)
    needs_old_logprobs: bool = True  # an importance ratio against the policy that generated the samples


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, needs_old_logprobs: bool = True):
    """Decorator: registers `fn` as the policy loss `name` (`algorithm.policy_loss` names one)."""
    def add(fn: Callable) -> Callable:
        POLICY_LOSSES[name] = PolicyLoss(name, fn, needs_old_logprobs)
        return fn

    return add


@register_policy_loss("ppo")
def ppo_clip(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, alg) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate with asymmetric clips and dual-clip (policy_loss_tokens)."""
    dual_clip = alg.clip_ratio_c if alg.clip_ratio_c > 0 else None
    return policy_loss_tokens(logprobs, old_logprobs, advantages, alg.clip_eps_low, alg.clip_eps_high, dual_clip)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    agg: str,
    clip_ratio_c: float | None = None,
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss over this batch (see policy_loss_tokens), aggregated with `agg`.

    logprobs, old_logprobs, response_mask: [B, T]. advantages: [B, T] per token, or [B] per sequence (GRPO).
    Metrics (detached 0-dim tensors): pg_loss, pg_clipfrac (fraction of response tokens whose gradient the
    ordinary clip removed), pg_clipfrac_lower (fraction capped by dual-clip), ppo_kl (k1 of KL(old || new)),
    ratio_mean.
    """
    loss_mat, terms = policy_loss_tokens(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high, clip_ratio_c)
    loss = aggregate(loss_mat, response_mask, agg, norm_len)
    metrics = {"pg_loss": loss.detach(), **{k: masked_mean(v, response_mask) for k, v in terms.items()}}
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float,
    agg: str,
    norm_len: int | None = None,
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
    loss = aggregate(loss_mat, mask_f, agg, norm_len)
    with torch.no_grad():
        # within the range old + (v - old) may differ from v by round-off: only an active clamp counts
        clipped = ((values - old_values).abs() > clip_eps) & (err_clipped > err_unclipped)
        metrics = {
            "vf_loss": loss.detach(),
            "vf_clipfrac": masked_mean(clipped.to(values.dtype), mask_f),
            "value_mean": masked_mean(values, mask_f),
        }
    return loss, metrics
