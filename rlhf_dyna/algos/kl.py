"""Per-token estimators of KL(policy || reference) from sampled-token log-probabilities.

Tokens are sampled from the policy, so log_ratio = logprobs - ref_logprobs estimates the KL in
expectation (k1); k2 and k3 are Schulman's lower-variance alternatives (k3 is unbiased and >= 0).
k3 exponentiates, so its log-ratio is clamped to +-KL_LOG_RATIO_CLAMP (finite value and gradient
for any input); `low_var_kl` is k3 with the result also capped at LOW_VAR_KL_MAX (veRL's
estimator of that name), which bounds the penalty of a single token.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .choices import KL_ESTIMATOR_NAMES

KL_LOG_RATIO_CLAMP = 20.0
LOW_VAR_KL_MAX = 10.0


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """log p - log q: unbiased, high variance, can be negative per token."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """0.5 * (log p - log q)^2: biased, low variance, non-negative."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """exp(q - p) - (q - p) - 1 in log space: unbiased, non-negative."""
    log_ratio = (ref_logprobs - logprobs).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    # expm1 keeps precision for tiny ratios; the clamp removes rounding just below zero.
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)


def kl_low_var(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 capped at LOW_VAR_KL_MAX per token."""
    return kl_k3(logprobs, ref_logprobs).clamp(max=LOW_VAR_KL_MAX)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = dict(
    zip(KL_ESTIMATOR_NAMES, (kl_k1, kl_k2, kl_k3, kl_low_var), strict=True))


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate by estimator name: "k1" | "k2" | "k3" | "low_var_kl". Same shape as inputs."""
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}") from None
    return fn(logprobs, ref_logprobs)
