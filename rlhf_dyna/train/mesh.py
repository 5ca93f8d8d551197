"""The training device mesh: (dp, tp) over the whole world, tp innermost (consecutive ranks share a TP group)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def build_mesh(dp: int, tp: int) -> DeviceMesh:
    """Mesh with dims ("dp", "tp"); tp innermost so a TP group is `tp` consecutive ranks, as in vLLM."""
    world = dist.get_world_size()
    if dp * tp != world:
        raise ValueError(f"dp={dp} x tp={tp} = {dp * tp} != world size {world}; valid: dp = {world} // tp")
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
