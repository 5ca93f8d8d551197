"""The names algorithm settings choose from: config validation reads them before any rank starts, without torch."""
from __future__ import annotations

SEQUENCE_LEVEL = ("grpo", "dr_grpo", "rloo")  # one advantage per sample, from the rewards of its prompt's group
TOKEN_LEVEL = ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")  # per token, whitened over the batch
ADV_ESTIMATORS = SEQUENCE_LEVEL + TOKEN_LEVEL
GROUP_BASELINE = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline")  # need n >= 2 samples per prompt
LOSS_AGGS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "low_var_kl")
KL_CONTROLLERS = ("fixed", "adaptive")
