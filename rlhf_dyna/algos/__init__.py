"""Advantage estimators, policy / value losses, KL penalties and controllers: pure tensor functions."""
from rlhf_dyna.algos.entropy import token_entropy
from rlhf_dyna.algos.estimators import (
    ADV_ESTIMATORS, discounted_returns, dr_grpo_advantages, group_centred_scores, reinforce_plus_plus, rloo_advantages,
)
from rlhf_dyna.algos.grpo import broadcast_to_tokens, group_advantages
from rlhf_dyna.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, kl_low_var, kl_penalty
from rlhf_dyna.algos.kl_control import AdaptiveKLController, FixedKLController, make_kl_controller
from rlhf_dyna.algos.losses import (
    LOSS_AGGS, agg_denominator, agg_numerator, aggregate, masked_mean, policy_loss, policy_loss_tokens, value_loss,
)
from rlhf_dyna.algos.ppo import gae, token_rewards, whiten

__all__ = [
    "ADV_ESTIMATORS", "AdaptiveKLController", "FixedKLController", "KL_ESTIMATORS", "LOSS_AGGS", "agg_denominator",
    "agg_numerator", "aggregate", "broadcast_to_tokens", "discounted_returns", "dr_grpo_advantages", "gae",
    "group_advantages", "group_centred_scores", "kl_k1", "kl_k2", "kl_k3", "kl_low_var", "kl_penalty",
    "make_kl_controller", "masked_mean", "policy_loss", "policy_loss_tokens", "reinforce_plus_plus",
    "rloo_advantages", "token_entropy", "token_rewards", "value_loss", "whiten",
]
