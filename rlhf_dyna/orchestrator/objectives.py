"""Loss functions handed to TrainEngine.step: actor (GRPO/PPO), critic, and supervised warm-up.

Each loss is rescaled so that summing micro-batch gradients and averaging over dp gives exactly the
gradient of the chosen aggregate over the whole global batch (see TrainEngine's LossNorm).
"""
from __future__ import annotations

from typing import Callable

from torch import Tensor

from ..algos.kl import kl_penalty
from ..algos.losses import aggregate, policy_loss, value_loss
from ..config import AlgorithmConfig
from ..train.engine import LossNorm, token_logprobs

LossFn = Callable[[object, dict[str, Tensor], LossNorm], tuple[Tensor, dict[str, float]]]


def global_scale(mask: Tensor, norm: LossNorm, agg: str) -> Tensor:
    """Factor turning a micro-batch-local aggregate into its share of the global aggregate."""
    if agg == "token_mean":
        return mask.sum() / norm.num_tokens
    return (mask.sum(-1) > 0).sum() / norm.num_sequences


def metric_weight(micro_batch: dict[str, Tensor], norm: LossNorm) -> float:
    """Metrics are row-weighted so that the engine's sum over micro-batches and mean over dp is a global mean."""
    return micro_batch["input_ids"].shape[0] / norm.num_sequences


def actor_loss(alg: AlgorithmConfig, temperature: float) -> LossFn:
    kl_in_loss = alg.kl_coef > 0 and not (alg.name == "ppo" and alg.kl_in_reward)

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        logprobs = token_logprobs(out.logits, mb["input_ids"], temperature)
        loss, metrics = policy_loss(
            logprobs, mb["old_logprobs"], mb["advantages"], mask, alg.clip_eps_low, alg.clip_eps_high, alg.loss_agg
        )
        if kl_in_loss:
            kl = aggregate(kl_penalty(logprobs, mb["ref_logprobs"], alg.kl_estimator), mask, alg.loss_agg)
            loss = loss + alg.kl_coef * kl
            metrics["kl"] = kl.detach()
        weight = metric_weight(mb, norm)
        return loss * global_scale(mask, norm, alg.loss_agg), {k: float(v) * weight for k, v in metrics.items()}

    return loss_fn


def critic_loss(alg: AlgorithmConfig) -> LossFn:
    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        loss, metrics = value_loss(out.values, mb["old_values"], mb["returns"], mask, alg.vf_clip, alg.loss_agg)
        weight = metric_weight(mb, norm)
        return loss * global_scale(mask, norm, alg.loss_agg), {k: float(v) * weight for k, v in metrics.items()}

    return loss_fn


def sft_loss() -> LossFn:
    """Token-mean cross-entropy on completion tokens (marked by response_mask)."""

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        nll = -token_logprobs(out.logits, mb["input_ids"])
        loss = aggregate(nll, mask, "token_mean")
        return loss * global_scale(mask, norm, "token_mean"), {"sft_loss": float(loss.detach()) * metric_weight(mb, norm)}

    return loss_fn
