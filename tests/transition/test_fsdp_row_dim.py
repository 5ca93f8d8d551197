"""Which dim FSDP shards row-parallel weights on in a run: dim 1 only when `parallel.schedule` changes tp (the
switches then keep those shards in place), dim 0 otherwise; every place that builds the run's engines or their VPS
specs reads the same rule."""
from __future__ import annotations

import pytest

from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.orchestrator.placements import placement_request
from rlhf_dyna.orchestrator.setup import engine_settings
from rlhf_dyna.parallel_dims import ParallelDims, fsdp_row_dim


@pytest.mark.parametrize("schedule,want", [
    ([], 0),
    ([LayoutSwitchConfig(step=3, zero=1)], 0),  # ZeRO-3 <-> ZeRO-1 at the same tp: no TP dim to keep in place
    ([LayoutSwitchConfig(step=3, tp=2)], 1),
    ([LayoutSwitchConfig(step=3, tp=2), LayoutSwitchConfig(step=5, tp=1)], 1),
])
def test_row_dim_follows_tp_switches(schedule, want):
    cfg = Config()
    cfg.parallel.world_size = 4
    cfg.parallel.schedule = schedule
    assert fsdp_row_dim(cfg) == want
    assert ParallelDims.from_config(cfg).train_spec().fsdp_row_dim == want  # the dry run's plans
    assert engine_settings(cfg, trainable=True)["fsdp_row_dim"] == want  # the live engines (actor, critic)
    assert engine_settings(cfg, trainable=False)["fsdp_row_dim"] == want  # the reference
    assert placement_request(cfg).train.fsdp_row_dim == want  # the placements' role specs


def test_row_dim_of_a_tp_run_without_switches():
    cfg = Config()
    cfg.parallel.world_size = 4
    cfg.parallel.train.tp = 2
    assert fsdp_row_dim(cfg) == 0
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, tp=2, zero=1)]  # same tp as the start
    assert fsdp_row_dim(cfg) == 0
