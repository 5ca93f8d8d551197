"""Config -> placement: the roles a run has, its layouts, and the policy's `Placement` (checked before spawn)."""
from __future__ import annotations

from ..config import Config
from ..elastic.placement import ACTOR, CRITIC, REFERENCE, ROLES, ROLLOUT, Placement, RankSet, changes, weight_sync
from ..elastic.policies import PolicyRequest, TrainLayout, make_placement
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


def check_placement_config(cfg: Config) -> Placement:
    """Refusals of the placement group, before spawn."""
    p = cfg.placement
    if p.rebalance:
        raise ConfigError("placement.rebalance=true: automatic re-balancing is not implemented yet; leave it false.")
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
    """The weight sync and each VPS-planned role move of one step under `cfg.placement` (for the dry run)."""
    from ..vps.dryrun import Transition

    placement = placement_of(cfg)
    sync = weight_sync(placement)
    moves = [Transition(c.name, c.src.spec, c.dst.spec) for c in changes(placement) if c.is_vps]
    return [Transition(sync.name, sync.src, sync.dst), *moves]


def check_split_live(cfg: Config, rollout: RankSet) -> None:
    """What the live split loop (orchestrator/split_run) does not do yet, refused before spawn."""
    t, p = cfg.trainer, cfg.placement
    unsupported = [(cfg.rollout.tp != 1, f"rollout.tp={cfg.rollout.tp} (each rollout rank runs one tp=1 engine; use 1)"),
                   (cfg.algorithm.name != "grpo", f"algorithm={cfg.algorithm.name} (use a critic-free one: grpo)"),
                   (cfg.parallel.train.pp > 1, f"parallel.train.pp={cfg.parallel.train.pp} (use 1)"),
                   (bool(t.resume), "trainer.resume (split runs start fresh)"),
                   (t.save_every > 0 or t.save_last, "checkpoints (set trainer.save_every=0 trainer.save_last=false)"),
                   (t.export_policy, "policy export (set trainer.export_policy=false)")]
    wrong = [what for bad, what in unsupported if bad]
    if wrong:
        raise ConfigError(
            f"placement=split runs live with generation on {rollout.describe()} and training on the other ranks, "
            f"but not with: {'; '.join(wrong)}. Change those settings, or use placement=colocate.")
