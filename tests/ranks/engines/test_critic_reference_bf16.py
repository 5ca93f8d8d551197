"""Value model training, a frozen reference engine, and bf16 mixed precision on FSDP2 (dp=2)."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.train.engine import LossNorm, TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks


def _value_loss(outputs, micro_batch: dict[str, torch.Tensor], norm: LossNorm) -> tuple[torch.Tensor, dict[str, float]]:
    mask = micro_batch["response_mask"].float()
    return ((outputs.values - 0.5) ** 2 * mask).sum() / norm.num_tokens, {}


def _checks(rank: int, world: int) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    batch = random_batch(seed=rank, batch=2)
    ids, mask = batch["input_ids"], batch["attention_mask"]

    reference = TrainEngine(build_policy(tiny_spec(), seed=7), mesh, trainable=False)
    policy = TrainEngine(build_policy(tiny_spec(), seed=7), mesh, lr=1e-2, precision="bf16")
    ref_before = reference.logprobs(ids, mask)
    bf16_before = policy.logprobs(ids, mask)
    assert ref_before.dtype == torch.float32 and ref_before.shape == ids.shape
    assert (bf16_before - ref_before).abs().max() < 0.1  # bf16 compute on the same weights
    losses = [policy.step(batch, nll_loss)["loss"] for _ in range(3)]
    assert losses[-1] < losses[0], losses
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in policy.model.parameters())  # fp32 masters
    assert torch.equal(reference.logprobs(ids, mask), ref_before)  # the reference never moves
    with pytest.raises(RuntimeError, match="trainable=False"):
        reference.step(batch, nll_loss)

    critic = TrainEngine(build_critic(tiny_spec(), seed=1), mesh, lr=2e-3)
    values = critic.values(ids, mask)
    assert values.shape == ids.shape
    value_losses = [critic.step(batch, _value_loss)["loss"] for _ in range(5)]
    assert value_losses[-1] < value_losses[0] * 0.5, value_losses


@pytest.mark.timeout(120)
def test_critic_reference_and_bf16_on_fsdp_dp2() -> None:
    run_ranks(_checks, 2)
