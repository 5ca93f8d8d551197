"""placement=split with placement.rebalance=true: between steps, move devices between the rollout set and the train set
when the measured phase times say that a different split shortens the step (the decision: elastic/rebalance.py).

Every candidate split's meshes and groups are built by the world builder on a background thread from the start of
the run, so a move waits only for bytes. A move (every rank takes part, the decision is rank 0's, broadcast):
the engines of ranks that leave the rollout set shut down on a background thread once the state has moved (their
engine process and shm file go, joined before the rank starts an engine again and at the end of the run); the actor's
parameters and AdamW moments, the reference's parameters, and PPO's critic with its AdamW moments move by VPS plan from
the old train set's FSDP mesh to empty engines on the new one (`reshard/<role>/rebalance/*`); ranks that join the
rollout set start their tp=1 engine, and the weight sync fills it. Logged: `rebalance/rollout_ranks` every step; in
the step of a move the decision (`rebalance/moved`, the predicted gain and cost); in the step it served the measured
seconds of each part (the slowest rank's) and what they cost; later `rebalance/measured_gain_s`.

The fixed work of a move is done ahead of it, on a background thread, for every split the run may move to from the
current one (`prepare_moves`, again after each move): the VPS plans of every role's state move and of the first weight sync after the move (plans are pure: vps_plans caches them), and, on the ranks that would
train there, the destination engines as skeletons (meta parameters, TP and FSDP2 applied: no storage, no
collective). The move itself allocates the skeleton's shards and moves the bytes; a leaving engine shuts down after
the move (on a GPU, before it: the train engine wants its memory).

A move does not end in a barrier: each rank goes on to the next step as soon as its own part is done, so rollout ranks
that hold no training state generate the next step while the train set moves its state. The parts' times are reduced
in the next `after_step` and logged in the step the move served: `rebalance/transition_seconds` (the slowest rank's
part) and `rebalance/lost_seconds`, the wall time the step lost to it (staleness 0: the rollout set's part, or the
train set's part beyond the step's generation, whichever is larger; staleness 1: at most the larger part), with
`rebalance/transition_share` = lost / that step's seconds.

A change of world (docs/elastic/placements.md) maps the current split's sets; no move is made at a boundary where one is known
to come (its world was built for the current split), `before_change` ends the old world's background work and shares
rank 0's manager, and `enter_world` re-plans the candidate splits, their builder and the manager over the new world.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...launch.threads import DeviceThread, EngineStop, joins_before_move
from ...elastic.placement import ACTOR, CRITIC, GENERATE, REFERENCE, ROLLOUT, TRAIN_ACTOR, Placement
from ...elastic.rebalance import Decision, RebalanceRule, Rebalancer, StepTimes, move_seconds, split_candidates
from ...elastic.world_builder import WorldBuilder, mesh_key
from ...models.catalog import catalog_from_config
from ...models.value_catalog import value_catalog_from_config
from ...parallel_layout import ParallelLayout
from ...train.engine import TrainEngine
from ...transition.role_move import ALL_KINDS, move_role_state, optimizer_step
from ...transition.subset_sync import SubsetSync
from ...transition.vps_plans import DEFAULT_BUDGET_BYTES, planned
from ...vps.spec import ParallelSpec
from ...vps.tensor import Kind
from ..batch import Sample
from ..build import materializer, skeleton_engine
from ..placements import split_placement, split_shape
from .split import SYNC, SplitRuntime, layouts_of, start_engine

MOVE_EVENT = "rebalance"  # the whole move on the timeline; its VPS rounds are reshard/<role>/rebalance
ENGINE_STOP_EVENT = "rebalance/engine_stop"  # a leaving engine's shutdown, in the background
MOVES = {role: f"reshard/{role}/{MOVE_EVENT}" for role in (ACTOR, REFERENCE, CRITIC)}
STOP_S = "rebalance/engine_stop_seconds"


def role_kinds(role: str) -> tuple[Kind, ...]:
    """What a role's move carries: parameters and AdamW moments of a trained role, parameters of the reference."""
    return (Kind.PARAM,) if role == REFERENCE else ALL_KINDS


@dataclass
class PendingMove:
    """A move whose parts' times are not reduced yet: every rank's own seconds of each part, and what it moved."""

    parts: dict[str, float]
    metrics: dict[str, float]
    moved_bytes: int
    build_seconds: float


GENERATES_S, TRAINS_S = "rebalance/rollout_set_seconds", "rebalance/train_set_seconds"  # each set's slowest part


class RebalanceRuntime(SplitRuntime):
    """The split runtime whose sets change size between steps. Rank 0 holds the decision state (`manager`)."""

    name = "rebalance"

    def start_train_set(self, mesh) -> None:
        """Every candidate split's groups and meshes start building in the background before the actor is built."""
        cfg = self.cfg
        self.moves_state()
        valid = self.candidates(cfg.parallel.world_size)  # checked before spawn: the start is among them
        home = self.placements[self.rollout_layout.size].slot(TRAIN_ACTOR, ACTOR).spec
        self.builder = WorldBuilder(list(self.placements.values()), known={mesh_key(home): mesh}).start()
        self.builder_started = True
        rule = RebalanceRule(cfg.placement.rebalance_margin, cfg.placement.rebalance_every)
        self.manager = Rebalancer(self.world_size, valid, self.rollout_layout.size, cfg.placement.max_staleness, rule) \
            if self.rank == 0 else None
        super().start_train_set(mesh)

    def moves_state(self) -> None:
        """What every rank keeps to make moves: catalogs, roles, timings, the background work (a joiner's too)."""
        cfg, self.tp = self.cfg, self.cfg.parallel.train.tp
        self.catalogs = {ACTOR: catalog_from_config(self.hf_config, "float32", "float32")}  # fp32 parameters
        self.catalogs[REFERENCE] = self.catalogs[ACTOR]
        self.catalogs[CRITIC] = value_catalog_from_config(self.hf_config, "float32", "float32")
        self.roles = [ACTOR] + ([REFERENCE] if cfg.algorithm.kl_coef > 0 else []) + \
            ([CRITIC] if cfg.algorithm.name == "ppo" else [])
        self.manager: Rebalancer | None = None  # rank 0's decision state
        self.carried: Rebalancer | None = None  # rank 0's manager as shared before a change of world
        self.builder: WorldBuilder | None = None
        self.builder_started = False  # a new world's builder starts at its first generation (`generate`)
        self.engine_start_s = 0.0  # rank 0's engine start at the beginning of the run: predicts a joining one's
        self.move_bytes_per_s: float | None = None  # measured by the last move
        self.stopping: list[EngineStop] = []  # engines of this rank shutting down in the background
        self.skeletons: dict[tuple[int, str], TrainEngine] = {}  # (rollout ranks, role) -> destination built ahead
        self.preparing: threading.Thread | None = None
        self.prepare_error: BaseException | None = None
        self.pending: PendingMove | None = None  # the last move, until the step it served ends

    def candidates(self, world_size: int) -> list[int]:
        """The rollout set sizes that can run the config in a world of `world_size`; their placements kept."""
        self.world_size = world_size
        valid, _ = split_candidates(split_shape(self.cfg, world_size))
        self.placements: dict[int, Placement] = {r: split_placement(self.cfg, r, world_size) for r in valid}
        return valid

    def prepare_to_join(self, membership, model_dir, process: int) -> None:
        super().prepare_to_join(membership, model_dir, process)
        self.moves_state()

    def start_rollout_set(self) -> None:
        started = time.perf_counter()  # rank 0 always generates: its engine's start predicts a joining one's
        super().start_rollout_set()
        self.engine_start_s = time.perf_counter() - started

    def begin(self) -> None:
        """Plans and destination skeletons of every move, in the background (a new world's: from its first
        generation, `generate`)."""
        if self.builder_started:
            self.prepare_moves(self.rollout_layout.size)

    def generate(self, step: int) -> tuple[list[Sample], float]:
        """A new world's candidate splits start building here, after the boundary's changes, which create groups on
        this thread (every rank must create groups in one order); then the plans of its moves."""
        if not self.builder_started:
            self.builder.start()
            self.builder_started = True
            self.prepare_moves(self.rollout_layout.size)
        return super().generate(step)

    def before_change(self) -> None:
        """The old world's builder and the move preparation done (their groups and meshes go with that world), and
        rank 0's manager on every rank: rank 0 may leave, and the new rank 0 goes on with its history."""
        self._join_preparing()
        if self.builder_started:
            self.builder.join()
        box = [self.manager]
        dist.broadcast_object_list(box, src=0)
        self.carried = box[0]

    def enter_world(self, layout: ParallelLayout, engines: dict, placement: Placement) -> None:
        """After a change of world: split's sets and sync, then the candidate splits of the new world, their builder
        (not started: `generate`), and on rank 0 the manager re-planned from the split the change left."""
        super().enter_world(layout, engines, placement)
        start = placement.slot(GENERATE, ROLLOUT).ranks.size
        valid = self.candidates(placement.world_size)
        self.builder, self.builder_started = WorldBuilder(list(self.placements.values())), False
        self.skeletons, self.prepare_error = {}, None  # on the old world's meshes
        if self.rank == 0:  # rank 0 stays rank 0 or leaves: every other rank's manager is None
            self.manager = self.carried.over(self.world_size, valid, start)
            print(f"rlhf_dyna: rebalance over {self.world_size} ranks from {start}+{self.world_size - start}: splits "
                  f"{', '.join(f'{r}+{self.world_size - r}' for r in valid)}", flush=True)

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        metrics = super().finish_step(step, metrics, started)
        return {**metrics, **self.after_step(step, metrics)}

    @property
    def trace_title(self) -> str:
        return f"{self.cfg.recipe}: placement=split, rebalance: phases and transitions"

    def _spec(self, rollout_ranks: int) -> ParallelSpec:
        """The train set's spec under split `rollout_ranks`."""
        train = self.placements[rollout_ranks].slot(TRAIN_ACTOR, ACTOR).ranks
        return ParallelLayout(train.size // self.tp, self.tp, first_rank=train.first).spec()

    def _role_plans(self, current: int, target: int) -> list:
        """This rank's share of every role's state move from split `current` to `target`, from vps_plans' cache
        (move_role_state asks for the same keys)."""
        src, dst, c = self._spec(current), self._spec(target), self.catalogs
        return [planned(c[role], src, c[role], dst, role_kinds(role), DEFAULT_BUDGET_BYTES, self.rank)
                for role in self.roles]

    def prepare_moves(self, current: int) -> None:
        """Local, on a background thread: every move's plans from split `current`, and this rank's destination
        skeletons of every split it would train in. The next move joins the thread first."""
        def prepare() -> None:
            try:
                for target, placement in self.placements.items():
                    if target == current:
                        continue
                    self._role_plans(current, target)
                    sync = SubsetSync(self.hf_config, self._spec(target), 0, target)  # the first sync on the new split
                    planned(sync.catalog, sync.train, sync.catalog, sync.rollout, (Kind.PARAM,), sync.budget_bytes,
                            self.rank)
                    if self.rank < target:  # not in that split's train set
                        continue
                    mesh = self.builder.get(placement.key(), record=False).mesh(
                        placement.slot(TRAIN_ACTOR, ACTOR).spec)
                    for role in self.roles:
                        if (target, role) not in self.skeletons:
                            self.skeletons[target, role] = skeleton_engine(self.cfg, self.hf_config, mesh, role)
            except BaseException as err:  # surfaced by the move, on the main thread
                self.prepare_error = err

        self.preparing = DeviceThread(prepare, "rlhf_dyna-move-prepare")  # on a GPU: this rank's device
        self.preparing.start()

    def _join_preparing(self) -> None:
        if self.preparing is not None:
            self.preparing.join()
            self.preparing = None
        if self.prepare_error is not None:
            raise RuntimeError(f"preparing the moves failed: {self.prepare_error}") from self.prepare_error

    def _destination(self, target: int, role: str, mesh) -> TrainEngine:
        """This rank's empty engine of `role` on split `target`: the skeleton built ahead (`prepare_moves` builds one
        for every split this rank would train in), given its shards now."""
        engine = self.skeletons.pop((target, role))
        engine.materialize_now(materializer(mesh))
        return engine

    def predicted_cost(self, current: int, target: int, sync_bytes_per_s: float, sync_s: float) -> float:
        """Seconds of moving current -> target: the state's planned bytes at the measured bandwidth (the last move's,
        else the weight sync's transfer), plus a joining engine's start and a weight sync into it."""
        moved = sum(plan.bytes_between_ranks for plan in self._role_plans(current, target))
        return move_seconds(moved, self.move_bytes_per_s or sync_bytes_per_s, target > current, self.engine_start_s,
                            sync_s)

    def change_due(self, step: int) -> str | None:
        """Why no move may follow `step`: a change of world is known to come at the boundary after it."""
        m = self.membership
        if m is not None and (m.due_before(step + 1) or m.agreed):
            return "a change of world comes at this boundary; the splits are re-planned over its world"
        return None

    def _decide(self, step: int, metrics: dict, transfer_s: float, hold: str | None) -> Decision:
        train_s = metrics["timing_s/prepare"] + metrics["timing_s/train_actor"] + metrics.get("timing_s/train_critic", 0.0)
        times = StepTimes(self.manager.current, metrics["timing_s/gen"], train_s, metrics[f"{SYNC}/seconds"],
                          metrics["timing_s/step"])
        self.manager.observe(times)
        if hold is not None:
            return Decision(self.manager.current, self.manager.current, reason=hold)
        bandwidth = metrics[f"{SYNC}/bytes_moved"] / max(transfer_s, 1e-9)  # the sync's transfer, install excluded
        current = self.manager.current
        decision = self.manager.decide(self.cfg.trainer.total_steps - step, lambda r: self.predicted_cost(
            current, r, bandwidth, metrics[f"{SYNC}/seconds"]))
        if decision.moves:
            print(f"rlhf_dyna: rebalance after step {step}: {decision.describe(self.world_size)}", flush=True)
        return decision

    def after_step(self, step: int, metrics: dict) -> dict[str, float]:
        """Collective: the cost of the move that served this step is logged; rank 0 decides from the step's metrics;
        every rank carries out a move. Returns the metrics."""
        out = self._finish_pending(metrics)
        hold = self.change_due(step)
        decision = self._decide(step, metrics, self.sync.transfer_seconds, hold) if self.manager is not None else None
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        decision = box[0]
        if self.manager is not None and (gain := self.manager.measured_gain()) is not None:
            out["rebalance/measured_gain_s"] = gain  # mean step on the split left last minus on this one
        if decision.moves:
            self.move(decision.target)
            out.update({"rebalance/moved": 1.0, "rebalance/from_rollout_ranks": float(decision.current),
                        "rebalance/predicted_gain_s": decision.predicted_gain_s,
                        "rebalance/predicted_total_gain_s": decision.predicted_total_gain_s,
                        "rebalance/predicted_cost_s": decision.predicted_cost_s})
            if self.manager is not None:
                self.manager.apply(decision)
        out["rebalance/rollout_ranks"] = float(self.rollout_layout.size)
        return out

    def _finish_pending(self, metrics: dict) -> dict[str, float]:
        """Collective: the last move's parts reduced over the ranks (each part's slowest rank), and what the step
        it served lost to it. Empty where no move is pending (every rank knows: moves are decided together)."""
        move, self.pending = self.pending, None
        if move is None:
            return {}
        reduced = torch.tensor(list(move.parts.values()), dtype=torch.float64)
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
        slowest = dict(zip(move.parts, reduced.tolist()))
        rollout_s, train_s = slowest[GENERATES_S], slowest[TRAINS_S]
        if self.cfg.placement.max_staleness == 0:  # the rollout set generated this step while the train set moved
            lost = max(rollout_s, train_s - metrics["timing_s/gen"])
        else:  # generation and training run side by side: a bound
            lost = max(rollout_s, train_s)
        state_s = slowest["rebalance/state_move_seconds"]
        if state_s > 0 and move.moved_bytes:
            self.move_bytes_per_s = move.moved_bytes / state_s
        return {**move.metrics, **slowest, "rebalance/transition_seconds": max(rollout_s, train_s),
                "rebalance/lost_seconds": lost, "rebalance/transition_share": lost / metrics["timing_s/step"],
                "placement/build_seconds": move.build_seconds}

    def move(self, target: int) -> None:
        """Collective: the split becomes `target` rollout ranks + the rest training; this runtime holds the new parts.
        Every part is timed on every rank; `self.pending` keeps the times until the next `after_step` reduces them."""
        t0, wall = time.perf_counter(), time.time()
        kl_ctl = self.run.kl_ctl
        old, old_rollout = self.layout, self.rollout_layout
        new, new_rollout = layouts_of(self.cfg, self.placements[target])
        t = time.perf_counter()
        world = self.builder.get(self.placements[target].key())
        parts = {"placement/wait_seconds": time.perf_counter() - t}  # name -> this rank's seconds of that part
        t = time.perf_counter()
        self._join_preparing()  # plans and skeletons of this move, built in the background since the last one
        parts["rebalance/prepare_wait_seconds"] = time.perf_counter() - t
        # one broadcast from the train set: the adaptive KL coefficient lives there, and the AdamW step counters that
        # the trained roles' moves need (the reference has no optimizer: -1, known everywhere)
        shared = torch.tensor([kl_ctl.value, optimizer_step(self.actor), optimizer_step(self.critic)],
                              dtype=torch.float64)
        dist.broadcast(shared, src=old.first_rank)
        kl_ctl.value = float(shared[0])
        steps = {ACTOR: float(shared[1]), CRITIC: float(shared[2]), REFERENCE: -1.0}
        mesh = world.mesh(self.placements[target].slot(TRAIN_ACTOR, ACTOR).spec)
        generates, trains = new_rollout.holds(self.rank), self.rank in new.ranks
        leaving = self.rollout if self.rollout is not None and not generates else None
        first = joins_before_move(mesh.device_type)  # a GPU's train engine wants the leaving engine's memory
        parts.update({STOP_S: 0.0, "rebalance/engine_start_seconds": 0.0, "rebalance/materialize_seconds": 0.0})
        if leaving is not None and first:
            parts[STOP_S] = self._stop_in_background(leaving)
            self._join_stopping()  # its process, and its memory, gone before the destination allocates
        if leaving is not None:
            self.rollout = None
        src, dst = self._spec(old_rollout.size), self._spec(target)
        metrics: dict[str, float] = {}
        moved = 0
        t_state = time.perf_counter()
        for role in self.roles:
            t = time.perf_counter()
            destination = self._destination(target, role, mesh) if trains else None
            parts["rebalance/materialize_seconds"] += time.perf_counter() - t
            stats = move_role_state(getattr(self, role), destination, src, dst,
                                    catalog=self.catalogs[role], recorder=self.recorder, trace_name=MOVES[role],
                                    step=steps[role])
            name = MOVES[role]
            metrics.update({f"{name}/bytes_moved": float(stats.bytes_moved), f"{name}/rounds": float(stats.rounds),
                            f"{name}/peak_extra_bytes": float(stats.peak_extra_bytes)})
            parts[f"{name}/seconds"] = stats.seconds
            moved += stats.bytes_moved
            setattr(self, role, destination)
        parts["rebalance/state_move_seconds"] = time.perf_counter() - t_state
        if generates and self.rollout is None:  # joins the rollout set: its engine opens the initial weights
            t = time.perf_counter()
            self._join_stopping()  # an engine this rank stopped earlier shares the weight file's name
            self.rollout = start_engine(self.cfg, self.model_dir, self.rank, replicas=1)  # the set may shrink to one
            parts["rebalance/engine_start_seconds"] = time.perf_counter() - t
        self.layout, self.rollout_layout, self.actor_first_rank = new, new_rollout, new.first_rank
        if self.membership is not None:  # a change of world maps the sets of the split that holds
            self.membership.placement = self.placements[target]
        self.sync = SubsetSync(self.hf_config, dst, new_rollout.first_rank, new_rollout.size)
        joined = target > old_rollout.size
        parts["rebalance/resync_seconds"] = self.sync_weights()[f"{SYNC}/seconds"] if joined else 0.0
        if leaving is not None and not first:  # the idle engine's shutdown overlaps the next step
            parts[STOP_S] = self._stop_in_background(leaving)
        # no barrier: this rank goes on to the next step; the parts are reduced in the next after_step
        own = time.perf_counter() - t0
        parts[GENERATES_S], parts[TRAINS_S] = (own if generates else 0.0), (own if trains else 0.0)
        if self.recorder is not None:
            self.recorder.add(MOVE_EVENT, 0, wall, own, {"from": old_rollout.size, "to": target})
        self.pending = PendingMove(parts, metrics, moved, world.build_seconds)
        self.prepare_moves(target)  # the moves from the new split, in the background

    def _stop_in_background(self, rollout) -> float:
        """Shut a leaving engine down on a thread: vLLM's shutdown waits seconds for its processes to exit, which the
        move need not wait for on the CPU (on a GPU the train engine would want its memory first: join before).
        Returns the seconds of handing it over to the thread."""
        t0 = time.perf_counter()

        def stopped(wall: float, seconds: float) -> None:
            if self.recorder is not None:
                self.recorder.add(ENGINE_STOP_EVENT, 0, wall, seconds, {})

        self.stopping.append(EngineStop(rollout, on_stopped=stopped))
        return time.perf_counter() - t0

    def _join_stopping(self) -> None:
        for stop in self.stopping:
            stop.join(timeout=120)
        self.stopping.clear()

    def close(self, failed: bool) -> None:
        """Local: every engine this rank stopped is gone, the builder and preparing threads have ended."""
        if self.preparing is not None:
            self.preparing.join(timeout=60)
        self._join_stopping()
        if self.builder_started:
            self.builder.join(timeout=60)
        super().close(failed)

