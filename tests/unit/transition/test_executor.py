"""The order in which a gloo sender packs its messages, from the plan alone (the executor on real ranks:
tests/ranks/transition/test_executor.py)."""
from __future__ import annotations

from rlhf_dyna.transition.executor import prepare
from rlhf_dyna.vps.rank_plan import for_rank
from rlhf_dyna.vps.spec import ParallelSpec
from tests.seeded_transition import seeded_transition


def test_gloo_packs_first_for_the_peers_with_most_to_receive():
    """Receivers that get the most bytes set a transition's end: a sender packs for them first."""
    _, _, schedule, _, _, _ = seeded_transition(0, ParallelSpec(dp=4), ParallelSpec(dp=2, tp=2, tp_outer=True), 1 << 20)
    received = [int(b) for b in schedule.plan.pair_bytes().sum(axis=0)]
    for rank in range(4):
        plan = for_rank(schedule, rank)
        order = prepare(plan, received_by_rank=received).send_order
        assert sorted(order) == sorted(plan.sends)
        assert [received[p] for p in order] == sorted((received[p] for p in plan.sends), reverse=True)
    assert len(set(received)) > 1  # the loads differ, so the order is not the default one by accident


def test_gloo_senders_with_equal_loads_start_with_different_peers():
    """Equal loads: each rank packs for the peers after it first (rank + 1, rank + 2, ... mod world), so the first
    messages of the senders spread over the receivers instead of all going to the lowest rank."""
    _, _, schedule, _, _, _ = seeded_transition(0, ParallelSpec(dp=4), ParallelSpec(dp=2, tp=2), 1 << 20)
    equal = [1, 1, 1, 1]
    orders = {rank: prepare(for_rank(schedule, rank), received_by_rank=equal).send_order for rank in range(4)}
    for rank, order in orders.items():
        assert list(order) == sorted(order, key=lambda peer: (peer - rank) % 4)
    assert orders[1] == (2, 0) and orders[2] == (3, 1)  # by peer number both would start with the lower one
