"""FSDP's collectives through shared memory (train/shm_collectives.py) on real gloo ranks: the same results as gloo's,
nothing left in /dev/shm, gloo again where the group spans hosts, and a training engine that trains alike."""
from __future__ import annotations

import shutil
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from rlhf_dyna.models.build import build_policy
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train import shm_collectives
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.launch.shm import SHM_DIR, run_ident
from rlhf_dyna.train.shm_collectives import ShmAllGather, ShmComm, ShmReduceScatter
from tests.multirank import run_ranks
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec


def _against_gloo(rank: int, world: int, other_host: bool, no_room: bool = False) -> None:
    group = dist.group.WORLD
    if other_host and rank == world - 1:
        socket.gethostname = lambda: "another-host"  # this process only: the group now spans two "hosts"
    if no_room and rank == world - 1:  # this process only sees a full /dev/shm: every rank must take gloo
        shm_collectives.shutil.disk_usage = lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)
    comm = ShmComm()
    gather, scatter = ShmAllGather(comm), ShmReduceScatter(comm)
    for step, (numel, dtype) in enumerate([(6, torch.float32), (3000, torch.bfloat16), (1 << 20, torch.float32),
                                           (5, torch.float32), (1 << 21, torch.float32)]):  # grows twice, alternates
        g = torch.Generator().manual_seed(10 * step + rank)
        shard = torch.randn(numel, generator=g).to(dtype)
        out, expected = torch.empty(world * numel, dtype=dtype), torch.empty(world * numel, dtype=dtype)
        assert gather(out, shard, group) is None or other_host
        dist.all_gather_into_tensor(expected, shard)
        assert torch.equal(out, expected), (numel, dtype)
        full = torch.randn(world * numel, generator=g).to(dtype)
        by_gloo = torch.empty(numel, dtype=dtype)
        dist.reduce_scatter_tensor(by_gloo, full)
        for op, want in ((dist.ReduceOp.SUM, by_gloo), (dist.ReduceOp.AVG, by_gloo / world)):
            reduced = torch.empty(numel, dtype=dtype)
            scatter(reduced, full, group, op)
            if numel % 2 == 0 or no_room:  # gloo's ring segments fall on the shares' bounds: gloo's order, its bits
                assert torch.equal(reduced, want), (numel, dtype, op)
            else:
                torch.testing.assert_close(reduced, want)
    assert (comm.windows[group.group_name] is None) == other_host
    if no_room:
        assert comm.windows[group.group_name].capacity == -1  # no window made, on any rank
    dist.barrier()
    left = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"{run_ident()}-fsdp-")]
    assert left == [], left


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,other_host,no_room", [(4, False, False), (3, False, False), (2, True, False),
                                                      (2, False, True)],
                         ids=["one_host_4", "one_host_3", "spans_hosts", "no_room_in_dev_shm"])
def test_shared_memory_collectives_equal_gloo(world: int, other_host: bool, no_room: bool) -> None:
    run_ranks(_against_gloo, world, other_host, no_room)


def _engines_alike(rank: int, world: int) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    batch = random_batch(seed=100 + rank, batch=2)
    runs = {}
    for shm in (True, False):
        shm_collectives.use_shm_collectives(shm)
        engine = TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=1.0)
        comms = {type(group._all_gather_comm) for m in engine.model.modules() if isinstance(m, FSDPModule)
                 for group in m._get_fsdp_state()._fsdp_param_groups}
        assert (comms == {ShmAllGather}) == shm, comms
        losses = [engine.step(batch, nll_loss)["loss"] for _ in range(3)]
        runs[shm] = losses, dict(full_state_dict(engine))
    shm_collectives.use_shm_collectives(True)
    assert runs[True][0] == runs[False][0], (runs[True][0], runs[False][0])
    for name, value in runs[False][1].items():
        assert torch.equal(runs[True][1][name], value), name


@pytest.mark.timeout(120)
def test_an_engine_trains_through_shared_memory_as_through_gloo() -> None:
    run_ranks(_engines_alike, 2)


def _new_group_made_once(rank: int, world: int) -> tuple[int, int, int, int]:
    grown = ShmComm()
    for numel in (6, 1 << 19, 1 << 20):  # float32: windows of 1, then 2, then 4 MiB
        ShmAllGather(grown)(torch.empty(world * numel), torch.zeros(numel), dist.group.WORLD)
    if rank == world - 1:
        shm_collectives._largest = 0  # a joiner: a fresh process has made no window yet
    group, fresh = dist.new_group(list(range(world))), ShmComm()  # a new world's group
    for numel in (6, 1 << 20):
        out = torch.empty(world * numel)
        ShmAllGather(fresh)(out, torch.full((numel,), float(rank)), group)
        assert torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(numel))
    old, new = grown.windows[dist.group.WORLD.group_name], fresh.windows[group.group_name]
    return old.generation, old.capacity, new.generation, new.capacity


@pytest.mark.timeout(120)
def test_a_new_group_makes_its_windows_once_at_the_largest_size_so_far() -> None:
    """A new world's first step does not grow its groups' windows call by call (a joiner agrees on the size)."""
    assert run_ranks(_new_group_made_once, 3) == [(3, 4 << 20, 1, 4 << 20)] * 3
