"""The new world's process groups built in the background, during the step before its boundary (gloo; the live part
of a membership change, docs/elastic/background_world.md).

    plan = WorldPlan(generation, world_size, mesh_groups([layout], world_size))   # the same on every process
    build = WorldBuild(plan, rank).start()       # every process of the new world, at the start of the step before
    ... the step runs on the old world's groups; the thread rendezvouses the new world's on the job's store ...
    enter_new_world(store, generation, rank, world_size, "gloo", build)   # elastic.world_switch: picks them up
    mesh = build_mesh(layout)                                            # picks its groups up too
    build.close()                                # what was not picked up is dropped

How torch.distributed takes them: the new world's default group is created with the backend PREBUILT, registered once
with the public `dist.Backend.register_backend(PREBUILT, create, extended_api=True, devices=["cpu"])`. Its creator gets
each group's `global_ranks_in_group` ([] for the default group) and returns the prebuilt ProcessGroupGloo of those
ranks, or builds a fresh ProcessGroupGloo (the one torch's own gloo branch builds), so every later group of that world
(`new_group` without a backend takes the default group's) is an ordinary gloo group. What reads the backend's name:
`dist.get_backend()` says PREBUILT in such a world; transition.transport and train.mesh look for "nccl" in it (so:
gloo, right), vLLM's groups are made with `configured_backend()` ("gloo"), DeviceMesh compares it with "gloo" only
where CUDA is available (no background build there), and each group's backend object is a ProcessGroupGloo
(`name()` "gloo").

Safe beside the main thread: ProcessGroupGloo's constructor rendezvouses through the store only (each pair's
address, then a full-mesh connect of its own sockets), never on another group, so it runs while the main thread's
collectives run on the old world's groups (elastic/world_builder.py, tests/ranks/elastic). Each build opens its own
client of the job's store. Every process builds the plan's groups it belongs to, in the plan's order (the same order
everywhere: no cycle of waits). On NCCL nothing is built in the background (a new communicator is an ncclCommSplit of
the default one: world_builder.py); the boundary builds the world as before.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..parallel_layout import ParallelLayout
from .join_world import job_client_store

PREBUILT = "rlhf_dyna_gloo"  # the backend name of a world whose groups were built in the background
WORLD = ("world",)  # the default group's key (torch hands the creator no ranks for it)
BUILD_TIMEOUT = timedelta(minutes=30)  # torch's default for gloo groups


@dataclass(frozen=True)
class WorldPlan:
    """A new world as every process of it agrees on it: its store generation, size, and the groups of its meshes
    besides the default group (sorted global ranks each, in the order the meshes will be built); `step`: the step at
    whose start it was planned (a world refused at its boundary is planned again later: its keys must be new)."""

    generation: int
    world_size: int
    groups: tuple[tuple[int, ...], ...]
    step: int = 0


def plan_payload(plan: WorldPlan, rank: int) -> dict:
    """What rank 0 posts to a joiner (elastic.join_world.post_plan): the plan and the joiner's rank in it."""
    return {"generation": plan.generation, "world_size": plan.world_size, "groups": [list(g) for g in plan.groups],
            "step": plan.step, "rank": rank}


def build_of_payload(payload: dict) -> WorldBuild:
    """A joiner's build of the plan rank 0 posted, started."""
    plan = WorldPlan(payload["generation"], payload["world_size"], tuple(tuple(g) for g in payload["groups"]),
                     payload["step"])
    return WorldBuild(plan, payload["rank"]).start()


def mesh_groups(layouts: Sequence[ParallelLayout], world_size: int) -> tuple[tuple[int, ...], ...]:
    """The groups DeviceMesh creates for `build_mesh(layout)` of each layout in a world of `world_size`: per mesh
    dimension, the ranks along it with the others fixed; a dimension spanning the world takes the default group."""
    out: list[tuple[int, ...]] = []
    for layout in layouts:
        positions = torch.tensor(layout.mesh_grid()[1])
        for dim, size in enumerate(positions.shape):
            if size != world_size:
                out += [tuple(sorted(row)) for row in positions.movedim(dim, -1).reshape(-1, size).tolist()]
    return tuple(out)


def _gloo(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroupGloo:
    """A gloo group as torch's gloo branch builds it (its connect is the cost), its sequence number agreed."""
    group = dist.ProcessGroupGloo(store, rank, size, timeout)
    group._set_sequence_number_for_group()
    return group


class WorldBuild:
    """The groups of `plan` this process (`rank` of the new world) belongs to, built on a thread of their own."""

    def __init__(self, plan: WorldPlan, rank: int, timeout: timedelta = BUILD_TIMEOUT):
        self.plan, self.rank, self.timeout = plan, rank, timeout
        self.build_seconds = 0.0  # the thread's time: every rendezvous and connect
        self.started_wall = 0.0  # time.time() at the start, for the trace
        self.waited = 0.0  # what the switch waited for the thread to finish
        self.used = False  # its groups were handed to torch.distributed
        self.picked_up = 0  # groups the new world took from this build
        self._groups: dict[tuple, list] = defaultdict(list)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rlhf_dyna-new-world", daemon=True)

    def start(self) -> WorldBuild:
        self.started_wall = time.time()
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            store = dist.PrefixStore(f"rlhf_dyna/world{self.plan.generation}/prebuilt{self.plan.step}",
                                     job_client_store())
            self._groups[WORLD].append(_gloo(dist.PrefixStore("world", store), self.rank, self.plan.world_size,
                                             self.timeout))
            for i, ranks in enumerate(self.plan.groups):
                if self.rank in ranks:
                    self._groups[ranks].append(_gloo(dist.PrefixStore(str(i), store), ranks.index(self.rank),
                                                     len(ranks), self.timeout))
        except BaseException as err:  # surfaced by wait(), on the main thread
            self._error = err
        finally:
            self.build_seconds = time.perf_counter() - t0

    def serves(self, generation: int, rank: int, world_size: int) -> bool:
        """Whether this build is of the world being entered (not where a change not known in advance came first)."""
        return (generation, rank, world_size) == (self.plan.generation, self.rank, self.plan.world_size)

    def wait(self) -> float:
        """Block until the thread is done; the seconds waited. Raises what the build raised."""
        t0 = time.perf_counter()
        self._thread.join()
        self.waited = time.perf_counter() - t0
        if self._error is not None:
            raise RuntimeError(f"building world {self.plan.generation} in the background failed: {self._error}") \
                from self._error
        return self.waited

    def activate(self) -> None:
        """From now until `close`, groups torch creates with the PREBUILT backend come from this build."""
        global _ACTIVE
        register_backend()
        self.used, _ACTIVE = True, self

    def take(self, key: tuple, rank: int, size: int):
        """A prebuilt group of ranks `key` where this process is `rank` of `size`, or None."""
        for i, group in enumerate(self._groups.get(key, [])):
            if (group.rank(), group.size()) == (rank, size):
                self.picked_up += 1
                return self._groups[key].pop(i)
        return None

    def close(self) -> bool:
        """The world's meshes are built: later groups are built fresh, the groups not picked up are dropped. Whether
        this build's groups were used."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        self._groups.clear()
        return self.used


_ACTIVE: WorldBuild | None = None  # the build whose groups the world being entered takes
_REGISTERED: list[str] = []  # PREBUILT, once registered in this process


def create(opts, _options) -> dist.ProcessGroupGloo:
    """The PREBUILT backend's creator (torch's extended API): the active build's group of these ranks, else a fresh
    gloo group, with the options torch's gloo branch sets."""
    key = tuple(opts.global_ranks_in_group) or WORLD
    group = _ACTIVE.take(key, opts.group_rank, opts.group_size) if _ACTIVE is not None else None
    if group is None:
        group = _gloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    group.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    group.options.group_name = opts.group_id
    return group


def register_backend() -> None:
    """Register PREBUILT with torch.distributed, once per process."""
    if not _REGISTERED:
        dist.Backend.register_backend(PREBUILT, create, extended_api=True, devices=["cpu"])
        _REGISTERED.append(PREBUILT)


def configured_backend() -> str:
    """The current world's backend as the run configured it: "gloo" in a world entered over prebuilt groups."""
    backend = dist.get_backend()
    return "gloo" if backend == PREBUILT else backend


def world_metrics(kind: str, build: WorldBuild | None, boundary_seconds: float) -> dict[str, float]:
    """`elastic/<kind>/{build_seconds,wait_seconds,world_seconds,background}` of a change's new world. Built in the
    background: build is the thread's time (every rendezvous and connect), wait what the boundary waited for the
    thread, world the boundary's time on the world's groups and meshes (the wait, then torch registering the default
    group and creating the meshes over the prebuilt groups). Built at the boundary: all three are its time there."""
    prefix = f"elastic/{kind}/"
    if build is None or not build.used:
        return {prefix + "build_seconds": boundary_seconds, prefix + "wait_seconds": boundary_seconds,
                prefix + "world_seconds": boundary_seconds, prefix + "background": 0.0}
    return {prefix + "build_seconds": build.build_seconds, prefix + "wait_seconds": build.waited,
            prefix + "world_seconds": boundary_seconds, prefix + "background": 1.0}


def record_world(recorder, name: str, build: WorldBuild | None, boundary_wall: float, boundary_seconds: float) -> None:
    """The new world's build on the run's trace: the background thread's span (arg background=1; timeline.png draws
    it apart from the transitions) and the boundary's part (`/world`)."""
    if recorder is None:
        return
    if build is not None and build.used:
        recorder.add(f"{name}/build", 0, build.started_wall, build.build_seconds,
                     {"background": 1, "groups": build.picked_up})
    used = build is not None and build.used
    recorder.add(f"{name}/world", 0, boundary_wall, boundary_seconds,
                 {"prebuilt": int(used), "thread_wait_s": build.waited if used else 0.0})
