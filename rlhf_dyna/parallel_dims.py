"""The one mapping from the config's parallel dimensions to VPS specs, shared by the dry run and the live run.

`ParallelDims.from_config` validates every dimension once (dp fills the world when -1). The spec constructors
(vps.spec.train_spec / rollout_spec) are the only places that build a training or rollout `ParallelSpec` from sizes:
the dry run, the placements (elastic/) and the live binding (transition/bind_train, bind_vllm) all call them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .validate import resolve_dp
from .vps.spec import ParallelSpec, rollout_spec, train_spec


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp: int
    tp: int
    pp: int = 1
    cp: int = 1
    ep: int = 1
    rollout_tp: int = 1
    rollout_expert_parallel: bool = False  # vLLM's MoE layers: whole experts over all rollout ranks
    master_weights: bool = False  # low-precision params with an fp32 master copy (the dry run's cluster dtype)

    @classmethod
    def from_config(cls, cfg: Config) -> ParallelDims:
        t, world = cfg.parallel.train, cfg.parallel.world_size
        return cls(world_size=world, dp=resolve_dp(t, world), tp=t.tp, pp=t.pp, cp=t.cp, ep=t.ep,
                   rollout_tp=cfg.rollout.tp, rollout_expert_parallel=cfg.rollout.expert_parallel,
                   master_weights=cfg.model.dtype != "float32")

    @property
    def rollout_replicas(self) -> int:
        return self.world_size // self.rollout_tp

    def train_spec(self, first_rank: int = 0) -> ParallelSpec:
        return train_spec(self.dp, self.tp, self.pp, self.cp, self.ep, self.master_weights, first_rank=first_rank)

    def rollout_spec(self, first_rank: int = 0) -> ParallelSpec:
        return rollout_spec(self.rollout_tp, self.rollout_replicas, first_rank, self.rollout_expert_parallel)

    def train_mesh(self):
        """The training DeviceMesh: ("pp", "dp", "tp") with pipeline stages, ("edp", "ep", "tp") plus the flattened
        "dp" with expert parallel, else ("dp", "tp"). Collective."""
        from .train.mesh import build_ep_mesh, build_mesh, build_pp_mesh  # deferred: the dry run needs no torch.distributed

        if self.pp > 1:
            return build_pp_mesh(self.pp, self.dp, self.tp)
        if self.ep > 1:
            return build_ep_mesh(self.dp, self.ep, self.tp)
        return build_mesh(self.dp, self.tp)

    def expert_parallel_problems(self, num_experts: int) -> list[str]:
        """Why this layout cannot train live with expert parallel (ep > 1), each with what would be valid; [] = it can.
        Live EP regroups the dp ranks as (edp, ep) (train.mesh.build_ep_mesh), each rank owning E / ep whole experts;
        tp, pp and cp with MoE are refused by validate_moe / validate.check_runs_live."""
        if self.ep == 1:
            return []
        out = []
        if self.dp % self.ep:
            out.append(f"parallel.train.ep={self.ep} does not divide dp={self.dp} (expert parallel regroups the dp ranks "
                       f"as edp x ep); valid ep: {[e for e in range(1, self.dp + 1) if self.dp % e == 0]}")
        if num_experts % self.ep:
            out.append(f"parallel.train.ep={self.ep} does not divide model.num_experts={num_experts} (each rank owns "
                       f"num_experts / ep whole experts); valid ep: {[e for e in range(1, num_experts + 1) if num_experts % e == 0]}")
        return out

    def train_to_rollout(self) -> tuple[ParallelSpec, ParallelSpec]:
        """The per-step weight sync: the training layout -> vLLM's layout."""
        return self.train_spec(), self.rollout_spec()
