"""The parallel layout: one type from the config to each rank's coordinates, the device mesh and the VPS spec.

A training layout is (pp, dp, cp, tp) over the contiguous ranks [first_rank, first_rank + size), outermost first
(with `tp_outer`: pp, tp, dp, cp, the same grid transposed), plus expert parallel (the dp ranks of a stage regrouped
as (edp, ep), ep inner), the ZeRO stage and the pipeline schedule. `dp=-1` fills whatever rank set the layout is
placed on: `fill(size, first_rank)` resolves it and checks every dimension, naming the number that is wrong.
`RolloutLayout` is the inference side: vLLM's TP groups of consecutive ranks and its DP replicas.

Pure: numbers in, numbers out. `train.mesh.build_mesh(layout)` turns `mesh_grid()` into a DeviceMesh.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .vps.spec import ParallelSpec, rollout_spec, train_spec

PP_SCHEDULES = ("1F1B", "GPipe")
ZERO_STAGES = (1, 2, 3)


class LayoutError(ValueError):
    """A layout that cannot exist: the message names the number that is wrong and what would be valid."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ParallelLayout:
    dp: int = -1  # -1: fills the rank set the layout is placed on
    tp: int = 1
    zero: int = 3  # 3 = FSDP (params, grads, optimizer state sharded); 1, 2 = optimizer state (and grads) sharded
    tp_outer: bool = False  # TP outermost within a stage: the rank order whose plans keep more state in place
    pp: int = 1
    pp_schedule: str = "1F1B"
    ep: int = 1
    cp: int = 1
    first_rank: int = 0
    master_weights: bool = False  # low-precision params with an fp32 master copy (the dry run's cluster dtype)

    @classmethod
    def of(cls, c, master_weights: bool = False) -> ParallelLayout:
        """From a config's layout (config.LayoutConfig: dp, tp, pp, cp, ep, zero, pp_schedule), dp unresolved."""
        return cls(c.dp, c.tp, c.zero, pp=c.pp, pp_schedule=c.pp_schedule, ep=c.ep, cp=c.cp,
                   master_weights=master_weights)

    @property
    def inner(self) -> int:
        """Ranks of one dp replica: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    @property
    def size(self) -> int:
        return self.dp * self.inner

    @property
    def data_parallel_only(self) -> bool:
        """No tensor, pipeline, context or expert parallel: every rank holds whole layers of its shard."""
        return self.inner == 1 and self.ep == 1

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.size)

    def fill(self, size: int, first_rank: int = 0, where: str = "parallel.train.",
             placed_on: str | None = None) -> ParallelLayout:
        """This layout on ranks [first_rank, first_rank + size), dp resolved; every dimension checked. `where` prefixes
        the key names in messages ("parallel.train." -> "parallel.train.tp=3"); `placed_on` names the rank count."""
        placed_on = placed_on or f"the {size} ranks it is placed on"
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise LayoutError(f"{where}{name}={getattr(self, name)} must be >= 1.")
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"{where}zero={self.zero}; valid: {', '.join(map(str, ZERO_STAGES))}.")
        if self.pp_schedule not in PP_SCHEDULES:
            raise LayoutError(f"{where}pp_schedule={self.pp_schedule!r}; valid: {', '.join(PP_SCHEDULES)}.")
        inner, label = self.inner, where.rstrip(". ")
        if size % inner:
            valid = [d for d in divisors(size) if d % (self.pp * self.cp) == 0]
            raise LayoutError(
                f"{label}: tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {inner} does not divide {placed_on}; choose "
                f"tp*pp*cp among {valid}.")
        dp = size // inner if self.dp == -1 else self.dp
        if dp < 1 or dp * inner != size:
            raise LayoutError(
                f"{label}: dp*tp*pp*cp = {dp}*{self.tp}*{self.pp}*{self.cp} = {dp * inner} but {placed_on}; use "
                f"dp={size // inner} (or dp=-1 to fill them).")
        grouped = dp * self.cp * self.tp  # the ranks of a stage, regrouped as (edp, ep, etp) for the experts
        if self.ep > 1 and grouped % self.ep:
            what = f"dp={dp}" if grouped == dp else f"dp*cp*tp={grouped}"
            raise LayoutError(f"{where}ep={self.ep} does not divide {what} (expert parallel regroups the ranks of a "
                              f"stage as edp x ep); valid ep: {divisors(grouped)}.")
        return replace(self, dp=dp, first_rank=first_rank)

    def model_problems(self, heads: int, kv_heads: int, experts: int, where: str = "parallel.train.") -> list[str]:
        """Why a model with these head and expert counts cannot take this layout's tp and ep, each with what would be
        valid; [] = it can (pipeline stages against layers: checks.pipeline, with the micro-batches)."""
        return self.head_problems(heads, kv_heads, where) + self.expert_problems(experts, where)

    def head_problems(self, heads: int, kv_heads: int, where: str = "parallel.train.") -> list[str]:
        if heads % self.tp:
            return [f"{where}tp={self.tp} does not divide num_attention_heads={heads}; valid {where}tp: "
                    f"{divisors(heads)}"]
        if kv_heads % self.tp:
            valid = [t for t in divisors(heads) if kv_heads % t == 0]
            return [f"{where}tp={self.tp} does not fit num_key_value_heads={kv_heads} (it must divide it); valid "
                    f"{where}tp: {valid}"]
        return []

    def expert_problems(self, experts: int, where: str = "parallel.train.") -> list[str]:
        if self.ep > 1 and experts == 0:
            return [f"{where}ep={self.ep} on a dense model (model.num_experts=0): expert parallel shards the experts "
                    f"of an MoE model; use ep=1, or an MoE model (e.g. model=qwen3_235b_a22b)"]
        if self.ep > 1 and experts % self.ep:
            return [f"{where}ep={self.ep} does not divide model.num_experts={experts} (each rank owns num_experts / "
                    f"ep whole experts); valid ep: {divisors(experts)}"]
        return []

    def spec(self) -> ParallelSpec:
        """The VPS spec of the training state in this layout (dp must be resolved)."""
        return train_spec(self.dp, self.tp, self.pp, self.cp, self.ep, self.master_weights, self.tp_outer,
                          self.first_rank)

    def mesh_grid(self) -> tuple[tuple[str, ...], list]:
        """(dimension names, nested list of global ranks) of the device mesh of this layout."""
        n = self.dp * self.tp
        if self.pp > 1:
            ranks = [[[self.first_rank + s * n + d * self.tp + t for t in range(self.tp)] for d in range(self.dp)]
                     for s in range(self.pp)]
            return ("pp", "dp", "tp"), ranks
        if self.ep > 1:
            edp = self.dp // self.ep
            ranks = [[[self.first_rank + (e * self.ep + x) * self.tp + t for t in range(self.tp)]
                      for x in range(self.ep)] for e in range(edp)]
            return ("edp", "ep", "tp"), ranks
        return ("dp", "tp"), [[self.first_rank + self.rank_at(d, t) for t in range(self.tp)] for d in range(self.dp)]

    def rank_at(self, d: int, t: int) -> int:
        """Offset from first_rank of the rank at dp coordinate d, tp coordinate t (one stage, cp=1)."""
        return t * self.dp + d if self.tp_outer else d * self.tp + t

    def dp_rank(self, rank: int) -> int:
        """The dp coordinate of a global rank of this layout (the same on every pipeline stage)."""
        within = (rank - self.first_rank) % (self.dp * self.tp)
        return within % self.dp if self.tp_outer else within // self.tp

    def describe(self) -> str:
        pipeline = f"pp{self.pp}x" if self.pp > 1 else ""
        experts = f"-ep{self.ep}" if self.ep > 1 else ""
        return f"{pipeline}dp{self.dp}xtp{self.tp}{experts}-zero{self.zero}" + ("-tp_outer" if self.tp_outer else "")


@dataclass(frozen=True)
class LayoutSwitch:
    """From `step` on (before that step trains) the training roles train in `layout`."""

    step: int
    layout: ParallelLayout


def switch_at(schedule: list[LayoutSwitch], step: int) -> ParallelLayout | None:
    """The layout to switch to before `step` trains, or None when the schedule has no switch at `step`."""
    return next((s.layout for s in schedule if s.step == step), None)


def reached_by(schedule: list[LayoutSwitch], step: int) -> ParallelLayout | None:
    """The layout the schedule has reached at `step` (the last switch at or before it), None before any switch."""
    passed = [s for s in schedule if s.step <= step]
    return passed[-1].layout if passed else None


@dataclass(frozen=True)
class RolloutLayout:
    """vLLM's layout on ranks [first_rank, first_rank + size): TP groups of `tp` consecutive ranks, one DP replica
    each; with expert_parallel, MoE layers spread whole experts over all the ranks."""

    size: int
    tp: int = 1
    first_rank: int = 0
    expert_parallel: bool = False

    @property
    def replicas(self) -> int:
        return self.size // self.tp

    def holds(self, rank: int) -> bool:
        return self.first_rank <= rank < self.first_rank + self.size

    def replica(self, rank: int) -> int:
        return (rank - self.first_rank) // self.tp

    def is_leader(self, rank: int) -> bool:
        """The rank of its TP group that reports the group's samples (its peers hold the same)."""
        return self.holds(rank) and (rank - self.first_rank) % self.tp == 0

    def spec(self) -> ParallelSpec:
        return rollout_spec(self.tp, self.replicas, self.first_rank, self.expert_parallel)
