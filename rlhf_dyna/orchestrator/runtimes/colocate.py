"""placement=colocate: every role on every rank, phases one after another (what veRL's hybrid engine does).

One vLLM engine spans all ranks (external_launcher: `rollout.tp` consecutive ranks per replica); the actor, reference
and critic train in the `parallel.train` layout, and `parallel.schedule` changes that layout online before the steps
it names (every engine's parameters and AdamW state move by VPS plan, `reshard/train_relayout/*`). The weights cross
into vLLM's layout after every step (`reshard/train_to_rollout/*`).
"""
from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from ...elastic.placement import WEIGHT_SYNC
from ...elastic.join_world import job_client_store
from ...elastic.membership import engines_kept
from ...parallel_layout import ParallelLayout, RolloutLayout, reached_by, switch_at
from ...rollout.context_length import max_model_len
from ...rollout.gpu_defaults import engine_args
from ...rollout.reform import engine_is_moe, reform, vllm_groups
from ...rollout.vllm_engine import VLLMRollout
from ...tracking.timeline import record_step_phases
from ...train.mesh import build_mesh
from ...transition.relayout import layout_of, relayout
from ...transition.syncs import make_sync
from ...transition.vps_mover import least_moving_layout, make_vps_mover
from ..build import build_actor, write_initial_checkpoint
from ..live_world import Membership
from ..phases import rollouts
from ..reward_scoring import make_scorer
from ..world_changes import changes_before_step
from ..step import mean_over_world, reshard_metrics
from .base import Runtime


class ColocateRuntime(Runtime):
    name = "colocate"
    joiner_generates = True  # every rank holds a vLLM engine

    def start(self) -> None:
        cfg, run, info = self.cfg, self.run, self.run.dist_info
        self.layout = cfg.parallel.train_layout(master_weights=cfg.model.dtype != "float32")
        self.schedule = cfg.parallel.layout_schedule()
        self.membership = Membership.of(cfg, job_client_store())  # elastic.events and SIGTERM (orchestrator/world_changes.py)
        self.rollout_layout = self.world_rollout_layout()
        self.actor = build_actor(cfg, run.source, build_mesh(self.layout))
        self.model_dir = write_initial_checkpoint(run.source, self.actor, run.tokenizer, run.out_dir, info.node_rank,
                                                  info.local_rank)
        self.rollout = self.start_rollout()
        self.recorder = self._recorder(WEIGHT_SYNC)
        self.sync = self.make_sync()

    def start_rollout(self, load_format: str = "auto", tp: int | None = None,
                      replicas: int | None = None) -> VLLMRollout:
        """This rank's vLLM engine of `tp` (rollout.tp) over the current world, opening `self.model_dir` ("dummy": its
        config only); `replicas`: how many share a step's samples (the world's replicas), which sizes its KV cache."""
        cfg = self.cfg
        tp = tp or cfg.rollout.tp
        return VLLMRollout(
            str(self.model_dir), tp=tp, seed=cfg.trainer.seed, max_model_len=max_model_len(cfg),
            expert_parallel=cfg.rollout.expert_parallel, load_format=load_format,
            **engine_args(cfg, self.run.dist_info.device.type, colocated=True,
                          replicas=replicas or dist.get_world_size() // tp),
        )

    def restart_rollout(self, tp: int) -> None:
        """Collective over a new world whose change moved the engines' tp or a rank's place in a TP group: a new
        engine of `tp` in place of this rank's (whose groups are released already); the next weight sync fills it."""
        self.rollout.discard()
        self.rollout = None
        gc.collect()  # the old engine's weights and KV cache, before the new one takes its own
        self.rollout = self.start_rollout(load_format="dummy", tp=tp)

    def prepare_to_join(self, membership: Membership, model_dir, process: int) -> None:
        """A joining process, before its world exists: what start() builds without the world (orchestrator/joiner.py).
        Its engines come by plan at the boundary; `process` names its trace row (its rank is not known yet)."""
        cfg = self.cfg
        self.layout = cfg.parallel.train_layout(master_weights=cfg.model.dtype != "float32")
        self.schedule, self.membership, self.model_dir = cfg.parallel.layout_schedule(), membership, model_dir
        # a replica of its own (tp 1) until the boundary, where a tp > 1 world starts new engines; the first weight
        # sync fills every weight
        self.rollout = self.start_rollout(load_format="dummy", tp=1, replicas=cfg.parallel.world_size)
        self.scorer = make_scorer(cfg, self.run.task, self.run.tokenizer, build=False)  # its engine comes by plan
        # vLLM's first generate pays one-off costs (kernels, buffers): here, in the background, not in the new world
        run, share = self.run, max(1, cfg.task.prompts_per_step // cfg.parallel.world_size)  # about a replica's prompts
        rollouts(cfg, self.rollout, run.task, run.tokenizer, run.task.eval_set()[:share], RolloutLayout(1), 0, seed=0)
        self.rank = process
        self.recorder = self._recorder(WEIGHT_SYNC)

    def world_rollout_layout(self) -> RolloutLayout:
        """vLLM over the whole world: one replica per tp ranks (rollout.tp, or the tp a change of world gave the
        engines)."""
        tp = self.rollout.tp if self.rollout is not None else self.cfg.rollout.tp
        return RolloutLayout(dist.get_world_size(), tp, expert_parallel=self.cfg.rollout.expert_parallel)

    def make_sync(self):
        # only the VPS executor has rounds to trace; naive's gathers are not traced
        name = self.cfg.rollout.sync
        return make_sync(name, **({"recorder": self.recorder} if name == "vps" else {}))

    def leave_job(self) -> None:
        """Its engine goes with the process: its groups are gone. vLLM's shutdown, which its finalizer would run when
        the engine is collected, collects the whole heap twice: CPU time beside the survivors' first steps."""
        if self.rollout is not None:
            self.rollout.discard()
        self.rollout = None

    def reform_rollout(self, change, engine_tp: int, tp: int, build=None) -> None:
        """Every rank's engine re-formed over the new world where it keeps its tp and place in its TP group (a DP
        group one replica smaller or larger; over `build`'s groups where it made them), else a new engine of `tp` on
        every rank."""
        if engines_kept(change, engine_tp, tp):
            reform(self.rollout, dist.get_rank(), dist.get_world_size(), build)
        else:
            self.restart_rollout(tp)

    def rollout_plan(self, change, tp: int) -> tuple[tuple[int, ...], ...]:
        """vLLM's groups of the re-formed engines (none where new engines start: they are made at the boundary)."""
        if not engines_kept(change, self.rollout_layout.tp, tp):
            return ()
        return vllm_groups(tp, change.new_world_size, engine_is_moe(self.rollout))

    def enter_world(self, layout: ParallelLayout, engines: dict, placement) -> None:
        """After a membership change (orchestrator/leave.py, which re-formed the rollout engine's groups): this rank's
        engines and the rollout's layout in the new world; a new weight sync (its plans were the old world's)."""
        for role, engine in engines.items():
            setattr(self, role, engine)
        self.layout, self.rank = layout, dist.get_rank()
        self.rollout_layout = self.world_rollout_layout()
        self.sync = self.make_sync()

    def generate(self, step: int) -> tuple[list, float]:
        samples = super().generate(step)
        self.rollout.sleep()  # CUDA: the GPU is training's until the sync wakes vLLM (no-op on the CPU)
        return samples

    def before_step(self, step: int) -> dict[str, float]:
        """The changes of world due now (orchestrator/world_changes.py); a layout switch of parallel.schedule (after a
        resume: the layout the schedule had reached)."""
        metrics = changes_before_step(self, self.membership, step) if self.membership is not None else {}
        start = self.run.start_step
        layout = switch_at(self.schedule, step) if step > start + 1 or start == 0 else reached_by(self.schedule, step)
        return {**metrics, **self.change_layout(layout)} if layout is not None else metrics

    def change_layout(self, layout: ParallelLayout) -> dict[str, float]:
        """Online change of the training layout: every engine's parameters and optimizer state move to `layout` in
        these processes, in the mesh rank order whose plan moves the fewest bytes (vps.rank_order; all engines take
        the actor's); each move's rounds are traced as train_relayout events."""
        searching = time.perf_counter()
        before, layout = layout_of(self.actor), least_moving_layout(self.actor, layout)
        totals = {"seconds": time.perf_counter() - searching, "bytes_moved": 0.0, "rounds": 0.0, "peak_extra_bytes": 0.0}
        for role in ("actor", "critic", "reference"):
            engine = getattr(self, role)
            if engine is None:
                continue
            mover = make_vps_mover(engine.model.config, in_place=True, recorder=self.recorder,
                                   trace_name="train_relayout")
            engine, stats = relayout(engine, layout, mover=mover)
            setattr(self, role, engine)
            totals["seconds"] += stats.seconds
            totals["rounds"] += stats.rounds
            totals["peak_extra_bytes"] = max(totals["peak_extra_bytes"], stats.peak_extra_bytes)
            received = torch.tensor([stats.bytes_received], dtype=torch.float64)
            dist.all_reduce(received)
            totals["bytes_moved"] += float(received)
        self.layout = layout
        if self.rank == 0:
            print(f"rlhf_dyna: training layout {before.describe()} -> {layout.describe()}: moved "
                  f"{totals['bytes_moved'] / 2**20:,.1f} MiB in {totals['seconds']:.3f} s", flush=True)
        return {f"reshard/train_relayout/{k}": v for k, v in totals.items()}

    def sync_weights(self) -> dict[str, float]:
        stats = self.sync.sync(self.actor, self.rollout)
        return {"timing_s/weight_sync": stats.seconds, **reshard_metrics(f"reshard/{WEIGHT_SYNC}", stats)}

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        """Phase times averaged over the ranks; the phases this rank served on the run's timeline."""
        if hasattr(self.actor, "pipeline_metrics"):
            metrics.update(self.actor.pipeline_metrics())  # pp/bubble_fraction
        timings = mean_over_world({k: v for k, v in metrics.items() if k.startswith("timing_s/")})
        if self.recorder is not None:
            record_step_phases(self.recorder, step, started, timings)
        return {**metrics, **timings}

    def checkpoint_layout(self) -> dict:
        return {"pp": self.layout.pp, "dp": self.layout.dp, "tp": self.layout.tp, "zero": self.actor.zero}
