"""Loss functions handed to TrainEngine.step: actor (GRPO/PPO), critic, and supervised warm-up.

Each loss is this micro-batch's numerator of its aggregate divided by the *whole batch's* denominator (tokens,
non-empty sequences, or rows * norm_len; see algos.losses), so that summing micro-batch gradients and averaging
over dp gives exactly the gradient of the aggregate over the whole global batch (see TrainEngine's LossNorm),
however the batch is split, empty responses included.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..algos.entropy import token_entropy
from ..algos.kl import kl_penalty
from ..algos.losses import POLICY_LOSSES, agg_denominator, aggregate, canonical_agg, value_loss
from ..config import AlgorithmConfig
from ..train.engine import LossNorm, token_logprobs

LossFn = Callable[[object, dict[str, Tensor], LossNorm], tuple[Tensor, dict[str, float]]]


def global_denominator(norm: LossNorm, agg: str, norm_len: int | None) -> float:
    """The whole batch's count for `agg`, per dp rank (as LossNorm's counts are)."""
    agg = canonical_agg(agg)
    if agg == "token_mean":
        return norm.num_tokens
    if agg == "seq_mean_token_sum_norm":
        return norm.num_sequences * float(norm_len)
    if norm.num_nonempty_sequences <= 0:  # the engine clamps a real count to >= 1 / dp; 0 means it never counted
        raise ValueError(f"loss_agg={agg} divides by the batch's non-empty sequences, but the engine's LossNorm has "
                         f"num_nonempty_sequences={norm.num_nonempty_sequences}; the engine must count the rows with "
                         f"at least one loss-mask token over the dp group (TrainEngine.step does), or use token_mean.")
    return norm.num_nonempty_sequences


def global_scale(mask: Tensor, norm: LossNorm, agg: str, norm_len: int | None = None) -> Tensor:
    """Factor turning a micro-batch-local aggregate into its share of the global aggregate."""
    return agg_denominator(mask, agg, norm_len) / global_denominator(norm, agg, norm_len)


AGGREGATED = ("pg_loss", "kl", "vf_loss", "entropy_loss")  # reduced with loss_agg; others are masked token means


def global_shares(metrics: dict[str, Tensor], mask: Tensor, norm: LossNorm, agg: str,
                  norm_len: int | None = None) -> dict[str, float]:
    """Each micro-batch metric times its share of the global batch, so that the engine's sum over micro-batches and
    mean over dp is the whole batch's value, however the layout splits it into micro-batches."""
    return {k: float(v * (global_scale(mask, norm, agg, norm_len) if k in AGGREGATED
                          else global_scale(mask, norm, "token_mean")))
            for k, v in metrics.items()}


def loss_norm_len(alg: AlgorithmConfig, max_new_tokens: int) -> int:
    return alg.loss_norm_len or max_new_tokens


def kl_in_loss(alg: AlgorithmConfig) -> bool:
    return alg.kl_coef > 0 and not alg.kl_in_reward


def old_logprobs_needed(alg: AlgorithmConfig) -> bool:
    """Whether the prepare phase runs the actor's forward for the old log-probs: only where the policy moves before a
    row's last optimizer step (several epochs or mini-batches) or the rewards read a KL to the reference before
    training. Otherwise the old policy is the current one and the loss takes its own forward's log-probs, detached."""
    return alg.epochs > 1 or alg.mini_batches > 1 or (alg.kl_coef > 0 and alg.kl_in_reward)


def actor_loss(alg: AlgorithmConfig, temperature: float, max_new_tokens: int = 0,
               kl_coef: float | None = None) -> LossFn:
    """kl_coef: the controller's current coefficient (default alg.kl_coef)."""
    coef = alg.kl_coef if kl_coef is None else kl_coef
    agg, norm_len = alg.loss_agg, loss_norm_len(alg, max_new_tokens)

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        logprobs = token_logprobs(out.logits, mb["input_ids"], temperature)
        # without the prepare phase's forward (old_logprobs_needed) the old policy is this forward's: ratio 1
        old_logprobs = mb["old_logprobs"] if "old_logprobs" in mb else logprobs.detach()
        loss_mat, terms = POLICY_LOSSES[alg.policy_loss].fn(logprobs, old_logprobs, mb["advantages"], alg)
        loss = aggregate(loss_mat, mask, agg, norm_len)
        metrics = {"pg_loss": loss.detach(), **{k: _token_mean(v, mask) for k, v in terms.items()}}
        # entropy from the logits this forward already made; a graph only when the bonus needs its gradient
        with torch.set_grad_enabled(alg.entropy_coef > 0 and torch.is_grad_enabled()):
            entropy = token_entropy(out.logits, temperature, length=mask.shape[1])
        metrics["entropy"] = _token_mean(entropy.detach(), mask)
        if alg.entropy_coef > 0:
            entropy_agg = aggregate(entropy, mask, agg, norm_len)
            loss = loss - alg.entropy_coef * entropy_agg
            metrics["entropy_loss"] = entropy_agg.detach()
        if kl_in_loss(alg):
            kl = aggregate(kl_penalty(logprobs, mb["ref_logprobs"], alg.kl_estimator), mask, agg, norm_len)
            loss = loss + coef * kl
            metrics["kl"] = kl.detach()
        return loss * global_scale(mask, norm, agg, norm_len), global_shares(metrics, mask, norm, agg, norm_len)

    return loss_fn


def _token_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def critic_loss(alg: AlgorithmConfig, max_new_tokens: int = 0) -> LossFn:
    agg, norm_len = alg.loss_agg, loss_norm_len(alg, max_new_tokens)

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        loss, metrics = value_loss(out.values, mb["old_values"], mb["returns"], mask, alg.vf_clip, agg, norm_len)
        return loss * global_scale(mask, norm, agg, norm_len), global_shares(metrics, mask, norm, agg, norm_len)

    return loss_fn


def sft_loss() -> LossFn:
    """Token-mean cross-entropy on completion tokens (marked by response_mask)."""

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        nll = -token_logprobs(out.logits, mb["input_ids"])
        scaled = aggregate(nll, mask, "token_mean") * global_scale(mask, norm, "token_mean")
        return scaled, {"sft_loss": float(scaled.detach())}

    return loss_fn
