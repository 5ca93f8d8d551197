"""VPS moves into the benchmark's vLLM-like `RolloutTarget` (same fused TP buffers as vLLM, no engine behind them).

`scripts/bench_reshard.py` compares methods on that target; this is the `vps` entry for its train_to_vllm_like row.
The world's ranks form rollout TP groups of `target.tp` consecutive ranks, as vLLM's do.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.transition.bind_train import DTYPE_NAMES, bind_train_buffers, train_catalog, train_spec
from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.movers import MoveStats
from bench.rollout_target import RolloutTarget
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, PlannedTransition, planned
from rlhf_dyna.vps.spec import rollout_spec
from rlhf_dyna.vps.tensor import Kind


def rollout_target_plan(hf_config: object, params: Mapping[str, Tensor], target: RolloutTarget,
                        budget_bytes: int = DEFAULT_BUDGET_BYTES) -> PlannedTransition:
    """This rank's cached plan from the dp-sharded params into the target's layout (its pair matrix: the floor)."""
    state = {(name, Kind.PARAM.value): p for name, p in params.items()}
    dtype = DTYPE_NAMES[next(iter(target.buffers.values())).dtype]
    spec = rollout_spec(target.tp, dist.get_world_size() // target.tp)
    return planned(train_catalog(hf_config, state), train_spec(state), catalog_from_config(hf_config, dtype), spec,
                   (Kind.PARAM,), budget_bytes, dist.get_rank())


def move_to_rollout_target(hf_config: object, params: Mapping[str, Tensor], target: RolloutTarget,
                           budget_bytes: int = DEFAULT_BUDGET_BYTES, verify: bool = False,
                           recorder: TraceRecorder | None = None) -> MoveStats:
    """Collective: HF name -> sharded param (DTensor) into target.buffers; seconds include planning on first use."""
    start, rank = time.perf_counter(), dist.get_rank()
    state = {(name, Kind.PARAM.value): p for name, p in params.items()}
    t = rollout_target_plan(hf_config, params, target, budget_bytes)
    want = {n: b.shape for n, b in t.dst.buffers(rank).items()}
    have = {n: tuple(b.shape) for n, b in target.buffers.items()}
    if want != have:
        raise ValueError(f"RolloutTarget buffers differ from the VPS rollout layout: "
                         f"{sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))[:5]}")
    src = bind_train_buffers(state, t.src, rank, t.src_buffers)
    stats = execute(t.rank_plan, src, target.buffers, verify=verify, trace=recorder, trace_name="train_to_rollout")
    return MoveStats(time.perf_counter() - start, stats.bytes_received, stats.rounds, stats.peak_extra_bytes)
