"""Checks of elastic.replicas, elastic.snapshot_every and elastic.recover_from_checkpoint (docs/elastic/recovery.md):
the values, a world that has a second rank to hold the replicas (and survivors to go on), checkpoints to
load in place, and what recovery from a lost rank runs with in this first version."""
from __future__ import annotations

from ..config import Config
from ..elastic.membership import MembershipError, WorldChange, world_after
from ..elastic.replicas import recovers_from_checkpoint
from ..errors import ConfigError
from ..elastic.events import EventError
from ..orchestrator.membership import global_batch, membership_worlds
from ..orchestrator.placements import placement_request, scores_with_reward_model
from ..elastic.policies import make_placement

RECOVERS = ("recovery from a lost rank runs under placement=colocate, placement=lend (snapshots at the step's end, "
            "every role at home; a rank lost inside lend's moves too) or placement=split without rebalance at "
            "placement.max_staleness=0 (a training rank's state rebuilt on the training set's survivors, a rollout "
            "rank's loss one engine fewer) with a training layout of dp, tp and pp "
            "(parallel.train cp, ep = 1, zero=3), any rollout.tp (vLLM's TP then reduces over gloo, and the survivors "
            "start new engines where the loss moves the tp or a rank's place in a TP group), model.dtype=float32, no parallel.schedule, a reward "
            "model (task.reward naming rm) only under colocate without reward_model.offload, no algorithm=reward_model, "
            "launched by python -m rlhf_dyna (not torchrun); elastic.events, elastic.leave_on_sigterm and "
            "elastic.join requests change the world beside it (a rank lost inside a leave stops the run)")


def recovery_problems(cfg: Config, under_torchrun: bool = False) -> list[str]:
    """What of this run recovery from a lost rank cannot handle yet; [] = it can."""
    t, problems = cfg.parallel.train, []
    if cfg.placement.policy not in ("colocate", "lend", "split") or cfg.placement.rebalance:
        problems.append(f"placement={cfg.placement.policy}{' with rebalance' if cfg.placement.rebalance else ''}")
    if cfg.placement.policy == "split" and cfg.placement.max_staleness:  # a snapshot keeps no samples generated ahead
        problems.append(f"placement=split with placement.max_staleness={cfg.placement.max_staleness}")
    problems += [f"parallel.train.{name}={getattr(t, name)}" for name in ("cp", "ep") if getattr(t, name) != 1]
    if t.zero != 3:  # a snapshot reads the shards; ZeRO-1/2's gathered replicas would have to be rebuilt after it
        problems.append(f"parallel.train.zero={t.zero}")
    if cfg.model.dtype != "float32":
        problems.append(f"model.dtype={cfg.model.dtype}")
    if cfg.parallel.schedule:
        problems.append("parallel.schedule")
    if scores_with_reward_model(cfg) and cfg.placement.policy != "colocate":
        problems.append(f"a reward model (task.reward naming rm) under placement={cfg.placement.policy}")
    if scores_with_reward_model(cfg) and cfg.reward_model.offload:  # its shards wait in host memory between steps
        problems.append("reward_model.offload=true")
    if cfg.algorithm.name == "reward_model":
        problems.append("algorithm=reward_model")
    if under_torchrun:
        problems.append("torchrun")
    return problems


def unrecoverable_losses(cfg: Config) -> list[str]:
    """For each rank whose loss the survivors could not take over (the global batch, a role's set), in the launched
    world or one that elastic.events reach, why; [] = the loss of any one rank can be recovered (rank 0's too: the
    launcher serves the job's store)."""
    request = placement_request(cfg)
    worlds = [(make_placement(request), cfg.parallel.world_size, "")]
    if cfg.elastic.events:
        try:
            worlds += [(w.placement, w.change.new_world_size, f" (in the world after {event.text})")
                       for event, w in membership_worlds(cfg)]
        except EventError:  # checks/elastic.py names the entry
            pass
    out = []
    for placement, world, where in worlds:
        for rank in range(world):
            try:
                world_after(placement, request.train, cfg.rollout.tp, global_batch(cfg), WorldChange(world, (rank,)))
            except MembershipError as err:
                out.append(f"{err}{where}")
    return out


def check_replicas(cfg: Config, under_torchrun: bool = False) -> None:
    e = cfg.elastic
    if e.replicas not in (0, 1):
        raise ConfigError(f"elastic.replicas={e.replicas}: it is 0 (no replicas: a lost rank stops the run) or 1 (each "
                          "rank's shard of the training state also held by the next rank, so the run survives the "
                          "loss of one rank). Set elastic.replicas=0 or 1.")
    if not isinstance(e.snapshot_every, int) or e.snapshot_every < 1:
        raise ConfigError(f"elastic.snapshot_every={e.snapshot_every}: the replicas are refreshed every K steps, K a "
                          "whole number >= 1 (1: after every step, at most one step lost). Set e.g. "
                          "elastic.snapshot_every=1.")
    if e.recover_from_checkpoint and cfg.trainer.save_every <= 0:
        raise ConfigError(f"elastic.recover_from_checkpoint=true with trainer.save_every={cfg.trainer.save_every}: the "
                          "survivors of a lost rank would load the newest complete checkpoint in place, and this run "
                          "writes none. Set trainer.save_every=N (a checkpoint every N steps), or "
                          "elastic.recover_from_checkpoint=false.")
    from_checkpoint = recovers_from_checkpoint(e.replicas, e.recover_from_checkpoint)
    if not (e.replicas or from_checkpoint) or cfg.dry_run:
        return
    what, off = (("elastic.replicas=1", "elastic.replicas=0") if e.replicas else
                 ("elastic.recover_from_checkpoint=true", "elastic.recover_from_checkpoint=false"))
    if cfg.parallel.world_size < 2:
        why = ("a replica lives on another rank, and a world of one has none to hold it (nor survivors to go on)"
               if e.replicas else "a world of one has no survivors to go on")
        raise ConfigError(f"{what} with parallel.world_size={cfg.parallel.world_size}: {why}. Use "
                          f"parallel.world_size >= 2, or {off}.")
    problems = recovery_problems(cfg, under_torchrun)
    if problems:
        raise ConfigError(f"{what}: this run could not recover from a lost rank yet: {'; '.join(problems)}. "
                          f"For now {RECOVERS}. Change those settings, or set {off}.")
    lost = unrecoverable_losses(cfg)
    if lost:
        raise ConfigError(f"{what}: the survivors of a lost rank could not go on: {lost[0]} Recovery keeps "
                          "the global batch, so it must split over the survivors of any one lost rank.")
