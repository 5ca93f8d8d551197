"""elastic.replicas, elastic.snapshot_every and elastic.recover_from_checkpoint (checks/replicas.py): the values, a world
of one, no checkpoints to load, and what recovery from a lost rank does not run with yet are refused before spawn in one
paragraph naming the value and what runs."""
from __future__ import annotations

import pytest

from rlhf_dyna.checks.elastic import join_refusal
from rlhf_dyna.checks.replicas import RECOVERS, check_replicas
from rlhf_dyna.config import Config
from rlhf_dyna.errors import ConfigError


def config(**changes) -> Config:
    cfg = Config()
    cfg.parallel.world_size, cfg.task.prompts_per_step, cfg.rollout.n = 4, 12, 4
    cfg.elastic.replicas, cfg.model.dtype = 1, "float32"  # the tiny models' dtype
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def test_a_colocated_dp_or_tp_run_may_keep_replicas():
    check_replicas(config())
    check_replicas(config(parallel__world_size=2, task__prompts_per_step=2))
    check_replicas(config(rollout__tp=2))  # vLLM's TP over gloo: a dead peer breaks it (launch/shm.vllm_tp_over_gloo)
    check_replicas(config(elastic__replicas=0, parallel__world_size=1))  # off: nothing to check
    assert join_refusal(config()) is None  # auto accept_joins resolves to true: a lost rank may come back by a join
    check_replicas(config(elastic__accept_joins=True))
    check_replicas(config(elastic__events=["leave:3@2", "join@4"], elastic__leave_on_sigterm=True))  # issue 27 + 28


def test_a_split_run_at_max_staleness_0_may_keep_replicas():
    """Each set shrinks to its survivors: a world whose rollout or training set is one rank cannot lose it."""
    check_replicas(config(placement__policy="split"))
    with pytest.raises(ConfigError, match=r"the survivors of a lost rank could not go on: rank 0 leaves \(3 -> 2 "):
        check_replicas(config(placement__policy="split", parallel__world_size=3, placement__rollout_ranks=1))


def test_a_colocated_run_with_a_reward_model_may_keep_replicas():
    """The frozen reward model needs no replica: the survivors load it again from its files."""
    check_replicas(config(task__name="file", task__reward=["rm", "exact"]))
    for changes, named in [(dict(placement__policy="lend", algorithm__name="ppo"),
                            "a reward model (task.reward naming rm) under placement=lend"),
                           (dict(reward_model__offload=True), "reward_model.offload=true")]:
        with pytest.raises(ConfigError) as err:
            check_replicas(config(task__name="file", task__reward=["rm", "exact"], **changes))
        assert named in str(err.value) and RECOVERS in str(err.value)


def test_a_lend_run_may_keep_replicas_where_the_survivors_hold_both_sets():
    """placement=lend: the snapshot is taken at the step's end (every role at home); the survivors of a loss re-plan
    the actor's and the critic's sets, so 2 ranks (1 survivor) are refused."""
    check_replicas(config(placement__policy="lend", algorithm__name="ppo"))
    check_replicas(config(placement__policy="lend", algorithm__name="ppo", elastic__events=["leave:3@2", "join@4"]))
    with pytest.raises(ConfigError, match=r"the survivors of a lost rank could not go on: rank 0 leaves \(2 -> 1 "
                                          r"ranks\): placement=lend trains the actor and the critic at once"):
        check_replicas(config(placement__policy="lend", algorithm__name="ppo", parallel__world_size=2))


@pytest.mark.parametrize("changes,named", [
    (dict(elastic__replicas=2), "elastic.replicas=2: it is 0"),
    (dict(elastic__replicas=-1), "elastic.replicas=-1: it is 0"),
    (dict(elastic__snapshot_every=0), "elastic.snapshot_every=0: the replicas are refreshed every K steps"),
    (dict(parallel__world_size=1), "elastic.replicas=1 with parallel.world_size=1: a replica lives on another rank"),
    (dict(placement__policy="split", placement__max_staleness=1),
     "this run could not recover from a lost rank yet: placement=split with placement.max_staleness=1"),
    (dict(placement__policy="split", placement__rebalance=True), "placement=split with rebalance"),
    (dict(model__dtype="bfloat16"), "model.dtype=bfloat16"),
    # a loss in a world the events reach: 5 -> 4 ranks splits 32 rows, the 3 survivors of a loss after the leave don't
    (dict(elastic__events=["leave:1@2"], task__prompts_per_step=8, parallel__world_size=5),
     "rank 0 leaves (4 -> 3 ranks): the actor would train with dp=3 (3 ranks / tp*pp*cp=1), but the 32 rows per step "
     "(task.prompts_per_step=8 x rollout.n=4) do not split into algorithm.mini_batches=1 x dp=3"),
    # rank 0 first: its loss is recovered as any other's, so the batch must split over its survivors too
    (dict(task__prompts_per_step=8), "the survivors of a lost rank could not go on: rank 0 leaves (4 -> 3 ranks): "
                                     "the actor would train with dp=3"),
])
def test_what_recovery_cannot_take_is_refused_naming_the_value(changes, named):
    with pytest.raises(ConfigError) as err:
        check_replicas(config(**changes))
    assert named in str(err.value)
    if "could not recover" in named:
        assert RECOVERS in str(err.value)


def test_the_dry_run_plans_without_the_live_checks():
    cfg = config(placement__policy="split")
    cfg.dry_run = True
    check_replicas(cfg)


def test_checkpoint_recovery_without_replicas_is_checked_like_replicas():
    """elastic.recover_from_checkpoint=true alone: the same run requirements, and checkpoints to load."""
    check_replicas(config(elastic__replicas=0, elastic__recover_from_checkpoint=True, trainer__save_every=2))
    check_replicas(config(elastic__replicas=0, placement__policy="split"))  # null, no replicas: off, nothing checked
    check_replicas(config(trainer__save_every=0))  # null beside replicas: the fallback finds no checkpoint, stops
    for changes, named in [
        (dict(trainer__save_every=0), "elastic.recover_from_checkpoint=true with trainer.save_every=0: the survivors"),
        (dict(placement__policy="split", placement__rebalance=True), "elastic.recover_from_checkpoint=true: this "
                                          "run could not recover from a lost rank yet: placement=split with rebalance"),
        (dict(parallel__world_size=1), "elastic.recover_from_checkpoint=true with parallel.world_size=1: a world of "
                                       "one has no survivors"),
    ]:
        with pytest.raises(ConfigError) as err:
            check_replicas(config(**{"elastic__replicas": 0, "elastic__recover_from_checkpoint": True,
                                     "trainer__save_every": 2, **changes}))
        assert named in str(err.value)
    assert join_refusal(config(elastic__replicas=0, elastic__recover_from_checkpoint=True)) is None  # joins admitted
