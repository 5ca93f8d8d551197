"""The global L2 norm of sharded gradients and their clipping, on the shards' local tensors.

Each DTensor's local shard counts once: a rank that holds a replica along some mesh dimension (a tp-replicated norm
weight) counts it only at coordinate 0 of that dimension, and the squares are summed over every dimension of the
mesh's groups. Working on local tensors keeps DTensor's sharding propagation out of the step, whose cache is cold on
every new mesh (the first step of a world a membership change made)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor


def _counted_locals(grads: list[Tensor]) -> dict[object, list[Tensor]]:
    """Per device mesh (None: plain tensors), the local tensors this rank counts."""
    by_mesh: dict[object, list[Tensor]] = {}
    for grad in grads:
        if not isinstance(grad, DTensor):
            by_mesh.setdefault(None, []).append(grad)
            continue
        mesh, placements = grad.device_mesh, grad.placements
        if any(p.is_partial() for p in placements):
            raise ValueError(f"a gradient with a partial placement {placements} (its reduction is still pending)")
        coordinate = mesh.get_coordinate()
        if coordinate is None:  # this rank is not on the mesh
            continue
        counted = by_mesh.setdefault(mesh, [])
        if all(c == 0 for c, p in zip(coordinate, placements) if p.is_replicate()):
            counted.append(grad.to_local())
    return by_mesh


@torch.no_grad()
def squared_grad_norm(grads: list[Tensor]) -> Tensor:
    """The sum of squares of every gradient element, each counted once over the meshes the gradients live on
    (float64, on the gradients' device; 0 for no gradients)."""
    total = None
    for mesh, locals_ in _counted_locals(grads).items():
        device = mesh.device_type if mesh is not None else (locals_[0].device if locals_ else "cpu")
        squares = torch.zeros((), dtype=torch.float64, device=device)
        if locals_:  # in float64: the sum does not depend on how the world splits the shards (its size, its order)
            squares = squares + torch.stack(torch._foreach_norm(locals_, 2, dtype=torch.float64)).square().sum()
        if mesh is not None:
            for dim in range(mesh.ndim):
                dist.all_reduce(squares, group=mesh.get_group(dim))
        total = squares if total is None else total + squares.to(total.device)
    return total if total is not None else torch.zeros((), dtype=torch.float64)


@torch.no_grad()
def clip_grads_(grads: list[Tensor], max_norm: float, total_norm: Tensor) -> None:
    """Scale the gradients in place by min(1, max_norm / (total_norm + 1e-6)), as torch's clip_grads_with_norm_."""
    shards = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    by_device: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for shard in shards:
        by_device.setdefault((shard.device, shard.dtype), []).append(shard)
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for (device, dtype), group in by_device.items():
        torch._foreach_mul_(group, coef.to(device, dtype))
