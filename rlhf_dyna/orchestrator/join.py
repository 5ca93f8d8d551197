"""A live join at a step boundary (placement=colocate, split or lend; docs/elastic/join.md): new ranks enter the job, every
training role's state spreads over its larger set by VPS plan (colocate: the whole world; split: the training set,
which the joiners extend), and the run goes on with the same global batch.

The joining processes start with the job and prepare while the world trains (orchestrator/joiner.py: task,
tokenizer, model skeletons on meta, under colocate a vLLM engine in a private world of one). At the boundary after
step S:
1. the old world waits on the job's store until its joiners are prepared (`wait_seconds`: ~0 when they were ready in
   time) or gone (the launcher found the process dead), rank 0 admits those alive (elastic.join_world: a joiner that
   died before is dropped, with a line naming it; where none is left the world goes on unchanged) and tells the
   others, and the world plans the new one (elastic.membership.world_after, `joining` ranks);
2. every process releases vLLM's groups and its default group (the old world's, or a joiner's private one; the vLLM
   engines stay) and enters the new default group over `rlhf_dyna/world<generation>`: the old ranks keep their
   numbers, the joiners come after them (over the groups built in the background during the step before,
   orchestrator/next_world.py, where the join was known then);
3. rank 0 broadcasts what the joiners lack (`Handover`, made on the actor's first rank: under split rank 0 holds
   no training role): the loop's state (step, prompt sampler, RNGs, task position, KL controller), each role's
   engine settings, buffers, catalog and source spec, the runtime's own (split: the samples generated ahead), the
   change's plan;
4. the old ranks copy their engines locally onto a mesh of the old layout in the new world (the same ranks), and
   each role's parameters and AdamW moments move by VPS plan into engines on the new layout over its set
   (transition.role_move: the joiners hold no source);
5. colocate re-forms every rank's vLLM engine over the new world (one replica more per joiner; split's engines live
   outside the world and stay) and the weights are synced.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module

from ..elastic.faults import kill_point
from ..elastic.join_world import GONE, Admission, admit, announced_pid, claim, drop, fate, refuse, wait_settled
from ..elastic.membership import MembershipError, NewWorld, WorldChange, world_after
from ..elastic.world_prebuild import WorldBuild, configured_backend, record_world, world_metrics
from ..elastic.world_switch import enter_new_world
from ..launch.joiner_watch import alive as process_alive
from ..launch.world_record import claim_published
from ..parallel_layout import ParallelLayout
from ..rollout.reform import release_groups
from ..train.mesh import build_mesh
from ..transition.bind_train import train_spec
from ..transition.relayout import bind_train_state, empty_engine, meta_skeleton, optimizer_groups, settings_of
from ..transition.role_move import move_role_state, role_catalog
from ..vps.model import ModelCatalog
from ..vps.spec import ParallelSpec
from .leave import role_layout, trained_layout
from .live_world import Membership
from .run import Run


@dataclass
class RoleBlueprint:
    """What a joiner needs to build its engine of a role like the old world's, and where the role's state lies."""

    settings: dict  # transition.relayout.settings_of
    groups: list[dict]  # the optimizer's param-group settings
    buffers: dict[str, Tensor]  # replicated in every layout (rotary frequencies)
    src: ParallelSpec  # the old world's engines' spec
    catalog: ModelCatalog  # its VPS catalog (every rank plans the move, holder or not)


@dataclass
class Handover:
    """Rank 0's broadcast in the new world: the change and everything of the run the joiners lack."""

    name: str  # the change's trace and metric name, elastic/join/+N@S
    new: NewWorld
    roles: dict[str, RoleBlueprint]
    step: int  # the last step done: the joiners' first is step + 1
    loop_rng: random.Random
    python_rng: object
    torch_rng: Tensor
    task_state: dict
    kl_ctl: object
    joiners_before: int  # joiner processes admitted so far, this change's included
    engine_tp: int  # the old world's vLLM engines' tp (a joiner's is 1)
    runtime_state: dict  # Runtime.handover_state of the actor's first rank


def blueprint(engine) -> RoleBlueprint:
    buffers = {name: b.detach().clone() for name, b in engine.model.named_buffers()}
    return RoleBlueprint(settings_of(engine), optimizer_groups(engine), buffers, train_spec(bind_train_state(engine)),
                         role_catalog(engine))


def handover(runtime, membership: Membership, new: NewWorld, step: int, name: str) -> Handover:
    run: Run = runtime.run
    roles = {move.role: blueprint(getattr(runtime, move.role)) for move in new.moves}
    return Handover(name, new, roles, step, run.rng, random.getstate(), torch.get_rng_state(),
                    getattr(run.task, "state_dict", dict)(), run.kl_ctl, membership.joiners_before,
                    runtime.rollout_layout.tp, runtime.handover_state())


def shared(h: Handover | None) -> Handover:
    """Collective over the new world: rank 0's handover on every rank."""
    box = [h]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def take_over(runtime, h: Handover) -> None:
    """A joiner: the loop's state as the old world has it after step h.step."""
    run: Run = runtime.run
    runtime.take_handover(h.runtime_state)
    run.start_step, run.rng, run.kl_ctl = h.step, h.loop_rng, h.kl_ctl
    random.setstate(h.python_rng)
    torch.set_rng_state(h.torch_rng)
    if h.task_state:
        run.task.load_state_dict(h.task_state)


def spread(runtime, h: Handover, staged: dict, skeletons: dict[str, Module], layout: ParallelLayout,
           mesh) -> tuple[dict, int, int]:
    """Collective over the new world: each role's state from `staged` (the old ranks' engines of the old world, whose
    local shards are the old layout's; {} on a joiner and on a rank outside the set) into empty engines on `mesh` of
    the new layout, on its ranks; (role -> engine, bytes moved, rounds)."""
    engines, moved, rounds, holds = {}, 0, 0, dist.get_rank() in layout.ranks
    for move in h.new.moves:
        source, plan = staged.get(move.role), h.roles[move.role]
        skeleton = meta_skeleton(source.model) if source is not None else skeletons.get(move.role)
        destination = empty_engine(plan.settings, plan.groups, plan.buffers, role_layout(layout, move.role), mesh,
                                   skeleton) if holds else None
        stats = move_role_state(source, destination, plan.src, move.dst, plan.catalog, recorder=runtime.recorder,
                                trace_name=h.name)
        if destination is not None:
            engines[move.role] = destination
        moved, rounds = moved + stats.bytes_moved, rounds + stats.rounds
    return engines, moved, rounds


def grow(runtime, membership: Membership, h: Handover, engines: dict, skeletons: dict[str, Module],
         build: WorldBuild | None) -> dict[str, float]:
    """Collective over the new world, on old ranks and joiners alike: its meshes (over `build`'s groups where it
    built them), stage, spread, re-form vLLM, sync; timings."""
    started = time.perf_counter()
    layout = trained_layout(h.new)
    mesh = build_mesh(layout)
    background = build is not None and build.close()
    meshed_at = time.perf_counter()
    for role in engines:
        setattr(runtime, role, None)  # the old world's engine: the move's source, dropped after it
    # an old rank keeps its number, so the old engines' shards are the old layout's in the new world too: the source
    grown, moved, rounds = spread(runtime, h, engines, skeletons, layout, mesh)
    moved_at = time.perf_counter()
    membership.placement, membership.joiners_before = h.new.placement, h.joiners_before
    runtime.reform_rollout(h.new.change, h.engine_tp, h.new.rollout_tp)
    runtime.enter_world(layout, grown, h.new.placement)
    runtime.sync_weights()
    return {"meshes_seconds": meshed_at - started, "background": float(background),
            "move_seconds": moved_at - meshed_at, "rollout_seconds": time.perf_counter() - moved_at, "bytes_moved": float(moved), "rounds": float(rounds)}


def joined_world(membership: Membership, joining: int) -> NewWorld:
    """The world after `joining` ranks join the current one (MembershipError: it cannot be)."""
    return world_after(membership.placement, membership.preferred, membership.rollout_tp, membership.batch,
                       WorldChange(dist.get_world_size(), (), joining))


def admit_joiners(runtime, membership: Membership, joiners: list[str], step: int, name: str,
                  scripted: bool = True, build: WorldBuild | None = None) -> dict[str, float]:
    """Collective over the old world: the processes `joiners` (elastic.join_world names) enter after step `step`;
    the change's metrics (elastic/join/*), on the ranks of the new world. `scripted`: an elastic.events join (its
    joiners count in membership.joiners_before), else elastic.join=RUN_DIR requests. `build`: the new world's groups,
    built in the background where the join was known a step ahead."""
    started, rank, world = time.perf_counter(), dist.get_rank(), dist.get_world_size()
    waited, prepared = wait_settled(membership.store, joiners)
    membership.joiners_before += len(joiners) if scripted else 0
    joiners = admitted(membership, joiners, name)
    if not joiners:
        if build is not None:
            build.close()  # its groups were of a world with the joiners
        return {}
    joining = len(joiners)
    new = joined_world(membership, joining)  # a scripted join was checked before spawn, a request by rank 0
    h = handover(runtime, membership, new, step, name) if rank == runtime.actor_first_rank else None
    if runtime.actor_first_rank != 0:  # split: the training roles and the KL controller are the training set's
        h = runtime.from_actor(h)
    membership.generation += 1
    if rank == 0:  # claimed by admitted(): from now on each is a rank of the new world
        for i, joiner in enumerate(joiners):
            admit(membership.store, joiner, Admission(membership.generation, world + i, world + joining, step))
    backend = configured_backend()
    release_groups()  # vLLM's groups and the old default group; the engines stay
    entering, entering_wall = time.perf_counter(), time.time()
    enter_new_world(membership.store, membership.generation, rank, world + joining, backend, build)
    entered_at = time.perf_counter()
    engines = {move.role: getattr(runtime, move.role) for move in new.moves if getattr(runtime, move.role) is not None}
    h = shared(h)
    handed_at = time.perf_counter()
    timings = grow(runtime, membership, h, engines, {}, build)
    done = time.perf_counter()
    boundary = entered_at - entering + timings.pop("meshes_seconds")
    background = build if timings.pop("background") else None
    record_world(runtime.recorder, name, background, entering_wall, boundary)
    if rank == 0:
        print(f"rlhf_dyna: {name}: {new.change.describe()}; moved {timings['bytes_moved'] / 2**20:,.2f} MiB in "
              f"{timings['rounds']:.0f} rounds; training layout {runtime.layout.describe()}, {done - started:.2f} s "
              f"(waited {waited:.2f} s for the joiners, who prepared in {prepared:.2f} s; the new world's groups "
              f"{'built in the background' if background else 'built here'}, {boundary:.3f} s here)", flush=True)
    return {"elastic/join/seconds": done - started, "elastic/join/prepare_seconds": prepared,
            "elastic/join/ready_wait_seconds": waited, "elastic/join/handover_seconds": handed_at - entered_at,
            **world_metrics("join", background, boundary),
            **{f"elastic/join/{key}": value for key, value in timings.items()}}


def admitted(membership: Membership, joiners: list[str], name: str) -> list[str]:
    """Collective over the old world: the joiners rank 0 admits, those still alive (claimed on the job's store before
    the launcher could mark them gone); the dead ones dropped with a line naming them (and the rest refused where the
    global batch does not split over the smaller world)."""
    box = [joiners]
    if dist.get_rank() == 0:
        store = membership.store
        for joiner in joiners:
            drop_if_dead(store, joiner)
        alive = [j for j in joiners if fate(store, j) != GONE and claim(store, j)]
        dead = [j for j in joiners if j not in alive]
        if dead:
            print(f"rlhf_dyna: {name}: {', '.join(dead)} died before the world admitted {'it' if len(dead) == 1 else 'them'}"
                  f"; {'the world goes on with' if not alive else 'admitting ' + ', '.join(alive) + ' to'} "
                  f"{dist.get_world_size() + len(alive)} ranks", flush=True)
        try:
            alive and joined_world(membership, len(alive))
        except MembershipError as err:
            why = f"{err} ({', '.join(dead)} died before the join.) The job goes on with {dist.get_world_size()} ranks."
            print(f"rlhf_dyna: join of {', '.join(alive)} refused: {why}", flush=True)
            for joiner in alive:
                refuse(store, joiner, why)
            alive = []
        if alive and membership.records and not claim_published(store, membership.launched,
                                                                [process_of(membership, j) for j in alive]):
            why = "a rank of the world was lost at the boundary; the survivors recover first. Ask again."
            for joiner in alive:
                refuse(store, joiner, why)
            alive = []  # the lost rank's announcement shuts the world's connections: the broadcast fails
        box = [alive]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def drop_if_dead(store, name: str) -> None:
    """Rank 0, before it claims joiner `name` or agrees on it: its process (the pid it announced, on this host: the
    join file's node) is gone, so it is dropped; under torchrun no launcher of ours watches it, elsewhere this only
    comes first where the launcher's watch has not looked yet (launch/joiner_watch.py)."""
    pid = announced_pid(store, name)
    if pid is not None and fate(store, name) is None and not process_alive(pid) and drop(store, name):
        print(f"rlhf_dyna: {name} (pid {pid}) died before the world admitted it; the run goes on without it",
              flush=True)


def process_of(membership: Membership, name: str) -> int | str:
    """Joiner `name`'s process in the world record (launch/world_record.py): a scripted joiner's launch index, an
    elastic.join process's name."""
    return membership.launched + int(name.removeprefix("joiner")) if name.startswith("joiner") else name


def enter_as_joiner(runtime, membership: Membership, admission: Admission, skeletons: dict[str, Module]) -> Handover:
    """A joiner at its boundary: leave the private world, enter the new one, take the loop's state and its share of
    every role (collective with the old world's `admit_joiners`)."""
    backend, build = configured_backend(), membership.build
    membership.build = None
    release_groups()  # the private world's vLLM groups and default group; the engine stays
    membership.generation = admission.generation
    enter_new_world(membership.store, admission.generation, admission.rank, admission.world_size, backend, build)
    h = shared(None)
    take_over(runtime, h)
    kill_point("join/move", runtime.run.dist_info.rank, runtime.run.dist_info.run_ident)  # tests: dead in the move
    grow(runtime, membership, h, {}, skeletons, build)
    return h
