"""A live leave at a step boundary (placement=colocate, split or lend; docs/elastic/leave.md): ranks leave the job, their share of
every training role's state moves to the survivors of its set by VPS plan, and the survivors go on in a smaller world.

At the boundary, on every rank of the old world, for each change due (`elastic.events` entries `leave:R@S` after step
S, then the ranks that received SIGTERM under elastic.leave_on_sigterm=true, agreed on by one all-reduce):
1. the new world is planned (elastic.membership.world_after: dp fills the survivors, the same global batch); a change
   that cannot happen is refused here with a message, and the run goes on in the old world;
2. each role's parameters and AdamW state move by VPS plan over the old world into tensors of the new layout's shards
   on the survivors of its set (transition.role_move: the leaving ranks send; under split a rollout rank holds none,
   and the training state stays where it is);
3. vLLM's process groups and the old default group are destroyed (rollout.reform: the engines stay); the leaving
   ranks stop (LeftWorld, exit code 0); the survivors join a new default group over a fresh prefix of the job's store
   (elastic.world_switch: over the groups built in the background during the step before, orchestrator/next_world.py,
   where the change was known then), build each role's engine once on the new world's mesh and copy the shards in,
   and the runtime takes
   its new world (`Runtime.enter_world`: colocate re-forms its vLLM engines' groups and data-parallel places over the
   new world, one replica fewer per leaving rank; split's rollout engines live outside the world and stay) and syncs
   the weights.
"""
from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass, replace

import torch.distributed as dist
from torch import Tensor
from torch.nn import Module

from ..elastic.faults import kill_point
from ..elastic.membership import MembershipError, NewWorld, WorldChange, live_refusal, world_after
from ..elastic.placement import ACTOR, REWARD_MODEL
from ..elastic.world_prebuild import WorldBuild, configured_backend, record_world, world_metrics
from ..elastic.world_switch import enter_new_world
from ..launch.host import store_host_rank
from ..launch.shm import clean_shm_segments
from ..parallel_layout import ParallelLayout
from ..rollout.reform import release_groups
from ..train.mesh import build_mesh
from ..transition.bind_train import train_spec
from ..transition.relayout import bind_train_state, empty_engine, meta_skeleton, optimizer_groups, settings_of
from ..transition.role_move import ALL_KINDS, fill_engine, move_role_state_to_buffers, role_catalog
from ..transition.vps_plans import DEFAULT_BUDGET_BYTES, planned
from ..vps.model import ModelCatalog
from ..vps.spec import ParallelSpec
from ..vps.tensor import Kind
from .live_world import Membership


class LeftWorld(Exception):
    """Raised on a rank that has left the job at a membership change: its state lives on the survivors now."""


def planned_world(membership: Membership, leaving: tuple[int, ...], name: str) -> NewWorld | None:
    """The world after `leaving` leave, or None (with a message on rank 0 and the leaving ranks) where it cannot be."""
    try:
        return left_world(membership, leaving)
    except MembershipError as err:
        if dist.get_rank() == 0 or dist.get_rank() in leaving:
            print(f"rlhf_dyna: {name} refused, the run goes on with {dist.get_world_size()} ranks: {err}", flush=True)
        return None


def left_world(membership: Membership, leaving: tuple[int, ...]) -> NewWorld:
    """The world after `leaving` leave the current one (MembershipError: it cannot be, or not live)."""
    change = WorldChange(dist.get_world_size(), leaving)
    new = world_after(membership.placement, membership.preferred, membership.rollout_tp, membership.batch, change)
    why = live_refusal(change, store_host_rank(launching=False))
    if why is not None:
        raise MembershipError(why)
    return new


def role_sources(runtime, new: NewWorld) -> dict[str, tuple[ModelCatalog, ParallelSpec, tuple[Kind, ...]]]:
    """Collective over the old world: each moving role's VPS catalog, its engines' spec and the kinds of state it holds
    (AdamW moments where trained), the actor's first rank's on every rank (under split the rollout ranks hold none)."""
    out = None
    if dist.get_rank() == runtime.actor_first_rank:
        out = {}
        for move in new.moves:
            engine = getattr(runtime, move.role)
            kinds = ALL_KINDS if engine.optimizer is not None else (Kind.PARAM,)
            out[move.role] = (role_catalog(engine), train_spec(bind_train_state(engine)), kinds)
    return runtime.from_actor(out)


def preplan_moves(runtime, new: NewWorld) -> None:
    """Collective at the start of the step before a scripted leave: its moves' VPS plans worked out on a thread (into
    the planner's cache), so that at the boundary only bytes move. Trained roles move their AdamW state there."""
    rank, sources = dist.get_rank(), role_sources(runtime, new)
    jobs = [(sources[m.role][0], sources[m.role][1], m.dst, sources[m.role][2]) for m in new.moves]

    def plan() -> None:
        for catalog, src_spec, dst_spec, kinds in jobs:
            planned(catalog, src_spec, catalog, dst_spec, kinds, DEFAULT_BUDGET_BYTES, rank)

    threading.Thread(target=plan, name="rlhf_dyna-leave-plans", daemon=True).start()


def trained_layout(new: NewWorld) -> ParallelLayout:
    """The training layout of the new world, on its actor's set (every rank under colocate, the training set under
    split)."""
    ranks = new.placement.slot(new.placement.phases[0], ACTOR).ranks
    return new.layout.fill(ranks.size, ranks.first)


def role_layout(layout: ParallelLayout, role: str) -> ParallelLayout:
    """A role's layout in a new world: the training layout's; the reward model's forward-only ZeRO-3 in any
    (orchestrator/build.build_reward_engine)."""
    return replace(layout, zero=3) if role == REWARD_MODEL else layout


@dataclass
class MovedRole:
    """A role's state as a survivor received it at a leave (the new layout's shards in plain tensors: `shards`,
    AdamW's `step`) and what builds its engine on the new world's mesh (transition.relayout.empty_engine)."""

    settings: dict
    groups: list[dict]
    buffers: dict[str, Tensor]  # the model's (rotary frequencies), replicated in every layout
    skeleton: Module
    shards: dict[str, Tensor]
    step: float


def send_state(runtime, new: NewWorld, layout: ParallelLayout, name: str) -> tuple[dict[str, MovedRole], int, int]:
    """Collective over the old world: every training role's state into tensors of the new layout's shards on the
    survivors of its set (`layout` of the new world, its ranks in the old numbering), the engines built once in the
    new world (`engines_on`); (role -> MovedRole, bytes moved, rounds), {} on the ranks that will not hold the role.
    The runtime's old engines are dropped."""
    holders = [new.change.new_ranks[r] for r in layout.ranks]
    staying = dist.get_rank() in holders
    sources = role_sources(runtime, new)
    staged, moved, rounds = {}, 0, 0
    for move in new.moves:
        engine = getattr(runtime, move.role)  # None on a rank outside the role's set (split's rollout ranks)
        catalog, src_spec, _ = sources[move.role]
        shards, step, stats = move_role_state_to_buffers(engine, staying, src_spec, move.dst, catalog,
                                                         engine.device if staying else None,
                                                         recorder=runtime.recorder, trace_name=name)
        moved, rounds = moved + stats.bytes_moved, rounds + stats.rounds
        if staying:
            staged[move.role] = MovedRole(settings_of(engine), optimizer_groups(engine),
                                          dict(engine.model.named_buffers()), meta_skeleton(engine.model), shards, step)
        setattr(runtime, move.role, None)  # the old world's engine: its state has moved
    return staged, moved, rounds


def engines_on(layout: ParallelLayout, staged: dict[str, MovedRole], mesh) -> dict:
    """The moved roles' engines on the new world's `mesh` of `layout`, filled from their shards; {} on a rank that
    holds none."""
    engines = {}
    for role, m in staged.items():
        engines[role] = empty_engine(m.settings, m.groups, m.buffers, role_layout(layout, role), mesh, m.skeleton)
        fill_engine(engines[role], m.shards, m.step)
    return engines


def change_world(runtime, membership: Membership, leaving: tuple[int, ...], name: str,
                 build: WorldBuild | None = None) -> dict[str, float]:
    """Collective over the old world: `leaving` (ranks of the current world) leave. On the survivors: the change's
    metrics (an empty dict where it was refused); on the leaving ranks: raises LeftWorld once their state is sent.
    `build`: the new world's groups, built in the background where the change was known a step ahead."""
    rank, started = dist.get_rank(), time.perf_counter()
    new = planned_world(membership, leaving, name)
    if new is None:
        return {}
    kill_point("leave/move", runtime.run.dist_info.rank, runtime.run.dist_info.run_ident)  # tests: dead in a leave
    layout = trained_layout(new)
    store, backend = membership.store, configured_backend()
    staged, moved, rounds = send_state(runtime, new, layout, name)
    moved_at = time.perf_counter()
    release_groups()  # vLLM's groups and the old default group; the engines stay
    if rank in leaving:
        runtime.leave_job()
        atexit.unregister(clean_shm_segments)  # the survivors' segments: the launcher removes them when the job ends
        raise LeftWorld(f"{name}: rank {rank} left the job after sending its state ({moved / 2**20:,.2f} MiB moved "
                        f"in {rounds} rounds, {moved_at - started:.2f} s); the run goes on with "
                        f"{new.change.new_world_size} ranks")
    released_at, released_wall = time.perf_counter(), time.time()
    membership.generation += 1
    enter_new_world(store, membership.generation, new.change.renumbering()[rank], new.change.new_world_size, backend,
                    build)
    mesh = build_mesh(layout)
    background = build is not None and build.close()
    built_at = time.perf_counter()
    engines = engines_on(layout, staged, mesh)
    copied_at = time.perf_counter()
    membership.placement = new.placement
    runtime.reform_rollout(new.change, runtime.rollout_layout.tp, new.rollout_tp)
    runtime.enter_world(layout, engines, new.placement)
    runtime.sync_weights()
    if dist.get_rank() == 0 and runtime.run.tracker is None:
        runtime.run.open_tracker()  # rank 0 has left: its successor writes the run's metrics from here on
    done = time.perf_counter()
    record_world(runtime.recorder, name, build if background else None, released_wall, built_at - released_at)
    if dist.get_rank() == 0:
        print(f"rlhf_dyna: {name}: {new.change.describe()}; moved {moved / 2**20:,.2f} MiB in {rounds} rounds; "
              f"training layout {layout.describe()}, {done - started:.2f} s", flush=True)
    return {"elastic/leave/seconds": done - started, "elastic/leave/bytes_moved": float(moved),
            "elastic/leave/rounds": float(rounds), "elastic/leave/move_seconds": moved_at - started,
            "elastic/leave/copy_seconds": copied_at - built_at,
            "elastic/leave/rollout_seconds": released_at - moved_at + done - copied_at,
            **world_metrics("leave", build if background else None, built_at - released_at)}
