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


AGGREGATED = ("pg_loss", "kl", "vf_loss")  # reduced with loss_agg; every other metric is a masked token mean


def global_shares(metrics: dict[str, Tensor], mask: Tensor, norm: LossNorm, agg: str) -> dict[str, float]:
    """Each micro-batch metric times its share of the global batch, so that the engine's sum over micro-batches and
    mean over dp is the whole batch's value, however the layout splits it into micro-batches."""
    return {k: float(v * global_scale(mask, norm, agg if k in AGGREGATED else "token_mean"))
            for k, v in metrics.items()}


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
        return loss * global_scale(mask, norm, alg.loss_agg), global_shares(metrics, mask, norm, alg.loss_agg)

    return loss_fn


def critic_loss(alg: AlgorithmConfig) -> LossFn:
    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        loss, metrics = value_loss(out.values, mb["old_values"], mb["returns"], mask, alg.vf_clip, alg.loss_agg)
        return loss * global_scale(mask, norm, alg.loss_agg), global_shares(metrics, mask, norm, alg.loss_agg)

    return loss_fn


def sft_loss() -> LossFn:
    """Token-mean cross-entropy on completion tokens (marked by response_mask)."""

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        mask = mb["response_mask"]
        nll = -token_logprobs(out.logits, mb["input_ids"])
        scaled = aggregate(nll, mask, "token_mean") * global_scale(mask, norm, "token_mean")
        return scaled, {"sft_loss": float(scaled.detach())}

    return loss_fn
