"""Placement policies: colocate, split, lend -> a `Placement` for one step (pure).

    placement = make_placement(PolicyRequest(policy="split", world_size=8, roles=("actor", "rollout"),
                                             train=ParallelLayout(tp=2), rollout_tp=2))
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..parallel_layout import ParallelLayout
from ..vps.spec import ParallelSpec, rollout_spec, train_spec
from .placement import (ACTOR, CRITIC, GENERATE, HOST, PHASES, PREPARE, REFERENCE, REWARD_MODEL, ROLLOUT, TRAIN_ACTOR,
                        TRAIN_CRITIC, Placement, RankSet, RoleSlot, resident)
from .validate import PlacementError, check_placement, check_sets

TRAINING_ROLES = (ACTOR, CRITIC, REFERENCE)


@dataclass(frozen=True)
class PolicyRequest:
    policy: str
    world_size: int
    roles: tuple[str, ...]  # always actor and rollout; critic for PPO; reference when kl_coef > 0
    train: ParallelLayout = ParallelLayout()  # every training role's; dp fills the rank set it is given
    rollout_tp: int = 1
    max_staleness: int = 0
    rollout_ranks: int = 0  # split: 0 = half the world
    train_ranks: int = 0  # split: 0 = the rest; lend: the actor's share, 0 = half
    explicit: tuple[tuple[str, RankSet], ...] = ()  # (role, set) pairs from placement.roles
    offloaded: tuple[str, ...] = ()  # roles parked in host memory outside the phases they compute in


def train_spec_on(ranks: RankSet, layout: ParallelLayout) -> ParallelSpec:
    return train_spec(ranks.size // layout.inner, layout.tp, layout.pp, layout.cp, layout.ep, layout.master_weights,
                      first_rank=ranks.first)


def rollout_spec_on(ranks: RankSet, tp: int) -> ParallelSpec:
    return rollout_spec(tp, ranks.size // tp, first_rank=ranks.first)


def _slot(role: str, ranks: RankSet, req: PolicyRequest) -> RoleSlot:
    if role == ROLLOUT:
        return resident(ranks, rollout_spec_on(ranks, req.rollout_tp))
    return resident(ranks, train_spec_on(ranks, req.train))


def _uniform(req: PolicyRequest, where: dict[str, RankSet]) -> dict[str, dict[str, RoleSlot]]:
    """Every role stays on the same set in every phase."""
    slots = {role: _slot(role, where[role], req) for role in req.roles}
    return {phase: dict(slots) for phase in PHASES}


def _active(req: PolicyRequest) -> dict[str, tuple[str, ...]]:
    has = set(req.roles)
    return {
        GENERATE: (ROLLOUT,),
        PREPARE: tuple(r for r in (ACTOR, REFERENCE, CRITIC, REWARD_MODEL) if r in has),
        TRAIN_ACTOR: (ACTOR,),
        TRAIN_CRITIC: (CRITIC,) if CRITIC in has else (),
    }


def colocate(req: PolicyRequest) -> Placement:
    if req.explicit:
        raise PlacementError(
            f"placement.policy=colocate puts every role on all {req.world_size} ranks, but placement.roles sets "
            f"{', '.join(r for r, _ in req.explicit)}; drop placement.roles or use placement=split / placement=lend.")
    if req.max_staleness:
        raise PlacementError(
            f"placement.max_staleness={req.max_staleness} with placement.policy=colocate: colocated phases run one "
            "after another on the same ranks, so generation cannot run ahead; use 0, or placement=split.")
    everyone = RankSet(0, req.world_size)
    check_sets(req.world_size, {"all ranks": everyone}, disjoint=())
    return Placement("colocate", req.world_size, _uniform(req, {r: everyone for r in req.roles}), _active(req))


def split(req: PolicyRequest) -> Placement:
    """Rollout on [0, r), every training role on [r, r + t): disjoint; the actor's weights cross each step."""
    given = dict(req.explicit)
    n_roll = req.rollout_ranks or req.world_size // 2
    rollout = given.get(ROLLOUT, RankSet(0, n_roll))
    train = given.get(ACTOR, RankSet(rollout.stop, req.train_ranks or req.world_size - rollout.stop))
    where = {ROLLOUT: rollout, **{role: given.get(role, train) for role in req.roles if role != ROLLOUT}}
    sets = {f"placement set of {role}": s for role, s in where.items()}
    disjoint = tuple((f"placement set of {ROLLOUT}", f"placement set of {r}") for r in req.roles if r != ROLLOUT)
    check_sets(req.world_size, sets, disjoint)
    if req.max_staleness not in (0, 1):
        raise PlacementError(
            f"placement.max_staleness={req.max_staleness}: split overlaps the generation of step k+1 with the "
            "training of step k, so valid values are 0 (on-policy, no overlap) and 1.")
    overlap = ((GENERATE, TRAIN_ACTOR),) if req.max_staleness else ()
    return Placement("split", req.world_size, _uniform(req, where), _active(req), overlap, req.max_staleness)


def lend_sets(world_size: int, share: int) -> tuple[RankSet, RankSet]:
    """lend's training sets over a world: the actor on the first `share` ranks (0: half of them), the critic on the
    rest."""
    actor = RankSet(0, share or world_size // 2)
    return actor, RankSet(actor.stop, world_size - actor.stop)


def lend(req: PolicyRequest) -> Placement:
    """PPO: all ranks generate and prepare; for training, the actor moves to one half and the critic to the other
    and both train at the same time; both move back onto all ranks before the next generation."""
    if CRITIC not in req.roles:
        raise PlacementError(
            "placement.policy=lend lends devices between roles that train at the same time (PPO's actor and "
            "critic); this algorithm trains only the actor (no critic), so there is nothing to lend. Use "
            "placement=colocate or placement=split, or algorithm=ppo.")
    if req.max_staleness:
        raise PlacementError(f"placement.max_staleness={req.max_staleness} with placement.policy=lend: every rank "
                             "generates, so generation cannot overlap training; use 0.")
    given = dict(req.explicit)
    everyone = RankSet(0, req.world_size)
    actor_set, critic_set = lend_sets(req.world_size, req.train_ranks)
    actor_set = given.get(ACTOR, actor_set)
    critic_set = given.get(CRITIC, RankSet(actor_set.stop, req.world_size - actor_set.stop))
    check_sets(req.world_size, {"placement set of actor": actor_set, "placement set of critic": critic_set},
               disjoint=(("placement set of actor", "placement set of critic"),))
    home = {role: _slot(role, everyone, req) for role in req.roles}
    if REWARD_MODEL in given:  # the reward model may score on a set of its own; it trains nothing, so it stays there
        check_sets(req.world_size, {"placement set of reward_model": given[REWARD_MODEL]}, disjoint=())
        home[REWARD_MODEL] = _slot(REWARD_MODEL, given[REWARD_MODEL], req)
    training = dict(home, **{ACTOR: _slot(ACTOR, actor_set, req), CRITIC: _slot(CRITIC, critic_set, req)})
    slots = {GENERATE: home, PREPARE: dict(home), TRAIN_ACTOR: training, TRAIN_CRITIC: dict(training)}
    share = None if ACTOR in given or CRITIC in given else req.train_ranks  # sets given: mapped at a change
    return Placement("lend", req.world_size, slots, _active(req), ((TRAIN_ACTOR, TRAIN_CRITIC),), actor_share=share)


POLICIES: dict[str, Callable[[PolicyRequest], Placement]] = {"colocate": colocate, "split": split, "lend": lend}


def register_policy(name: str, builder: Callable[[PolicyRequest], Placement]) -> None:
    """A placement policy by name: `builder` maps a request to the run's placement (pure)."""
    POLICIES[name] = builder


def make_placement(req: PolicyRequest) -> Placement:
    if req.policy not in POLICIES:
        raise PlacementError(f"placement.policy={req.policy!r} is not a policy; valid: {', '.join(POLICIES)}.")
    unknown = [r for r, _ in req.explicit if r not in req.roles]
    if unknown:
        raise PlacementError(
            f"placement.roles names {', '.join(unknown)}, which this run does not have; its roles are "
            f"{', '.join(req.roles)} (critic only for PPO, reference only when algorithm.kl_coef > 0, reward_model "
            f"only when task.reward names rm).")
    placement = park_idle(POLICIES[req.policy](req), req.offloaded)
    check_placement(placement, req.train.inner, req.rollout_tp)
    return placement


def park_idle(placement: Placement, roles: tuple[str, ...]) -> Placement:
    """`roles` parked in host memory in every phase they do not compute in (moved back before the phase they do)."""
    if not roles:
        return placement
    slots = {phase: {role: slot if role not in roles or role in placement.active[phase] else HOST
                     for role, slot in by_role.items()} for phase, by_role in placement.slots.items()}
    return replace(placement, slots=slots)
