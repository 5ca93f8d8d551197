"""ParallelSpec: a typed, pure description of one parallel configuration and its role."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .tensor import Kind


class Phase(str, Enum):
    TRAIN = "train"  # FSDP2 / ZeRO, DTensor TP, PP, EP, CP on HF module names
    ROLLOUT = "rollout"  # vLLM's fused parameter layout


@dataclass(frozen=True)
class ParallelSpec:
    """One parallel configuration over ranks [first_rank, first_rank + world_size).

    Train rank order (outer -> inner): pp, dp_replicate, dp, cp, tp; with tp_outer: pp, tp, dp_replicate,
    dp, cp (the same mesh, transposed: the rank order that keeps more state in place for some changes).  FSDP (zero=3) shards dim 0 of
    the TP-local tensor over the flattened (dp, cp) group (torchtitan's dp_shard_cp); zero=1/2 keep
    params replicated and shard optimizer states (and grads for zero=2) the same way; zero=0 is DDP.
    Experts: the dp*cp*tp ranks of a stage are regrouped (outer -> inner) as (edp, ep, etp).

    Rollout rank order (outer -> inner): dp (independent vLLM engines), vllm_dp, pp, tp.  MoE layers
    span vllm_dp*tp ranks (vLLM flattens TP across its DP); ep == vllm_dp*tp enables vLLM's expert
    parallelism, ep == 1 shards every expert by TP.
    """

    phase: Phase = Phase.TRAIN
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp_replicate: int = 1
    vllm_dp: int = 1
    zero: int = 3
    pp_layers: tuple[int, ...] | None = None  # layers per stage; None: vLLM's get_pp_indices rule
    master_weights: bool = False  # fp32 master copy besides the (low precision) params
    with_grads: bool = False  # grads persist across the transition (rarely: they are transient)
    first_rank: int = 0
    tp_outer: bool = False  # train only: TP outermost within a PP stage instead of innermost

    @property
    def world_size(self) -> int:
        if self.phase == Phase.ROLLOUT:
            return self.dp * self.vllm_dp * self.pp * self.tp
        return self.pp * self.dp_replicate * self.dp * self.cp * self.tp

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.world_size)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        if self.phase == Phase.ROLLOUT:
            return (Kind.PARAM,)
        kinds = [Kind.PARAM]
        if self.with_grads:
            kinds.append(Kind.GRAD)
        if self.master_weights:
            kinds.append(Kind.MASTER)
        return (*kinds, Kind.EXP_AVG, Kind.EXP_AVG_SQ)

    def describe(self) -> str:
        if self.phase == Phase.ROLLOUT:
            parts = dict(dp=self.dp, vllm_dp=self.vllm_dp, pp=self.pp, tp=self.tp, ep=self.ep)
        else:
            parts = dict(pp=self.pp, dp_replicate=self.dp_replicate, dp=self.dp, cp=self.cp, tp=self.tp,
                         ep=self.ep, etp=self.etp, zero=self.zero)
        body = ",".join(f"{k}={v}" for k, v in parts.items() if v != 1 or k in ("zero",))
        order = ",tp_outer" if self.tp_outer else ""
        return f"{self.phase.value}[{body or 'single'}{order}]@{self.first_rank}"


def train_spec(dp: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, master_weights: bool = False,
               tp_outer: bool = False, first_rank: int = 0) -> ParallelSpec:
    """The training state's layout between steps. zero=3 at every ZeRO stage: FSDP2's sharded parameter (the master shard
    AdamW updates) and the optimizer state stay sharded; zero 1/2 only add gathered replicas, rebuilt after each step and
    never moved."""
    return ParallelSpec(Phase.TRAIN, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=3, master_weights=master_weights,
                        tp_outer=tp_outer, first_rank=first_rank)


def rollout_spec(tp: int, replicas: int, first_rank: int = 0, expert_parallel: bool = False) -> ParallelSpec:
    """vLLM's layout: one engine with data_parallel_size=replicas, each replica a TP group of `tp` consecutive ranks;
    with expert_parallel (vLLM's enable_expert_parallel) MoE layers spread whole experts over all tp*replicas ranks."""
    return ParallelSpec(Phase.ROLLOUT, tp=tp, vllm_dp=replicas, ep=tp * replicas if expert_parallel else 1,
                        first_rank=first_rank)
