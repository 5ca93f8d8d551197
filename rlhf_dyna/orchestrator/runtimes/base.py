"""The interface of a placement policy's runtime: where each phase of an RL step runs, and what moves between phases.

The loop (orchestrator/loop.py) calls, in this order: `start`, `warm_up`, `build_roles`, `restore` (resuming),
`sync_weights`, `begin`; then for every step `before_step`, `generate`, `score`, `prepare`, `train`, `sync_weights`,
`finish_step`, and `evaluate` and the checkpoint when due; `close` at the end. Every method is collective: every rank
calls it, whether or not it holds the role that computes (the others wait in the method's collectives).

The base class implements what placements share: the reference and critic built beside the actor, the reward model
on its placement's rank set (orchestrator/reward_scoring.py) and its scores joining the rewards, the prepare
phase (old and reference log-probs, values, advantages) and training on the ranks that hold the actor, evaluation on
the rollout layout, the supervised warm-up. A policy overrides what it does differently.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

import torch.distributed as dist

from ...parallel_layout import RolloutLayout
from ...train.engine import TrainEngine
from ...transition.trace import TraceRecorder
from ..batch import Sample, pack, rank_rows
from ..build import build_critic_engine, build_reference
from ..phases import evaluate, rollouts, supervised_warmup
from ..resume import RunState, restore_run
from ..reward_scoring import RewardScorer, make_scorer
from ..run import Run
from ..advantages import compute_advantages
from ..step import kl_metrics_and_update, train_roles


class Runtime(ABC):
    name: str  # the registered policy name (runtimes.RUNTIMES)
    joiner_generates = False  # a joining process starts a rollout engine of its own (orchestrator/joiner.py)

    def __init__(self, run: Run) -> None:
        self.run, self.cfg, self.rank = run, run.cfg, dist.get_rank()
        self.actor: TrainEngine | None = None  # this rank's engines; None where it holds none
        self.reference: TrainEngine | None = None
        self.critic: TrainEngine | None = None
        self.scorer: RewardScorer | None = None  # the reward-model role, on every rank when task.reward names rm
        self.rollout = None  # this rank's rollout engine, if it generates
        self.rollout_layout: RolloutLayout | None = None  # set by start()
        self.actor_first_rank = 0  # the first rank holding the actor: it writes the export, its metrics are shared
        self.model_dir: Path | None = None  # the weights the rollout engines opened
        self.recorder: TraceRecorder | None = None  # the run's Chrome trace: phases and transition rounds

    @property
    def reward_model(self) -> TrainEngine | None:
        """The reward model's engine on this rank (the scorer's): a membership change moves it as any role's."""
        return self.scorer.engine if self.scorer is not None else None

    @reward_model.setter
    def reward_model(self, engine: TrainEngine | None) -> None:
        self.scorer.engine = engine

    def _recorder(self, sync_name: str) -> TraceRecorder | None:
        """The trace recorder of this rank, keeping the first tracking.trace_syncs weight syncs."""
        tracking = self.cfg.tracking
        return TraceRecorder(self.rank, {sync_name: tracking.trace_syncs}) if tracking.transition_trace else None

    # --- set-up -------------------------------------------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Build the actor on its ranks and the rollout engine(s) on theirs, both holding the run's initial weights."""

    def warm_up(self) -> dict[str, float]:
        """The held-out accuracy before the supervised warm-up, then the warm-up on the actor's ranks."""
        metrics = self.evaluate(prefix="pre_warmup")
        sft = supervised_warmup(self.cfg, self.actor, self.run.task, self.run.tokenizer) if self.actor else {}
        return {**metrics, **self.from_actor(sft)}

    def build_roles(self) -> None:
        """The reward model on its rank set; the reference (a frozen copy of the warmed-up actor) and PPO's critic,
        beside the actor."""
        cfg = self.cfg
        self.scorer = make_scorer(cfg, self.run.task, self.run.tokenizer)  # collective: its set's groups
        if self.actor is None:
            return
        if cfg.algorithm.kl_coef > 0:
            self.reference = build_reference(cfg, self.run.source, self.actor)
        if cfg.algorithm.name == "ppo":
            self.critic = build_critic_engine(cfg, self.run.source, self.actor)

    def restore(self, path: Path) -> RunState:
        """Load a checkpoint into this rank's engines (resharded to their layout) and the run's state."""
        return restore_run(path, self.engines(), self.run.task)

    def begin(self) -> None:
        """Start what runs in the background from the first step on (none by default)."""

    # --- one step -----------------------------------------------------------------------------------------------
    def before_step(self, step: int) -> dict[str, float]:
        """Changes before `step` trains (none by default); their metrics."""
        return {}

    def generate(self, step: int) -> tuple[list[Sample], float]:
        """The step's samples, scored, on every rank; the generate phase's seconds."""
        run = self.run
        prompts = run.task.train_prompts(step, self.cfg.task.prompts_per_step, run.rng)  # same on every rank
        return rollouts(self.cfg, self.rollout, run.task, run.tokenizer, prompts, self.rollout_layout, self.rank,
                        seed=run.sample_seed(step))

    def score(self, step: int, samples: list[Sample]) -> dict[str, float]:
        """The reward model's scores join the samples' rewards on every rank (nothing without one);
        timing_s/reward_model and the reward model's host copies."""
        return self.scorer.apply(samples) if self.scorer is not None else {}

    def prepare(self, step: int, samples: list[Sample]) -> tuple[dict | None, dict[str, float]]:
        """This rank's rows of the step with old / reference log-probs, values and advantages (None off the actor's
        ranks); the advantage statistics and timing_s/prepare."""
        if self.actor is None:
            return None, {}
        t0, alg = time.perf_counter(), self.cfg.algorithm
        batch = rank_rows(pack(samples, self.run.tokenizer.pad_id), self.actor.dp_rank, self.actor.dp_size,
                          alg.mini_batches)
        metrics = compute_advantages(self.cfg, batch, samples, self.actor, self.reference, self.critic,
                                     self.run.kl_ctl.value)
        return batch, {**metrics, "timing_s/prepare": time.perf_counter() - t0}

    def train(self, step: int, batch: dict | None, samples: list[Sample], prepared: dict[str, float],
              ) -> dict[str, float]:
        """Train the actor, then the critic, on this rank's rows: the prepare phase's and their metrics, as logged."""
        if self.actor is None:
            return prepared
        metrics = {**prepared, **train_roles(self.cfg, self.actor, self.critic, batch, self.run.kl_ctl.value)}
        return {**metrics, **self.kl_update(metrics, batch, samples)}

    def kl_update(self, metrics: dict[str, float], batch: dict, samples: list[Sample]) -> dict[str, float]:
        """actor/kl and actor/kl_coef, and the KL controller's step, where a reference is held."""
        if self.reference is None:
            return {}
        return kl_metrics_and_update(metrics, batch, self.actor, self.run.kl_ctl, len(samples))

    @abstractmethod
    def sync_weights(self) -> dict[str, float]:
        """The trained actor's weights into every rollout engine; the move's metrics."""

    def finish_step(self, step: int, metrics: dict[str, float], started: float) -> dict[str, float]:
        """The metrics of the step that started at `started` (time.time()) as rank 0 logs them; changes that follow a
        step happen here."""
        return metrics

    # --- a change of world (orchestrator/leave.py, join.py, recovery.py) -------------------------------------------
    def before_change(self) -> None:
        """Collective over the old world, before each change of world at a boundary (orchestrator/world_changes.py):
        what works in the background on the old world's groups is done, and what the new world's ranks will need of
        this runtime's state is shared (nothing by default)."""

    def leave_job(self) -> None:
        """This rank has left the job, its state sent: what `close` must leave alone (nothing by default)."""

    def reform_rollout(self, change, engine_tp: int, tp: int, build=None) -> None:
        """Collective over the new world of `change` (elastic.membership.WorldChange), before `enter_world`: the
        rollout engines of `engine_tp` over it, at rollout tp `tp`, over the groups `build` (elastic.world_prebuild)
        made for them where it built this world (nothing by default: engines outside the world stay as they are)."""

    def rollout_plan(self, change, tp: int) -> tuple[tuple[int, ...], ...]:
        """The groups `reform_rollout` will create over the new world of `change` at rollout tp `tp`, in their order,
        for its build in the background (none by default)."""
        return ()

    def enter_world(self, layout, engines: dict, placement) -> None:
        """In the new world: this rank's engines (role -> engine; roles it does not hold are absent) on `layout`, and
        the world's `placement` (elastic.placement.Placement, in the new numbering)."""
        raise NotImplementedError(f"placement={self.name} does not change its world live")

    def handover_state(self) -> dict:
        """What a joiner takes from the actor's first rank besides the loop's state (`take_handover`)."""
        return {}

    def take_handover(self, state: dict) -> None:
        """A joiner: `handover_state` of the actor's first rank."""

    # --- evaluation and checkpoints -----------------------------------------------------------------------------
    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        run = self.run
        rescore = self.scorer.apply if self.scorer is not None else None
        return evaluate(self.cfg, self.rollout, run.task, run.tokenizer, self.rollout_layout, self.rank, prefix, rescore)

    def engines(self) -> dict[str, TrainEngine | None]:
        """This rank's engines by checkpoint role (None where it holds none)."""
        return {"actor": self.actor, "critic": self.critic, "reference": self.reference}

    @abstractmethod
    def checkpoint_layout(self) -> dict:
        """The layout a checkpoint records (for its message on resume; DCP reshards on load whatever it was)."""

    def from_actor(self, value):
        """Collective: the actor's first rank's `value` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=self.actor_first_rank)
        return box[0]

    @property
    def trace_title(self) -> str:
        return f"{self.cfg.recipe}: phases and transitions"

    def close(self, failed: bool) -> None:
        """Stop this rank's engines and background work (`failed`: a rank failed, so no collective may run)."""
        if self.rollout is not None and not failed:
            self.rollout.close_for_exit()
