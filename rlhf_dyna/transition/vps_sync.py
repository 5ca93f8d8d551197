"""`VpsSync`: train -> rollout weight sync by VPS plan: each rollout rank receives exactly its own shard.

The source is the engine's sharded params (ParallelSpec(TRAIN, dp, tp, zero=3), see bind_train), the destination
vLLM's TP-local (fused) parameters (ParallelSpec(ROLLOUT, tp, vllm_dp), see bind_vllm). Plans are cached per
(model, specs, budget). Bytes moved = the plan's minimum; fp32 masters are cast to vLLM's dtype while packing.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.bind_train import bind_train_buffers, train_catalog, train_spec
from rlhf_dyna.transition.bind_vllm import VllmDestination, rollout_dtype, rollout_spec
from rlhf_dyna.transition.executor import ExecStats, execute
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.transition.sync import SyncStats, WeightSync
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, planned
from rlhf_dyna.vps.tensor import Kind


class VpsSync(WeightSync):
    name = "vps"

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, verify: bool = False,
                 recorder: TraceRecorder | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.verify = verify  # checksum every received piece against its source (tests)
        self.recorder = recorder  # one trace event per round when set
        self.last: ExecStats | None = None  # this rank's executor stats of the latest sync
        self.phases: dict[str, float] = {}  # seconds of the latest sync: plan (+ binding, staging), move, install

    def sync(self, train_engine: TrainEngine, rollout: VLLMRollout) -> SyncStats:
        start, rank = time.perf_counter(), dist.get_rank()
        params = {key: t for key, t in bind_train_state(train_engine).items() if key[1] == Kind.PARAM.value}
        config = train_engine.model.config
        t = planned(train_catalog(config, params), train_spec(params), catalog_from_config(config, rollout_dtype(rollout)),
                    rollout_spec(rollout), (Kind.PARAM,), self.budget_bytes, rank)
        destination = VllmDestination(rollout, t.dst, rank)
        moving = time.perf_counter()
        src = bind_train_buffers(params, t.src, rank, t.src_buffers)
        self.last = execute(t.rank_plan, src, destination.buffers, verify=self.verify, trace=self.recorder,
                            trace_name="train_to_rollout")
        staged = destination.staged_bytes
        installing = time.perf_counter()
        destination.install()
        seconds = time.perf_counter() - start
        self.phases = dict(plan=moving - start, move=installing - moving, install=start + seconds - installing)
        total = torch.tensor([self.last.bytes_received], dtype=torch.int64, device=train_engine.device)
        dist.all_reduce(total)
        return SyncStats(seconds=seconds, bytes_moved=int(total), rounds=self.last.rounds,
                         peak_extra_bytes=staged + self.last.peak_extra_bytes)
