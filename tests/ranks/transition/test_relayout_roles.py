"""Relayout of the other engines the loop keeps on the actor's mesh: the critic (ValueModel) and the frozen reference."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import relayout
from rlhf_dyna.transition.trace import TraceRecorder
from tests.ranks.tiny_models import random_batch
from tests.multirank import run_ranks
from tests.ranks.transition.test_relayout import SPEC


def _roles(rank: int, world: int) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    batch = random_batch(seed=7, batch=2)
    critic = TrainEngine(build_critic(SPEC, seed=1), mesh, lr=1e-2)
    critic.step(batch, lambda out, mb, norm: ((out.values * mb["response_mask"]).pow(2).sum() / norm.num_tokens, {}))
    reference = TrainEngine(build_policy(SPEC, seed=2), mesh, trainable=False)
    values = critic.values(batch["input_ids"], batch["attention_mask"])
    logprobs = reference.logprobs(batch["input_ids"], batch["attention_mask"])

    recorder = TraceRecorder(rank)
    layout = ParallelLayout(dp=1, tp=world, zero=3)
    critic, stats = relayout(critic, layout, recorder=recorder)
    reference, _ = relayout(reference, layout)
    assert reference.optimizer is None and critic.mesh is reference.mesh  # one mesh per layout, shared
    # same outputs after the move: weights, and buffers such as the rotary frequencies, came across
    torch.testing.assert_close(critic.values(batch["input_ids"], batch["attention_mask"]), values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reference.logprobs(batch["input_ids"], batch["attention_mask"]), logprobs, rtol=1e-5, atol=1e-6)
    assert critic.step(batch, lambda out, mb, n: (out.values.pow(2).mean(), {}))["loss"] >= 0

    received = torch.tensor([stats.bytes_received], dtype=torch.float64)
    dist.all_reduce(received)
    assert float(received) > stats.bytes_received > 0 and stats.rounds >= 1  # every rank received a share
    (event,) = recorder.events
    assert event.rank == rank and event.args["bytes_received"] == stats.bytes_received


@pytest.mark.timeout(120)
def test_critic_and_frozen_reference_relayout_give_the_same_outputs() -> None:
    run_ranks(_roles, 2)
