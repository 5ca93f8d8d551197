"""Baselines a VPS transition is measured against, each moving the same live state into the same target:

- naive: every tensor gathered whole on every rank (`DTensor.full_tensor`), the target's part kept by name;
- redistribute: DTensor `redistribute` on one 2-D mesh, where the source layout can be viewed on that mesh;
- checkpoint: `torch.distributed.checkpoint` save of the sharded state, then load into the new layout
  (DCP reshards on load); the process-restart variant lives in scripts/bench_reshard.py.
The floor (bench/measure.py) replays the VPS plan's own pair matrix.

Sources are dp-sharded FSDP2 states (Shard(0) over the whole world); targets are a `RolloutTarget` (vLLM-like
fused TP weights) or a destination TrainEngine's bound state (DTensors).
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.movers import MoveStats, StateKey, local_of, nbytes
from bench.rollout_target import RolloutTarget


@torch.no_grad()
def naive_to_rollout(params: Mapping[str, Tensor], target: RolloutTarget) -> MoveStats:
    start, received, peak = time.perf_counter(), 0, 0
    for name in sorted(params):  # same order on every rank: each gather is collective
        full = params[name].full_tensor()
        received += nbytes(full) - nbytes(local_of(params[name]))
        peak = max(peak, nbytes(full))
        target.fill(name, full)
    return MoveStats(time.perf_counter() - start, received, len(params), peak)


def _on_mesh(source: DTensor, mesh: DeviceMesh) -> DTensor:
    """A world-wide Shard(d) DTensor (FSDP: d = 0, or 1 for row-parallel weights) seen on a 2-D mesh of the same
    ranks (row-major): (Shard(d), Shard(d)). Holds only when dim d divides evenly over the world."""
    dim = source.placements[0].dim
    if source.shape[dim] % mesh.size():
        raise ValueError(f"dim {dim} = {source.shape[dim]} is not divisible by {mesh.size()} ranks")
    return DTensor.from_local(source.to_local(), mesh, [Shard(dim), Shard(dim)], shape=source.shape, stride=source.stride())


@torch.no_grad()
def redistribute_to_rollout(params: Mapping[str, Tensor], target: RolloutTarget, mesh: DeviceMesh) -> MoveStats:
    """mesh: (dp, tp) over the world with tp innermost, as the rollout's TP groups are."""
    start, peak = time.perf_counter(), 0
    for name in sorted(params):
        dim = target.tp_shard_dim(name)
        placements = [Replicate(), Replicate() if dim is None else Shard(dim)]
        local = _on_mesh(params[name], mesh).redistribute(mesh, placements).to_local()
        peak = max(peak, nbytes(local))
        first = 0 if dim is None else target.tp_rank * (params[name].shape[dim] // target.tp)
        target.fill(name, local, first)
    return MoveStats(time.perf_counter() - start, -1, len(params), peak)  # bytes: DTensor does not report them


@torch.no_grad()
def redistribute_train(source: Mapping[StateKey, Tensor], destination: Mapping[StateKey, Tensor], mesh: DeviceMesh) -> MoveStats:
    """Destination tensors live on `mesh` or on its "dp" sub-mesh (FSDP keeps tp-replicated params there)."""
    start, peak = time.perf_counter(), 0
    for key in sorted(destination):
        dst = destination[key]
        placements = list(dst.placements) if dst.device_mesh.ndim == 2 else [dst.placements[0], Replicate()]
        local = _on_mesh(source[key], mesh).redistribute(mesh, placements).to_local()
        peak = max(peak, nbytes(local))
        dst.to_local().copy_(local)
    return MoveStats(time.perf_counter() - start, -1, len(destination), peak)


def checkpoint_save(engine: TrainEngine, path: Path) -> float:
    """Collective: DCP save of the engine's sharded model + optimizer state; returns seconds."""
    if dist.get_rank() == 0 and path.exists():
        shutil.rmtree(path)
    dist.barrier()
    start = time.perf_counter()
    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
    return time.perf_counter() - start


def checkpoint_load(engine: TrainEngine, path: Path) -> float:
    """Collective: DCP load into the engine's own layout (optimizer state must be allocated); returns seconds."""
    start = time.perf_counter()
    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return time.perf_counter() - start


def must_receive_train(source: Mapping[StateKey, Tensor], destination: Mapping[StateKey, Tensor]) -> int:
    """Bytes this rank must receive in a train -> train move, counted with torch's own placements: the
    destination's elements, as flat indices of the logical tensor, that this rank's source shard does not hold."""
    elements: dict[str, int] = {}  # per parameter name: its optimizer states share its layout
    total = 0
    for key in sorted(destination):
        src, dst = source[key], destination[key]
        if key[0] not in elements:
            index = torch.arange(src.numel(), dtype=torch.int64).view(src.shape)
            mine = distribute_tensor(index, dst.device_mesh, dst.placements, src_data_rank=None).to_local()
            held = distribute_tensor(index, src.device_mesh, src.placements, src_data_rank=None).to_local()
            elements[key[0]] = mine.numel() - int(torch.isin(mine, held).sum())
        total += elements[key[0]] * dst.element_size()
    return total
