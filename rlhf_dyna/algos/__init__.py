"""Advantage estimators, policy / value losses and KL penalties: pure tensor functions."""
from rlhf_dyna.algos.grpo import broadcast_to_tokens, group_advantages
from rlhf_dyna.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, kl_penalty
from rlhf_dyna.algos.losses import LOSS_AGGS, aggregate, masked_mean, policy_loss, value_loss
from rlhf_dyna.algos.ppo import gae, token_rewards, whiten

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGGS", "aggregate", "broadcast_to_tokens", "gae", "group_advantages",
    "kl_k1", "kl_k2", "kl_k3", "kl_penalty", "masked_mean", "policy_loss", "token_rewards",
    "value_loss", "whiten",
]
