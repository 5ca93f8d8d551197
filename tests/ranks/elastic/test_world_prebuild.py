"""A new world's groups built in the background (elastic/world_prebuild.py) on 4 real gloo ranks: while the old world
runs collectives, the 3 survivors of a leave build the new world's default group and its meshes' groups on a thread;
at the switch the new default group and the meshes take them, and every group works, a group made afterwards too (a
fresh gloo group). The switch waits for no rendezvous (the thread's end: at most 10% of its build, issue 27) and
costs a fraction of building the same world at the switch (measured alternately in one run: what stays is torch's
bookkeeping of the groups and meshes). A build of another world (a change not known in advance came first) is
dropped and the switch builds the world itself. The unit side is tests/unit/elastic/test_world_prebuild.py."""
from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist

from rlhf_dyna.elastic.join_world import job_client_store
from rlhf_dyna.elastic.world_prebuild import PREBUILT, WorldBuild, WorldPlan, configured_backend, mesh_groups
from rlhf_dyna.elastic.world_switch import enter_new_world
from rlhf_dyna.launch.job_store import serve_job_store
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.transport import world_transport
from tests.multirank import run_ranks
from tests.ranks.elastic.test_world_builder import phase_of_compute

LAYOUTS = [ParallelLayout(dp=3, tp=1), ParallelLayout(dp=1, tp=2)]  # the second over ranks 0-1 of 3: [0] twice
SWITCHES = 6  # worlds 1..6: odd ones built at the switch, even ones in the background


def check_world(rank: int, meshes: list) -> int:
    """Every group of the new world works: the default group (all-reduce, batched P2P as the executor posts it, an
    object broadcast), each mesh dimension of this rank, and a group made after the switch."""
    y = torch.tensor([float(rank)])
    dist.all_reduce(y)
    assert y.item() == 0 + 1 + 2
    peer, got = (rank + 1) % 3, torch.zeros(1)
    ops = [dist.P2POp(dist.isend, torch.tensor([float(rank)]), peer), dist.P2POp(dist.irecv, got, (rank - 1) % 3)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    assert got.item() == (rank - 1) % 3
    box = ["hello" if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box == ["hello"]
    checked = 0
    for mesh in meshes:
        if rank in mesh.mesh.flatten().tolist():
            for dim in range(mesh.ndim):
                y = torch.ones(1)
                dist.all_reduce(y, group=mesh.get_group(dim))
                assert y.item() == mesh.size(dim)
                checked += 1
    later = dist.new_group([0, 2])
    if rank in (0, 2):
        y = torch.ones(1)
        dist.all_reduce(y, group=later)
        assert y.item() == 2
    return checked


def switch(rank: int, generation: int, build: WorldBuild | None) -> tuple[float, list]:
    """Enter world `generation` of 3 ranks and build its meshes; the seconds it took and the meshes."""
    store = job_client_store()
    t0 = time.perf_counter()
    enter_new_world(store, generation, rank, 3, "gloo", build)
    meshes = [build_mesh(layout) for layout in LAYOUTS]
    if build is not None:
        build.close()
    return time.perf_counter() - t0, meshes


def leaves_and_switches(rank: int, world: int, port: int, generation_built: int | None) -> dict:
    """Rank 3 leaves after a phase of collectives; the survivors enter worlds 1..SWITCHES of 3 ranks, each after a
    phase of collectives in the one before, the even ones over groups built in the background during that phase
    (of world `generation_built` instead, where given: a build of another world). The job's store is served on
    `port` apart from the old world's, as the launcher serves it."""
    server = serve_job_store(port) if rank == 0 else None
    os.environ["MASTER_PORT"] = str(port)  # job_client_store() reaches the job's store there
    out: dict = {"rank": rank, "at_switch": [], "prebuilt": [], "build": [], "thread_wait": [], "picked_up": [],
                 "used": [], "backend": [], "checked": [], "rounds": []}
    for generation in range(1, SWITCHES + 1):
        background = generation % 2 == 0 and rank < 3
        plan = WorldPlan(generation_built or generation, 3, mesh_groups(LAYOUTS, 3), step=generation)
        build = WorldBuild(plan, rank).start() if background else None
        out["rounds"].append(phase_of_compute(0.5))
        dist.destroy_process_group()
        if rank == 3:
            return out
        seconds, meshes = switch(rank, generation, build)
        out["at_switch" if build is None else "prebuilt"].append(seconds)
        if build is not None:
            out["build"].append(build.build_seconds)
            out["thread_wait"].append(build.waited)
            out["picked_up"].append(build.picked_up)
            out["used"].append(build.used)
        out["backend"].append((dist.get_backend(), configured_backend(), world_transport()))
        out["checked"].append(check_world(rank, meshes))
    dist.destroy_process_group()
    del server
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_new_world_takes_the_groups_built_in_the_background():
    rows = run_ranks(leaves_and_switches, 4, free_port(), None, timeout=300)
    groups = mesh_groups(LAYOUTS, 3)
    assert groups == ((0,), (1,), (2,), (0,), (1,), (0, 1))
    for r in rows[:3]:
        mine = sum(r["rank"] in g for g in groups)
        assert all(r["used"]) and r["picked_up"] == [1 + mine] * 3, r  # the default group, each mesh group of its
        assert r["backend"] == [("gloo",) * 3, (PREBUILT, "gloo", "gloo")] * 3
        assert min(r["rounds"]) > 3, "the main thread ran collectives while the new world was built"
        assert r["checked"] == [4 if r["rank"] < 2 else 2] * SWITCHES
        assert max(r["thread_wait"]) <= 0.1 * min(r["build"]), r  # every rendezvous and connect was off the path
    print({r["rank"]: {k: [round(x, 4) for x in r[k]] for k in ("build", "thread_wait", "prebuilt", "at_switch")}
           for r in rows[:3]})


def test_a_build_of_another_world_is_dropped_and_the_switch_builds_it():
    rows = run_ranks(leaves_and_switches, 4, free_port(), SWITCHES + 1, timeout=300)
    for r in rows[:3]:
        assert not any(r["used"]) and r["picked_up"] == [0] * 3, r
        assert r["backend"] == [("gloo",) * 3] * SWITCHES
        assert r["checked"] == [4 if r["rank"] < 2 else 2] * SWITCHES
