"""The wire of a world: gloo or NCCL, chosen once from the run's device, the same on every rank.

The default group's backend is set from the run's device when the rank starts (launch/devices.world_backend): "gloo"
on the CPU, "cpu:gloo,cuda:nccl" on CUDA. Every transition of the world then moves its bytes over one transport: a
rank never picks it from where its own buffers happen to live, since a rank whose buffers are on the CPU would post
gloo receives that the other ranks' NCCL sends never match (both sides hang). On NCCL every buffer is on the rank's
GPU (`wire_device`).

NCCL creates a group's communicator at the group's first collective call, and torch's `batch_isend_irecv` requires
every rank of the group to take part in that first call (its docstring); a transition's round posts nothing on the
ranks that have nothing to move. `ensure_warm` makes the first call on a group a one-element all-reduce that every
rank joins (collective), before anything that only some ranks post.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

GLOO, NCCL = "gloo", "nccl"
_WARM: set[tuple[str, int]] = set()  # groups whose first NCCL call has been made by ensure_warm


def transport_of_backend(backend: str) -> str:
    """The transport of a world whose default backend is `backend` ("gloo", "nccl" or "cpu:gloo,cuda:nccl")."""
    return NCCL if NCCL in str(backend) else GLOO


def world_transport(group: dist.ProcessGroup | None = None) -> str:
    """The transport of `group` (default: the world), from its backend: the same answer on every member."""
    return transport_of_backend(dist.get_backend(group))


def world_device_type() -> str:
    """"cuda" in a world that moves CUDA tensors over NCCL, else "cpu"."""
    return "cuda" if world_transport() == NCCL else "cpu"


def wire_device(transport: str) -> torch.device:
    """Where every buffer of a transition lives under `transport`: this rank's current GPU for NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if transport == NCCL else torch.device("cpu")


def group_key(group: dist.ProcessGroup | None) -> tuple[str, int]:
    """A group of this world: its name (the same on every member) and the object (a later world may reuse names)."""
    pg = group or dist.group.WORLD
    return pg.group_name, id(pg)


def warm_up(group: dist.ProcessGroup | None, device: torch.device) -> bool:
    """Collective over `group` the first time it is asked for that group (every member must call it): a one-element
    all-reduce on `device` with every rank present. Returns whether it ran."""
    key = group_key(group)
    if key in _WARM:
        return False
    dist.all_reduce(torch.zeros(1, device=device), group=group)
    _WARM.add(key)
    return True


def ensure_warm(group: dist.ProcessGroup | None, transport: str) -> bool:
    """`warm_up` on this rank's GPU before a group's first NCCL use (it creates the communicator with every member
    present); nothing on gloo, whose groups need no first call."""
    return transport == NCCL and warm_up(group, wire_device(transport))


def release_cached_memory(device: torch.device) -> None:
    """After a phase change on CUDA (a relayout, a role move, a sync's staging): return the caching allocator's free
    blocks to the driver, so the next phase (vLLM waking up, another role's engine) can have them. Nothing on the
    CPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
