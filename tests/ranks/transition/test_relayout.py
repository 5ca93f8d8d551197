"""Online change of the training layout on 4 real gloo ranks: state carried exactly, losses unchanged."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.parallel_layout import LayoutSwitch, ParallelLayout, switch_at
from rlhf_dyna.models.build import ModelSpec, build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.relayout import layout_of, relayout
from tests.ranks.tiny_models import VOCAB, nll_loss
from tests.multirank import run_ranks
from tests.ranks.transition._layout_switches import STEPS, full_state, rows

SPEC = ModelSpec(arch="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)  # tp=4 divides the heads


def _engine(world: int) -> TrainEngine:
    return TrainEngine(build_policy(SPEC, seed=3), build_mesh(ParallelLayout(world, 1)), lr=1e-2, grad_clip=1.0)


def _params_sharded_over_dp(engine: TrainEngine) -> bool:
    """The module's registered params: FSDP's dp-sharded DTensors (ZeRO-3), or gathered replicas (ZeRO-1/2)."""
    return all(isinstance(p, DTensor) and "dp" in p.device_mesh.mesh_dim_names for p in engine.model.parameters())


def _step_counter(engine: TrainEngine) -> list[float]:
    return sorted({float(s["step"]) for s in engine.optimizer.state.values()})


def _state_is_carried_exactly(rank: int, world: int) -> None:
    engine = _engine(world)
    for step in range(2):
        engine.step(rows(engine, step), nll_loss)
    before = full_state(engine)
    for layout in (ParallelLayout(dp=2, tp=2, zero=1), ParallelLayout(dp=4, tp=1, zero=2), ParallelLayout(dp=1, tp=4, zero=3),
                   ParallelLayout(dp=4, tp=1, zero=3)):
        engine, stats = relayout(engine, layout)
        assert layout_of(engine) == layout
        assert _step_counter(engine) == [2.0]
        assert _params_sharded_over_dp(engine) == (layout.zero == 3), layout
        after = full_state(engine)
        assert after.keys() == before.keys()
        for key, tensor in before.items():
            assert torch.equal(after[key], tensor), (layout, key)  # bit-exact: only copies, no arithmetic
        assert stats.rounds == len(before) and stats.bytes_received > 0
    metrics = engine.step(rows(engine, 2), nll_loss)  # and it trains on
    assert _step_counter(engine) == [3.0] and metrics["loss"] > 0
    engine, _ = relayout(engine, ParallelLayout(dp=2, tp=2, zero=2))
    engine.step(rows(engine, 3), nll_loss)
    assert not _params_sharded_over_dp(engine)  # ZeRO-2 replicas re-gathered after the step


def _train_with_schedule(rank: int, world: int, schedule: list[LayoutSwitch], out: str) -> None:
    engine = _engine(world)
    losses, norms = [], []
    for step in range(1, STEPS + 1):
        layout = switch_at(schedule, step)
        if layout is not None:
            engine, _ = relayout(engine, layout)
        metrics = engine.step(rows(engine, step), nll_loss)
        losses.append(metrics["loss"])
        norms.append(metrics["grad_norm"])
    if rank == 0:
        Path(out).write_text(json.dumps({"loss": losses, "grad_norm": norms}))


@pytest.mark.timeout(120)
def test_relayout_carries_params_and_adamw_state_bit_exactly() -> None:
    run_ranks(_state_is_carried_exactly, 4)


@pytest.mark.timeout(180)
def test_losses_with_layout_switches_equal_losses_without(tmp_path: Path) -> None:
    schedule = [LayoutSwitch(3, ParallelLayout(dp=2, tp=2, zero=3)), LayoutSwitch(4, ParallelLayout(dp=2, tp=2, zero=1)),
                LayoutSwitch(5, ParallelLayout(dp=4, tp=1, zero=3))]
    run_ranks(_train_with_schedule, 4, [], str(tmp_path / "fixed.json"))
    run_ranks(_train_with_schedule, 4, schedule, str(tmp_path / "switched.json"))
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    switched = json.loads((tmp_path / "switched.json").read_text())
    assert fixed["loss"][-1] < fixed["loss"][0], fixed  # it trains, so equal losses mean equal state
    for name in ("loss", "grad_norm"):
        for step, (a, b) in enumerate(zip(fixed[name], switched[name]), start=1):
            assert abs(a - b) <= 1e-5 * abs(a), (name, step, a, b)
