"""The one mapping from the config's parallel dimensions to VPS specs, shared by the dry run and the live run.

`ParallelDims.from_config` validates every dimension once (dp fills the world when -1); the spec constructors below
are the only places that build a training or rollout `ParallelSpec` from sizes, so the dry run plans exactly the
layouts the live engines bind (transition/bind_train, transition/bind_vllm).
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .validate import resolve_dp
from .vps.spec import ParallelSpec, Phase


def train_spec(dp: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, master_weights: bool = False,
               tp_outer: bool = False, first_rank: int = 0) -> ParallelSpec:
    """The training state's layout between steps. zero=3 at every ZeRO stage: FSDP2's sharded parameter (the master shard
    AdamW updates) and the optimizer state stay sharded; zero 1/2 only add gathered replicas, rebuilt after each step and
    never moved (train.parallelize.apply_fsdp)."""
    return ParallelSpec(Phase.TRAIN, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=3, master_weights=master_weights,
                        tp_outer=tp_outer, first_rank=first_rank)


def rollout_spec(tp: int, replicas: int, first_rank: int = 0) -> ParallelSpec:
    """vLLM's layout: one engine with data_parallel_size=replicas, each replica a TP group of `tp` consecutive ranks."""
    return ParallelSpec(Phase.ROLLOUT, tp=tp, vllm_dp=replicas, first_rank=first_rank)


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp: int
    tp: int
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 3  # the engine's ZeRO stage (gathered replicas); the state's VPS layout is zero=3 (train_spec)
    rollout_tp: int = 1
    master_weights: bool = False  # low-precision params with an fp32 master copy (the dry run's cluster dtype)

    @classmethod
    def from_config(cls, cfg: Config) -> ParallelDims:
        t, world = cfg.parallel.train, cfg.parallel.world_size
        return cls(world_size=world, dp=resolve_dp(t, world), tp=t.tp, pp=t.pp, cp=t.cp, ep=t.ep, zero=t.zero,
                   rollout_tp=cfg.rollout.tp, master_weights=cfg.model.dtype != "float32")

    @property
    def rollout_replicas(self) -> int:
        return self.world_size // self.rollout_tp

    def train_spec(self, first_rank: int = 0) -> ParallelSpec:
        return train_spec(self.dp, self.tp, self.pp, self.cp, self.ep, self.master_weights, first_rank=first_rank)

    def rollout_spec(self, first_rank: int = 0) -> ParallelSpec:
        return rollout_spec(self.rollout_tp, self.rollout_replicas, first_rank)

    def train_to_rollout(self) -> tuple[ParallelSpec, ParallelSpec]:
        """The per-step weight sync: the training layout -> vLLM's layout."""
        return self.train_spec(), self.rollout_spec()
