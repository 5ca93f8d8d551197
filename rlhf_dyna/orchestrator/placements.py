"""Config -> placement: the roles a run has, its layouts, and the policy's `Placement` (checked before spawn)."""
from __future__ import annotations

from dataclasses import replace

from ..config import Config
from ..elastic.placement import (
    ACTOR, CRITIC, GENERATE, REFERENCE, ROLES, ROLLOUT, TRAIN_ACTOR, Placement, RankSet, changes, weight_sync,
)
from ..elastic.policies import PolicyRequest, TrainLayout, make_placement
from ..elastic.rebalance import SplitShape, describe_invalid, split_candidates
from ..elastic.validate import PlacementError
from ..validate import ConfigError

LIVE_POLICIES = ("colocate", "lend", "split")  # what the loop executes today; the others are planned by dry_run=true


def run_roles(cfg: Config) -> tuple[str, ...]:
    roles = [ACTOR]
    if cfg.algorithm.name == "ppo":
        roles.append(CRITIC)
    if cfg.algorithm.kl_coef > 0:
        roles.append(REFERENCE)
    return (*roles, ROLLOUT)


def explicit_sets(cfg: Config) -> tuple[tuple[str, RankSet], ...]:
    out = []
    for role, pair in cfg.placement.roles.items():
        if role not in ROLES or len(pair) != 2:
            raise ConfigError(
                f"placement.roles.{role}={list(pair)}: each entry is role: [first_rank, size] with role one of "
                f"{', '.join(ROLES)}, e.g. +placement.roles.rollout=[0,2] +placement.roles.actor=[2,2].")
        out.append((role, RankSet(int(pair[0]), int(pair[1]))))
    return tuple(out)


def placement_request(cfg: Config) -> PolicyRequest:
    t, p = cfg.parallel.train, cfg.placement
    layout = TrainLayout(tp=t.tp, pp=t.pp, cp=t.cp, ep=t.ep, zero=t.zero, master_weights=cfg.model.dtype != "float32")
    return PolicyRequest(p.policy, cfg.parallel.world_size, run_roles(cfg), layout, cfg.rollout.tp, p.max_staleness,
                         p.rollout_ranks, p.train_ranks, explicit_sets(cfg))


def placement_of(cfg: Config) -> Placement:
    try:
        return make_placement(placement_request(cfg))
    except PlacementError as err:
        raise ConfigError(str(err)) from err


def split_placement(cfg: Config, rollout_ranks: int) -> Placement:
    """The split of the world into `rollout_ranks` rollout ranks from rank 0 and the rest training (rebalancing)."""
    return make_placement(replace(placement_request(cfg), rollout_ranks=rollout_ranks, train_ranks=0, explicit=()))


def split_shape(cfg: Config) -> SplitShape:
    return SplitShape(cfg.parallel.world_size, cfg.task.prompts_per_step, cfg.task.prompts_per_step * cfg.rollout.n,
                      cfg.algorithm.mini_batches, cfg.rollout.tp, placement_request(cfg).train.inner)


def check_rebalance(cfg: Config) -> None:
    """placement.rebalance=true: split only, sets it may choose itself, and a second split to move to."""
    p = cfg.placement
    if p.policy != "split":
        raise ConfigError(
            f"placement.rebalance=true with placement={p.policy}: re-balancing moves devices between the rollout set "
            "and the train set of placement=split; use placement=split, or placement.rebalance=false.")
    if p.roles or p.train_ranks:
        given = "placement.roles" if p.roles else f"placement.train_ranks={p.train_ranks}"
        raise ConfigError(
            f"placement.rebalance=true with {given}: re-balancing chooses the sets itself (rollout from rank 0, "
            "training on the rest); give only the starting placement.rollout_ranks.")
    if p.rebalance_margin < 0 or p.rebalance_every < 1:
        raise ConfigError(
            f"placement.rebalance_margin={p.rebalance_margin}, placement.rebalance_every={p.rebalance_every}: the "
            "margin is a fraction of the step >= 0 (e.g. 0.1) and decisions come every >= 1 steps.")
    valid, invalid = split_candidates(split_shape(cfg))
    if len(valid) < 2:
        world = cfg.parallel.world_size
        runs = ", ".join(f"{r}+{world - r}" for r in valid) or "none"
        raise ConfigError(
            f"placement.rebalance=true: no second split of the {world} ranks runs this config, so there is "
            f"nothing to re-balance to. Valid rollout+train splits: {runs}; "
            f"tried and invalid: {describe_invalid(invalid, world, cfg.rollout.tp)}. Change task.prompts_per_step / rollout.n / "
            "algorithm.mini_batches (e.g. task.prompts_per_step=12 on 4 ranks), or placement.rebalance=false.")


def check_placement_config(cfg: Config) -> Placement:
    """Refusals of the placement group, before spawn."""
    p = cfg.placement
    if p.rebalance:
        check_rebalance(cfg)
    placement = placement_of(cfg)
    rollout = placement.slot("generate", ROLLOUT).ranks
    replicas = rollout.size // cfg.rollout.tp
    if cfg.task.prompts_per_step % replicas:
        raise ConfigError(
            f"task.prompts_per_step={cfg.task.prompts_per_step} must be a multiple of the {replicas} rollout replicas "
            f"of the rollout set {rollout.describe()} (its {rollout.size} ranks / rollout.tp={cfg.rollout.tp}); use "
            f"{replicas * max(1, cfg.task.prompts_per_step // replicas)}.")
    if not cfg.dry_run and p.policy not in LIVE_POLICIES:
        raise ConfigError(
            f"placement={p.policy} is planned by the dry run only (add dry_run=true to see its placement changes and "
            f"their predicted times); live runs execute placement={'/'.join(LIVE_POLICIES)} today, where every role "
            "sits on every rank. Drop the placement override to run.")
    if p.policy == "lend" and cfg.parallel.train.pp > 1 and not cfg.dry_run:
        raise ConfigError(
            f"placement=lend with parallel.train.pp={cfg.parallel.train.pp}: lent roles train on (dp, tp) meshes of "
            "their rank sets; pipeline stages are not moved between sets yet. Use parallel.train.pp=1 with lend, or "
            "placement=colocate for pipeline parallel.")
    if p.policy == "split" and not cfg.dry_run:
        check_split_live(cfg, rollout)
    if p.policy != "colocate" and cfg.parallel.schedule and not cfg.dry_run:
        raise ConfigError(
            f"placement={p.policy} with parallel.schedule ({len(cfg.parallel.schedule)} layout switches): the loop "
            "moves roles between the placement's rank sets and does not change the training layout as well; drop "
            "parallel.schedule or use placement=colocate.")
    return placement


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
        for role in (r for r in run_roles(cfg) if r != ROLLOUT):
            name = f"reshard/{role}/rebalance/{start}+{world - start}_to_{target}+{world - target}"
            out.append(Transition(name, src, dst))
    return out


def check_split_live(cfg: Config, rollout: RankSet) -> None:
    """What the live split loop (orchestrator/split_run) does not do yet, refused before spawn."""
    p = cfg.placement
    unsupported = [(cfg.rollout.tp != 1, f"rollout.tp={cfg.rollout.tp} (each rollout rank runs one tp=1 engine; use 1)"),
                   (cfg.parallel.train.pp > 1, f"parallel.train.pp={cfg.parallel.train.pp} (use 1)")]
    wrong = [what for bad, what in unsupported if bad]
    if wrong:
        raise ConfigError(
            f"placement=split runs live with generation on {rollout.describe()} and training on the other ranks, "
            f"but not with: {'; '.join(wrong)}. Change those settings, or use placement=colocate.")
    valid, invalid = split_candidates(split_shape(cfg))
    if not p.roles and rollout.size in invalid:  # e.g. the step's rows do not shard over the train set's dp
        world = cfg.parallel.world_size
        raise ConfigError(
            f"placement=split with {rollout.size} rollout + {world - rollout.size} train ranks cannot run a step: "
            f"{invalid[rollout.size]}. Splits that can: {', '.join(f'{r}+{world - r}' for r in valid) or 'none'} "
            "(placement.rollout_ranks).")
