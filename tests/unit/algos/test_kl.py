import math

import pytest
import torch

from rlhf_dyna.algos.kl import kl_k1, kl_k2, kl_k3, kl_penalty

LP = torch.tensor([math.log(0.5)])
REF = torch.tensor([math.log(0.25)])


def test_estimators_by_hand():
    # log p - log q = log 2
    assert kl_k1(LP, REF).item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_k2(LP, REF).item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)
    # q/p - log(q/p) - 1 = 0.5 + log 2 - 1
    assert kl_k3(LP, REF).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_k3_non_negative_and_zero_when_equal():
    torch.manual_seed(0)
    lp, ref = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (kl_k3(lp, ref) >= 0).all()
    tiny = lp + 1e-7
    assert (kl_k3(lp, tiny) >= 0).all()
    assert torch.equal(kl_k3(lp, lp), torch.zeros(1000))


def test_k3_estimates_true_kl_in_expectation():
    # p = softmax(a), q = softmax(b); sample x ~ p and average k3 -> KL(p || q)
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0]), dim=0)
    logq = torch.log_softmax(torch.tensor([0.0, 0.5, 0.0]), dim=0)
    true_kl = (logp.exp() * (logp - logq)).sum().item()
    x = torch.multinomial(logp.exp(), 200_000, replacement=True)
    assert kl_k3(logp[x], logq[x]).mean().item() == pytest.approx(true_kl, rel=0.03)
    assert kl_k1(logp[x], logq[x]).mean().item() == pytest.approx(true_kl, rel=0.03)


@pytest.mark.parametrize("name,fn", [("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)])
def test_kl_penalty_selects_by_name(name, fn):
    assert torch.equal(kl_penalty(LP, REF, name), fn(LP, REF))


def test_kl_penalty_unknown_name():
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(LP, REF, "k4")
