"""Advantage estimators against hand-computed values."""
import math

import pytest
import torch

from rlhf_dyna.algos.estimators import (
    discounted_returns, dr_grpo_advantages, group_centred_scores, reinforce_plus_plus, rloo_advantages,
)
from rlhf_dyna.algos.grpo import group_advantages


def test_grpo_unbiased_std_by_hand():
    # group [0, 1, 2]: mean 1, sample std 1 -> -1, 0, 1; population std sqrt(2/3) -> +-1.2247
    rewards = torch.tensor([0.0, 1.0, 2.0])
    assert torch.allclose(group_advantages(rewards, 3, True, eps=0.0, unbiased=True), torch.tensor([-1.0, 0.0, 1.0]))
    assert group_advantages(rewards, 3, True, eps=0.0)[2].item() == pytest.approx(math.sqrt(3 / 2), abs=1e-5)


def test_dr_grpo_only_centres():
    adv = dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0]), n=3)
    assert torch.allclose(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3]))


def test_rloo_by_hand():
    # group [1, 0, 0, 0]: 1 - 0 = 1; 0 - 1/3 = -1/3 each
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0]), n=4)
    assert torch.allclose(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 0.0]))


def test_rloo_is_n_over_n_minus_1_times_centred():
    torch.manual_seed(0)
    r = torch.rand(20)
    assert torch.allclose(rloo_advantages(r, 5), dr_grpo_advantages(r, 5) * 5 / 4, atol=1e-6)


def test_rloo_rejects_n_1():
    with pytest.raises(ValueError, match="n >= 2"):
        rloo_advantages(torch.zeros(3), 1)


def test_discounted_returns_by_hand_skip_padding():
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 1, 0]])  # position 2 is a gap, position 4 padding
    ret = discounted_returns(rewards, mask, gamma=0.5)
    # G3 = 2; G1 = 1 + 0.5*2 = 2; G0 = 0 + 0.5*2 = 1; masked positions 0
    assert torch.allclose(ret, torch.tensor([[1.0, 2.0, 0.0, 2.0, 0.0]]))


def test_reinforce_plus_plus_whitens_returns_over_the_batch():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # outcome on the last token; gamma 1 -> returns [[1,1],[0,0]]
    mask = torch.ones(2, 2)
    adv, ret = reinforce_plus_plus(rewards, mask, gamma=1.0)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    # mean 0.5, population std 0.5 -> +-1
    assert torch.allclose(adv, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), atol=1e-6)


def test_reinforce_plus_plus_reduce_gives_whole_batch_statistics():
    # two "ranks" each holding one row must whiten like one rank holding both
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    whole, _ = reinforce_plus_plus(rewards, mask, 1.0)
    halves = [(rewards[i:i + 1], mask[i:i + 1]) for i in range(2)]
    rets = [discounted_returns(r, m, 1.0) for r, m in halves]
    # whiten asks `reduce` for two sums over ranks: [count, total] (2 numbers), then the squared deviations (1)
    partial: dict[int, torch.Tensor] = {}
    reduce = lambda t: partial[t.numel()]
    partial[2] = sum(torch.stack([m.sum(), (g * m).sum()]) for g, (_, m) in zip(rets, halves))
    mean = partial[2][1] / partial[2][0]
    partial[1] = sum((((g - mean) * m) ** 2).sum() for g, (_, m) in zip(rets, halves)).reshape(())
    for i, (r, m) in enumerate(halves):
        adv, _ = reinforce_plus_plus(r, m, 1.0, reduce=reduce)
        assert torch.allclose(adv, whole[i:i + 1], atol=1e-6)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_first():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert torch.allclose(group_centred_scores(scores, 2), torch.tensor([0.5, -0.5, 0.0, 0.0]))
