import math

import pytest
import torch

from rlhf_dyna.algos.losses import aggregate, masked_mean, policy_loss, value_loss

LOG = math.log

# Two sequences, T=3. Row 1's last token is padding holding garbage that must not count.
LOG_RATIO = torch.tensor([[LOG(1.5), LOG(0.5), 0.0], [LOG(0.5), 0.0, 50.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, -2.0, 1e6]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# Per-token loss max(-A r, -A clip(r, 0.8, 1.2)), by hand:
#   row 0: r=1.5,A=1 -> max(-1.5,-1.2)=-1.2 (clipped); r=0.5,A=1 -> max(-0.5,-0.8)=-0.5; r=1,A=-1 -> 1
#   row 1: r=0.5,A=-2 -> max(1.0,1.6)=1.6 (clipped); r=1,A=-2 -> 2
TOKEN_MEAN = (-1.2 - 0.5 + 1.0 + 1.6 + 2.0) / 5
SEQ_MEAN = ((-1.2 - 0.5 + 1.0) / 3 + (1.6 + 2.0) / 2) / 2


def _loss(agg, low=0.2, high=0.2, adv=ADV):
    old = torch.zeros(2, 3)
    lp = (old + LOG_RATIO).requires_grad_(True)
    loss, metrics = policy_loss(lp, old, adv, MASK, low, high, agg)
    return lp, loss, metrics


def test_policy_loss_token_mean_by_hand():
    _, loss, metrics = _loss("token_mean")
    assert loss.item() == pytest.approx(TOKEN_MEAN, abs=1e-6)
    assert metrics["pg_loss"].item() == pytest.approx(TOKEN_MEAN, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    # k1 of KL(old || new): mean of old - new over the 5 response tokens
    assert metrics["ppo_kl"].item() == pytest.approx(-(LOG(1.5) + 2 * LOG(0.5)) / 5, abs=1e-6)
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1 + 0.5 + 1) / 5, abs=1e-6)


def test_policy_loss_seq_mean_by_hand():
    _, loss, _ = _loss("seq_mean")
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-6)


def test_clipped_tokens_get_no_gradient_and_unclipped_do():
    lp, loss, _ = _loss("token_mean")
    loss.backward()
    # d/dlp of -A * exp(lp - old) / 5 = -A * r / 5; clipped tokens and padding: 0
    expected = torch.tensor([[0.0, -0.5 / 5, 1.0 / 5], [0.0, 2.0 / 5, 0.0]])
    assert torch.allclose(lp.grad, expected, atol=1e-6)


def test_asymmetric_clip_high_lets_ratio_1_5_through():
    _, loss, metrics = _loss("token_mean", high=0.6)
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.0 + 1.6 + 2.0) / 5, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 5)


def test_per_sequence_advantages_broadcast_like_per_token():
    seq_adv = torch.tensor([0.7, -1.3])
    _, loss_seq, _ = _loss("token_mean", adv=seq_adv)
    _, loss_tok, _ = _loss("token_mean", adv=seq_adv[:, None].expand(2, 3))
    assert loss_seq.item() == pytest.approx(loss_tok.item())


def test_on_policy_loss_is_minus_mean_advantage_and_nothing_clipped():
    lp = torch.randn(2, 3)
    loss, metrics = policy_loss(lp, lp.clone(), ADV, MASK, 0.2, 0.2, "token_mean")
    assert loss.item() == pytest.approx(-(1 + 1 - 1 - 2 - 2) / 5, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == 0.0
    assert metrics["ppo_kl"].item() == 0.0


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.5, 0.0, 9.0]])
    old = torch.tensor([[0.5, 0.4, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_eps=0.2, agg="token_mean")
    # tok0: v_clip=0.7, max(1.0, 0.49) -> 0.5; tok1: v_clip=v -> 0.5*0.25; tok2: v_clip=0.3, max(0, 0.09)
    assert loss.item() == pytest.approx((0.5 + 0.125 + 0.045) / 3, abs=1e-6)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["value_mean"].item() == pytest.approx(0.5)


def test_value_clipfrac_counts_no_round_off_within_the_range():
    # old + (v - old) rounds away from v for about a third of independent values; none is past the range
    gen = torch.Generator().manual_seed(0)
    old, values = torch.randn(1, 4096, generator=gen), torch.randn(1, 4096, generator=gen)
    returns = torch.randn(1, 4096, generator=gen)
    assert ((old + (values - old)) != values).any()  # the case exists
    _, metrics = value_loss(values, old, returns, torch.ones(1, 4096), clip_eps=1e9, agg="token_mean")
    assert metrics["vf_clipfrac"].item() == 0.0


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_seq_mean_skips_empty_sequences():
    loss_mat = torch.tensor([[2.0, 4.0], [100.0, 100.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate(loss_mat, mask, "seq_mean").item() == pytest.approx(3.0)
    assert aggregate(loss_mat, mask, "token_mean").item() == pytest.approx(3.0)


def test_token_and_seq_mean_differ_for_unequal_lengths():
    loss_mat = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss_mat, mask, "token_mean").item() == pytest.approx(7 / 4)
    assert aggregate(loss_mat, mask, "seq_mean").item() == pytest.approx(5 / 2)


def test_unknown_agg_rejected():
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "sum")
