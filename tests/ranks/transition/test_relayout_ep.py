"""Online switches dp4 -> ep2 x dp2 -> dp4 of a tiny Qwen3-MoE by VPS plan on 4 gloo ranks: parameters and AdamW
state carried bit-exactly (experts regrouped over ep, everything else stays), and losses identical to a run without
switches."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.parallel_layout import LayoutSwitch, ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import layout_of
from tests.ranks.tiny_models import nll_loss
from tests.multirank import run_ranks
from tests.ranks.train.test_expert_parallel import MOE
from tests.ranks.transition._layout_switches import full_state, losses, rows, switch
EP = ParallelLayout(dp=4, tp=1, ep=2)
DP = ParallelLayout(dp=4, tp=1)


def _engine() -> TrainEngine:
    return TrainEngine(build_policy(MOE, seed=3), build_mesh(ParallelLayout(4, 1)), lr=1e-2, grad_clip=1.0, micro_batch_size=2)


def _carried_exactly(rank: int) -> None:
    engine = _engine()
    for step in range(2):
        engine.step(rows(engine, step), nll_loss)
    before = full_state(engine)
    engine, there = switch(engine, EP)
    assert layout_of(engine) == EP
    received = torch.tensor([there.bytes_received])
    torch.distributed.all_reduce(received)
    # ep inner: ranks 0 and 3 keep their dp4 experts, 1 and 2 swap theirs; every other shard stays
    assert (there.bytes_received > 0) == (rank in (1, 2)), (rank, there.bytes_received)
    experts = engine.model.model.layers[0].mlp.experts.down_proj
    assert experts.device_mesh.mesh_dim_names == ("edp", "ep") and experts.to_local().shape[0] == 2
    after = full_state(engine)
    assert after.keys() == before.keys()
    for key, tensor in after.items():
        assert torch.equal(tensor, before[key]), key
    engine.step(rows(engine, 2), nll_loss)  # it trains in the expert-parallel layout
    trained = full_state(engine)
    engine, _ = switch(engine, DP)
    assert layout_of(engine) == DP
    for key, tensor in full_state(engine).items():
        assert torch.equal(tensor, trained[key]), key
    assert {float(s["step"]) for s in engine.optimizer.state.values()} == {3.0}
    if rank == 0:
        print(f"dp4 -> ep2: {int(received)} B received over all ranks")


def _switches_keep_losses(rank: int, world: int) -> None:
    _carried_exactly(rank)
    plain = losses(_engine, [])
    switched = losses(_engine, [LayoutSwitch(3, ParallelLayout(4, 1, ep=2)), LayoutSwitch(5, ParallelLayout(4, 1))])
    for a, b in zip(plain, switched):
        assert abs(a - b) <= 1e-5 * abs(a), (plain, switched)
    if rank == 0:
        print(f"losses without / with dp4 -> ep2 x dp2 -> dp4 switches: {plain} / {switched}")


@pytest.mark.timeout(300)
def test_dp4_ep2_dp4_switches_carry_state_and_keep_losses() -> None:
    run_ranks(_switches_keep_losses, 4)
