"""Config -> placement: the roles a run has, its layouts, and the policy's `Placement` (elastic.policies)."""
from __future__ import annotations

from dataclasses import replace

from ..config import Config
from ..parallel_layout import ParallelLayout
from ..elastic.placement import (
    ACTOR, CRITIC, GENERATE, REFERENCE, REWARD_MODEL, ROLES, ROLLOUT, TRAIN_ACTOR, Placement, RankSet, changes,
    weight_sync,
)
from ..elastic.policies import PolicyRequest, make_placement
from ..elastic.rebalance import SplitShape, split_candidates
from ..elastic.validate import PlacementError
from ..tasks.rewards import LEARNED, reward_names


def scores_with_reward_model(cfg: Config) -> bool:
    """task.reward names `rm`: the reward model (reward_model.path) is a role of the run."""
    return cfg.task.name == "file" and LEARNED in reward_names(cfg.task.reward)

def run_roles(cfg: Config) -> tuple[str, ...]:
    roles = [ACTOR]
    if cfg.algorithm.name == "ppo":
        roles.append(CRITIC)
    if cfg.algorithm.kl_coef > 0:
        roles.append(REFERENCE)
    if scores_with_reward_model(cfg):
        roles.append(REWARD_MODEL)
    return (*roles, ROLLOUT)


def explicit_sets(cfg: Config) -> tuple[tuple[str, RankSet], ...]:
    out = []
    for role, pair in cfg.placement.roles.items():
        if role not in ROLES or len(pair) != 2:
            raise PlacementError(
                f"placement.roles.{role}={list(pair)}: each entry is role: [first_rank, size] with role one of "
                f"{', '.join(ROLES)}, e.g. +placement.roles.rollout=[0,2] +placement.roles.actor=[2,2].")
        out.append((role, RankSet(int(pair[0]), int(pair[1]))))
    return tuple(out)


def placement_request(cfg: Config) -> PolicyRequest:
    p = cfg.placement
    layout = ParallelLayout.of(cfg.parallel.train, master_weights=cfg.model.dtype != "float32")
    offloaded = (REWARD_MODEL,) if cfg.reward_model.offload and scores_with_reward_model(cfg) else ()
    return PolicyRequest(p.policy, cfg.parallel.world_size, run_roles(cfg), layout, cfg.rollout.tp, p.max_staleness,
                         p.rollout_ranks, p.train_ranks, explicit_sets(cfg), offloaded)


def placement_of(cfg: Config) -> Placement:
    return make_placement(placement_request(cfg))


def split_placement(cfg: Config, rollout_ranks: int, world_size: int | None = None) -> Placement:
    """The split of the world (the launched one, or one of `world_size` ranks after a change of world) into
    `rollout_ranks` rollout ranks from rank 0 and the rest training (rebalancing)."""
    return make_placement(replace(placement_request(cfg), world_size=world_size or cfg.parallel.world_size,
                                  rollout_ranks=rollout_ranks, train_ranks=0, explicit=()))


def split_shape(cfg: Config, world_size: int | None = None) -> SplitShape:
    return SplitShape(world_size or cfg.parallel.world_size, cfg.task.prompts_per_step,
                      cfg.task.prompts_per_step * cfg.rollout.n, cfg.algorithm.mini_batches, cfg.rollout.tp,
                      placement_request(cfg).train.inner)


def placement_transitions(cfg: Config) -> list:
    """The weight sync and each VPS-planned role move of one step under `cfg.placement`, then, with re-balancing, the
    first moves the manager may make (for the dry run)."""
    from ..vps.dryrun import Transition

    placement = placement_of(cfg)
    sync = weight_sync(placement)
    moves = [Transition(c.name, c.src.spec, c.dst.spec) for c in changes(placement) if c.is_vps]
    return [Transition(sync.name, sync.src, sync.dst), *moves, *(rebalance_transitions(cfg) if cfg.placement.rebalance
                                                              else [])]


def rebalance_transitions(cfg: Config) -> list:
    """The state moves of re-balancing from the starting split to the nearest split on each side that can run the
    config (one rank set size step): every training role moves from the train set's spec to the new one's, named
    `reshard/<role>/rebalance/<rollout>+<train>_to_<rollout>+<train>`."""
    from ..vps.dryrun import Transition

    world = cfg.parallel.world_size
    start = placement_of(cfg).slot(GENERATE, ROLLOUT).ranks.size
    valid, _ = split_candidates(split_shape(cfg))
    nearest = [max((r for r in valid if r < start), default=None), min((r for r in valid if r > start), default=None)]
    src = split_placement(cfg, start).slot(TRAIN_ACTOR, ACTOR).spec
    out = []
    for target in (r for r in nearest if r is not None):
        dst = split_placement(cfg, target).slot(TRAIN_ACTOR, ACTOR).spec
        for role in (r for r in run_roles(cfg) if r not in (ROLLOUT, REWARD_MODEL)):  # the RM does not move yet
            name = f"reshard/{role}/rebalance/{start}+{world - start}_to_{target}+{world - target}"
            out.append(Transition(name, src, dst))
    return out
