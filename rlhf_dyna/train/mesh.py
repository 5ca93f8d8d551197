"""The training DeviceMesh of a parallel layout: one builder for every layout (dp x tp in either rank order, on any
contiguous rank set; pp x dp x tp; expert parallel as edp x ep x tp with the flattened "dp"). Every rank of the world
calls it, members or not: creating a mesh's process groups is collective over the world."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rlhf_dyna.parallel_layout import ParallelLayout

EP_MESH_DIMS = ("edp", "ep", "tp")


def mesh_device_type() -> str:
    """"cuda" under NCCL, else "cpu". The mesh uses this thread's current GPU, which launch/rank.py chose for the rank
    (launch/devices.rank_device) and worker threads take over (launch/threads.DeviceThread)."""
    return "cuda" if "nccl" in dist.get_backend() else "cpu"


def build_mesh(layout: ParallelLayout, ranks: Sequence[int] | None = None) -> DeviceMesh:
    """The named mesh of `layout` (dp resolved): ("dp", "tp"), ("pp", "dp", "tp"), or ("edp", "ep", "tp") whose
    ("edp", "ep") flattened is "dp" (non-expert parameters shard over all dp ranks, the experts' shards over edp).
    `ranks`: the global rank at each position of the layout's rank order, where they are not the contiguous range from
    `layout.first_rank` (e.g. the survivors of a leave, as `vps.spec.placed_on` places the shards)."""
    world = dist.get_world_size()
    names, grid = layout.mesh_grid()
    positions = torch.tensor(grid, dtype=torch.int)
    if ranks is not None:
        if len(ranks) != layout.size or min(ranks) < 0 or max(ranks) >= world:
            raise ValueError(f"layout {layout.describe()} over ranks {list(ranks)}: needs {layout.size} ranks of the "
                             f"world of {world}")
        positions = torch.tensor(list(ranks), dtype=torch.int)[positions - layout.first_rank]
    elif layout.dp < 1 or layout.first_rank < 0 or layout.first_rank + layout.size > world:
        raise ValueError(f"layout {layout.describe()} on ranks from {layout.first_rank} does not fit the world of "
                         f"{world} ranks; valid: dp resolved and first_rank + dp*tp*pp*cp <= {world}")
    mesh = DeviceMesh(mesh_device_type(), positions, mesh_dim_names=names)
    if names == EP_MESH_DIMS:
        mesh["edp", "ep"]._flatten("dp")  # registered on the root: mesh["dp"] is then the 1-D data-parallel mesh
    return mesh


def layout_of_mesh(mesh: DeviceMesh, zero: int = 3, pp_schedule: str = "1F1B") -> ParallelLayout:
    """The layout a mesh made by `build_mesh` was built from (its rank order read back from the grid)."""
    names = tuple(mesh.mesh_dim_names or ())
    first = int(mesh.mesh.min())
    if "pp" in names:
        return ParallelLayout(mesh["dp"].size(), mesh["tp"].size(), zero, pp=mesh["pp"].size(),
                              pp_schedule=pp_schedule, first_rank=first)
    if names == EP_MESH_DIMS:
        return ParallelLayout(mesh["dp"].size(), mesh["tp"].size(), zero, ep=mesh["ep"].size(), first_rank=first)
    dp, tp = mesh.shape if mesh.ndim == 2 else (mesh.size(0), 1)
    ranks = mesh.mesh.reshape(dp, tp).tolist()
    for tp_outer in (False, True):
        layout = ParallelLayout(dp, tp, zero, tp_outer, first_rank=first)
        if ranks == layout.mesh_grid()[1]:
            return layout
    raise ValueError(f"mesh {names} over ranks {mesh.mesh.tolist()}: expected (dp, tp) in row-major or TP-outer rank "
                     f"order over a contiguous rank range")
