"""Placements as data: which ranks hold each role's state in each phase, in which parallel spec.

Pure (vps and the standard library only). A role's state in a phase is either resident on a contiguous
rank set in a `ParallelSpec` whose `first_rank` is the set's first rank, or parked in host memory.
`changes(placement)` lists the role-state moves that walking the phases of one step implies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..vps.spec import ParallelSpec

ACTOR, CRITIC, REFERENCE, ROLLOUT = "actor", "critic", "reference", "rollout"
REWARD_MODEL = "reward_model"  # a learned reward: forward-only, it scores the samples in the prepare phase
ROLES = (ACTOR, CRITIC, REFERENCE, REWARD_MODEL, ROLLOUT)
GENERATE, PREPARE, TRAIN_ACTOR, TRAIN_CRITIC = "generate", "prepare", "train_actor", "train_critic"
PHASES = (GENERATE, PREPARE, TRAIN_ACTOR, TRAIN_CRITIC)  # the order of one RL step
WEIGHT_SYNC = "train_to_rollout"  # name of the per-step actor -> rollout weight move (metric names rely on it)


@dataclass(frozen=True)
class RankSet:
    """Ranks [first, first + size)."""

    first: int
    size: int

    @property
    def ranks(self) -> range:
        return range(self.first, self.first + self.size)

    @property
    def stop(self) -> int:
        return self.first + self.size

    def overlaps(self, other: RankSet) -> bool:
        return self.first < other.stop and other.first < self.stop

    def describe(self) -> str:
        return f"[{self.first}..{self.stop - 1}]" if self.size > 1 else f"[{self.first}]"


@dataclass(frozen=True)
class RoleSlot:
    """Where a role's state is in one phase: resident on `ranks` in `spec`, or parked in host memory."""

    ranks: Optional[RankSet]
    spec: Optional[ParallelSpec]

    @property
    def parked(self) -> bool:
        return self.ranks is None

    def describe(self) -> str:
        return "host" if self.parked else self.spec.describe()  # type: ignore[union-attr]


HOST = RoleSlot(None, None)


def resident(ranks: RankSet, spec: ParallelSpec) -> RoleSlot:
    return RoleSlot(ranks, spec)


@dataclass(frozen=True)
class Placement:
    """phase -> role -> slot for every role the algorithm has, plus who computes in each phase.

    `active[phase]` are the roles that compute in it; `concurrent` lists phases that run at the same
    time on disjoint sets; `staleness` is how many steps generation may run ahead of training.
    """

    policy: str
    world_size: int
    slots: dict[str, dict[str, RoleSlot]]
    active: dict[str, tuple[str, ...]]
    concurrent: tuple[tuple[str, ...], ...] = ()
    staleness: int = 0
    phases: tuple[str, ...] = PHASES
    notes: tuple[str, ...] = field(default=())
    actor_share: int | None = None  # lend: the actor's training set as asked (0 = half), re-planned in every world

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in ROLES if r in self.slots[self.phases[0]])

    def slot(self, phase: str, role: str) -> RoleSlot:
        return self.slots[phase][role]

    def key(self) -> str:
        """Stable name of this placement (world builder key, trace labels): policy and each role's sets."""
        sets = []
        for role in self.roles:
            seen = dict.fromkeys(self.slot(ph, role).describe() for ph in self.phases)
            sets.append(f"{role}={'|'.join(seen)}")
        return f"{self.policy}/w{self.world_size}/" + ",".join(sets)


@dataclass(frozen=True)
class Change:
    """One role's state moves from its slot in `from_phase` to its slot in `to_phase`."""

    role: str
    from_phase: str
    to_phase: str
    src: RoleSlot
    dst: RoleSlot

    @property
    def name(self) -> str:
        return f"reshard/{self.role}/{self.from_phase}_to_{self.to_phase}"

    @property
    def is_vps(self) -> bool:
        """Both ends resident: a VPS plan moves it; otherwise it is a park or an unpark (host copy)."""
        return not self.src.parked and not self.dst.parked


@dataclass(frozen=True)
class WeightSync:
    """The trained actor weights move into the rollout engine's layout before generation."""

    from_phase: str
    src: ParallelSpec
    dst: ParallelSpec
    name: str = WEIGHT_SYNC


def changes(placement: Placement) -> list[Change]:
    """Role-state moves of one step, in phase order, wrapping from the last phase back to the first."""
    out = []
    phases = placement.phases
    for i, to_phase in enumerate(phases):
        from_phase = phases[i - 1]
        for role in placement.roles:
            src, dst = placement.slot(from_phase, role), placement.slot(to_phase, role)
            if src != dst:
                out.append(Change(role, from_phase, to_phase, src, dst))
    return out


def weight_sync(placement: Placement) -> WeightSync:
    """Actor's slot at the end of the step -> rollout's slot in generate."""
    last = placement.phases[-1]
    actor, rollout = placement.slot(last, ACTOR), placement.slot(GENERATE, ROLLOUT)
    if actor.parked or rollout.parked:
        raise ValueError(f"placement {placement.policy}: the weight sync needs the actor resident in {last} and "
                         f"the rollout resident in {GENERATE}; it found actor={actor.describe()}, "
                         f"rollout={rollout.describe()}")
    return WeightSync(last, actor.spec, rollout.spec)  # type: ignore[arg-type]
