"""The training device mesh: (dp, tp) over a contiguous rank set [first_rank, first_rank + dp * tp) (the whole world
by default), tp innermost (consecutive ranks share a TP group) or, where a layout change keeps more state in place that
way, outermost (the same mesh transposed). Every rank of the world calls build_mesh, members or not (group creation
is collective over the world)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def mesh_device_type() -> str:
    """"cuda" under NCCL, else "cpu". The mesh uses this thread's current GPU, which launch/rank.py chose for the rank
    (launch/devices.rank_device) and worker threads take over (launch/threads.DeviceThread)."""
    return "cuda" if "nccl" in dist.get_backend() else "cpu"


def build_mesh(dp: int, tp: int, tp_outer: bool = False, first_rank: int = 0) -> DeviceMesh:
    """Mesh with dims ("dp", "tp"); tp innermost so a TP group is `tp` consecutive ranks, as in vLLM, or with
    tp_outer a dp group is `dp` consecutive ranks (rank = first_rank + t * dp + d)."""
    world = dist.get_world_size()
    if first_rank < 0 or first_rank + dp * tp > world:
        raise ValueError(f"dp={dp} x tp={tp} ranks from rank {first_rank} do not fit the world of {world} ranks; "
                         f"valid: first_rank + dp * tp <= {world}")
    device_type = mesh_device_type()
    if tp_outer or first_rank or dp * tp != world:
        return DeviceMesh(device_type, mesh_ranks(dp, tp, tp_outer) + first_rank, mesh_dim_names=("dp", "tp"))
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def mesh_ranks(dp: int, tp: int, tp_outer: bool) -> torch.Tensor:
    """The (dp, tp) grid of ranks from 0: row-major, or with TP outermost rank = t * dp + d."""
    return torch.arange(dp * tp).reshape(tp, dp).T if tp_outer else torch.arange(dp * tp).reshape(dp, tp)


def first_rank_of(mesh: DeviceMesh) -> int:
    return int(mesh.mesh.min())


def is_tp_outer(mesh: DeviceMesh) -> bool:
    """Whether a (dp, tp) mesh has TP outermost; any other rank arrangement than the two build_mesh makes is refused."""
    dp, tp = mesh.shape if mesh.ndim == 2 else (mesh.size(0), 1)
    ranks = mesh.mesh.reshape(dp, tp) - first_rank_of(mesh)
    for tp_outer in (False, True):
        if torch.equal(ranks, mesh_ranks(dp, tp, tp_outer)):
            return tp_outer
    raise ValueError(f"mesh {mesh.mesh_dim_names} over ranks {mesh.mesh.tolist()}: expected (dp, tp) in row-major or "
                     f"TP-outer rank order over a contiguous rank range")


def build_pp_mesh(pp: int, dp: int, tp: int = 1) -> DeviceMesh:
    """Mesh with dims ("pp", "dp", "tp") over the whole world, pp outermost (the VPS train rank order: a stage is
    dp * tp consecutive ranks), tp innermost."""
    world = dist.get_world_size()
    if pp * dp * tp != world:
        raise ValueError(f"pp={pp} x dp={dp} x tp={tp} = {pp * dp * tp} ranks but the world has {world}; "
                         f"valid: pp * dp * tp == {world}")
    device_type = mesh_device_type()
    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


EP_MESH_DIMS = ("edp", "ep", "tp")


def build_ep_mesh(dp: int, ep: int, tp: int = 1) -> DeviceMesh:
    """Mesh with dims ("edp", "ep", "tp") over the whole world (the VPS expert rank order: the dp ranks regrouped as
    (edp, ep), ep inner, so an EP group is `ep` consecutive ranks), plus "dp" = (edp, ep) flattened: non-expert
    parameters are FSDP-sharded over all dp ranks, the experts' ep-local shards over edp."""
    world = dist.get_world_size()
    if dp * tp != world or ep < 1 or dp % ep:
        raise ValueError(f"dp={dp} x tp={tp} with ep={ep} on a world of {world} ranks; valid: dp * tp == {world} and "
                         f"ep dividing dp (ep in {[e for e in range(1, dp + 1) if dp % e == 0]})")
    device_type = mesh_device_type()
    mesh = init_device_mesh(device_type, (dp // ep, ep, tp), mesh_dim_names=EP_MESH_DIMS)
    mesh["edp", "ep"]._flatten("dp")  # registered on the root: mesh["dp"] is then the 1-D data-parallel mesh
    return mesh


def is_ep_mesh(mesh: DeviceMesh) -> bool:
    return tuple(mesh.mesh_dim_names or ()) == EP_MESH_DIMS
