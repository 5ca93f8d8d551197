"""Placement policies as pure data: who sits where in each phase, and the moves that implies."""
from __future__ import annotations

import pytest

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.elastic.placement import (ACTOR, CRITIC, GENERATE, PHASES, PREPARE, REFERENCE, ROLLOUT, TRAIN_ACTOR,
                                         TRAIN_CRITIC, RankSet, changes, weight_sync)
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.elastic.validate import PlacementError

PPO = (ACTOR, CRITIC, REFERENCE, ROLLOUT)
GRPO = (ACTOR, ROLLOUT)


def request(policy, world=8, roles=PPO, **kw):
    return PolicyRequest(policy=policy, world_size=world, roles=roles, **kw)


def test_colocate_puts_every_role_on_all_ranks_and_moves_nothing():
    p = make_placement(request("colocate", train=ParallelLayout(tp=2), rollout_tp=4))
    for phase in PHASES:
        for role in PPO:
            assert p.slot(phase, role).ranks == RankSet(0, 8)
            assert p.slot(phase, role).spec.world_size == 8
    assert changes(p) == []
    sync = weight_sync(p)
    assert (sync.src.dp, sync.src.tp, sync.dst.vllm_dp, sync.dst.tp) == (4, 2, 2, 4)
    assert p.active[TRAIN_CRITIC] == (CRITIC,) and p.active[GENERATE] == (ROLLOUT,)


def test_split_defaults_to_half_half_disjoint_and_syncs_across_sets():
    p = make_placement(request("split", roles=GRPO, max_staleness=1))
    assert p.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 4)
    assert p.slot(TRAIN_ACTOR, ACTOR).ranks == RankSet(4, 4)
    sync = weight_sync(p)
    assert sync.src.first_rank == 4 and sync.dst.first_rank == 0 and sync.dst.world_size == 4
    assert p.staleness == 1 and p.concurrent == ((GENERATE, TRAIN_ACTOR),)
    assert changes(p) == []  # every role keeps its set; only the weights cross, by the sync
    assert set(p.slot(GENERATE, ROLLOUT).ranks.ranks).isdisjoint(p.slot(TRAIN_ACTOR, ACTOR).ranks.ranks)


def test_split_uneven_sets_from_counts():
    p = make_placement(request("split", roles=GRPO, rollout_ranks=6))
    assert p.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 6) and p.slot(PREPARE, ACTOR).ranks == RankSet(6, 2)


def test_lend_moves_actor_and_critic_to_disjoint_halves_for_training_and_back():
    p = make_placement(request("lend"))
    assert p.slot(TRAIN_ACTOR, ACTOR).ranks == RankSet(0, 4)
    assert p.slot(TRAIN_CRITIC, CRITIC).ranks == RankSet(4, 4)
    assert p.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 8)
    names = [c.name for c in changes(p)]
    # the critic moves with the actor: train_critic runs concurrently with train_actor
    assert names == ["reshard/actor/train_critic_to_generate", "reshard/critic/train_critic_to_generate",
                     "reshard/actor/prepare_to_train_actor", "reshard/critic/prepare_to_train_actor"]
    for c in changes(p):
        assert c.is_vps and c.src.spec.world_size != c.dst.spec.world_size
    assert p.concurrent == ((TRAIN_ACTOR, TRAIN_CRITIC),)


def test_explicit_sets_are_used():
    p = make_placement(request("split", roles=GRPO, explicit=((ROLLOUT, RankSet(0, 2)), (ACTOR, RankSet(2, 6)))))
    assert p.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 2) and p.slot(TRAIN_ACTOR, ACTOR).spec.dp == 6


@pytest.mark.parametrize("req, words", [
    (request("lend", roles=GRPO), ["nothing to lend", "critic"]),
    (request("split", roles=GRPO, rollout_ranks=8), ["0 ranks", "world_size=8"]),
    (request("split", roles=GRPO, explicit=((ROLLOUT, RankSet(0, 4)), (ACTOR, RankSet(6, 4)))), ["6..9", "0..7"]),
    (request("split", roles=GRPO, explicit=((ROLLOUT, RankSet(0, 4)), (ACTOR, RankSet(3, 5)))), ["share ranks [3]"]),
    (request("lend", explicit=((ACTOR, RankSet(0, 5)), (CRITIC, RankSet(4, 4)))), ["share ranks [4]"]),
    (request("split", roles=GRPO, rollout_ranks=3, rollout_tp=2), ["rollout.tp=2", "3 ranks"]),
    (request("split", roles=GRPO, rollout_ranks=5, train=ParallelLayout(tp=2)), ["tp*pp*cp=2", "3 ranks"]),
    (request("colocate", max_staleness=1), ["max_staleness=1"]),
    (request("split", roles=GRPO, max_staleness=3), ["max_staleness=3", "0", "1"]),
    (request("colocate", explicit=((ACTOR, RankSet(0, 2)),)), ["placement.roles"]),
    (request("split", roles=GRPO, explicit=((CRITIC, RankSet(0, 2)),)), ["critic", "does not have"]),
    (request("spread"), ["'spread'", "colocate, split, lend"]),
])
def test_bad_placements_are_refused_naming_the_number(req, words):
    with pytest.raises(PlacementError) as err:
        make_placement(req)
    for w in words:
        assert w in str(err.value), str(err.value)
