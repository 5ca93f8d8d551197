"""vLLM's groups of a new world built in the background (elastic/world_prebuild.py, rollout/reform.py) on 4 real gloo
ranks, through vLLM's own `init_worker_distributed_environment` as rollout.reform calls it: in the old world of 4 its
new_group calls at tp 2 are the plan's (`vllm_groups`, vLLM's order); rank 3 leaves and, while the old world runs
collectives, the 3 survivors build the new world with vLLM's groups at tp 1 on a thread; at the boundary vLLM's
re-form takes every group it creates from that build (none built there) and its count of the machines (one here, as
vLLM counts at the boundary), and a collective over each group works. A world entered without a build (a change not
known a step ahead) builds and counts them at the boundary, as before."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from rlhf_dyna.elastic.join_world import job_client_store
from rlhf_dyna.elastic.world_prebuild import PREBUILT, WorldBuild, WorldPlan, rollout_groups
from rlhf_dyna.elastic.world_switch import enter_new_world
from rlhf_dyna.launch.job_store import serve_job_store
from rlhf_dyna.rollout.reform import release_groups, vllm_groups
from tests.multirank import run_ranks
from tests.ranks.elastic.test_world_builder import phase_of_compute
from tests.ranks.elastic.test_world_prebuild import free_port


def vllm_reform(rank: int, tp: int, build: WorldBuild | None) -> tuple[list, float]:
    """vLLM's groups over the current world at `tp` as rollout.reform makes them (a config of no model: vLLM counts
    it as MoE); the groups of the new_group calls (sorted ranks) and the seconds it took."""
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config  # in the ranks only: vLLM is slow
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    config = VllmConfig(parallel_config=ParallelConfig(distributed_executor_backend="external_launcher",
                                                       tensor_parallel_size=tp))
    config.parallel_config.data_parallel_size = dist.get_world_size() // tp
    config.parallel_config.data_parallel_rank = config.parallel_config.data_parallel_index = rank // tp
    calls, plain = [], dist.new_group

    def seen(ranks=None, timeout=None, backend=None, **kwargs):  # the real new_group, its groups noted
        calls.append((tuple(sorted(ranks)), backend))
        return plain(ranks, timeout, backend, **kwargs)

    dist.new_group = seen
    t0 = time.perf_counter()
    try:
        with rollout_groups(build), set_current_vllm_config(config):
            init_worker_distributed_environment(config, rank, "env://", backend="gloo")
    finally:
        dist.new_group = plain
    return calls, time.perf_counter() - t0


def collectives_over_vllms_groups(rank: int) -> int:
    """An all-reduce over the cpu and the device group of each of vLLM's group coordinators this rank is in."""
    from vllm.distributed import parallel_state

    checked = 0
    for ref in list(parallel_state._groups.values()):
        coordinator = ref()
        if coordinator is None:
            continue
        for group in (coordinator.cpu_group, coordinator.device_group):
            y = torch.ones(1)
            dist.all_reduce(y, group=group)
            assert y.item() == coordinator.world_size, (coordinator.unique_name, y.item())
            checked += 1
    return checked


def leave_and_reform(rank: int, world: int, port: int) -> dict:
    """Old world of 4 at tp 2; rank 3 leaves; world 1 of 3 at tp 1 over a build made during a phase of collectives,
    world 2 of 3 without one. vLLM's groups and the default group under them go as at a change (release_groups)."""
    server = serve_job_store(port) if rank == 0 else None
    os.environ["MASTER_PORT"] = str(port)  # job_client_store() reaches the job's store there
    out: dict = {"rank": rank}
    out["old_calls"], _ = vllm_reform(rank, 2, None)
    out["old_checked"] = collectives_over_vllms_groups(rank)
    plan = WorldPlan(1, 3, (), step=2, rollout=vllm_groups(1, 3, moe=True))
    build = WorldBuild(plan, rank).start() if rank < 3 else None
    out["rounds"] = phase_of_compute(0.5)
    release_groups()
    if rank == 3:
        return out
    plain, store = dist.new_group, job_client_store()
    for generation, b in ((1, build), (2, None)):
        enter_new_world(store, generation, rank, 3, "gloo", b)
        if b is not None:
            b.close(keep_rollout=True)
        calls, seconds = vllm_reform(rank, 1, b)
        from vllm.distributed.parallel_state import get_node_count

        out[f"world{generation}"] = {"calls": calls, "seconds": seconds, "checked": collectives_over_vllms_groups(rank),
                                     "machines": (get_node_count(), b.machines if b is not None else None),
                                     "taken": b.rollout_picked_up if b is not None else 0,
                                     "build_seconds": b.build_seconds if b is not None else 0.0,
                                     "waited": b.waited if b is not None else 0.0}
        release_groups()
    out["new_group_restored"] = dist.new_group is plain
    del server
    return out


def test_vllms_groups_of_the_new_world_come_from_the_background_build():
    rows = run(leave_and_reform)
    for r in rows:
        assert [ranks for ranks, _ in r["old_calls"]] == list(vllm_groups(2, 4, moe=True)), r["old_calls"]
        assert r["old_checked"] == 2 * 7  # world, TP, ETP (=TP: not counted twice), DCP, PCP, PP, DP, EP
    for r in rows[:3]:
        assert min(r["rounds"] for r in rows) > 3, "the main thread ran collectives while the new world was built"
        built, at_boundary = r["world1"], r["world2"]
        assert [ranks for ranks, _ in built["calls"]] == list(vllm_groups(1, 3, moe=True))
        mine = sum(r["rank"] in ranks for ranks in vllm_groups(1, 3, moe=True))
        assert built["taken"] == mine == 14, built  # every group this rank is in: none was built at the boundary
        assert {backend for _, backend in built["calls"]} == {PREBUILT}  # "gloo" read as PREBUILT inside the scope
        assert at_boundary["taken"] == 0 and {backend for _, backend in at_boundary["calls"]} == {"gloo"}
        assert built["checked"] == at_boundary["checked"] == 2 * 7
        assert built["machines"] == (1, 1) and at_boundary["machines"] == (1, None)  # counted by the build, as vLLM does
        assert r["new_group_restored"]
    print({r["rank"]: {w: {k: round(r[w][k], 4) for k in ("seconds", "build_seconds", "waited")}
                       for w in ("world1", "world2")} for r in rows[:3]})


def run(fn) -> list:
    return run_ranks(fn, 4, free_port(), timeout=300)
