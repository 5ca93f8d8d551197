import pytest
import torch

from rlhf_dyna.algos.ppo import gae, token_rewards, whiten


def test_gae_three_tokens_by_hand():
    # gamma=0.9, lam=0.8, gamma*lam=0.72; value after the last token is 0.
    #   t2: delta = 1 - 0.7 = 0.3                      A2 = 0.3
    #   t1: delta = 0.9*0.7 - 0.6 = 0.03               A1 = 0.03 + 0.72*0.3   = 0.246
    #   t0: delta = 0.9*0.6 - 0.5 = 0.04               A0 = 0.04 + 0.72*0.246 = 0.21712
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0]]), atol=1e-6)


def test_gae_right_padding_ignores_garbage_and_batches_independently():
    # Row 1 ends after 2 tokens; its padded reward 5 and value 100 must not matter.
    #   t1: delta = 1 - 0.6 = 0.4; t0: delta = 0.9*0.6 - 0.5 = 0.04, A0 = 0.04 + 0.72*0.4 = 0.328
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv[1], torch.tensor([0.328, 0.4, 0.0]), atol=1e-6)
    assert torch.allclose(ret[1], torch.tensor([0.828, 1.0, 0.0]), atol=1e-6)
    assert torch.allclose(adv[0], torch.tensor([0.21712, 0.246, 0.3]), atol=1e-6)


def test_gae_with_gamma_lam_one_is_monte_carlo_return_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 1.0]])
    values = torch.tensor([[0.3, 0.2, 0.9]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.tensor([[0.9, 0.8, 1.0]]), atol=1e-6)
    assert torch.allclose(adv, ret - values, atol=1e-6)


def test_gae_lam_zero_is_one_step_td():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2]])
    adv, _ = gae(rewards, values, torch.ones(1, 2), gamma=0.5, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.5 * 0.2 - 0.5, 1.0 - 0.2]]), atol=1e-6)


def test_token_rewards_score_on_last_response_token_with_kl():
    scores = torch.tensor([1.0, 0.5, 0.9])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    assert torch.equal(
        token_rewards(scores, mask),
        torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]),
    )
    with_kl = token_rewards(scores, mask, ref_kl=torch.full((3, 3), 0.1), kl_coef=0.5)
    expected = torch.tensor([[-0.05, -0.05, 0.95], [-0.05, 0.45, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(with_kl, expected, atol=1e-6)


def test_whiten_masked_population_stats():
    adv = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = whiten(adv, mask, eps=0.0)
    # mean 2, population var 2/3 -> (+-1) * sqrt(3/2)
    assert torch.allclose(out, torch.tensor([[-1.224745, 0.0, 1.224745, 0.0]]), atol=1e-5)
    kept = whiten(adv, mask, shift_mean=False, eps=0.0)
    assert torch.allclose(kept, torch.tensor([[0.775255, 2.0, 3.224745, 0.0]]), atol=1e-5)


def test_gae_values_do_not_get_gradients():
    values = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae(torch.zeros(1, 2), values, torch.ones(1, 2), 1.0, 1.0)
    assert not adv.requires_grad and not ret.requires_grad
    assert ret.sum().item() == pytest.approx(0.0)
