"""The VPS state mover for `relayout`: train layout -> train layout, parameters and AdamW moments, by plan.

    new_engine, stats = relayout(engine, ParallelLayout(dp=2, tp=2), mover=make_vps_mover(engine.model.config))

Same contract as `movers.move_by_full_tensors`: collective, gets (HF name, kind) -> live tensor for the old and the
new engine (AdamW's `step` is relayout's to copy), fills the destination. Source and destination specs are read
from the DTensors' meshes; the plan is cached per (model, specs, kinds, budget). Seconds are the whole call's
wall time (planning included the first time). In place, a destination shard that is exactly a source shard of the
same rank takes over its storage instead of a copy (`vps.adopt`), so what stays in place costs nothing;
FSDP2 must then re-read its params (relayout does: `train.engine.refresh_fsdp_shards`).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from rlhf_dyna.transition.bind_train import (StateKey, adopt_storage, bind_train_buffers, buffer_name, release_storage,
                                             state_kinds, train_catalog, train_layout, train_spec)
from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.movers import MoveStats, StateMover
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, PlannedTransition, planned, ranks_per_node
from rlhf_dyna.vps.rank_order import least_moving_order
from rlhf_dyna.vps.spec import ParallelSpec, Phase


def planned_relayout(hf_config: object, source: Mapping[StateKey, Tensor], destination: Mapping[StateKey, Tensor],
                     budget_bytes: int = DEFAULT_BUDGET_BYTES) -> PlannedTransition:
    """This rank's cached plan from the live source state's layout to the destination's (same keys)."""
    return planned(train_catalog(hf_config, source), train_spec(source), train_catalog(hf_config, destination),
                   train_spec(destination), state_kinds(source), budget_bytes, dist.get_rank())


def make_vps_mover(hf_config: object, budget_bytes: int = DEFAULT_BUDGET_BYTES, verify: bool = False,
                   in_place: bool = False, recorder: TraceRecorder | None = None, trace_name: str = "relayout") -> StateMover:
    """A StateMover for `hf_config`'s model. in_place: adopt the source shards that stay and free each other one as
    soon as its last read is done (only when the source state is consumed, as in relayout; never when the caller
    reuses it: old and new state share the adopted storages)."""

    def move(source: Mapping[StateKey, Tensor], destination: Mapping[StateKey, Tensor]) -> MoveStats:
        # keys may differ (pipeline stages hold different tensors); bind_train_buffers checks each side's layout
        start, rank = time.perf_counter(), dist.get_rank()
        t = planned_relayout(hf_config, source, destination, budget_bytes)
        src = bind_train_buffers(source, t.src, rank, t.src_buffers)
        dst = bind_train_buffers(destination, t.dst, rank, t.dst_buffers)
        prepared, release = t.rank_plan, None
        if in_place:
            adopted, prepared = t.in_place
            keys = {buffer_name(k): k for k in destination}
            for d, s in adopted.items():
                adopt_storage(destination[keys[d]], src[s])
                dst[d] = src[s]
            release = release_storage(src)
        stats = execute(prepared, src, dst, verify=verify, trace=recorder, trace_name=trace_name, release=release)
        return MoveStats(time.perf_counter() - start, stats.bytes_received, stats.rounds, stats.peak_extra_bytes)

    return move


def least_moving_layout(engine: TrainEngine, layout: ParallelLayout) -> ParallelLayout:
    """`layout` in the mesh rank order (TP innermost or outermost) whose plan moves the fewest bytes from the
    engine's live state; same answer on every rank (planning is a pure function of the layouts)."""
    if layout.pp > 1 or isinstance(engine, PipelineEngine) or layout.ep > 1 or layout.tp == 1:
        return layout  # pipeline and expert meshes have one rank order; without TP both orders are the same
    source = bind_train_state(engine)
    config = engine.model.config
    spec = ParallelSpec(Phase.TRAIN, dp=layout.dp, tp=layout.tp, zero=3)  # bound state is always the sharded one
    best = least_moving_order(train_layout(config, source), train_catalog(config, source), spec, state_kinds(source),
                              ranks_per_node())
    return replace(layout, tp_outer=best.tp_outer)
