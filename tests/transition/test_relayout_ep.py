"""Online switches dp4 -> ep2 x dp2 -> dp4 of a tiny Qwen3-MoE by VPS plan on 4 gloo ranks: parameters and AdamW
state carried bit-exactly (experts regrouped over ep, everything else stays), and losses identical to a run without
switches."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import LayoutSwitch, TrainLayout, bind_train_state, layout_of, relayout, switch_at
from rlhf_dyna.transition.vps_mover import make_vps_mover
from tests.engines._common import nll_loss, random_batch
from tests.engines._dist import run_ranks
from tests.train.test_expert_parallel import MOE

GLOBAL_BATCH = 8
STEPS = 6
EP = TrainLayout(dp=4, tp=1, ep=2)
DP = TrainLayout(dp=4, tp=1)


def _engine() -> TrainEngine:
    return TrainEngine(build_policy(MOE, seed=3), build_mesh(4, 1), lr=1e-2, grad_clip=1.0, micro_batch_size=2)


def _rows(engine: TrainEngine, step: int) -> dict[str, torch.Tensor]:
    batch = random_batch(seed=1000 + step % 2, batch=GLOBAL_BATCH)
    rows = GLOBAL_BATCH // engine.dp_size
    return {k: v[engine.dp_rank * rows:(engine.dp_rank + 1) * rows] for k, v in batch.items()}


def _full_state(engine: TrainEngine) -> dict[tuple[str, str], torch.Tensor]:
    return {k: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            for k, t in sorted(bind_train_state(engine).items())}


def _switch(engine: TrainEngine, layout: TrainLayout):
    return relayout(engine, layout, mover=make_vps_mover(engine.model.config, in_place=True, verify=True))


def _carried_exactly(rank: int) -> None:
    engine = _engine()
    for step in range(2):
        engine.step(_rows(engine, step), nll_loss)
    before = _full_state(engine)
    engine, there = _switch(engine, EP)
    assert layout_of(engine) == EP
    received = torch.tensor([there.bytes_received])
    torch.distributed.all_reduce(received)
    # ep inner: ranks 0 and 3 keep their dp4 experts, 1 and 2 swap theirs; every other shard stays
    assert (there.bytes_received > 0) == (rank in (1, 2)), (rank, there.bytes_received)
    experts = engine.model.model.layers[0].mlp.experts.down_proj
    assert experts.device_mesh.mesh_dim_names == ("edp", "ep") and experts.to_local().shape[0] == 2
    after = _full_state(engine)
    assert after.keys() == before.keys()
    for key, tensor in after.items():
        assert torch.equal(tensor, before[key]), key
    engine.step(_rows(engine, 2), nll_loss)  # it trains in the expert-parallel layout
    trained = _full_state(engine)
    engine, _ = _switch(engine, DP)
    assert layout_of(engine) == DP
    for key, tensor in _full_state(engine).items():
        assert torch.equal(tensor, trained[key]), key
    assert {float(s["step"]) for s in engine.optimizer.state.values()} == {3.0}
    if rank == 0:
        print(f"dp4 -> ep2: {int(received)} B received over all ranks")


def _losses(schedule: list[LayoutSwitch]) -> list[float]:
    engine = _engine()
    losses = []
    for step in range(1, STEPS + 1):
        layout = switch_at(schedule, step)
        if layout is not None:
            engine, _ = _switch(engine, layout)
        losses.append(engine.step(_rows(engine, step), nll_loss)["loss"])
    return losses


def _switches_keep_losses(rank: int, world: int) -> None:
    _carried_exactly(rank)
    plain = _losses([])
    switched = _losses([LayoutSwitch(3, 4, 1, ep=2), LayoutSwitch(5, 4, 1)])
    for a, b in zip(plain, switched):
        assert abs(a - b) <= 1e-5 * abs(a), (plain, switched)
    if rank == 0:
        print(f"losses without / with dp4 -> ep2 x dp2 -> dp4 switches: {plain} / {switched}")


@pytest.mark.timeout(300)
def test_dp4_ep2_dp4_switches_carry_state_and_keep_losses() -> None:
    run_ranks(_switches_keep_losses, 4)
