"""Checks of the elastic group: every scripted membership change can happen (the event is well formed, its step lies
inside the run, its ranks exist, it empties no role, the new world fits a layout and the same global batch), and what
does not run live yet is refused, naming what does."""
from __future__ import annotations

from ..config import Config
from ..elastic.events import Event, EventError, parse_events
from ..elastic.membership import NewWorld, live_refusal
from ..elastic.placement import GENERATE, ROLLOUT
from ..launch.host import store_host_rank
from ..orchestrator.membership import membership_worlds
from ..orchestrator.placements import placement_of, scores_with_reward_model
from ..errors import ConfigError

LIVE = ("a live run executes leave:R@S and leave:A-B@S (and leaves on SIGTERM), and join@S and join:N@S, under "
        "placement=colocate, placement=split (a leave shrinks the set the rank left, joiners extend the training "
        "set; with placement.rebalance=true the candidate splits and the re-balancing manager are re-planned over "
        "the new world, and no move is made at a boundary where a change is known to come), or placement=lend "
        "(every role at home at the boundary; the actor's and the critic's sets re-planned over the new world), with "
        "a training layout of dp, tp and pp (parallel.train cp, ep = 1; lend: pp = 1), no parallel.schedule, a "
        "reward model (task.reward naming rm) only under colocate without reward_model.offload, no "
        "algorithm=reward_model, any rollout.tp (vLLM engines restarted where a change moves their tp or a rank's "
        "place in a TP group; split's engines are tp=1); join@S needs python -m rlhf_dyna's launcher, which starts "
        "the joining processes: under torchrun leaves run live, and a process joins when started by hand with "
        "python -m rlhf_dyna elastic.join=RUN_DIR on rank 0's host")
# why each layout dimension the planner handles is still refused live
DIMENSIONS = {
    "cp": "context parallel does not train live in any run yet, with or without changes of world (its mesh "
          "dimension, sequence split and attention are not built; docs/extending.md); dry_run=true plans its "
          "changes, cp kept where the new world's sets divide by it",
    "ep": "expert parallel's MoE rollout on the CPU needs one vLLM TP group over every rank, which no change keeps",
}


def live_problems(cfg: Config, worlds: list[tuple[Event, NewWorld]], under_torchrun: bool = False) -> list[str]:
    """What of a run with these changes (each event with the world after it) a live run cannot execute yet
    (docs/elastic/membership.md); [] = it can."""
    t, problems, split = cfg.parallel.train, [], cfg.placement.policy == "split"
    if cfg.placement.policy not in ("colocate", "split", "lend"):
        problems.append(f"placement={cfg.placement.policy}")
    # split: the scorer's set and groups are the training set's; lend: a scorer beside lent roles is untried live
    if cfg.placement.policy != "colocate" and scores_with_reward_model(cfg):
        problems.append(f"a reward model (task.reward naming rm) under placement={cfg.placement.policy}")
    problems += [f"parallel.train.{name}={getattr(t, name)} ({why})" for name, why in DIMENSIONS.items()
                 if getattr(t, name) != 1]
    if cfg.parallel.schedule:
        problems.append("parallel.schedule")
    if cfg.algorithm.name == "reward_model":
        problems.append("algorithm=reward_model")
    if scores_with_reward_model(cfg) and cfg.reward_model.offload:  # its shards wait in host memory at a boundary
        problems.append("reward_model.offload=true")
    joins = [event.text for event, _ in worlds if event.joining]
    if joins and split and (why := joiners_generate(cfg)):
        problems.append(f"{', '.join(joins)} ({why})")
    if joins and under_torchrun:  # nobody would start the joiners: the app does not spawn processes under torchrun
        problems.append(f"{', '.join(joins)} under torchrun (python -m rlhf_dyna's launcher starts a scripted joiner; "
                        f"under torchrun start python -m rlhf_dyna elastic.join=RUN_DIR by hand instead, on rank 0's "
                        f"host, and drop {', '.join(joins)})")
    problems += [f"{event.text} ({why})" for event, world in worlds
                 if event.leaving and (why := live_refusal(world.change, store_host_rank(launching=not under_torchrun)))]
    return problems


def joiners_generate(cfg: Config) -> str | None:
    """Under split, why joiners would not train: the rollout set reaches the end of the world (placement.roles), so
    the planner gives it the joiners, and a split joiner starts no vLLM engine; None where the training set does."""
    placement = placement_of(cfg)
    rollout = placement.slot(GENERATE, ROLLOUT).ranks
    if rollout.stop != placement.world_size:
        return None
    return (f"the rollout set {rollout.describe()} reaches the end of the world, so joiners would generate, and a "
            f"joiner under placement=split trains; place the training set last (placement.roles)")


def join_refusal(cfg: Config, under_torchrun: bool = False) -> str | None:
    """Why a running job of this config cannot admit elastic.join=RUN_DIR processes live, or None."""
    problems = live_problems(cfg, [], under_torchrun)  # beside recovery from a lost rank too (the world regrows)
    if cfg.placement.policy == "split" and (why := joiners_generate(cfg)):
        problems.append(why)
    return "; ".join(problems) or None


def check_elastic(cfg: Config, under_torchrun: bool = False) -> None:
    e = cfg.elastic
    if e.accept_joins and not cfg.dry_run and (why := join_refusal(cfg, under_torchrun)):
        raise ConfigError(f"elastic.accept_joins=true: this run cannot admit joining processes live: {why}. For now "
                          f"{LIVE}. Set elastic.accept_joins=null (admit them where the run can) or false.")
    if not e.events and not e.leave_on_sigterm:
        return
    try:
        worlds = membership_worlds(cfg) if e.events else []
    except EventError as err:
        raise ConfigError(str(err)) from err
    problems = [] if cfg.dry_run else live_problems(cfg, worlds, under_torchrun)
    if problems:
        asked = [f"elastic.events={list(e.events)}"] if e.events else []
        asked += ["elastic.leave_on_sigterm=true"] if e.leave_on_sigterm else []
        dry = ", or add dry_run=true to plan and predict what each change moves and costs" if e.events else ""
        raise ConfigError(f"{' with '.join(asked)}: a live run cannot execute this yet: {'; '.join(problems)}. For now "
                          f"{LIVE}. Change those settings{dry}.")


def check_events_after_resume(cfg: Config, asked: str, checkpoint: str, step: int, saved_world: int) -> None:
    """trainer.resume (`asked`, resolved to `checkpoint` of `step`, saved on `saved_world` ranks) with elastic.events:
    the resumed run starts after `step` with parallel.world_size ranks and an event's step is the run's global step,
    so an event at or before `step` would never happen: refused, naming it and the world it would have left."""
    events = parse_events(list(cfg.elastic.events), cfg.trainer.total_steps)
    past = [e for e in events if e.step <= step]  # events are in step order: the past ones come first
    if not past:
        return
    left = membership_worlds(cfg)[len(past) - 1][1].change.new_world_size
    later = [e.text for e in events if e.step > step]
    them, they = ("it", "it") if len(past) == 1 else ("them", "they")
    raise ConfigError(
        f"elastic.events={list(cfg.elastic.events)} with trainer.resume={asked}: the run resumes after step {step} "
        f"(the checkpoint {checkpoint}, saved on {saved_world} ranks) with parallel.world_size="
        f"{cfg.parallel.world_size} ranks, and an event's step is the run's global step, so "
        f"{', '.join(e.text for e in past)} (at or before step {step}) would never happen. Drop {them} "
        f"(elastic.events=[{','.join(later)}]), and to resume in the world {they} left, set parallel.world_size={left}; "
        f"a resumed run's events come after its step: S in {step + 1}..{cfg.trainer.total_steps - 1}.")
