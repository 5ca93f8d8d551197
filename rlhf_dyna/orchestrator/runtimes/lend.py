"""placement=lend (PPO): every rank generates and prepares with the colocated engines; for training, the actor and the
critic move by VPS plan to their disjoint rank sets, train there at the same time, and move back onto all ranks
before the weight sync.

The moves are the placement's own changes (`elastic.placement.changes`), logged as
`reshard/<role>/<from_phase>_to_<to_phase>/{seconds,bytes_moved,rounds,peak_extra_bytes}`. The sets' meshes and
groups are built by the world builder on a background thread from before the first step, while the step-0
evaluation, the generation and the preparation of step 1 compute; each switch reports the builder's seconds and the
seconds it actually waited (`placement/build_seconds`, `placement/wait_seconds`).

A change of world (elastic.events, SIGTERM, elastic.join, a lost rank's recovery) comes at a step boundary, where every
role is at home on every rank: it is colocate's change, and lend's two sets are re-planned over the new world
(elastic.membership: the actor's share, placement.train_ranks or half, of the new world), their meshes and groups built
anew from the next generation on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...config import Config
from ...elastic.faults import fault_point, kill_point
from ...elastic.placement import ACTOR, CRITIC, GENERATE, TRAIN_ACTOR, TRAIN_CRITIC, Placement, RoleSlot, changes
from ...elastic.world_builder import BuiltWorld, WorldBuilder, mesh_key
from ...parallel_layout import ParallelLayout
from ...tracking.timeline import record_phase
from ...train.engine import TrainEngine
from ...transition.role_move import ParkedState, engine_on, move_role_state, role_catalog
from ..batch import Sample, rank_rows
from ..placements import placement_of
from ..step import prefixed, reshard_metrics, role_losses, train_on
from .colocate import ColocateRuntime

TRAINED_BY = {ACTOR: "timing_s/train_actor", CRITIC: "timing_s/train_critic"}


def whole_batch(shard: dict[str, torch.Tensor], engine: TrainEngine, mini_batches: int) -> dict[str, torch.Tensor]:
    """Every row of the step on every rank, from the dp shards of `engine`'s mesh (exact: each row is summed once
    with zeros; TP peers hold the same rows, so only TP rank 0 contributes)."""
    dp, dp_rank = engine.dp_size, engine.dp_rank
    rows_here = next(iter(shard.values())).shape[0]
    rows = rank_rows({"i": torch.arange(rows_here * dp)}, dp_rank, dp, mini_batches)["i"]
    contributes = engine.mesh["tp"].get_local_rank() == 0
    out = {}
    for key, value in sorted(shard.items()):
        full = value.new_zeros((rows_here * dp, *value.shape[1:]))
        if contributes:
            full[rows] = value
        dist.all_reduce(full)
        out[key] = full
    return out


@dataclass
class PlacedTraining:
    """This rank's part of a placement whose roles move between phases: the builder, the lent engines."""

    placement: Placement
    builder: WorldBuilder
    tp: int
    rank: int
    recorder: object = None
    launched: tuple[int, str] = (0, "")  # (launched rank, run ident): this process for elastic.faults.kill_point
    started: bool = False  # the builder's thread
    lent: dict[str, TrainEngine] = field(default_factory=dict)  # role -> its engine on this rank's set (members)
    parked: dict[str, ParkedState] = field(default_factory=dict)  # role -> its home state's storages while lent

    def _world(self) -> tuple[BuiltWorld, float]:
        t0 = time.perf_counter()
        world = self.builder.get(self.placement.key())
        return world, time.perf_counter() - t0

    def _engine_in(self, role: str, slot: RoleSlot, home: dict[str, TrainEngine], world: BuiltWorld):
        """The role's engine in `slot` on this rank: the colocated one at home, the lent one (built at the first
        switch, then reused) on a member of its set, None elsewhere."""
        if slot == self.placement.slot(GENERATE, role):
            return home[role]
        if self.rank not in slot.ranks.ranks:  # type: ignore[union-attr]
            return None
        if role not in self.lent:
            self.lent[role] = engine_on(home[role], world.mesh(slot.spec))  # type: ignore[arg-type]
        return self.lent[role]

    def start(self) -> None:
        """The sets' meshes and groups start building (on a thread on gloo), once."""
        if not self.started:
            self.builder.start()
            self.started = True

    def enter(self, phase: str, home: dict[str, TrainEngine], step: int) -> dict[str, float]:
        """Collective: run the role moves of `step` into `phase`; their metrics and the builder's seconds."""
        moves = [c for c in changes(self.placement) if c.to_phase == phase and c.is_vps]
        if not moves:
            return {}
        world, waited = self._world()
        metrics = {"placement/build_seconds": world.build_seconds, "placement/wait_seconds": waited}
        for change in moves:
            src = self._engine_in(change.role, change.src, home, world)
            dst = self._engine_in(change.role, change.dst, home, world)
            fault_point(change.name, self.rank)
            if change.role == ACTOR and phase == TRAIN_ACTOR:  # tests: a rank dead in the step's first move
                kill_point(f"lend/move/step_{step}", *self.launched)
            if dst is home[change.role] and change.role in self.parked:
                self.parked.pop(change.role).unpark()  # storage back; the move fills it
            stats = move_role_state(src, dst, self._spec(change.src), self._spec(change.dst),
                                    catalog=role_catalog(home[change.role]), recorder=self.recorder,
                                    trace_name=change.name)
            if src is home[change.role]:  # lent: the home copy's memory is free for the set that trains here
                self.parked[change.role] = ParkedState()
                metrics[f"placement/{change.role}_parked_bytes"] = float(self.parked[change.role].park(src))
            metrics.update(reshard_metrics(change.name, stats))
        return metrics

    def _spec(self, slot: RoleSlot):
        ranks = slot.ranks
        return ParallelLayout(ranks.size // self.tp, self.tp, first_rank=ranks.first).spec()  # type: ignore[union-attr]

    def train(self, cfg: Config, step: int, batch: dict, actor: TrainEngine, critic: TrainEngine,
              losses: dict[str, object]) -> tuple[dict, dict, dict, dict]:
        """Collective. Moves the roles out, trains each lent engine on its rows of the step with its role's loss
        (concurrently across the sets), moves them home. Returns (actor, critic, timings, placement) metrics."""
        alg, home = cfg.algorithm, {ACTOR: actor, CRITIC: critic}
        full = whole_batch(batch, actor, alg.mini_batches)
        metrics = self.enter(TRAIN_ACTOR, home, step)
        trained: dict[str, tuple[dict, float]] = {}
        for role, engine in self.lent.items():
            wall, t0 = time.time(), time.perf_counter()
            rows = rank_rows(full, engine.dp_rank, engine.dp_size, alg.mini_batches)
            trained[role] = (train_on(engine, rows, losses[role], alg), time.perf_counter() - t0)
            # this rank's own phase, at its real time (the sets train at once)
            record_phase(self.recorder, f"train_{role}", step, wall, trained[role][1], role)
        dist.barrier()  # the slower set's training is the phase's time, not the move's that follows it
        back = self.enter(GENERATE, home, step)
        back["placement/wait_seconds"] += metrics["placement/wait_seconds"]  # the step's switches waited this long
        metrics.update(back)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, trained)
        role_metrics, timings = {ACTOR: {}, CRITIC: {}}, {}
        for role, key in TRAINED_BY.items():
            served = [part[role] for part in gathered if role in part]
            role_metrics[role] = served[0][0]  # dp-averaged already: the same on every rank of the set
            timings[key] = sum(seconds for _, seconds in served) / len(served)
        timings["timing_s/placement_change"] = sum(v for k, v in metrics.items() if k.endswith("/seconds")
                                                   and k.startswith("reshard/"))
        return role_metrics[ACTOR], role_metrics[CRITIC], timings, metrics

    def close(self) -> None:
        if self.started:
            self.builder.join(timeout=60)


class LendRuntime(ColocateRuntime):
    name = "lend"
    placed: PlacedTraining | None = None  # the sets of the current world

    def begin(self) -> None:
        """The launched world's sets (a joiner's came with its world, enter_world)."""
        if self.placed is None:
            self.placed = self.placed_training(placement_of(self.cfg))

    def placed_training(self, placement: Placement) -> PlacedTraining:
        """`placement`'s sets over the current world, their builder not started yet (`generate` starts it)."""
        home = placement.slot(GENERATE, ACTOR).spec
        builder = WorldBuilder([placement], known={mesh_key(home): self.actor.mesh})  # type: ignore[arg-type]
        info = self.run.dist_info
        return PlacedTraining(placement, builder, self.cfg.parallel.train.tp, self.rank, self.recorder,
                              (info.rank, info.run_ident))

    def enter_world(self, layout: ParallelLayout, engines: dict, placement: Placement) -> None:
        """After a change of world (every role at home): the colocated engines on the new world and lend's sets
        re-planned over it; the old sets' lent engines and groups (of a world that is gone) are dropped."""
        super().enter_world(layout, engines, placement)
        self.placed = self.placed_training(placement)
        if self.rank == 0:
            actor, critic = placement.slot(TRAIN_ACTOR, ACTOR).ranks, placement.slot(TRAIN_CRITIC, CRITIC).ranks
            print(f"rlhf_dyna: placement=lend over {placement.world_size} ranks: the actor trains on "
                  f"{actor.describe()}, the critic on {critic.describe()}", flush=True)

    def generate(self, step: int) -> tuple[list[Sample], float]:
        """The sets' meshes and groups build on a thread while the step generates: after the boundary's changes and
        the snapshot ring over a new world, which create groups on this thread (every rank must create groups in one
        order)."""
        self.placed.start()
        return super().generate(step)

    def train(self, step: int, batch: dict | None, samples: list[Sample], prepared: dict[str, float],
              ) -> dict[str, float]:
        """The actor and the critic move out to their sets, train there at once, and move home."""
        t0 = time.perf_counter()
        actor, critic, timings, placement = self.placed.train(self.cfg, step, batch, self.actor, self.critic,
                                                              role_losses(self.cfg, self.run.kl_ctl.value))
        metrics = {**prepared, **prefixed("actor", actor), **prefixed("critic", critic), **timings,
                   "timing_s/train": time.perf_counter() - t0, **placement}
        return {**metrics, **self.kl_update(metrics, batch, samples)}

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        metrics.update(change_share(metrics, metrics["timing_s/step"]))
        return super().finish_step(step, metrics, started)

    def close(self, failed: bool) -> None:
        if not failed and self.placed is not None:
            self.placed.close()
        super().close(failed)


def change_share(metrics: dict[str, float], step_seconds: float) -> dict[str, float]:
    """The share of the step that the placement changes cost."""
    moved = sum(v for k, v in metrics.items() if k.startswith("reshard/") and k.endswith("/seconds")
                and k.count("/") == 3)  # reshard/<role>/<from>_to_<to>/seconds
    return {"placement/change_share": moved / step_seconds if step_seconds > 0 else 0.0}
