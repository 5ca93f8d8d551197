"""Pairwise losses of reward-model training (algorithm.name=reward_model): the chosen and rejected completions'
scores ([P] each) -> one loss per pair, registered by name and chosen by `algorithm.pair_loss`. Pure tensor functions."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

PairLoss = Callable[[Tensor, Tensor, object], Tensor]
PAIR_LOSSES: dict[str, PairLoss] = {}


def register_pair_loss(name: str) -> Callable[[PairLoss], PairLoss]:
    def add(fn: PairLoss) -> PairLoss:
        PAIR_LOSSES[name] = fn
        return fn

    return add


@register_pair_loss("bradley_terry")
def bradley_terry(chosen: Tensor, rejected: Tensor, alg=None) -> Tensor:
    """-log sigmoid(r_chosen - r_rejected): the negative log-likelihood of the preference under the Bradley-Terry
    model (Bradley & Terry 1952), the reward-model loss of InstructGPT (Ouyang et al. 2022)."""
    return -torch.nn.functional.logsigmoid(chosen.float() - rejected.float())
