import math

import pytest
import torch

from rlhf_dyna.algos.grpo import broadcast_to_tokens, group_advantages


def test_group_mean_and_population_std_by_hand():
    # group [0, 1, 2]: mean 1, population std sqrt(2/3) -> (+-1) / 0.81650 = +-1.22474
    adv = group_advantages(torch.tensor([0.0, 1.0, 2.0]), n=3, norm_by_std=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.224745, 0.0, 1.224745]), atol=1e-5)


def test_two_groups_normalised_and_constant_group_is_zero():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, n=4, norm_by_std=True)
    # group 1: mean 0.5, std 0.5 -> +-0.5 / (0.5 + 1e-6)
    expected_first = 0.5 / (0.5 + 1e-6)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]) * expected_first)
    assert torch.equal(adv[4:], torch.zeros(4))


def test_no_std_division_only_centres():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), n=4, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_constant_group_of_inexact_floats_is_exactly_zero():
    # mean(0.1, 0.1, 0.1) may round; without the explicit zeroing (r - mean) / eps would be noise.
    adv = group_advantages(torch.full((7,), 0.1), n=7, norm_by_std=True)
    assert torch.equal(adv, torch.zeros(7))
    assert not torch.isnan(adv).any()


def test_single_sample_groups_give_zero_not_nan():
    adv = group_advantages(torch.tensor([0.3, 0.9]), n=1, norm_by_std=True)
    assert torch.equal(adv, torch.zeros(2))


def test_std_normalised_group_has_unit_population_std():
    torch.manual_seed(0)
    adv = group_advantages(torch.rand(5 * 6), n=6, norm_by_std=True).view(5, 6)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(5), atol=1e-5)
    assert torch.allclose(adv.std(dim=1, unbiased=False), torch.ones(5), atol=1e-4)


@pytest.mark.parametrize("n", [0, 3])
def test_rejects_n_not_dividing(n):
    with pytest.raises(ValueError, match="n="):
        group_advantages(torch.zeros(4), n=n, norm_by_std=True)


def test_broadcast_to_tokens_zeroes_padding():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    assert not math.isnan(out.sum().item())
