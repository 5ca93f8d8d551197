"""Per-token estimators of KL(policy || reference) from sampled-token log-probabilities.

Tokens are sampled from the policy, so log_ratio = logprobs - ref_logprobs estimates the KL in
expectation (k1); k2 and k3 are Schulman's lower-variance alternatives (k3 is unbiased and >= 0).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """log p - log q: unbiased, high variance, can be negative per token."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """0.5 * (log p - log q)^2: biased, low variance, non-negative."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """exp(q - p) - (q - p) - 1 in log space: unbiased, non-negative."""
    log_ratio = ref_logprobs - logprobs
    # expm1 keeps precision for tiny ratios; the clamp removes rounding just below zero.
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate by estimator name: "k1" | "k2" | "k3". Same shape as inputs."""
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}") from None
    return fn(logprobs, ref_logprobs)
