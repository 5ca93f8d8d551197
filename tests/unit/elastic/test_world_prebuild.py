"""The plan of a world built in the background (elastic/world_prebuild.py): the groups DeviceMesh will create for a
layout's mesh, and the plan as rank 0 posts it to a joiner. The live side is tests/ranks/elastic/test_world_prebuild.py
(and the leaves and joins of tests/app/elastic)."""
from __future__ import annotations

import torch.distributed as dist

import rlhf_dyna.elastic.world_prebuild as wp
from rlhf_dyna.elastic.world_prebuild import (PREBUILT, WorldBuild, WorldPlan, _as_prebuilt, mesh_groups, plan_payload,
                                              rollout_groups)
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.rollout.reform import vllm_groups


def test_mesh_groups_are_each_dimensions_ranks_and_skip_what_spans_the_world():
    assert mesh_groups([ParallelLayout(dp=4, tp=1)], 4) == ((0,), (1,), (2,), (3,))  # dp: the default group
    assert mesh_groups([ParallelLayout(dp=2, tp=2)], 4) == ((0, 2), (1, 3), (0, 1), (2, 3))
    assert mesh_groups([ParallelLayout(dp=2, tp=2, tp_outer=True)], 4) == ((0, 1), (2, 3), (0, 2), (1, 3))
    assert mesh_groups([ParallelLayout(dp=1, tp=2, first_rank=2)], 4) == ((2,), (3,), (2, 3))


def test_a_join_plans_the_staging_mesh_over_the_old_ranks_then_the_new_layout():
    """dp1 x tp2 over ranks 0-1 of the new world of 4, then dp2 x tp2 over all: [0, 1] is planned twice."""
    groups = mesh_groups([ParallelLayout(dp=1, tp=2), ParallelLayout(dp=2, tp=2)], 4)
    assert groups == ((0,), (1,), (0, 1), (0, 2), (1, 3), (0, 1), (2, 3))


def test_the_posted_plan_names_the_joiners_rank_and_carries_vllms_groups():
    plan = WorldPlan(3, 4, ((0, 2), (1, 3)), step=5, rollout=((0, 1, 2, 3), (0, 1, 2, 3)))
    payload = plan_payload(plan, 3)
    assert payload == {"generation": 3, "world_size": 4, "groups": [[0, 2], [1, 3]], "step": 5,
                       "rollout": [[0, 1, 2, 3], [0, 1, 2, 3]], "rank": 3}


def test_vllms_groups_in_its_order_each_twice():
    """world, TP, DCP, PCP, PP, DP (EP for MoE): a device group and a cpu group each (tests/ranks/elastic checks the
    order against vLLM's own calls)."""
    once = vllm_groups(2, 4, moe=False)[::2]
    assert once == ((0, 1, 2, 3), (0, 1), (2, 3), *[(r,) for r in range(4)] * 3, (0, 2), (1, 3))
    assert vllm_groups(2, 4, moe=False)[1::2] == once
    assert vllm_groups(1, 3, moe=True)[::2] == ((0, 1, 2), *[(r,) for r in range(3)] * 4, (0, 1, 2), (0, 1, 2))


def test_only_a_used_build_reroutes_new_group_and_only_its_gloo_groups():
    """No build (NCCL, a SIGTERM leave, recovery) or one of another world: torch's new_group untouched; inside a used
    build's scope a group asked for as gloo is made by PREBUILT, any other backend as asked, and torch's comes back."""
    plain = dist.new_group
    unused = WorldBuild(WorldPlan(1, 1, (), rollout=((0,), (0,))), 0)  # never started nor activated
    for build in (None, unused):
        with rollout_groups(build):
            assert dist.new_group is plain
    asked = []
    unused.used = True  # as enter_new_world leaves a build of the world it entered
    with unused.rollout_groups():
        assert dist.new_group is not plain
        for backend in ("gloo", "GLOO", "nccl", None):
            _as_prebuilt(lambda ranks, timeout, backend, **kw: asked.append(backend), [0], backend=backend)
    assert asked == [PREBUILT, PREBUILT, "nccl", None]
    assert dist.new_group is plain and wp._ACTIVE is None
