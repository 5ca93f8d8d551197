"""`VpsSync`: train -> rollout weight sync by VPS plan: each rollout rank receives exactly its own shard.

The source is the engine's sharded params (ParallelSpec(TRAIN, dp, tp, zero=3), see bind_train), the destination
vLLM's TP-local (fused) parameters (ParallelSpec(ROLLOUT, tp, vllm_dp), see bind_vllm). Plans are cached per
(model, specs, budget). Bytes moved = the plan's minimum; fp32 masters are cast to vLLM's dtype while packing.
On the CPU the move runs per group of layers (vps.layer_groups), each installed into vLLM (vllm_install) once it
has arrived (or, with overlap_install, while the next one is on the wire), so staging never holds the whole shard;
into several DP replicas it is relayed through one of them where that moves at most 1% more (vps.relay).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
import torch.distributed as dist

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.bind_train import StateKey, bind_train_buffers, train_catalog, train_spec
from rlhf_dyna.transition.bind_vllm import STAGING_POOL, VllmDestination, rollout_dtype, rollout_spec
from rlhf_dyna.transition.executor import ExecStats, execute
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.transition.sync import SyncStats, WeightSync
from rlhf_dyna.transition.tensor_pool import TensorPool
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.transition.vllm_install import LayerwiseInstaller
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, PlannedTransition, planned, planned_relay, ranks_per_node
from rlhf_dyna.vps.layer_groups import layer_groups, sub_catalog
from rlhf_dyna.vps.layout import Layout
from rlhf_dyna.vps.plan import Plan
from rlhf_dyna.vps.relay import chosen_relay
from rlhf_dyna.vps.tensor import Kind


class VpsSync(WeightSync):
    name = "vps"

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, verify: bool = False,
                 recorder: TraceRecorder | None = None, overlap_install: bool = False,
                 pool: TensorPool = STAGING_POOL, pack_first: bool = True, relay: bool = True) -> None:
        self.budget_bytes = budget_bytes
        self.relay = relay  # CPU: relay through one DP replica where that moves no more bytes (vps.relay)
        self.pack_first = pack_first  # gloo: cast every message of a round before sending (executor.post_streaming)
        self.verify = verify  # checksum every received piece against its source (tests)
        self.recorder = recorder  # one trace event per round when set
        # install a group on a worker thread while the next one is received; off by default: on CPU ranks that share
        # their cores (4 gloo ranks, 2 cores) the thread competes with gloo and the repack and lost 2x in
        # scripts/bench_reshard.py (README); worth it where a rank has a core to spare
        self.overlap_install = overlap_install
        self.last: ExecStats | None = None  # this rank's executor stats of the latest sync (summed over its groups)
        self.phases: dict[str, float] = {}  # seconds of the latest sync: plan, move (+ install when overlapped), install
        self.on_staged: Callable[[dict[str, Tensor]], None] | None = None  # sees each staged group before its install
        self.pool = pool  # the CPU install's staging, kept between groups and syncs
        self._plans_cached: SyncPlans | None = None  # the latest (training layout, engine)'s

    def sync(self, train_engine: TrainEngine, rollout: VLLMRollout) -> SyncStats:
        start, rank = time.perf_counter(), dist.get_rank()
        rollout.wake_up(("weights",))  # a sleeping engine's parameters come back at their addresses (CUDA colocate)
        params = {key: t for key, t in bind_train_state(train_engine).items() if key[1] == Kind.PARAM.value}
        plans = self._plans(train_engine.model.config, params, rollout, rank)
        moving = time.perf_counter()
        steps: dict[str, float] = {}
        if plans.destination.staged:  # CPU: receive and install group by group, staging bounded by the budget
            stats, staged, steps = self._grouped(params, plans, rollout)
        else:  # GPU: straight into vLLM's parameters, in place
            src = bind_train_buffers(params, plans.whole.src, rank, plans.whole.src_buffers)
            stats, staged = [self._execute(plans.whole, src, plans.destination.buffers(plans.whole.dst))], 0
        installing = time.perf_counter()
        rollout.reset_prefix_cache()  # its KV was computed with the old weights
        seconds = time.perf_counter() - start
        self.last = ExecStats(sum(s.seconds for s in stats), sum(s.bytes_sent for s in stats),
                              sum(s.bytes_received for s in stats), sum(s.local_bytes for s in stats),
                              sum(s.rounds for s in stats), sum(s.messages for s in stats),
                              max(s.peak_extra_bytes for s in stats), sum(s.copy_seconds for s in stats),
                              sum(s.wait_seconds for s in stats))
        self.phases = dict(plan=moving - start, move=installing - moving, install=start + seconds - installing, **steps)
        total = torch.tensor([self.last.bytes_received], dtype=torch.int64, device=train_engine.device)
        dist.all_reduce(total)
        return SyncStats(seconds=seconds, bytes_moved=int(total), rounds=self.last.rounds,
                         peak_extra_bytes=staged + self.last.peak_extra_bytes)

    def _plans(self, config: object, params: dict, rollout: VLLMRollout, rank: int) -> SyncPlans:
        """The sync's plans and vLLM binding, worked out once per (training layout, engine): every later sync only
        re-reads the live shards (about 20 ms a sync at 300M otherwise: catalogs, layouts, names, vLLM's parameters)."""
        src_spec, dst_spec = train_spec(params), rollout_spec(rollout)
        param_dtype = next(iter(params.values())).dtype
        cached = self._plans_cached
        if (cached is not None and cached.config is config and cached.rollout is rollout
                and cached.specs == (param_dtype, src_spec, dst_spec)):
            return cached
        src_catalog, dst_catalog = train_catalog(config, params), catalog_from_config(config, rollout_dtype(rollout))
        whole = planned(src_catalog, src_spec, dst_catalog, dst_spec, (Kind.PARAM,), self.budget_bytes, rank)
        destination = VllmDestination(rollout, whole.dst, rank, self.pool)
        groups, relay = [], None
        if destination.staged:  # groups of layers of at most budget/8 per rank each (see _grouped)
            relay = chosen_relay(whole.schedule.plan, ranks_per_node()) if self.relay else None
            itemsize = torch.empty((), dtype=TORCH_DTYPES[dst_catalog.param_dtype]).element_size()
            for group in layer_groups(dst_catalog, rollout.tp, itemsize, self.budget_bytes // 8):
                names = {t.train_buffer for t in group}  # live names: MoE experts are fused in training
                catalogs = (sub_catalog(src_catalog, group), src_spec, sub_catalog(dst_catalog, group), dst_spec,
                            (Kind.PARAM,), self.budget_bytes // 2, rank)
                if relay is None:
                    t = planned(*catalogs)
                    dst, stages = t.dst, (t,)
                else:
                    dst, *stages = planned_relay(*catalogs, relay[0])
                groups.append(StagedGroup(tuple(stages), dst, tuple(k for k in params if k[0] in names)))
        self._plans_cached = SyncPlans(whole, destination, groups, relay[1] if relay else None, config, rollout,
                                       (param_dtype, src_spec, dst_spec))
        return self._plans_cached

    @property
    def relayed(self) -> bool:
        """Whether the latest plans relay through one DP replica of vLLM (vps.relay)."""
        return self._plans_cached is not None and self._plans_cached.relay is not None

    def pair_bytes(self) -> np.ndarray:
        """[world, world] bytes each rank sends each rank in one sync with the latest plans (both relay stages)."""
        plans = self._plans_cached
        if plans is None:
            raise RuntimeError("no sync has run yet: the plans are made by the first")
        stages = plans.relay or (plans.whole.schedule.plan,)
        return sum(p.pair_bytes() for p in stages)

    def _execute(self, t, src, dst, first_round: int = 0) -> ExecStats:
        return execute(t.rank_plan, src, dst, verify=self.verify, trace=self.recorder, trace_name="train_to_rollout",
                       first_round=first_round, pack_first=self.pack_first)

    def _grouped(self, params: dict, plans: SyncPlans,
                 rollout: VLLMRollout) -> tuple[list[ExecStats], int, dict[str, float]]:
        """Groups of layers of at most budget/8 per rank each: the executor gets budget/2, at most two groups are
        staged at once (one being received, one being installed) and the repack copies one layer more, so the
        peak stays within the budget plus the largest layer. Returns the groups' stats, the most staged bytes and the
        seconds of each step summed over the groups."""
        rank, stats, peak_staged, alive = dist.get_rank(), [], 0, []
        destination = plans.destination
        steps = dict.fromkeys(("group_bind", "group_stage", "group_execute", "group_install"), 0.0)
        clock = time.perf_counter()

        def lap(step: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            steps[step] += now - clock
            clock = now

        with LayerwiseInstaller(destination.model, rollout.llm.llm_engine.vllm_config, destination.aliases,
                                self.overlap_install, installed=destination.pool.give) as installer:
            lap("group_install")
            for group in plans.groups:
                t = group.stages[0]
                src = bind_train_buffers({k: params[k] for k in group.keys}, t.src, rank, t.src_buffers)
                lap("group_bind")
                staged = destination.buffers(group.dst)
                lap("group_stage")
                for t in group.stages:  # relayed: the first ranks assemble, then pass their staging on whole
                    stats.append(self._execute(t, src, staged, first_round=sum(s.rounds for s in stats)))  # one trace
                    src = staged
                lap("group_execute")
                alive = alive[-1:] + [sum(b.numel() * b.element_size() for b in staged.values())]
                peak_staged = max(peak_staged, sum(alive) if self.overlap_install else alive[-1])
                if self.on_staged is not None:
                    self.on_staged(staged)
                installer.submit(staged)
                del staged
                lap("group_install")
        lap("group_install")
        return stats, peak_staged, dict(steps, install_work=installer.install_seconds)


@dataclass(frozen=True)
class StagedGroup:
    stages: tuple[PlannedTransition, ...]  # of this group's tensors alone: the move, or the two stages of a relay
    dst: Layout  # the group's whole rollout layout: this rank's staging
    keys: tuple[StateKey, ...]  # the live params it reads


@dataclass(frozen=True)
class SyncPlans:
    whole: PlannedTransition
    destination: VllmDestination
    groups: list[StagedGroup]  # CPU: the layer groups, staged and installed one by one; GPU: none (in place)
    relay: tuple[Plan, Plan] | None  # the whole model's two stages where the groups are relayed
    config: object  # what the plans were worked out for: the model config, the engine, (param dtype, specs)
    rollout: VLLMRollout
    specs: tuple
