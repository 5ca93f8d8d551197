"""A new world after ranks leave or join (live part): the new default process group over a fresh prefix of the job's
store once the old world is gone (a leave moves the state first, into a mesh over the survivors inside the old world:
`train.mesh.build_mesh(layout, survivors)`; a join after, over the new world).

    store = job_client_store()                            # elastic.join_world: this process's client of the job's store
    mesh = build_mesh(layout, survivors)                  # every rank of the old world calls it, members or not
    ... the state moves by VPS plan over the old world into engines on `mesh`; the old world is destroyed ...
    enter_new_world(store, generation=1, rank=new_rank, world_size=3, backend="gloo", build=build)  # survivors only

gloo cannot shrink a group (`dist.shrink_group` refuses it: docs/elastic/torchft.md), so the new world is a new default group
over `PrefixStore("rlhf_dyna/world<generation>", store)`. With `build` (elastic.world_prebuild: the new world's groups
built in the background during the step before) that is this world's, the new default group and the meshes built
until `build.close()` take its groups; otherwise (NCCL, a change not known in advance) they are built here. The
store's server lives in the launcher's process (launch/spawn.py; torchrun's agent under torchrun), so any rank may
leave.
"""
from __future__ import annotations

import os

import torch.distributed as dist
from torch.distributed.tensor import _redistribute
from torch.distributed.tensor._collective_utils import MeshTopoInfo
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

from .world_prebuild import PREBUILT, WorldBuild


def enter_new_world(store: dist.Store, generation: int, rank: int, world_size: int, backend: str,
                    build: WorldBuild | None = None) -> None:
    """Join the new default process group (the old one destroyed): `rank` of `world_size`, on the `generation`-th
    prefix of the job's store; over `build`'s groups where it built this world (waiting for it if need be)."""
    if dist.is_initialized():
        raise RuntimeError("the old world's default group is still initialised: destroy it before entering the new one")
    prebuilt = build is not None and build.serves(generation, rank, world_size)
    if prebuilt:
        build.wait()
        build.activate()
    elif build is not None:
        build.close()  # another world's (a SIGTERM leave came first): its groups are dropped
    dist.init_process_group(PREBUILT if prebuilt else backend,
                            store=dist.PrefixStore(f"rlhf_dyna/world{generation}", store), rank=rank,
                            world_size=world_size)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))  # vLLM's external launcher reads its DP rank there
    forget_old_meshes()


def forget_old_meshes() -> None:
    """Drop DTensor's caches keyed by device mesh: a mesh compares equal to an old world's mesh of the same shape and
    ranks, so a cached sharding would carry the old mesh, whose groups no longer exist ("Could not resolve the
    process group registered under the name ...")."""
    _clear_sharding_prop_cache()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    MeshTopoInfo.build_from_mesh.cache_clear()
