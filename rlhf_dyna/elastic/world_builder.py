"""Build the process groups and device meshes of upcoming placements on a background thread (live part).

    builder = WorldBuilder([split_placement, lend_placement]).start()   # every rank, same list, same order
    ... the current phase computes on its own groups ...
    world = builder.get(split_placement.key())   # waits only if the build is not done yet
    world.build_seconds, world.wait_seconds, world.mesh(spec), world.group(rank_set)

Group creation is collective over the world (every rank calls it, members or not, in the same order), so
only this thread may create groups while it runs; the main thread keeps running collectives on groups
that already exist. On gloo a new group rendezvouses through the store only (no collective on another
group), which is why building it concurrently with the main thread's collectives is safe
(tests/ranks/elastic/test_world_builder.py checks it on 4 ranks).

On NCCL the builder works on the caller's thread, before `start` returns (`builds_in_background`). A CUDA rank binds
its device to the default group (launch/rank.py passes `device_id`), and torch then creates every new group's
communicator at once by `ncclCommSplit` of the default group's (distributed_c10d._new_process_group_helper:
`eager_connect_single_device`, and `perform_nocolor_split` on the ranks outside the group): a collective on the
default communicator, which a second thread would issue while the main thread's own collectives run on it, in an
order that may differ from rank to rank (a hang). Without `device_id` the communicators would be created lazily at
each group's first collective, on the main thread anyway, so a background build would hide nothing. Each group built
on NCCL gets its first call at once (transition/transport.ensure_warm), with every member present.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..parallel_layout import ParallelLayout
from ..train.mesh import build_mesh
from ..transition.transport import GLOO, NCCL, ensure_warm, world_transport
from ..vps.spec import ParallelSpec, Phase
from .placement import Placement, RankSet


@dataclass
class BuiltWorld:
    key: str
    meshes: dict[tuple, DeviceMesh] = field(default_factory=dict)  # training meshes by mesh_key(spec)
    groups: dict[RankSet, object] = field(default_factory=dict)  # one flat group per rank set (rollout, syncs)
    build_seconds: float = 0.0  # time the background thread spent on this placement
    wait_seconds: float = 0.0  # time get() blocked the caller

    def mesh(self, spec: ParallelSpec) -> DeviceMesh:
        return self.meshes[mesh_key(spec)]

    def group(self, ranks: RankSet):
        return self.groups[ranks]


def mesh_key(spec: ParallelSpec) -> tuple:
    return (spec.first_rank, spec.dp, spec.tp, spec.tp_outer)


def placement_specs(placement: Placement) -> tuple[list[ParallelSpec], list[RankSet]]:
    """Distinct training specs and rank sets of a placement, in a deterministic order (same on every rank)."""
    specs: dict[tuple, ParallelSpec] = {}
    sets: dict[RankSet, None] = {}
    for phase in placement.phases:
        for role in placement.roles:
            slot = placement.slot(phase, role)
            if slot.parked:
                continue
            sets.setdefault(slot.ranks, None)  # type: ignore[arg-type]
            spec = slot.spec
            if spec.phase == Phase.TRAIN:
                if spec.pp * spec.cp * spec.dp_replicate != 1:
                    raise ValueError(f"world builder: {spec.describe()} has pp={spec.pp}, cp={spec.cp}, "
                                     f"dp_replicate={spec.dp_replicate}; train.mesh builds (dp, tp) meshes only, so "
                                     "live placements need pp=cp=dp_replicate=1.")
                specs.setdefault(mesh_key(spec), spec)
    return list(specs.values()), list(sets)


def builds_in_background(transport: str) -> bool:
    """Whether groups may be created on a second thread while the main thread runs collectives: only on gloo."""
    return transport == GLOO


def warm_mesh(mesh: DeviceMesh, transport: str) -> None:
    """NCCL: the first call of each of the mesh's dimension groups, on its members (see transport.ensure_warm)."""
    if transport != NCCL or mesh.get_coordinate() is None:  # gloo, or this rank is outside the mesh
        return
    for dim in range(mesh.ndim):
        ensure_warm(mesh.get_group(dim), transport)


class WorldBuilder:
    """Builds the meshes and groups of `placements`, in order, on one background thread (gloo) or before `start`
    returns (NCCL, see the module doc); `get` waits if needed."""

    def __init__(self, placements: list[Placement], known: dict[tuple, DeviceMesh] | None = None,
                 background: bool | None = None):
        """`known`: meshes that exist already, by mesh_key (the engines' home mesh), so they are not built twice.
        `background`: None = on gloo only (`builds_in_background` of the world's transport)."""
        self.background = builds_in_background(world_transport()) if background is None else background
        self._placements = placements
        self._worlds: dict[str, BuiltWorld] = {}
        self._ready = {p.key(): threading.Event() for p in placements}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rlhf_dyna-world-builder", daemon=True)
        self._mesh_cache: dict[tuple, DeviceMesh] = dict(known or {})
        self._group_cache: dict[RankSet, object] = {}

    def start(self) -> WorldBuilder:
        if self.background:
            self._thread.start()
        else:
            self._run()
        return self

    def _run(self) -> None:
        try:
            for placement in self._placements:
                t0 = time.perf_counter()
                world = BuiltWorld(placement.key())
                specs, sets = placement_specs(placement)
                for spec in specs:
                    key = mesh_key(spec)
                    if key not in self._mesh_cache:  # shared between placements: built once
                        layout = ParallelLayout(spec.dp, spec.tp, tp_outer=spec.tp_outer, first_rank=spec.first_rank)
                        self._mesh_cache[key] = build_mesh(layout)
                        if not self.background:
                            warm_mesh(self._mesh_cache[key], world_transport())
                    world.meshes[key] = self._mesh_cache[key]
                for ranks in sets:
                    if ranks not in self._group_cache:
                        self._group_cache[ranks] = dist.new_group(list(ranks.ranks))
                        if not self.background and dist.get_rank() in ranks.ranks:
                            ensure_warm(self._group_cache[ranks], world_transport())
                    world.groups[ranks] = self._group_cache[ranks]
                world.build_seconds = time.perf_counter() - t0
                self._worlds[world.key] = world
                self._ready[world.key].set()
        except BaseException as err:  # surfaced by get(), on the caller's thread
            self._error = err
            for event in self._ready.values():
                event.set()

    def get(self, key: str, timeout: float | None = None, record: bool = True) -> BuiltWorld:
        """The built world of placement `key`, waiting for it; `record=False` (a background caller): the wait is not
        added to the world's `wait_seconds`, which counts what the switches waited."""
        if key not in self._ready:
            raise KeyError(f"world builder: no placement {key!r}; it builds {', '.join(self._ready)}")
        t0 = time.perf_counter()
        if not self._ready[key].wait(timeout):
            raise TimeoutError(f"world builder: placement {key!r} not built after {timeout} s")
        if self._error is not None and key not in self._worlds:
            raise RuntimeError(f"world builder failed while building {key!r}: {self._error}") from self._error
        world = self._worlds[key]
        if record:
            world.wait_seconds += time.perf_counter() - t0
        return world

    def join(self, timeout: float | None = None) -> None:
        if self.background:
            self._thread.join(timeout)
