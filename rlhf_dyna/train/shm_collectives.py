"""FSDP2's all-gathers and reduce-scatters through shared memory, for a data-parallel group on one host's CPUs.

Gloo moves a CPU collective over loopback TCP; ranks of one host can read each other's memory at memcpy speed
instead. Each rank owns two windows in /dev/shm that every rank of the group maps. A collective writes this rank's
part into its window, meets the others at one gloo barrier (a few bytes), and reads their parts. Alternating the two
windows makes one barrier per call enough: a rank writes a window again two calls later, after the next call's
barrier, which every rank reaches only when it is done reading that window. The windows are unlinked as soon as all
ranks have mapped them, so a crash leaves nothing in /dev/shm. They cost each rank twice the largest unsharded FSDP
unit (a reduce-scatter's input) in /dev/shm; where it has no room for the group's windows, gloo carries the calls.
A group's first windows are as large as the largest this process made before (the ranks agree on the size), so the
groups of a new world or layout are made once, at their first call, not grown call by call in their first step.

Reductions add the ranks' parts in the order gloo's ring does (ring_sum): gloo's bits.
"""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from rlhf_dyna.launch.shm import SHM_DIR, run_ident

WINDOW_ALIGN = 1 << 20
_enabled = True  # a rank sets it from parallel.shm_collectives (use_shm_collectives)
_largest = 0  # the largest window this process has made: a new group's first size (a joiner's 0: the others' wins)


def use_shm_collectives(enabled: bool) -> None:
    """This process's FSDP units on the CPU use shared-memory collectives where their group is on one host."""
    global _enabled
    _enabled = enabled


def _map(path: Path, nbytes: int, create: bool) -> Tensor:
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
    return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)


class ShmWindows:
    """Two windows per rank of `group`, mapped by all of its ranks; they grow together (every call's sizes are the
    same on every rank: FSDP pads shards to equal sizes)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group, self.rank, self.size = group, group.rank(), group.size()
        self.prefix = f"{run_ident()}-fsdp-{group.group_name}"
        self.capacity, self.generation, self.calls = 0, 0, 0
        self.windows: list[list[Tensor]] = []  # [slot][rank], bytes

    def _grow(self, nbytes: int) -> bool:
        """Windows of at least `nbytes`; False (on every rank) where /dev/shm has no room for the group's windows:
        a write past a full tmpfs would kill the rank with SIGBUS."""
        global _largest
        wanted = max(nbytes, 2 * self.capacity, _largest if self.capacity == 0 else 0)
        # one all-reduce agrees on both: the largest size any rank wants, the least free /dev/shm of any rank
        agreed = torch.tensor([-(-wanted // WINDOW_ALIGN) * WINDOW_ALIGN, -shutil.disk_usage(SHM_DIR).free])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.group)
        capacity, free = int(agreed[0]), -int(agreed[1])
        if free < 2 * capacity * self.size:
            self.windows, self.capacity = [], -1  # gloo from now on
            return False
        self.generation += 1
        name = f"{self.prefix}-g{self.generation}"
        own = [SHM_DIR / f"{name}-s{slot}-r{self.rank}" for slot in (0, 1)]
        mine = [_map(path, capacity, create=True) for path in own]
        dist.barrier(group=self.group)
        self.windows = [[mine[slot] if r == self.rank else _map(SHM_DIR / f"{name}-s{slot}-r{r}", capacity, False)
                         for r in range(self.size)] for slot in (0, 1)]
        dist.barrier(group=self.group)  # every rank holds every mapping: the names can go
        for path in own:
            path.unlink()
        self.capacity, _largest = capacity, max(_largest, capacity)
        return True

    def slot(self, nbytes: int) -> list[Tensor] | None:
        """The windows of this call, one per rank, holding at least `nbytes`; None: gloo carries it."""
        if self.capacity < 0 or (nbytes > self.capacity and not self._grow(nbytes)):
            return None
        self.calls += 1
        return self.windows[self.calls % 2]

    def barrier(self) -> None:
        dist.barrier(group=self.group)


def _as(window: Tensor, start: int, numel: int, dtype: torch.dtype) -> Tensor:
    size = torch.empty((), dtype=dtype).element_size()
    return window[start * size:(start + numel) * size].view(dtype)


def ring_sum(parts: list[Tensor], rank: int, out: Tensor) -> None:
    """out = rank `rank`'s share summed in the order of gloo's ring (torch 2.13, measured element for element on 2-4
    ranks): from the previous rank backwards around the ring, this rank's own part last. Where gloo's ring segments
    fall on the shares' bounds (shares of an even number of elements, as FSDP's padded shards are here) these are
    gloo's bits, so a run's numbers do not depend on which of the two carried its gradients; elsewhere the same sum
    in another order."""
    size = len(parts)
    out.copy_(parts[(rank - 1) % size])
    for k in range(2, size + 1):
        out.add_(parts[(rank - k) % size])


class ShmComm:
    """The windows of each group this process's FSDP units use, made at the group's first collective, or None where
    the group spans hosts (then gloo carries it)."""

    def __init__(self) -> None:
        self.windows: dict[str, ShmWindows | None] = {}

    def of(self, group: dist.ProcessGroup) -> ShmWindows | None:
        name = group.group_name
        if name not in self.windows:
            hosts: list[str | None] = [None] * group.size()
            dist.all_gather_object(hosts, socket.gethostname(), group=group)
            self.windows[name] = ShmWindows(group) if len(set(hosts)) == 1 else None
        return self.windows[name]


class ShmAllGather(AllGather):
    def __init__(self, comm: ShmComm) -> None:
        self.comm = comm

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        windows = self.comm.of(group)
        numel, dtype, out = input_tensor.numel(), input_tensor.dtype, output_tensor.view(-1)
        slot = windows.slot(numel * input_tensor.element_size()) if windows is not None else None
        if slot is None:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        _as(slot[windows.rank], 0, numel, dtype).copy_(input_tensor.view(-1))
        windows.barrier()
        for r in range(windows.size):
            part = out[r * numel:(r + 1) * numel]
            if r != windows.rank or part.data_ptr() != input_tensor.data_ptr():
                part.copy_(_as(slot[r], 0, numel, dtype))
        return None


class ShmReduceScatter(ReduceScatter):
    def __init__(self, comm: ShmComm) -> None:
        self.comm = comm

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup, op,
                 async_op: bool = False) -> dist.Work | None:
        windows = self.comm.of(group) if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) else None
        slot = windows.slot(input_tensor.numel() * input_tensor.element_size()) if windows is not None else None
        if slot is None:
            if op != dist.ReduceOp.AVG:
                return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            dist.reduce_scatter_tensor(output_tensor, input_tensor, group=group)  # gloo has no AVG
            output_tensor.div_(group.size())
            return None
        total, dtype, out = input_tensor.numel(), input_tensor.dtype, output_tensor.view(-1)
        numel = total // windows.size
        _as(slot[windows.rank], 0, total, dtype).copy_(input_tensor.view(-1))
        windows.barrier()
        start = windows.rank * numel
        ring_sum([_as(window, start, numel, dtype) for window in slot], windows.rank, out)
        if op == dist.ReduceOp.AVG:
            out.div_(windows.size)
        return None


def install(modules: list[torch.nn.Module]) -> None:
    """Shared-memory collectives for these FSDP units (one param group each), where use_shm_collectives(True)."""
    if not _enabled:
        return
    comm = ShmComm()
    gather, scatter = ShmAllGather(comm), ShmReduceScatter(comm)
    for module in modules:
        module.set_custom_all_gather(gather)
        module.set_custom_reduce_scatter(scatter)
