"""The world a snapshot was taken in, kept beside it (orchestrator/recovery.py): what a survivor needs to rebuild that
world's engines when its own are gone, and whether a loss is only of ranks that joined since.

A rank that joins (orchestrator/join.py) holds no replica until the first step of the grown world ends: the newest
snapshot is of the world before the join. Where the only ranks lost are such joiners (they died inside their join, or
during that first step), the survivors are exactly that world's ranks, each with its own shards: they go back to it
whole, with nothing to serve from a replica. Inside the join a survivor's engines may already be given up to the move
(`runtime.<role>` None): the engine's settings, optimizer groups, buffers and architecture, kept at each snapshot,
rebuild them empty. The loop's state of the snapshot's step (LoopState) is kept beside it too."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module

from ..elastic.membership import NewWorld, RoleMove, WorldChange
from ..elastic.placement import Placement
from ..parallel_layout import ParallelLayout
from ..transition.relayout import empty_engine, meta_skeleton, optimizer_groups, settings_of
from .run import Run

WORLDS = 1_000_000  # LoopState.key: the snapshot's step, then the world it was taken in (a change's snapshot: same step)


@dataclass
class EngineTemplate:
    """What makes an empty engine like a role's (transition.relayout.empty_engine), without the engine."""

    settings: dict
    groups: list[dict]
    buffers: dict[str, Tensor]
    skeleton: Module  # on meta; copied for each engine built (parallelizing consumes it)

    @classmethod
    def of(cls, engine, previous: EngineTemplate | None) -> EngineTemplate:
        skeleton = previous.skeleton if previous is not None else meta_skeleton(engine.model)  # one architecture a run
        buffers = {name: b.detach() for name, b in engine.model.named_buffers()}
        return cls(settings_of(engine), optimizer_groups(engine), buffers, skeleton)

    def empty(self, layout: ParallelLayout, mesh):
        return empty_engine(self.settings, self.groups, self.buffers, layout, mesh, copy.deepcopy(self.skeleton))


@dataclass
class SnapshotWorld:
    """The snapshot's world: its placement (the joins' and recoveries' so far) and training layout."""

    placement: Placement
    layout: ParallelLayout


def only_joiners_lost(lost: tuple[int, ...], world: int, snapshot_world: int) -> bool:
    """Whether the ranks `lost` of `world` are exactly those that joined after the snapshot of `snapshot_world` ranks
    (joiners take the numbers after the old ranks')."""
    return snapshot_world < world and sorted(lost) == list(range(snapshot_world, world))


def snapshot_world_again(change: WorldChange, world: SnapshotWorld, snapshots: dict, rollout_tp: int) -> NewWorld:
    """The snapshot's world again, after `change` (the joiners lost): every role stays where the snapshot holds it."""
    moves = tuple(RoleMove(role, snap.spec, snap.spec, snap.kinds) for role, snap in snapshots.items())
    return NewWorld(change, world.placement, world.layout, rollout_tp, moves)


def joiner_gone(world: int) -> str:
    """The recovery's line where only joiners were lost."""
    return f"it joined after the newest snapshot: the {world}-rank world of that snapshot again, from the survivors' own shards"


@dataclass
class LoopState:
    """What a survivor rolls back to besides the engines: the loop's state after `step`."""

    step: int
    rng: random.Random
    python_rng: object
    torch_rng: torch.Tensor
    task_state: dict
    kl_ctl: object
    world: int  # the world whose ring holds this snapshot's replicas
    where: SnapshotWorld | None = None  # that world's placement and layout
    key: int = 0  # the newest is the largest: step, then the world (worlds entered since launch)

    @classmethod
    def of(cls, run: Run, step: int, where: SnapshotWorld | None = None, worlds: int = 0) -> LoopState:
        return cls(step, copy.deepcopy(run.rng), random.getstate(), torch.get_rng_state(),
                   copy.deepcopy(getattr(run.task, "state_dict", dict)()), copy.deepcopy(run.kl_ctl),
                   dist.get_world_size(), where, step * WORLDS + worlds)

    def restore(self, run: Run) -> None:
        run.rng, run.kl_ctl = copy.deepcopy(self.rng), copy.deepcopy(self.kl_ctl)
        random.setstate(self.python_rng)
        torch.set_rng_state(self.torch_rng)
        if self.task_state:
            run.task.load_state_dict(copy.deepcopy(self.task_state))
