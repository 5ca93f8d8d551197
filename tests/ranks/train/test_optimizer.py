"""AdamW on the shards' local tensors (train/optimizer.py) against torch's AdamW on the DTensors, on 4 real gloo
ranks: the same parameters and moments, bit for bit, over three steps."""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from rlhf_dyna.train.optimizer import ShardLocalAdamW
from tests.multirank import run_ranks


def _params(world: int) -> list[nn.Parameter]:
    grid = init_device_mesh("cpu", (2, world // 2))
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(distribute_tensor(torch.randn(6, 4, generator=g), grid, placements))
            for placements in ([Shard(0), Shard(1)], [Shard(0), Replicate()], [Replicate(), Replicate()])]


def _steps(rank: int, world: int) -> bool:
    ours, theirs = _params(world), _params(world)
    settings = dict(lr=0.1, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    optimizers = ShardLocalAdamW(ours, **settings), torch.optim.AdamW(theirs, **settings)
    for step in range(3):
        g = torch.Generator().manual_seed(step + 1)
        for a, b in zip(ours, theirs):
            grad = torch.randn(a.shape, generator=g)
            a.grad = distribute_tensor(grad, a.device_mesh, a.placements)
            b.grad = distribute_tensor(grad, b.device_mesh, b.placements)
        for optimizer in optimizers:
            optimizer.step()
    same = True
    for a, b in zip(ours, theirs):
        same &= isinstance(a, DTensor) and torch.equal(a.full_tensor(), b.full_tensor())
        for key in ("exp_avg", "exp_avg_sq", "step"):
            x, y = optimizers[0].state[a][key], optimizers[1].state[b][key]
            same &= torch.equal(x.full_tensor() if isinstance(x, DTensor) else x,
                                y.full_tensor() if isinstance(y, DTensor) else y)
    moved = not torch.equal(ours[0].full_tensor(), _params(world)[0].full_tensor())
    return same and moved


def test_adamw_on_local_shards_updates_like_adamw_on_the_dtensors():
    assert run_ranks(_steps, 4) == [True] * 4
