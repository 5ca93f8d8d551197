"""Dual-clip, loss aggregation modes, entropy, and finiteness at extreme log-ratios / KLs, against values by hand."""
import math

import pytest
import torch

from rlhf_dyna.algos.entropy import token_entropy
from rlhf_dyna.algos.kl import KL_ESTIMATORS, LOW_VAR_KL_MAX, kl_penalty
from rlhf_dyna.algos.losses import LOSS_AGGS, aggregate, policy_loss


def test_dual_clip_caps_negative_advantage_at_c_times_abs_a():
    # ratio 5, A = -1: unclipped -A r = 5 > clipped 1.2 -> 5; dual-clip c=3 caps it at 3 and removes the gradient
    lp = torch.tensor([[math.log(5.0), math.log(5.0), 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    loss, m = policy_loss(lp, old, adv, mask, 0.2, 0.2, "token_mean", clip_ratio_c=3.0)
    # tok0 capped at 3; tok1 A=+1, r=5 -> max(-5, -1.2) = -1.2 (upper clip); tok2 on-policy -> 1
    assert loss.item() == pytest.approx((3.0 - 1.2 + 1.0) / 3, abs=1e-6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 1].item() == 0.0
    assert lp.grad[0, 2].item() == pytest.approx(1 / 3, abs=1e-6)  # d(-A e^lp)/dlp / 3 with A=-1
    # without dual-clip the same token costs 5
    loss_off, m_off = policy_loss(lp.detach(), old, adv, mask, 0.2, 0.2, "token_mean")
    assert loss_off.item() == pytest.approx((5.0 - 1.2 + 1.0) / 3, abs=1e-6)
    assert m_off["pg_clipfrac_lower"].item() == 0.0


# Rows: 3 tokens of loss 1, 2, 3; 1 token of loss 4; an empty response (its padding holds 100).
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize("agg,expected", [
    ("token_mean", (1 + 2 + 3 + 4) / 4),
    ("seq_mean_token_mean", (2.0 + 4.0) / 2),  # the empty row is left out
    ("seq_mean", (2.0 + 4.0) / 2),
    ("seq_mean_token_sum", (6.0 + 4.0) / 2),
    ("seq_mean_token_sum_norm", (6.0 + 4.0 + 0.0) / (3 * 5)),  # every row, constant length 5 (Dr. GRPO)
])
def test_aggregation_modes_by_hand(agg, expected):
    assert aggregate(LOSS, MASK, agg, norm_len=5).item() == pytest.approx(expected)


def test_token_sum_norm_needs_its_constant():
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(LOSS, MASK, "seq_mean_token_sum_norm")


def test_entropy_by_hand_and_aligned_with_logprobs():
    # position 0 predicts token 1: uniform over 4 -> log 4; position 1: one-hot-ish -> ~0; column 0 is 0
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]])
    ent = token_entropy(logits)
    assert ent.shape == (1, 3)
    assert ent[0, 0].item() == 0.0
    assert ent[0, 1].item() == pytest.approx(math.log(4), abs=1e-6)
    assert ent[0, 2].item() == pytest.approx(0.0, abs=1e-6)
    # temperature 2 flattens: entropy of softmax([0,0,0,0]/2) is still log 4; of [50,0,0,0]/2 still ~0
    p = torch.softmax(torch.tensor([1.0, 2.0, 3.0, 4.0]) / 2, 0)
    assert token_entropy(logits[:, [0, 2, 2]], temperature=2.0)[0, 2].item() == pytest.approx(
        float(-(p * p.log()).sum()), abs=1e-6)


@pytest.mark.parametrize("agg", LOSS_AGGS)
@pytest.mark.parametrize("log_ratio", [-100.0, -30.0, 30.0, 100.0])
def test_policy_loss_and_gradient_finite_at_extreme_log_ratios(agg, log_ratio):
    old = torch.zeros(2, 4)
    lp = torch.full((2, 4), log_ratio, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    for dual in (None, 3.0):
        loss, metrics = policy_loss(lp, old, adv, torch.ones(2, 4), 0.2, 0.28, agg, clip_ratio_c=dual, norm_len=4)
        (grad,) = torch.autograd.grad(loss, lp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), (agg, log_ratio, dual, loss, grad)
        assert all(torch.isfinite(v) for v in metrics.values())
        assert abs(loss.item()) < 1e9  # before the clamp: ~1e13 at 30, inf / NaN at 100


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
@pytest.mark.parametrize("gap", [-1e4, -100.0, 100.0, 1e4])
def test_kl_estimators_finite_with_finite_gradient(estimator, gap):
    lp = torch.full((3,), gap, requires_grad=True)
    ref = torch.zeros(3)
    kl = kl_penalty(lp, ref, estimator)
    (grad,) = torch.autograd.grad(kl.sum(), lp)
    assert torch.isfinite(kl).all() and torch.isfinite(grad).all(), (estimator, gap, kl, grad)
    if estimator == "low_var_kl":
        assert (kl <= LOW_VAR_KL_MAX).all()


def test_low_var_kl_equals_k3_for_small_gaps():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
