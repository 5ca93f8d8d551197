"""The names algorithm settings choose from: config validation reads them before any rank starts, without torch."""
from __future__ import annotations

LOSS_AGGS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "low_var_kl")
KL_CONTROLLERS = ("fixed", "adaptive")
