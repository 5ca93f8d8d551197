"""Membership changes as data: new rank numbers, the layout of the new world (dp first, tp / pp only where the size
requires), the policy's sets after a leave or a join, the same global batch, and each role's move in rank space."""
from __future__ import annotations

import pytest

from rlhf_dyna.elastic.membership import (GlobalBatch, MembershipError, WorldChange, layout_candidates, layout_for,
                                          engines_kept, live_refusal, world_after)
from rlhf_dyna.elastic.placement import (ACTOR, CRITIC, GENERATE, REFERENCE, ROLLOUT, TRAIN_ACTOR, TRAIN_CRITIC,
                                         RankSet)
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind


@pytest.mark.parametrize("leaving,survivors", [((0,), (1, 2, 3)), ((1,), (0, 2, 3)), ((3,), (0, 1, 2)),
                                               ((1, 2), (0, 3))])
def test_survivors_keep_their_order(leaving, survivors):
    change = WorldChange(4, leaving)
    assert change.survivors == change.new_ranks == survivors and change.rank_space == 4
    assert change.renumbering() == {old: new for new, old in enumerate(survivors)}
    assert change.kind == "leave" and change.new_world_size == 4 - len(leaving)


def test_joiners_come_after_the_old_world():
    change = WorldChange(3, joining=2)
    assert change.new_ranks == (0, 1, 2, 3, 4) and change.rank_space == 5 and change.kind == "join"
    both = WorldChange(4, (1,), 1)
    assert both.new_ranks == (0, 2, 3, 4) and both.rank_space == 5 and both.kind == "leave+join"
    assert both.describe() == "rank 1 leaves and 1 rank joins (4 -> 4 ranks)"


@pytest.mark.parametrize("args,message", [
    ((4, (4,)), r"rank\(s\) \[4\] cannot leave: the world has 4 ranks, 0..3"),
    ((4, (1, 1)), r"leaving ranks \[1, 1\] name a rank twice"),
    ((4, (), 0), "a change needs ranks leaving or at least one joining"),
    ((2, (0, 1)), "all 2 ranks would leave"),
])
def test_impossible_changes_are_refused(args, message):
    with pytest.raises(MembershipError, match=message):
        WorldChange(*args)


def test_sets_map_to_contiguous_sets_and_the_last_one_takes_the_joiners():
    change = WorldChange(8, (1, 6), joining=3)
    assert change.set_after(RankSet(0, 4)) == RankSet(0, 3)  # 0, 2, 3 -> 0, 1, 2
    assert change.set_after(RankSet(4, 4)) == RankSet(3, 6)  # 4, 5, 7 -> 3, 4, 5 and joiners 6, 7, 8
    assert change.set_after(RankSet(1, 1)) == RankSet(1, 0)


def test_dp_changes_first_and_tp_pp_only_where_the_size_requires():
    tp8 = ParallelLayout(tp=8)
    assert layout_candidates(tp8)[0] == ParallelLayout(dp=-1, tp=8)
    assert layout_for(tp8, [120]).fill(120).dp == 15  # 128 -> 120 GPUs: dp 16 -> 15, tp stays 8
    assert layout_for(ParallelLayout(tp=4), [6]) == ParallelLayout(tp=2)  # 6 ranks: tp 4 -> 2, dp 3
    assert layout_for(ParallelLayout(tp=2, pp=2), [6]) == ParallelLayout(tp=2, pp=1)  # one dimension, tp kept
    assert layout_for(ParallelLayout(tp=2, pp=2), [4, 8]) == ParallelLayout(tp=2, pp=2)
    moe = ParallelLayout(tp=4, ep=8)
    assert layout_for(moe, [120]) == moe and layout_for(moe, [12]) == ParallelLayout(tp=4, ep=4)


def colocate(world: int, tp: int = 1, roles=(ACTOR, REFERENCE, ROLLOUT), rollout_tp: int = 1):
    req = PolicyRequest("colocate", world, roles, ParallelLayout(tp=tp), rollout_tp)
    return make_placement(req), req.train


def test_a_middle_leave_plans_into_the_survivors_in_rank_space():
    placement, layout = colocate(4)
    new = world_after(placement, layout, 1, GlobalBatch(12, 48), WorldChange(4, (1,)))
    assert new.placement.world_size == 3 and new.placement.slot(GENERATE, ACTOR).ranks == RankSet(0, 3)
    actor, reference = new.moves
    assert actor.role == ACTOR and actor.src == ParallelSpec(dp=4) and actor.kinds == ParallelSpec().kinds
    assert actor.dst == ParallelSpec(dp=3, rank_map=(0, 2, 3))
    assert reference.role == REFERENCE and reference.kinds == (Kind.PARAM,)


def test_a_join_plans_from_the_old_world_into_the_joiners():
    placement, layout = colocate(120, tp=8, roles=(ACTOR, ROLLOUT), rollout_tp=8)
    new = world_after(placement, layout, 8, GlobalBatch(240, 1920), WorldChange(120, joining=8))
    (actor,) = new.moves
    assert actor.src == ParallelSpec(dp=15, tp=8) and actor.dst == ParallelSpec(dp=16, tp=8)
    assert new.rollout_tp == 8 and new.placement.slot(GENERATE, ROLLOUT).spec.vllm_dp == 16


def test_context_parallel_is_kept_where_the_new_world_divides_by_it_and_dropped_dp_first_where_not():
    """cp=2 on 4 ranks (dp2 x cp2): rank 3 leaving leaves 3 ranks, which cp 2 does not divide, so cp drops to 1 (dp 3);
    the join returns to dp2 x cp2; on 8 ranks two leaving keep cp (dp 4 -> 3). The moves carry the cp specs."""
    req = PolicyRequest("colocate", 4, (ACTOR, REFERENCE, ROLLOUT), ParallelLayout(cp=2))
    left = world_after(make_placement(req), req.train, 1, GlobalBatch(12, 48), WorldChange(4, (3,)))
    assert left.layout == ParallelLayout(cp=1)
    assert left.moves[0].src == ParallelSpec(dp=2, cp=2) and left.moves[0].dst == ParallelSpec(dp=3)
    back = world_after(left.placement, req.train, 1, GlobalBatch(12, 48), WorldChange(3, joining=1))
    assert back.layout == ParallelLayout(cp=2) and back.moves[0].dst == ParallelSpec(dp=2, cp=2)
    req = PolicyRequest("colocate", 8, (ACTOR, ROLLOUT), ParallelLayout(cp=2))
    two = world_after(make_placement(req), req.train, 1, GlobalBatch(12, 48), WorldChange(8, (2, 5)))
    assert two.layout == ParallelLayout(cp=2) and two.moves[0].dst == ParallelSpec(dp=3, cp=2,
                                                                                   rank_map=(0, 1, 3, 4, 6, 7))


def test_split_shrinks_the_set_the_rank_left_and_joiners_train():
    req = PolicyRequest("split", 4, (ACTOR, CRITIC, ROLLOUT))
    placement = make_placement(req)
    batch = GlobalBatch(4, 16)
    left = world_after(placement, req.train, 1, batch, WorldChange(4, (1,)))
    assert left.placement.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 1)
    assert left.placement.slot(TRAIN_ACTOR, ACTOR).ranks == RankSet(1, 2)
    assert [m.dst for m in left.moves] == [ParallelSpec(dp=2, first_rank=2)] * 2  # the train set did not change ranks
    grown = world_after(placement, req.train, 1, batch, WorldChange(4, (), 2))
    assert grown.placement.slot(TRAIN_CRITIC, CRITIC).ranks == RankSet(2, 4)
    two_to_four = (ParallelSpec(dp=2, first_rank=2), ParallelSpec(dp=4, first_rank=2))
    assert [(m.src, m.dst) for m in grown.moves] == [two_to_four] * 2
    with pytest.raises(MembershipError, match=r"ranks 0-1 leave \(4 -> 2 ranks\) empties the rollout's set \[0..1\] in "
                                              r"generate \(placement=split\)"):
        world_after(placement, req.train, 1, batch, WorldChange(4, (0, 1)))


def test_lend_replans_its_halves_over_the_new_world_and_moves_from_home():
    """The actor's share (placement.train_ranks, 0 = half) is taken of each new world; sets placement.roles gave map
    to their survivors; a world too small for both sets, or whose rows do not split over every rank's prepare, is
    refused."""
    req = PolicyRequest("lend", 4, (ACTOR, CRITIC, ROLLOUT))
    batch = GlobalBatch(6, 12)
    new = world_after(make_placement(req), req.train, 1, batch, WorldChange(4, (3,)))
    assert new.placement.slot(TRAIN_ACTOR, ACTOR).ranks == RankSet(0, 1)  # half of 3
    assert new.placement.slot(TRAIN_CRITIC, CRITIC).ranks == RankSet(1, 2)
    assert new.placement.slot(GENERATE, ACTOR).ranks == RankSet(0, 3)
    assert [(m.src, m.dst) for m in new.moves] == [(ParallelSpec(dp=4), ParallelSpec(dp=3))] * 2
    grown = world_after(new.placement, req.train, 1, batch, WorldChange(3, (), 3))
    assert grown.placement.slot(TRAIN_ACTOR, ACTOR).ranks == RankSet(0, 3)
    assert grown.placement.slot(TRAIN_CRITIC, CRITIC).ranks == RankSet(3, 3)
    three = make_placement(PolicyRequest("lend", 4, (ACTOR, CRITIC, ROLLOUT), train_ranks=3))
    with pytest.raises(MembershipError, match=r"rank 0 leaves \(4 -> 3 ranks\): placement=lend trains the actor and "
                                              r"the critic at once .*placement.train_ranks=3\), and a world of 3 ranks "
                                              r"has no room for both. Keep at least 4 ranks"):
        world_after(three, req.train, 1, batch, WorldChange(4, (0,)))
    with pytest.raises(MembershipError, match=r"placement.train_ranks=0: half of the world\), and a world of 1 rank"):
        world_after(make_placement(PolicyRequest("lend", 2, (ACTOR, CRITIC, ROLLOUT))), req.train, 1, batch,
                    WorldChange(2, (1,)))
    given = make_placement(PolicyRequest("lend", 4, (ACTOR, CRITIC, ROLLOUT), explicit=((ACTOR, RankSet(0, 2)),)))
    mapped = world_after(given, req.train, 1, batch, WorldChange(4, (3,)))
    assert mapped.placement.slot(TRAIN_CRITIC, CRITIC).ranks == RankSet(2, 1)  # the given sets' survivors
    with pytest.raises(MembershipError, match=r"rank 3 leaves \(4 -> 3 ranks\): the actor would prepare with dp=3 "
                                              r"\(3 ranks"):
        world_after(make_placement(req), req.train, 1, GlobalBatch(8, 32), WorldChange(4, (3,)))


def test_the_global_batch_stays_and_must_split_over_the_new_dp():
    placement, layout = colocate(128, tp=8, roles=(ACTOR, ROLLOUT), rollout_tp=8)
    with pytest.raises(MembershipError, match=(
            r"ranks 120-127 leave \(128 -> 120 ranks\): the actor would train with dp=15 \(120 ranks / tp\*pp\*cp=8\), "
            r"but the 128 rows per step \(task.prompts_per_step=16 x rollout.n=8\) do not split into "
            r"algorithm.mini_batches=1 x dp=15 equal shards.*task.prompts_per_step=240")):
        world_after(placement, layout, 8, GlobalBatch(16, 128), WorldChange(128, tuple(range(120, 128))))
    placement, layout = colocate(4, roles=(ACTOR, ROLLOUT))
    with pytest.raises(MembershipError, match=r"the rollout would have 3 replicas \(3 ranks / rollout.tp=1\), which "
                                              r"task.prompts_per_step=4 does not split over.*prompts_per_step=12"):
        world_after(placement, layout, 1, GlobalBatch(4, 12), WorldChange(4, (0,)))


def test_rollout_tp_drops_only_where_the_set_requires():
    placement, layout = colocate(4, tp=2, roles=(ACTOR, ROLLOUT), rollout_tp=2)
    new = world_after(placement, layout, 2, GlobalBatch(6, 12), WorldChange(4, (2,)))
    assert new.rollout_tp == 1 and new.layout == ParallelLayout(tp=1)
    assert new.moves[0].dst == ParallelSpec(dp=3, rank_map=(0, 1, 3))


def test_vllm_engines_are_kept_where_every_survivor_keeps_its_tp_and_place_else_restarted():
    """rollout tp 2 on 8 ranks: a pair of consecutive ranks may leave anywhere with the engines kept; one rank, or a
    pair that moves a survivor to the other half of a TP group, or a new tp, or a joiner where tp > 1 (its engine is a
    replica of its own) restarts every engine; rank 0 may leave only where a launcher serves the store."""
    assert engines_kept(WorldChange(8, (2, 3)), 2, 2)
    assert engines_kept(WorldChange(8, (1, 2)), 2, 2)  # 3 -> 1, 4 -> 2: each keeps its place (rank mod 2)
    assert not engines_kept(WorldChange(8, (1,)), 2, 2)  # rank 2 would move to the other half of its TP group
    assert not engines_kept(WorldChange(8, (5,)), 2, 1)
    assert not engines_kept(WorldChange(6, (), 2), 2, 2) and engines_kept(WorldChange(3, (), 1), 1, 1)
    assert engines_kept(WorldChange(4, (3,)), 1, 1)
    assert "rank 0 serves the job's store" in live_refusal(WorldChange(8, (0, 1)), store_rank=0)
    assert live_refusal(WorldChange(8, (0, 1))) is None  # a launcher serves the store: rank 0 may leave
