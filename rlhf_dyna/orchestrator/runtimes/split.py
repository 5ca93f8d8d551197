"""placement=split: generation on the rollout set, training on the train set, disjoint ranks.

Each rollout rank runs one tp=1 vLLM engine in its own process (rollout.subset_engine.SubsetVLLMRollout: an engine on
a rank subset cannot join our world); the actor (and reference, and PPO's critic) live on an FSDP (dp, tp) mesh over
the train set only. One step: the rollout set generates (global prompt indices seed the sampling, so the samples are
those of any other placement), every rank receives the samples (one all_gather), the train set prepares and trains,
and the trained weights cross to the rollout set by a VPS plan (transition.subset_sync.SubsetSync), logged as
`reshard/actor/train_actor_to_generate/*`. With placement.max_staleness=1 the rollout set generates step k+1 while the
train set trains step k. Ranks with nothing to do in a phase wait in the next collective; each rank records the
phases it served (transition_trace.json, timeline.png).

A change of world (elastic.events, SIGTERM, elastic.join; orchestrator/world_changes.py) maps each set to its
survivors: a rollout rank that leaves takes its engine with it (one replica fewer), a training rank's state moves to
the training set's survivors, and joiners extend the training set (no engine: they do not generate). The rollout
engines live outside the world, so they stay as they are; the weight sync is re-planned for the new sets.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from ...elastic.join_world import job_client_store
from ...elastic.placement import ACTOR, GENERATE, ROLLOUT, TRAIN_ACTOR, Placement
from ...models.build import save_hf_dir
from ...models.hf_config import make_hf_config
from ...models.meta_init import checkpoint_config
from ...parallel_layout import ParallelLayout, RolloutLayout
from ...rollout.context_length import max_model_len
from ...rollout.gpu_defaults import engine_args
from ...rollout.subset_engine import SubsetVLLMRollout
from ...tracking.timeline import record_phase
from ...train.engine import full_state_dict
from ...train.mesh import build_mesh
from ...transition.subset_sync import SubsetSync
from ...transition.transport import world_device_type
from ..batch import Sample
from ..build import build_actor
from ..live_world import Membership
from ..phases import rollouts
from ..reward_scoring import make_scorer
from ..placements import placement_of
from ..step import reshard_metrics
from ..world_changes import changes_before_step
from .base import Runtime

SYNC = f"reshard/{ACTOR}/{TRAIN_ACTOR}_to_{GENERATE}"  # the actor's weights, train set -> rollout set, every step


def split_layouts(cfg) -> tuple[ParallelLayout, RolloutLayout]:
    """The train set's layout and the rollout set's under the config's split."""
    return layouts_of(cfg, placement_of(cfg))


def layouts_of(cfg, placement: Placement) -> tuple[ParallelLayout, RolloutLayout]:
    """The train set's layout and the rollout set's in `placement` (the run's, or one after a change of world)."""
    rollout, train = placement.slot(GENERATE, ROLLOUT).ranks, placement.slot(TRAIN_ACTOR, ACTOR).ranks
    layout = ParallelLayout(train.size // cfg.parallel.train.tp, cfg.parallel.train.tp, cfg.parallel.train.zero,
                            first_rank=train.first)
    return layout, RolloutLayout(rollout.size, 1, rollout.first)


def start_engine(cfg, model_dir: Path, rank: int, replicas: int) -> SubsetVLLMRollout:
    """This rank's tp=1 engine (core in its own process), opened on the run's initial weights, its KV cache sized
    for one of `replicas` rollout ranks."""
    return SubsetVLLMRollout(model_dir, seed=cfg.trainer.seed, max_model_len=max_model_len(cfg),
                             rank=rank, **engine_args(cfg, world_device_type(), colocated=False, replicas=replicas))


class SplitRuntime(Runtime):
    name = "split"

    def start(self) -> None:
        cfg, run = self.cfg, self.run
        self.layout, self.rollout_layout = split_layouts(cfg)
        self.actor_first_rank = self.layout.first_rank
        source = run.source
        self.hf_config = checkpoint_config(source) if isinstance(source, str) else make_hf_config(source)
        mesh = build_mesh(self.layout)  # collective: every rank takes part
        self.recorder = self._recorder(SYNC)
        self.stale = cfg.placement.max_staleness
        self.ahead: tuple[list[Sample], float] | None = None  # max_staleness=1: the next step's samples
        self.membership = Membership.of(cfg, job_client_store())  # elastic.events, SIGTERM and elastic.join
        self.start_train_set(mesh)
        self.model_dir = self.initial_model_dir()
        self.start_rollout_set()
        self.sync = SubsetSync(self.hf_config, self.layout.spec(), self.rollout_layout.first_rank,
                               self.rollout_layout.size)

    def start_train_set(self, mesh) -> None:
        """The actor on the train set's mesh (every rank has taken part in building it)."""
        if self.rank in self.layout.ranks:
            self.actor = build_actor(self.cfg, self.run.source, mesh)

    def start_rollout_set(self) -> None:
        if self.rollout_layout.holds(self.rank):
            self.rollout = start_engine(self.cfg, self.model_dir, self.rank, self.rollout_layout.replicas)

    def initial_model_dir(self) -> Path:
        """The engines open a model directory: the train set's first rank writes the initial weights (random init)."""
        source, model_dir = self.run.source, self.opened_dir()
        if isinstance(source, str):
            return model_dir
        if self.actor is not None:
            weights = list(full_state_dict(self.actor))  # collective over the train set
            if self.rank == self.actor_first_rank:
                save_hf_dir(weights, make_hf_config(source), model_dir)
                self.run.tokenizer.save(model_dir)
        dist.barrier()
        return model_dir

    def opened_dir(self) -> Path:
        """The model directory the engines opened: the checkpoint, or the initial weights the train set wrote."""
        source = self.run.source
        return Path(source) if isinstance(source, str) else self.run.out_dir / "model_init" / "split"

    def prepare_to_join(self, membership: Membership, model_dir, process: int) -> None:
        """A joining process, before its world exists (orchestrator/joiner.py): it will train (joiners extend the
        training set), so it starts no engine; its roles come by plan at the boundary. `model_dir`: unused (the
        engines opened the run's, which the policy export reads); `process` names its trace row."""
        run = self.run
        self.hf_config = checkpoint_config(run.source) if isinstance(run.source, str) else make_hf_config(run.source)
        self.membership, self.model_dir, self.rank = membership, self.opened_dir(), process
        self.stale, self.ahead = self.cfg.placement.max_staleness, None
        self.scorer = make_scorer(self.cfg, run.task, run.tokenizer, build=False)  # None: refused with split (LIVE)
        self.recorder = self._recorder(SYNC)

    def before_step(self, step: int) -> dict[str, float]:
        """The changes of world due now (orchestrator/world_changes.py)."""
        return changes_before_step(self, self.membership, step) if self.membership is not None else {}

    def enter_world(self, layout: ParallelLayout, engines: dict, placement) -> None:
        """After a change of world: this rank's training engines (none on a rollout rank), both sets' layouts from the
        new placement, and a weight sync planned between them."""
        for role, engine in engines.items():
            setattr(self, role, engine)
        self.rank = dist.get_rank()
        self.layout, self.rollout_layout = layouts_of(self.cfg, placement)
        if self.layout.ranks != layout.ranks:
            raise AssertionError(f"the training set {list(layout.ranks)} is not the placement's "
                                 f"{list(self.layout.ranks)}")
        self.actor_first_rank = self.layout.first_rank
        self.sync = SubsetSync(self.hf_config, self.layout.spec(), self.rollout_layout.first_rank,
                               self.rollout_layout.size)

    def handover_state(self) -> dict:
        return {"ahead": self.ahead}  # max_staleness=1: the next step's samples, generated before the boundary

    def take_handover(self, state: dict) -> None:
        self.ahead = state["ahead"]

    def generate(self, step: int) -> tuple[list[Sample], float]:
        """The step's samples on every rank (generated one step ahead with max_staleness=1) and the rollout set's
        generate seconds (its slowest engine's)."""
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            return ahead
        return self.rollouts_of(step)

    def rollouts_of(self, step: int) -> tuple[list[Sample], float]:
        """Collective: step `step`'s samples on every rank, and the rollout set's slowest generate seconds."""
        run, wall = self.run, time.time()
        prompts = run.task.train_prompts(step, self.cfg.task.prompts_per_step, run.rng)  # same on every rank
        samples, seconds = rollouts(self.cfg, self.rollout, run.task, run.tokenizer, prompts, self.rollout_layout,
                                    self.rank, seed=run.sample_seed(step))
        if self.rollout_layout.holds(self.rank):
            record_phase(self.recorder, "generate", step, wall, seconds, "rollout")
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the phase lasts as long as its slowest engine
        return samples, float(slowest)

    def prepare(self, step: int, samples: list[Sample]) -> tuple[dict | None, dict[str, float]]:
        wall = time.time()
        batch, metrics = super().prepare(step, samples)
        if batch is not None:
            roles = ["actor"] + (["reference"] if self.reference else []) + (["critic"] if self.critic else [])
            record_phase(self.recorder, "prepare", step, wall, metrics["timing_s/prepare"], ", ".join(roles))
        return batch, metrics

    def train(self, step: int, batch: dict | None, samples: list[Sample], prepared: dict[str, float],
              ) -> dict[str, float]:
        """The train set trains (the actor, then the critic) while, with max_staleness=1, the rollout set generates
        the next step's samples; the train set's metrics on every rank."""
        wall = time.time()
        metrics = super().train(step, batch, samples, prepared)
        if self.actor is not None:
            record_phase(self.recorder, "train_actor", step, wall, metrics["timing_s/train_actor"], "actor")
            if self.critic is not None:
                wall += metrics["timing_s/train_actor"]
                record_phase(self.recorder, "train_critic", step, wall, metrics["timing_s/train_critic"], "critic")
        if self.stale and step < self.cfg.trainer.total_steps:
            self.ahead = self.rollouts_of(step + 1)
        return self.from_actor(metrics)  # the rollout set waits here while the train set trains

    def sync_weights(self) -> dict[str, float]:
        """Collective: the actor's weights, train set -> every engine of the rollout set."""
        stats = self.sync.sync(self.actor, self.rollout, self.recorder, SYNC)
        return {**reshard_metrics(SYNC, stats), "timing_s/weight_sync": stats.seconds,
                "timing_s/placement_change": stats.seconds}

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        seconds = metrics["timing_s/step"]
        metrics["placement/change_share"] = metrics[f"{SYNC}/seconds"] / seconds if seconds > 0 else 0.0
        metrics["placement/staleness"] = 0.0 if not self.stale or step == 1 else 1.0  # step 1: w0 both
        return metrics

    def checkpoint_layout(self) -> dict:
        return {"placement": "split", "rollout_ranks": self.rollout_layout.size, "train_dp": self.layout.dp,
                "tp": self.layout.tp}

    @property
    def trace_title(self) -> str:
        return f"{self.cfg.recipe}: placement=split: phases and transitions"

    def close(self, failed: bool) -> None:
        if self.rollout is not None:  # local: stops the engine process and removes its shm file
            self.rollout.shutdown()
