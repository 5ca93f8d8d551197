"""The gradient norm and clipping on local shards (train/grad_norm.py) against torch's DTensor norm, on 4 real gloo
ranks: shards over a 1-D mesh, a 2-D mesh with tp-replicated tensors (each counted once), and plain tensors."""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from rlhf_dyna.train.grad_norm import clip_grads_, squared_grad_norm
from tests.multirank import run_ranks


def _grads(world: int) -> list:
    dp = init_device_mesh("cpu", (world,))
    grid = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(0)  # the same full tensors on every rank
    full = [torch.randn(8, 5, generator=g) for _ in range(4)]
    return [distribute_tensor(full[0], dp, [Shard(0)]),
            distribute_tensor(full[1], grid, [Shard(0), Shard(1)]),
            distribute_tensor(full[2], grid, [Shard(0), Replicate()]),  # a tp-replicated norm weight
            distribute_tensor(full[3], grid, [Replicate(), Replicate()])], full


def _norms(rank: int, world: int) -> dict:
    grads, full = _grads(world)
    ours = float(squared_grad_norm(grads).sqrt())
    expected = float(torch.linalg.vector_norm(torch.stack([t.norm() for t in full])))
    torch_dtensor = [torch.nn.utils.get_total_norm([g]).full_tensor() for g in grads]
    assert abs(float(torch.linalg.vector_norm(torch.stack(torch_dtensor))) - expected) < 1e-5 * expected
    plain = float(squared_grad_norm([t.clone() for t in full]).sqrt())  # before clipping: a replicated shard is `full`
    clip_grads_(grads, 0.5 * expected, torch.tensor(ours))
    clipped = float(squared_grad_norm(grads).sqrt())
    return {"ours": ours, "expected": expected, "clipped": clipped, "plain": plain}


def test_the_norm_counts_every_element_once_and_clipping_scales_to_the_bound():
    for result in run_ranks(_norms, 4):
        assert abs(result["ours"] - result["expected"]) <= 1e-6 * result["expected"], result
        assert abs(result["plain"] - result["expected"]) <= 1e-6 * result["expected"], result
        assert abs(result["clipped"] - 0.5 * result["expected"]) <= 1e-5 * result["expected"], result
