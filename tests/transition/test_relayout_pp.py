"""Online switches dp4 -> pp2 x dp2 -> dp4 by VPS plan on 4 gloo ranks: parameters and AdamW state carried
bit-exactly (tied embedding included: one logical tensor, two stage copies), and losses identical to a run
without switches."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from rlhf_dyna.transition.relayout import LayoutSwitch, TrainLayout, bind_train_state, layout_of, relayout, switch_at
from rlhf_dyna.transition.vps_mover import make_vps_mover
from tests.engines._common import nll_loss, random_batch, tiny_spec
from tests.engines._dist import run_ranks

GLOBAL_BATCH = 8
STEPS = 6
PP = TrainLayout(dp=2, tp=1, pp=2)
DP = TrainLayout(dp=4, tp=1)


def _engine(tie: bool) -> TrainEngine:
    spec = replace(tiny_spec(tie=tie), num_hidden_layers=3)  # stages own layers [0, 2) and [2, 3)
    return TrainEngine(build_policy(spec, seed=3), build_mesh(4, 1), lr=1e-2, grad_clip=1.0, micro_batch_size=2)


def _rows(engine: TrainEngine, step: int) -> dict[str, torch.Tensor]:
    batch = random_batch(seed=1000 + step % 2, batch=GLOBAL_BATCH)
    rows = GLOBAL_BATCH // engine.dp_size
    return {k: v[engine.dp_rank * rows:(engine.dp_rank + 1) * rows] for k, v in batch.items()}


def _full_state(engine: TrainEngine) -> dict[tuple[str, str], torch.Tensor]:
    """Every (name, kind) of the whole model, gathered over dp and exchanged between stages."""
    mine = {k: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone() for k, t in bind_train_state(engine).items()}
    parts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, mine)
    merged: dict[tuple[str, str], torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def _switch(engine: TrainEngine, layout: TrainLayout):
    return relayout(engine, layout, mover=make_vps_mover(engine.model.config, in_place=True, verify=True))


def _carried_exactly(rank: int, world: int, tie: bool) -> None:
    engine = _engine(tie)
    for step in range(2):
        engine.step(_rows(engine, step), nll_loss)
    before = _full_state(engine)
    engine, there = _switch(engine, PP)
    assert isinstance(engine, PipelineEngine) and layout_of(engine) == PP
    assert there.bytes_received > 0
    on_stages = _full_state(engine)
    for key, tensor in on_stages.items():  # the last stage's lm_head copy of a tied embedding equals the embedding
        source = before[("model.embed_tokens.weight", key[1])] if tie and key[0] == "lm_head.weight" else before[key]
        assert torch.equal(tensor, source), key
    engine.step(_rows(engine, 2), nll_loss)  # it trains in the pipeline layout
    trained = _full_state(engine)
    engine, _ = _switch(engine, DP)
    assert type(engine) is TrainEngine and layout_of(engine) == DP
    back = _full_state(engine)
    for key, tensor in back.items():
        assert torch.equal(tensor, trained[key]), key
    assert {float(s["step"]) for s in engine.optimizer.state.values()} == {3.0}


def _losses(rank: int, world: int, tie: bool, schedule: list[LayoutSwitch], out: list) -> list[float]:
    engine = _engine(tie)
    losses = []
    for step in range(1, STEPS + 1):
        layout = switch_at(schedule, step)
        if layout is not None:
            engine, _ = _switch(engine, layout)
        losses.append(engine.step(_rows(engine, step), nll_loss)["loss"])
    return losses


def _switches_keep_losses(rank: int, world: int, tie: bool) -> None:
    _carried_exactly(rank, world, tie)
    plain = _losses(rank, world, tie, [], [])
    switched = _losses(rank, world, tie, [LayoutSwitch(3, 2, 1, pp=2), LayoutSwitch(5, 4, 1)], [])
    for a, b in zip(plain, switched):
        assert abs(a - b) <= 1e-5 * abs(a), (plain, switched)
    if rank == 0:
        print(f"losses without / with dp4 -> pp2 x dp2 -> dp4 switches (tied={tie}): {plain} / {switched}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_dp4_pp2_dp4_switches_carry_state_and_keep_losses(tie: bool) -> None:
    run_ranks(_switches_keep_losses, 4, tie)
