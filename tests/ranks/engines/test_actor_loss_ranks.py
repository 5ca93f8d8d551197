"""actor_loss through the real TrainEngine on 2 gloo ranks (dp=2, micro-batches of 1, empty responses): the loss,
pg_loss and gradients equal those of the whole global batch's aggregate on one unsharded copy of the model."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.algos.losses import aggregate, policy_loss_tokens
from rlhf_dyna.config import AlgorithmConfig
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.orchestrator.objectives import actor_loss
from rlhf_dyna.train.engine import TrainEngine, position_ids_from_mask, token_logprobs
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import random_batch, tiny_spec
from tests.multirank import run_ranks

MAX_NEW = 6


def _global_batch() -> dict[str, torch.Tensor]:
    batch = random_batch(seed=7, batch=4)
    batch["response_mask"] = batch["response_mask"].float()
    batch["response_mask"][1] = 0  # an empty response on rank 0
    batch["response_mask"][2, 8:] = 0  # a short one on rank 1
    g = torch.Generator().manual_seed(8)
    batch["old_logprobs"] = -3.0 - torch.rand(batch["input_ids"].shape, generator=g)
    batch["advantages"] = torch.tensor([1.0, -0.5, -1.0, 0.5])
    return batch


def _expected(model, batch, agg):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=position_ids_from_mask(batch["attention_mask"]), use_cache=False)
    lp = token_logprobs(out.logits, batch["input_ids"])
    loss_mat, _ = policy_loss_tokens(lp, batch["old_logprobs"], batch["advantages"], 0.2, 0.2, 3.0)
    return aggregate(loss_mat, batch["response_mask"], agg, MAX_NEW)


def _check(rank: int, world: int) -> None:
    for agg in ("seq_mean_token_mean", "seq_mean_token_sum_norm"):
        _check_agg(rank, world, agg)


def _check_agg(rank: int, world: int, agg: str) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    engine = TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=None, micro_batch_size=1)
    batch = _global_batch()
    mine = {k: v[rank * 2 : rank * 2 + 2] for k, v in batch.items()}
    metrics = engine.step(mine, actor_loss(AlgorithmConfig(loss_agg=agg), 1.0, MAX_NEW))
    reference = build_policy(tiny_spec(), seed=3)
    expected = _expected(reference, batch, agg)
    expected.backward()
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-5), (agg, metrics)
    assert metrics["pg_loss"] == pytest.approx(expected.item(), abs=1e-5), (agg, metrics)
    ref_grads = dict(reference.named_parameters())
    for name, p in engine.model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        torch.testing.assert_close(grad, ref_grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.timeout(180)
def test_actor_loss_on_two_ranks_matches_whole_batch_for_each_aggregation() -> None:
    run_ranks(_check, 2)
