"""The actor / critic loss closures: however a batch is split into dp ranks and micro-batches (empty responses
included), the engine's sum over micro-batches and mean over dp equals the aggregate of the whole batch.

This replays TrainEngine.step's arithmetic (LossNorm from whole-batch counts / dp, loss summed over micro-batches,
gradients averaged over dp) on plain tensors; tests/ranks/engines/test_actor_loss_ranks.py checks it on real gloo ranks.
"""
from types import SimpleNamespace

import pytest
import torch

from rlhf_dyna.algos.losses import LOSS_AGGS, aggregate, policy_loss_tokens
from rlhf_dyna.config import AlgorithmConfig
from rlhf_dyna.orchestrator.objectives import actor_loss, critic_loss
from rlhf_dyna.train.engine import LossNorm, token_logprobs

B, T, V, MAX_NEW = 8, 7, 5, 4


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    for row, length in enumerate([4, 0, 2, 1, 0, 3, 4, 0]):  # three empty responses
        mask[row, 3 : 3 + length] = 1
    return {
        "input_ids": torch.randint(0, V, (B, T), generator=g),
        "response_mask": mask,
        "old_logprobs": -torch.rand(B, T, generator=g),
        "ref_logprobs": -torch.rand(B, T, generator=g),
        "advantages": torch.randn(B, generator=g),
        "old_values": torch.randn(B, T, generator=g),
        "returns": torch.randn(B, T, generator=g),
    }


def _norm(rows: list[dict], dp: int) -> LossNorm:
    mask = torch.cat([r["response_mask"] for r in rows])
    return LossNorm(num_tokens=float(mask.sum()) / dp, num_sequences=mask.shape[0] / dp,
                    num_nonempty_sequences=float((mask.sum(-1) > 0).sum()) / dp)


def _engine_loss(loss_fn, batch, logits, dp: int, mbs: int):
    """sum over micro-batches, mean over dp ranks (what backward + FSDP's reduce-scatter compute)."""
    shards = [{k: v[r * B // dp : (r + 1) * B // dp] for k, v in batch.items()} for r in range(dp)]
    logit_shards = [logits[r * B // dp : (r + 1) * B // dp] for r in range(dp)]
    norm = _norm(shards, dp)
    total, metrics = 0.0, {}
    for shard, lg in zip(shards, logit_shards):
        for i in range(0, shard["input_ids"].shape[0], mbs):
            mb = {k: v[i : i + mbs] for k, v in shard.items()}
            out = SimpleNamespace(logits=lg[i : i + mbs], values=lg[i : i + mbs, :, 0])
            loss, m = loss_fn(out, mb, norm)
            total = total + loss / dp
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v / dp
    return total, metrics


@pytest.mark.parametrize("agg", LOSS_AGGS)
@pytest.mark.parametrize("entropy_coef,kl_coef", [(0.0, 0.0), (0.01, 0.1)])
def test_actor_loss_equals_whole_batch_aggregate_in_every_layout(agg, entropy_coef, kl_coef):
    alg = AlgorithmConfig(loss_agg=agg, entropy_coef=entropy_coef, kl_coef=kl_coef, clip_ratio_c=3.0)
    batch = _batch()
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(1), requires_grad=True)
    fn = actor_loss(alg, temperature=1.0, max_new_tokens=MAX_NEW)
    # the whole batch's aggregate, computed directly (not through global_scale)
    lp = token_logprobs(logits, batch["input_ids"])
    loss_mat, _ = policy_loss_tokens(lp, batch["old_logprobs"], batch["advantages"], 0.2, 0.2, 3.0)
    expected = aggregate(loss_mat, batch["response_mask"], agg, MAX_NEW)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    for dp, mbs in [(1, B), (1, 1), (2, 4), (2, 1), (4, 2), (8, 1)]:
        total, metrics = _engine_loss(fn, batch, logits, dp, mbs)
        if entropy_coef == 0 and kl_coef == 0:
            assert total.item() == pytest.approx(expected.item(), abs=1e-6), (agg, dp, mbs)
            (grad,) = torch.autograd.grad(total, logits)
            torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
        assert metrics["pg_loss"] == pytest.approx(expected.item(), abs=1e-6), (agg, dp, mbs)
        reference, _ = _engine_loss(fn, batch, logits, 1, B)
        assert total.item() == pytest.approx(reference.item(), abs=1e-6)
        assert "entropy" in metrics and metrics["entropy"] > 0


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy():
    batch = _batch()
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(1))
    plain, m = _engine_loss(actor_loss(AlgorithmConfig(), 1.0, MAX_NEW), batch, logits, 2, 2)
    bonus, mb = _engine_loss(actor_loss(AlgorithmConfig(entropy_coef=0.5), 1.0, MAX_NEW), batch, logits, 2, 2)
    assert bonus.item() == pytest.approx(plain.item() - 0.5 * m["entropy"], abs=1e-6)
    assert mb["entropy_loss"] == pytest.approx(m["entropy"], abs=1e-6)  # token_mean: the same number


@pytest.mark.parametrize("agg", LOSS_AGGS)
def test_critic_loss_equals_whole_batch_aggregate_in_every_layout(agg):
    alg = AlgorithmConfig(loss_agg=agg)
    batch = _batch()
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(2))
    fn = critic_loss(alg, MAX_NEW)
    reference, m_ref = _engine_loss(fn, batch, logits, 1, B)
    for dp, mbs in [(1, 1), (2, 1), (4, 2)]:
        total, m = _engine_loss(fn, batch, logits, dp, mbs)
        assert total.item() == pytest.approx(reference.item(), abs=1e-6)
        assert m["vf_loss"] == pytest.approx(m_ref["vf_loss"], abs=1e-6)
