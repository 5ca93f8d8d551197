"""ParallelSpec: a typed, pure description of one parallel configuration and its role."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from .tensor import Kind


class Phase(str, Enum):
    TRAIN = "train"  # FSDP2 / ZeRO, DTensor TP, PP, EP, CP on HF module names
    ROLLOUT = "rollout"  # vLLM's fused parameter layout


@dataclass(frozen=True)
class ParallelSpec:
    """One parallel configuration over ranks [first_rank, first_rank + world_size), or over the ranks of `rank_map`.

    Train rank order (outer -> inner): pp, dp_replicate, dp, cp, tp; with tp_outer: pp, tp, dp_replicate,
    dp, cp (the same mesh, transposed: the rank order that keeps more state in place for some changes).  FSDP (zero=3) shards dim 0 of
    the TP-local tensor over the flattened (dp, cp) group (torchtitan's dp_shard_cp); zero=1/2 keep
    params replicated and shard optimizer states (and grads for zero=2) the same way; zero=0 is DDP.
    Experts: the dp*cp*tp ranks of a stage are regrouped (outer -> inner) as (edp, ep, etp).

    Rollout rank order (outer -> inner): dp (independent vLLM engines), vllm_dp, pp, tp.  MoE layers
    span vllm_dp*tp ranks (vLLM flattens TP across its DP); ep == vllm_dp*tp enables vLLM's expert
    parallelism, ep == 1 shards every expert by TP.

    `rank_map` (made by `placed_on`): the global rank at each position of the rank order where those ranks are not
    consecutive, e.g. the survivors (0, 2, 3) of a world whose rank 1 left; `first_rank` is then rank_map[0].
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
    rank_map: tuple[int, ...] | None = None  # ranks in rank order; None: first_rank onwards

    @property
    def world_size(self) -> int:
        if self.phase == Phase.ROLLOUT:
            return self.dp * self.vllm_dp * self.pp * self.tp
        return self.pp * self.dp_replicate * self.dp * self.cp * self.tp

    @property
    def ranks(self) -> Sequence[int]:
        """The global rank at each position of the spec's rank order."""
        if self.rank_map is not None:
            return self.rank_map
        return range(self.first_rank, self.first_rank + self.world_size)

    @property
    def rank_bound(self) -> int:
        """One past the highest rank the spec spans: the world a plan involving it needs."""
        return max(self.ranks, default=self.first_rank - 1) + 1

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
        where = self.first_rank if self.rank_map is None else describe_ranks(self.rank_map)
        return f"{self.phase.value}[{body or 'single'}{order}]@{where}"


def describe_ranks(ranks: Sequence[int]) -> str:
    """Ranks as runs: (0, 2, 3, 4, 9) -> "0,2-4,9"."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def placed_on(spec: ParallelSpec, ranks: Sequence[int]) -> ParallelSpec:
    """`spec` over `ranks` (one per position of its rank order): consecutive ranks give the plain spec from the first,
    any others a spec with that rank map (so equal placements give equal specs, and plans are cached once)."""
    ranks = tuple(int(r) for r in ranks)
    if len(ranks) != spec.world_size:
        raise ValueError(f"{spec.describe()} spans {spec.world_size} ranks, but {len(ranks)} were given: {ranks}")
    consecutive = ranks == tuple(range(ranks[0], ranks[0] + len(ranks))) if ranks else True
    first = ranks[0] if ranks else 0
    return replace(spec, first_rank=first, rank_map=None if consecutive else ranks)


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
