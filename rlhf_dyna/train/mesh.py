"""The training device mesh: (dp, tp) over the whole world, tp innermost (consecutive ranks share a TP group) or,
where a layout change keeps more state in place that way, outermost (the same mesh transposed)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def build_mesh(dp: int, tp: int, tp_outer: bool = False) -> DeviceMesh:
    """Mesh with dims ("dp", "tp"); tp innermost so a TP group is `tp` consecutive ranks, as in vLLM, or with
    tp_outer a dp group is `dp` consecutive ranks (rank = t * dp + d)."""
    world = dist.get_world_size()
    if dp * tp != world:
        raise ValueError(f"dp={dp} x tp={tp} = {dp * tp} != world size {world}; valid: dp = {world} // tp")
    device_type = "cuda" if "nccl" in dist.get_backend() else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    if tp_outer:
        return DeviceMesh(device_type, mesh_ranks(dp, tp, tp_outer=True), mesh_dim_names=("dp", "tp"))
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def mesh_ranks(dp: int, tp: int, tp_outer: bool) -> torch.Tensor:
    """The (dp, tp) grid of ranks: row-major, or with TP outermost rank = t * dp + d."""
    return torch.arange(dp * tp).reshape(tp, dp).T if tp_outer else torch.arange(dp * tp).reshape(dp, tp)


def is_tp_outer(mesh: DeviceMesh) -> bool:
    """Whether a (dp, tp) mesh has TP outermost; any other rank arrangement than the two build_mesh makes is refused."""
    dp, tp = mesh.shape if mesh.ndim == 2 else (mesh.size(0), 1)
    ranks = mesh.mesh.reshape(dp, tp)
    for tp_outer in (False, True):
        if torch.equal(ranks, mesh_ranks(dp, tp, tp_outer)):
            return tp_outer
    raise ValueError(f"mesh {mesh.mesh_dim_names} over ranks {mesh.mesh.tolist()}: expected (dp, tp) in row-major or "
                     f"TP-outer rank order over 0..{dp * tp - 1}")
