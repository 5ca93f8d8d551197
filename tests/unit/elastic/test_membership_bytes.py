"""The plan of a membership change moves exactly the minimum for the change, counted a second way: element by element,
what each rank of the new world needs and its rank in the old world did not hold (the new layout built over 0..n-1
and renamed here by hand, not through the planner's rank maps). The reference executor then rebuilds every role's
state in the new world from the old one."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_dyna.elastic.membership import GlobalBatch, RoleMove, WorldChange, world_after
from rlhf_dyna.elastic.membership_plan import move_plans
from rlhf_dyna.elastic.placement import ACTOR, CRITIC, REFERENCE, ROLLOUT
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.models.value_catalog import value_catalog
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.vps.layout import Layout, build_layout
from rlhf_dyna.vps.schedule import build_schedule
from rlhf_dyna.vps.spec import placed_on
from rlhf_dyna.vps.validate import SpecError

from ..vps.model_strategies import catalogs
from ..vps.reference_executor import check_destination, execute, random_state

BATCH = GlobalBatch(prompts=420, rows=840)  # splits over every dp and rollout replica count up to 7 (5 ranks + 2)
PPO = (ACTOR, CRITIC, REFERENCE, ROLLOUT)


def masks(layout: Layout, rank: int) -> dict[tuple, np.ndarray]:
    """(tensor, kind) -> boolean mask of the elements `rank` holds."""
    out: dict[tuple, np.ndarray] = {}
    for p in layout.pieces(rank):
        key = (p.tensor.name, p.tensor.kind)
        mask = out.setdefault(key, np.zeros(p.tensor.shape, bool))
        mask[tuple(slice(lo, hi) for lo, hi in zip(p.box.lo, p.box.hi))] = True
    return out


def brute_force_bytes(catalog, move: RoleMove, change: WorldChange) -> int:
    """Bytes the new world lacks: per new rank q, the elements it needs that rank new_ranks[q] did not hold."""
    plain = placed_on(move.dst, [change.new_ranks.index(r) for r in move.dst.ranks])  # the same spec over 0..n-1
    old, new = build_layout(catalog, move.src, move.kinds), build_layout(catalog, plain, move.kinds)
    itemsize = {(e.tensor.name, e.tensor.kind): e.tensor.itemsize for e in new.entries}
    total = 0
    for q in plain.ranks:
        had = masks(old, change.new_ranks[q])
        for key, need in masks(new, q).items():
            held = had.get(key, np.zeros_like(need))
            total += int((need & ~held).sum()) * itemsize[key]
    return total


def check_change(catalog, placement, layout, change: WorldChange, ranks_per_node: int, budget: int = 1 << 20):
    new = world_after(placement, layout, 1, BATCH, change)
    catalogs_ = {ACTOR: catalog, REFERENCE: catalog, CRITIC: value_catalog(catalog)}
    plans = move_plans(new, catalogs_, ranks_per_node)
    assert set(plans) == {r for r in placement.roles if r != ROLLOUT}
    for move in new.moves:
        plan, role_catalog = plans[move.role], catalogs_[move.role]
        assert plan.moved_bytes == plan.min_bytes == brute_force_bytes(role_catalog, move, change), move
        assert plan.world_size == change.rank_space
        src, dst = build_layout(role_catalog, move.src, move.kinds), build_layout(role_catalog, move.dst, move.kinds)
        state = random_state(src)
        dst_bufs, writes = execute(build_schedule(plan, budget), src, dst, state)
        check_destination(dst, state, dst_bufs, writes, plan.world_size)
        for gone in change.leaving:  # a leaving rank ends up with nothing
            assert not dst.pieces(gone)
    return new


CHANGES = {
    "first rank leaves": (4, WorldChange(4, (0,)), 4),
    "middle rank leaves": (4, WorldChange(4, (1,)), 4),
    "last rank leaves": (4, WorldChange(4, (3,)), 4),
    "one rank joins": (4, WorldChange(4, (), 1), 4),
    "two ranks join": (4, WorldChange(4, (), 2), 4),
    "middle node of 2 leaves": (6, WorldChange(6, (2, 3)), 2),
    "node of 2 joins": (4, WorldChange(4, (), 2), 2),
    "a rank leaves as one joins": (4, WorldChange(4, (2,), 1), 4),
}
LAYOUTS = {"fsdp": ParallelLayout(), "fsdp x tp2": ParallelLayout(tp=2), "pp2": ParallelLayout(pp=2)}


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("case", list(CHANGES))
def test_a_change_moves_the_minimum_counted_element_by_element(tiny, case, layout_name):
    world, change, ranks_per_node = CHANGES[case]
    req = PolicyRequest("colocate", world, PPO, LAYOUTS[layout_name])
    check_change(tiny, make_placement(req), req.train, change, ranks_per_node)


def test_a_split_train_set_shrinks_and_grows_with_the_minimum(tiny):
    req = PolicyRequest("split", 6, PPO, rollout_ranks=2)
    placement = make_placement(req)
    check_change(tiny, placement, req.train, WorldChange(6, (3,)), 2)  # a train rank leaves: 4 -> 3 train ranks
    check_change(tiny, placement, req.train, WorldChange(6, (0,)), 2)  # a rollout rank leaves: train set renumbered
    check_change(tiny, placement, req.train, WorldChange(6, (), 2), 2)


@st.composite
def changes(draw, world: int) -> WorldChange:
    leaving = tuple(sorted(draw(st.sets(st.integers(0, world - 1), max_size=world - 1))))
    joining = draw(st.integers(0 if leaving else 1, 2))
    return WorldChange(world, leaving, joining)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_models_and_changes_move_the_minimum(data):
    catalog = data.draw(catalogs())
    world = data.draw(st.integers(1, 5))
    tp = data.draw(st.sampled_from([t for t in (1, 2, 3) if world % t == 0]))
    pp = data.draw(st.sampled_from([p for p in (1, 2) if world % (tp * p) == 0 and p <= catalog.dims.num_layers]))
    layout = ParallelLayout(tp=tp, pp=pp)
    try:  # a tp or pp the drawn model cannot take
        build_layout(catalog, layout.fill(world).spec())
    except SpecError:
        return
    roles = data.draw(st.sampled_from([(ACTOR, ROLLOUT), PPO]))
    req = PolicyRequest("colocate", world, roles, layout)
    change = data.draw(changes(world))
    new = check_change(catalog, make_placement(req), req.train, change, data.draw(st.integers(1, 3)),
                       data.draw(st.sampled_from([64, 1 << 20])))
    assert new.placement.world_size == change.new_world_size and len(new.moves) == len(roles) - 1
