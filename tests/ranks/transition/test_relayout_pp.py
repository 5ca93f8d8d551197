"""Online switches dp4 -> pp2 x dp2 -> dp4 by VPS plan on 4 gloo ranks: parameters and AdamW state carried
bit-exactly (tied embedding included: one logical tensor, two stage copies), and losses identical to a run
without switches."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlhf_dyna.parallel_layout import LayoutSwitch, ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from rlhf_dyna.transition.relayout import layout_of
from tests.ranks.tiny_models import nll_loss, tiny_spec
from tests.multirank import run_ranks
from tests.ranks.transition._layout_switches import full_state, losses, rows, switch
PP = ParallelLayout(dp=2, tp=1, pp=2)
DP = ParallelLayout(dp=4, tp=1)


def _engine(tie: bool) -> TrainEngine:
    spec = replace(tiny_spec(tie=tie), num_hidden_layers=3)  # stages own layers [0, 2) and [2, 3)
    return TrainEngine(build_policy(spec, seed=3), build_mesh(ParallelLayout(4, 1)), lr=1e-2, grad_clip=1.0, micro_batch_size=2)


def _carried_exactly(rank: int, world: int, tie: bool) -> None:
    engine = _engine(tie)
    for step in range(2):
        engine.step(rows(engine, step), nll_loss)
    before = full_state(engine)
    engine, there = switch(engine, PP)
    assert isinstance(engine, PipelineEngine) and layout_of(engine) == PP
    assert there.bytes_received > 0
    on_stages = full_state(engine)
    for key, tensor in on_stages.items():  # the last stage's lm_head copy of a tied embedding equals the embedding
        source = before[("model.embed_tokens.weight", key[1])] if tie and key[0] == "lm_head.weight" else before[key]
        assert torch.equal(tensor, source), key
    engine.step(rows(engine, 2), nll_loss)  # it trains in the pipeline layout
    trained = full_state(engine)
    engine, _ = switch(engine, DP)
    assert type(engine) is TrainEngine and layout_of(engine) == DP
    back = full_state(engine)
    for key, tensor in back.items():
        assert torch.equal(tensor, trained[key]), key
    assert {float(s["step"]) for s in engine.optimizer.state.values()} == {3.0}


def _switches_keep_losses(rank: int, world: int, tie: bool) -> None:
    _carried_exactly(rank, world, tie)
    plain = losses(lambda: _engine(tie), [])
    switched = losses(lambda: _engine(tie), [LayoutSwitch(3, ParallelLayout(2, 1, pp=2)), LayoutSwitch(5, ParallelLayout(4, 1))])
    for a, b in zip(plain, switched):
        assert abs(a - b) <= 1e-5 * abs(a), (plain, switched)
    if rank == 0:
        print(f"losses without / with dp4 -> pp2 x dp2 -> dp4 switches (tied={tie}): {plain} / {switched}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_dp4_pp2_dp4_switches_carry_state_and_keep_losses(tie: bool) -> None:
    run_ranks(_switches_keep_losses, 4, tie)
