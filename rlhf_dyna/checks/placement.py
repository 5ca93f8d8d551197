"""Checks of the placement group: the policy's sets, what the live split and re-balancing runs do not do yet."""
from __future__ import annotations

from ..config import Config
from ..elastic.placement import ROLLOUT, Placement, RankSet
from ..elastic.rebalance import describe_invalid, split_candidates
from ..elastic.validate import PlacementError
from ..orchestrator.placements import placement_of, split_shape
from ..errors import ConfigError


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
    try:
        placement = placement_of(cfg)
    except PlacementError as err:
        raise ConfigError(str(err)) from err
    rollout = placement.slot("generate", ROLLOUT).ranks
    replicas = rollout.size // cfg.rollout.tp
    if cfg.task.prompts_per_step % replicas:
        raise ConfigError(
            f"task.prompts_per_step={cfg.task.prompts_per_step} must be a multiple of the {replicas} rollout replicas "
            f"of the rollout set {rollout.describe()} (its {rollout.size} ranks / rollout.tp={cfg.rollout.tp}); use "
            f"{replicas * max(1, cfg.task.prompts_per_step // replicas)}.")
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


def check_split_live(cfg: Config, rollout: RankSet) -> None:
    """What the live split loop (orchestrator/runtimes/split.py) does not do yet, refused before spawn."""
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
