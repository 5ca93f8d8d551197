"""The world a snapshot was taken in, kept beside it (orchestrator/recovery.py): what a survivor needs to rebuild that
world's engines when its own are gone, and whether a loss is only of ranks that joined since.

A rank that joins (orchestrator/join.py) holds no replica until the first step of the grown world ends: the newest
snapshot is of the world before the join. Where the only ranks lost are such joiners (they died inside their join, or
during that first step), the survivors are exactly that world's ranks, each with its own shards: they go back to it
whole, with nothing to serve from a replica. Inside the join a survivor's engines may already be given up to the move
(`runtime.<role>` None): the engine's settings, optimizer groups, buffers and architecture, kept at each snapshot,
rebuild them empty."""
from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import Tensor
from torch.nn import Module

from ..elastic.membership import NewWorld, RoleMove, WorldChange
from ..elastic.placement import Placement
from ..parallel_layout import ParallelLayout
from ..transition.relayout import empty_engine, meta_skeleton, optimizer_groups, settings_of


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
