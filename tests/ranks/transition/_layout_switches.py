"""Shared by the online layout-switch tests (dp4 <-> pp2 x dp2, dp4 <-> ep2 x dp2): the step's rows of a rank, the
whole training state gathered, a VPS switch, and the losses of a run with a switch schedule."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.parallel_layout import LayoutSwitch, ParallelLayout, switch_at
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.relayout import bind_train_state, relayout
from rlhf_dyna.transition.vps_mover import make_vps_mover
from tests.ranks.tiny_models import nll_loss, random_batch

GLOBAL_BATCH = 8
STEPS = 6


def rows(engine: TrainEngine, step: int) -> dict[str, torch.Tensor]:
    batch = random_batch(seed=1000 + step % 2, batch=GLOBAL_BATCH)
    per_rank = GLOBAL_BATCH // engine.dp_size
    return {k: v[engine.dp_rank * per_rank:(engine.dp_rank + 1) * per_rank] for k, v in batch.items()}


def full_state(engine: TrainEngine) -> dict[tuple[str, str], torch.Tensor]:
    """Every (name, kind) of the whole model, gathered over dp and exchanged between pipeline stages."""
    mine = {k: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone() for k, t in bind_train_state(engine).items()}
    parts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, mine)
    merged: dict[tuple[str, str], torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def switch(engine: TrainEngine, layout: ParallelLayout):
    return relayout(engine, layout, mover=make_vps_mover(engine.model.config, in_place=True, verify=True))


def losses(make_engine: Callable[[], TrainEngine], schedule: list[LayoutSwitch]) -> list[float]:
    engine, out = make_engine(), []
    for step in range(1, STEPS + 1):
        layout = switch_at(schedule, step)
        if layout is not None:
            engine, _ = switch(engine, layout)
        out.append(engine.step(rows(engine, step), nll_loss)["loss"])
    return out
