"""What a live run with ranks leaving runs today (checks/elastic.py): a colocated dp x tp run passes; every other
setting is refused before spawn in one paragraph naming the setting and what is supported; the dry run plans them all."""
from __future__ import annotations

import pytest

from rlhf_dyna.checks.elastic import LIVE, check_elastic, check_events_after_resume, join_refusal
from rlhf_dyna.config import Config
from rlhf_dyna.errors import ConfigError


def config(events: list[str], **changes) -> Config:
    cfg = Config()
    cfg.parallel.world_size, cfg.task.prompts_per_step, cfg.rollout.n = 4, 12, 4
    cfg.elastic.events = events
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def test_a_colocated_dp_only_run_may_lose_ranks_live():
    check_elastic(config(["leave:1@2", "leave:2@3"]))
    check_elastic(config([], elastic__leave_on_sigterm=True))


def test_rank_0_may_leave_where_a_launcher_serves_the_store(monkeypatch):
    """python -m rlhf_dyna's launcher serves the job's store, and torchrun's agent with its agent store; under torchrun
    without one, rank 0's process serves it and may not leave."""
    check_elastic(config(["leave:0@2"]))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    check_elastic(config(["leave:0@2"]), under_torchrun=True)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    with pytest.raises(ConfigError, match=r"leave:0@2 \(rank 0 leaves \(4 -> 3 ranks\): rank 0 serves the job's store"):
        check_elastic(config(["leave:0@2"]), under_torchrun=True)


def test_ranks_may_join_a_colocated_run_live_and_under_torchrun_only_when_started_by_hand():
    """Under torchrun nobody starts a scripted joiner: join@S is refused, naming the command that joins instead; a
    torchrun job itself admits elastic.join=RUN_DIR processes."""
    check_elastic(config(["leave:3@2", "join@3"]))
    check_elastic(config(["join@2", "leave:1-2@3", "join:2@4"], parallel__world_size=2))
    with pytest.raises(ConfigError, match=r"join@3 under torchrun \(.*start python -m rlhf_dyna elastic.join=RUN_DIR "
                                          r"by hand instead, on rank 0's host, and drop join@3\)"):
        check_elastic(config(["leave:3@2", "join@3"]), under_torchrun=True)
    assert join_refusal(config([]), under_torchrun=True) is None
    check_elastic(config(["leave:3@2"], elastic__accept_joins=True), under_torchrun=True)


@pytest.mark.parametrize("events,changes,named", [
    (["leave:1@2"], dict(placement__policy="split", placement__rebalance=True), "placement=split with rebalance"),
    ([], dict(elastic__leave_on_sigterm=True, placement__policy="lend", algorithm__name="ppo", task__name="file",
              task__reward=["rm"]), "a reward model (task.reward naming rm) under placement=lend"),
])
def test_what_does_not_run_live_is_refused_naming_it(events, changes, named):
    with pytest.raises(ConfigError) as err:
        check_elastic(config(events, **changes))
    message = str(err.value)
    assert named in message and LIVE in message and "a live run cannot execute this yet" in message


def test_a_split_run_leaves_and_joins_live_where_joiners_train():
    """placement=split: a leave shrinks the set the rank left; joiners extend the training set, which must be last (the
    planner gives joiners to the sets that reach the end of the world) and hold no reward model."""
    check_elastic(config(["leave:1@2", "join@3"], placement__policy="split"))
    check_elastic(config(["leave:3@2", "join@3"], placement__policy="split", placement__max_staleness=0))
    assert join_refusal(config([], placement__policy="split")) is None
    last = config(["leave:0@2", "join@3"], placement__policy="split")
    last.placement.roles = {"actor": [0, 2], "rollout": [2, 2]}
    check_elastic(config(["leave:0@2"], placement__policy="split", placement__roles=last.placement.roles))
    with pytest.raises(ConfigError, match=r"join@3 \(the rollout set \[2..3\] reaches the end of the world, so "
                                          r"joiners would generate"):
        check_elastic(last)
    assert "reaches the end of the world" in join_refusal(last)
    with pytest.raises(ConfigError, match="a reward model \\(task.reward naming rm\\) under placement=split"):
        check_elastic(config(["leave:3@2"], placement__policy="split", task__name="file", task__reward=["rm"]))


def test_a_lend_run_leaves_and_joins_live_where_the_new_world_holds_both_sets():
    """placement=lend: every role is at home at a boundary, and the actor's and the critic's sets are re-planned over
    the new world; a world too small for both is refused before spawn, naming the event."""
    check_elastic(config(["leave:3@2", "join@4"], placement__policy="lend", algorithm__name="ppo"))
    assert join_refusal(config([], placement__policy="lend", algorithm__name="ppo")) is None
    with pytest.raises(ConfigError, match=r"elastic.events entry 'leave:1@2' \(after step 2\): rank 1 leaves \(2 -> 1 "
                                          r"ranks\): placement=lend trains the actor and the critic at once .* a world of "
                                          r"1 rank has no room for both"):
        check_elastic(config(["leave:1@2"], placement__policy="lend", algorithm__name="ppo", parallel__world_size=2,
                             task__prompts_per_step=4))


def test_a_pipeline_layout_changes_live_and_an_expert_parallel_one_is_refused_but_planned_by_the_dry_run():
    cfg = config(["leave:3@2", "join@3"])
    cfg.parallel.train.pp = 2
    check_elastic(cfg)
    cfg.parallel.train.ep = 2
    with pytest.raises(ConfigError, match="parallel.train.ep=2"):
        check_elastic(cfg)
    cfg.dry_run = True
    check_elastic(cfg)


def test_a_tensor_parallel_training_layout_may_lose_ranks_live():
    cfg = config(["leave:1-2@2"])
    cfg.parallel.train.tp = 2
    check_elastic(cfg)


def test_any_rank_may_leave_and_ranks_may_join_live_under_rollout_tp_2():
    """Where a change moves the engines' tp or a rank's place in a TP group, every rank starts a new vLLM engine."""
    check_elastic(config(["leave:2-3@2"], rollout__tp=2))
    check_elastic(config(["leave:1@2", "join@3"], rollout__tp=2))
    check_elastic(config(["leave:2-3@2", "join:2@3"], rollout__tp=2))


def test_a_running_job_admits_join_requests_where_a_join_runs_live():
    assert join_refusal(config([])) is None
    assert join_refusal(config([], rollout__tp=2)) is None  # the engines restart at the boundary
    assert "placement=split with rebalance" in join_refusal(config([], placement__policy="split",
                                                                     placement__rebalance=True))
    check_elastic(config([], elastic__accept_joins=True))
    with pytest.raises(ConfigError, match="elastic.accept_joins=true: this run cannot admit joining processes live: "
                                          "parallel.schedule"):
        cfg = config([], elastic__accept_joins=True)
        cfg.parallel.schedule = [{"step": 2, "tp": 2}]
        check_elastic(cfg)


def test_a_resumed_run_takes_the_events_after_its_step_and_refuses_earlier_ones():
    """Event steps are the run's global steps and a resumed run starts with parallel.world_size ranks: events after
    the checkpoint's step run live; one at or before it would never happen and is refused, naming the world it left."""
    cfg = config(["leave:3@3", "join@5"], trainer__resume="auto", trainer__total_steps=8)
    check_elastic(cfg)
    check_events_after_resume(cfg, "auto", "/runs/a/checkpoints/step_2", 2, 4)
    cfg.elastic.events = ["join@6", "leave:3@2", "leave:0@4"]
    with pytest.raises(ConfigError) as err:
        check_events_after_resume(cfg, "auto", "/runs/a/checkpoints/step_4", 4, 3)
    assert str(err.value) == (
        "elastic.events=['join@6', 'leave:3@2', 'leave:0@4'] with trainer.resume=auto: the run resumes after step 4 "
        "(the checkpoint /runs/a/checkpoints/step_4, saved on 3 ranks) with parallel.world_size=4 ranks, and an "
        "event's step is the run's global step, so leave:3@2, leave:0@4 (at or before step 4) would never happen. "
        "Drop them (elastic.events=[join@6]), and to resume in the world they left, set parallel.world_size=2; a "
        "resumed run's events come after its step: S in 5..7.")


def test_a_reward_model_moves_live_unless_it_waits_in_host_memory():
    """task.reward naming rm: the reward model's shards move with the other roles at a leave and a join; offloaded,
    they wait in host memory at the boundary, which a live change does not move: refused."""
    cfg = config(["leave:3@2", "join@3"], task__name="file", task__reward=["rm", "exact"])
    check_elastic(cfg)
    cfg.reward_model.offload = True
    with pytest.raises(ConfigError, match="a live run cannot execute this yet: reward_model.offload=true"):
        check_elastic(cfg)
    with pytest.raises(ConfigError, match="algorithm=reward_model"):
        check_elastic(config(["leave:3@2"], algorithm__name="reward_model"))
