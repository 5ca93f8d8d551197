"""placement.rebalance=true live: between steps of a split run, move devices between the rollout set and the train set
when the measured phase times say that a different split shortens the step (the decision: elastic/rebalance.py).

Every candidate split's meshes and groups are built by the world builder on a background thread from the start of
the run, so a move waits only for bytes. A move (every rank takes part, the decision is rank 0's, broadcast):
the engines of ranks that leave the rollout set shut down on a background thread (their engine process and shm file
go, joined before the rank starts an engine again and at the end of the run); the actor's
parameters and AdamW moments, and the reference's parameters, move by VPS plan from the old train set's FSDP mesh to
empty engines on the new one (`reshard/actor/rebalance/*`, `reshard/reference/rebalance/*`); ranks that join the
rollout set start their tp=1 engine, and the weight sync fills it. Logged: `rebalance/rollout_ranks` every step; on a
move the predicted gain and cost, the measured seconds of each part; after it `rebalance/measured_gain_s`.
"""
from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from ..config import Config
from ..elastic.placement import ACTOR, REFERENCE, TRAIN_ACTOR
from ..elastic.rebalance import Decision, RebalanceRule, Rebalancer, StepTimes, split_candidates
from ..elastic.world_builder import WorldBuilder, mesh_key
from ..models.catalog import catalog_from_config
from ..models.meta_init import meta_policy, recompute_buffers_
from ..train.engine import TrainEngine
from ..train.pipeline_engine import make_engine
from ..transition.role_move import ALL_KINDS, move_role_state, set_spec
from ..transition.subset_sync import SubsetSync
from ..transition.trace import TraceRecorder
from ..transition.vps_plans import ranks_per_node
from ..vps.layout import build_layout
from ..vps.plan import build_plan
from ..vps.spec import ParallelSpec
from ..vps.tensor import Kind
from .placements import split_placement, split_shape
from .split_run import SYNC, SplitRanks, SplitState, start_engine

MOVE_EVENT = "rebalance"  # the whole move on the timeline; its VPS rounds are reshard/<role>/rebalance
ENGINE_STOP_EVENT = "rebalance/engine_stop"  # a leaving engine's shutdown, in the background
MOVES = {ACTOR: f"reshard/{ACTOR}/{MOVE_EVENT}", REFERENCE: f"reshard/{REFERENCE}/{MOVE_EVENT}"}


def empty_engine(cfg: Config, hf_config, mesh, trainable: bool) -> TrainEngine:
    """An engine of the run's settings on `mesh` with uninitialised parameters: the destination of a move. Built from
    the config, since a rank joining the train set holds no engine to copy settings from."""
    alg = cfg.algorithm
    device = torch.device("cpu") if mesh.device_type == "cpu" else torch.device("cuda", torch.cuda.current_device())

    def materialize(model) -> None:
        model.to_empty(device=device)
        recompute_buffers_(model, device)  # rotary buffers are not moved: recomputed from the config

    optimizer = dict(lr=alg.lr, weight_decay=alg.weight_decay, betas=tuple(alg.betas), grad_clip=alg.grad_clip)
    return make_engine(meta_policy(hf_config, torch.float32), mesh, pp_schedule=cfg.parallel.train.pp_schedule,
                       precision=cfg.trainer.precision, micro_batch_size=alg.micro_batch_size,
                       zero=cfg.parallel.train.zero, materialize=materialize,
                       **(optimizer if trainable else {"trainable": False}))


def planned_bytes(catalog, src: ParallelSpec, dst: ParallelSpec, kinds: tuple[Kind, ...]) -> int:
    """Bytes the VPS plan sends between ranks to move `kinds` of the model from `src` to `dst` (no execution)."""
    plan = build_plan(build_layout(catalog, src, kinds), build_layout(catalog, dst, kinds), ranks_per_node())
    return int(plan.pair_bytes().sum())


class SplitRebalance:
    """This rank's part of re-balancing: the candidate splits and their background-built worlds; on rank 0 the
    decision state. `after_step` is collective."""

    def __init__(self, cfg: Config, ranks: SplitRanks, home_mesh, hf_config, recorder: TraceRecorder | None) -> None:
        self.cfg, self.hf_config, self.recorder, self.rank = cfg, hf_config, recorder, ranks.rank
        self.tp, self.world_size = cfg.parallel.train.tp, cfg.parallel.world_size
        valid, _ = split_candidates(split_shape(cfg))  # checked before spawn: the start is among them
        self.placements = {r: split_placement(cfg, r) for r in valid}
        home = self.placements[ranks.rollout.size].slot(TRAIN_ACTOR, ACTOR).spec
        self.builder = WorldBuilder(list(self.placements.values()), known={mesh_key(home): home_mesh}).start()
        self.catalog = catalog_from_config(hf_config, "float32", "float32")  # engines keep fp32 parameters
        self.has_reference = cfg.algorithm.kl_coef > 0
        rule = RebalanceRule(cfg.placement.rebalance_margin, cfg.placement.rebalance_every)
        self.manager = Rebalancer(self.world_size, valid, ranks.rollout.size, cfg.placement.max_staleness, rule) \
            if self.rank == 0 else None
        self.model_dir = None  # set by run_split once the initial weights are written
        self.engine_start_s = 0.0  # rank 0's engine start at the beginning of the run: predicts a joining one's
        self.move_bytes_per_s: float | None = None  # measured by the last move
        self.stopping: list[threading.Thread] = []  # engines of this rank shutting down in the background

    def _spec(self, rollout_ranks: int) -> ParallelSpec:
        return set_spec(rollout_ranks, self.world_size - rollout_ranks, self.tp)

    def predicted_cost(self, current: int, target: int, sync_bytes_per_s: float, sync_s: float) -> float:
        """Seconds of moving current -> target: the state's planned bytes at the measured bandwidth (the last move's,
        else the weight sync's transfer), plus a joining engine's start and a weight sync into it."""
        src, dst = self._spec(current), self._spec(target)
        moved = planned_bytes(self.catalog, src, dst, ALL_KINDS)
        if self.has_reference:
            moved += planned_bytes(self.catalog, src, dst, (Kind.PARAM,))
        seconds = moved / max(self.move_bytes_per_s or sync_bytes_per_s, 1.0)
        return seconds + (self.engine_start_s + sync_s if target > current else 0.0)

    def _decide(self, step: int, metrics: dict, transfer_s: float) -> Decision:
        times = StepTimes(self.manager.current, metrics["timing_s/gen"],
                          metrics["timing_s/prepare"] + metrics["timing_s/train_actor"], metrics[f"{SYNC}/seconds"],
                          metrics["timing_s/step"])
        self.manager.observe(times)
        bandwidth = metrics[f"{SYNC}/bytes_moved"] / max(transfer_s, 1e-9)  # the sync's transfer, install excluded
        current = self.manager.current
        decision = self.manager.decide(self.cfg.trainer.total_steps - step, lambda r: self.predicted_cost(
            current, r, bandwidth, metrics[f"{SYNC}/seconds"]))
        if decision.moves:
            print(f"rlhf_dyna: rebalance after step {step}: {decision.describe(self.world_size)}", flush=True)
        return decision

    def after_step(self, step: int, state: SplitState, metrics: dict, kl_ctl) -> dict[str, float]:
        """Collective: rank 0 decides from the step's metrics; every rank carries out a move. Returns the metrics."""
        decision = self._decide(step, metrics, state.sync.transfer_seconds) if self.manager is not None else None
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        decision = box[0]
        out = {}
        if self.manager is not None and (gain := self.manager.measured_gain()) is not None:
            out["rebalance/measured_gain_s"] = gain  # mean step on the split left last minus on this one
        if decision.moves:
            out.update(self.move(state, decision.target, kl_ctl), **{
                "rebalance/from_rollout_ranks": float(decision.current),
                "rebalance/predicted_gain_s": decision.predicted_gain_s,
                "rebalance/predicted_total_gain_s": decision.predicted_total_gain_s,
                "rebalance/predicted_cost_s": decision.predicted_cost_s})
            out["rebalance/transition_share"] = out["rebalance/transition_seconds"] / metrics["timing_s/step"]
            if self.manager is not None:
                self.manager.apply(decision)
        out["rebalance/rollout_ranks"] = float(state.ranks.rollout.size)
        return out

    def move(self, state: SplitState, target: int, kl_ctl) -> dict[str, float]:
        """Collective: the split becomes `target` rollout ranks + the rest training; `state` now holds the new parts."""
        t0, wall = time.perf_counter(), time.time()
        old, new = state.ranks, SplitRanks(self.cfg, target)
        world = self.builder.get(self.placements[target].key())
        waited = time.perf_counter() - t0
        kl_ctl.value = old.from_trainer(kl_ctl.value)  # the adaptive coefficient lives on the train set
        stop_s = start_s = 0.0
        if state.rollout is not None and not new.generates:  # leaves the rollout set: its engine stops meanwhile
            t = time.perf_counter()
            self._stop_in_background(state.rollout)
            state.rollout, stop_s = None, time.perf_counter() - t
        mesh = world.mesh(self.placements[target].slot(TRAIN_ACTOR, ACTOR).spec)
        src, dst = self._spec(old.rollout.size), self._spec(target)
        metrics: dict[str, float] = {}
        moved = 0
        roles = [(ACTOR, True)] + ([(REFERENCE, False)] if self.has_reference else [])
        for role, trainable in roles:
            source = state.actor if role == ACTOR else state.ref
            destination = empty_engine(self.cfg, self.hf_config, mesh, trainable) if new.trains else None
            stats = move_role_state(source, destination, src, dst, catalog=self.catalog, recorder=self.recorder,
                                    trace_name=MOVES[role])
            name = MOVES[role]
            metrics.update({f"{name}/seconds": stats.seconds, f"{name}/bytes_moved": float(stats.bytes_moved),
                            f"{name}/rounds": float(stats.rounds), f"{name}/peak_extra_bytes": float(stats.peak_extra_bytes)})
            moved += stats.bytes_moved
            if role == ACTOR:
                state.actor = destination
            else:
                state.ref = destination
        state_s = time.perf_counter() - t0 - waited - stop_s
        if new.generates and state.rollout is None:  # joins the rollout set: its engine opens the initial weights
            t = time.perf_counter()
            self._join_stopping()  # an engine this rank stopped earlier shares the weight file's name
            state.rollout = start_engine(self.cfg, self.model_dir, self.rank)
            start_s = time.perf_counter() - t
        state.ranks = new
        state.sync = SubsetSync(self.hf_config, dst, new.rollout.first, new.rollout.size)
        sync_s = state.sync_weights(self.recorder).seconds if target > old.rollout.size else 0.0  # joined engines
        dist.barrier()  # the move ends when every rank is done (a joining engine's start included)
        seconds = time.perf_counter() - t0
        slowest = torch.tensor([stop_s, start_s], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if self.recorder is not None:
            self.recorder.add(MOVE_EVENT, 0, wall, seconds, {"from": old.rollout.size, "to": target})
        self.move_bytes_per_s = moved / state_s if state_s > 0 and moved else self.move_bytes_per_s
        return {**metrics, "rebalance/moved": 1.0, "rebalance/transition_seconds": seconds,
                "rebalance/state_move_seconds": state_s, "rebalance/engine_stop_seconds": float(slowest[0]),
                "rebalance/engine_start_seconds": float(slowest[1]), "rebalance/resync_seconds": sync_s,
                "placement/build_seconds": world.build_seconds, "placement/wait_seconds": waited}

    def _stop_in_background(self, rollout) -> None:
        """Shut a leaving engine down on a thread: vLLM's shutdown waits seconds for its processes to exit, which the
        move need not wait for on the CPU (on a GPU the train engine would want its memory first: join before)."""
        def stop() -> None:
            wall, t = time.time(), time.perf_counter()
            rollout.shutdown()  # local: its engine process and its shm file
            if self.recorder is not None:
                self.recorder.add(ENGINE_STOP_EVENT, 0, wall, time.perf_counter() - t, {})

        thread = threading.Thread(target=stop, name="rlhf_dyna-engine-stop")
        thread.start()
        self.stopping.append(thread)

    def _join_stopping(self) -> None:
        for thread in self.stopping:
            thread.join(timeout=120)
        self.stopping.clear()

    def close(self) -> None:
        """Local: every engine this rank stopped is gone, the builder thread has ended."""
        self._join_stopping()
        self.builder.join(timeout=60)

