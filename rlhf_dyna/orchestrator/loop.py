"""The RL loop of one rank: set up, then per step generate -> score -> prepare -> advantages -> train -> sync.

Where each phase runs is the placement policy's runtime (orchestrator/runtimes): colocate, lend, split or rebalance.
Every call below is collective: every rank makes it, whatever it holds.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..config import Config
from ..elastic.faults import kill_point
from ..elastic.replicas import recovers_from_checkpoint
from ..launch import DistInfo
from ..tracking.sample_log import log_samples
from ..tracking.timeline import write_run_trace
from .leave import LeftWorld
from .recovery import Recovery
from .resume import checkpoint_and_export, export_policy, save_due
from .reward_training import run_reward_training
from .run import Run, make_run
from .runtimes import RUNTIMES, Runtime, runtime_name
from .step import sample_metrics


def run_training(cfg: Config, out_dir: Path, dist_info: DistInfo) -> None:
    if cfg.algorithm.name == "reward_model":  # no generation: preference pairs in, a sequence classifier out
        return run_reward_training(cfg, out_dir, dist_info)
    run = make_run(cfg, out_dir, dist_info)
    runtime = make_runtime(run)
    run_steps(run, runtime, lambda: set_up(run, runtime))


def make_runtime(run: Run) -> Runtime:
    name = runtime_name(run.cfg.placement)
    if name not in RUNTIMES:
        raise ValueError(f"placement={name} has no runtime to run it live (it can be planned with dry_run=true); "
                         f"runtimes: {', '.join(RUNTIMES)} (orchestrator/runtimes)")
    return RUNTIMES[name](run)


def set_up(run: Run, runtime: Runtime) -> None:
    """A rank of the launched world: its engines, the warm-up, the other roles, a resumed state; step 0's metrics."""
    cfg = run.cfg
    runtime.start()  # the actor and the rollout engine(s) on their ranks, holding the initial weights
    run.open_tracker()
    warmup = runtime.warm_up() if cfg.trainer.sft_warmup_steps > 0 and run.resume_from is None else {}
    runtime.build_roles()  # the reference copies the warmed-up actor; PPO's critic
    if run.resume_from is not None:  # DCP reshards into this run's layout
        state = runtime.restore(run.resume_from)
        run.start_step, run.rng = state.step, state.loop_rng
        if state.kl_coef is not None:  # the adaptive controller's coefficient has moved since kl_coef
            run.kl_ctl.value = state.kl_coef
    runtime.sync_weights()  # the engines generate with the (warmed-up or resumed) actor's weights
    runtime.begin()
    if run.start_step == 0:
        run.log(0, {**warmup, **runtime.evaluate()})


def run_steps(run: Run, runtime: Runtime, set_up: Callable[[], None]) -> None:
    """`set_up` (a launched rank's, or a joiner's entry into the world), then the steps after run.start_step, the
    export and the run's trace; the engines stopped at the end, failed or not."""
    cfg, failed, recovery = run.cfg, True, None
    try:
        set_up()
        if cfg.elastic.replicas or recovers_from_checkpoint(cfg.elastic.replicas, cfg.elastic.recover_from_checkpoint):
            membership = getattr(runtime, "membership", None)
            joined = membership is not None and membership.entered_before is not None
            process = membership.process if membership is not None and membership.process is not None else \
                run.dist_info.rank
            recovery = Recovery(cfg, joined, process)  # surviving a lost rank (orchestrator/recovery.py)
            recovery.start(run, runtime)
        try:
            step = run.start_step + 1
            while step <= cfg.trainer.total_steps:
                try:
                    step_and_log(run, runtime, step, recovery)
                except LeftWorld:
                    raise  # this rank has left: a loss announced later is the survivors' to recover, not its own
                except Exception as err:
                    if recovery is None:
                        raise
                    step = recovery.recover(run, runtime, err, step)  # re-raises where no rank was lost
                    continue
                step += 1
        except LeftWorld as left:  # elastic: this rank's state moved to the survivors, which go on without it
            print(f"rlhf_dyna: {left}", flush=True)
            failed = False
            return
        if cfg.trainer.export_policy and not save_due(cfg.trainer, cfg.trainer.total_steps):
            export_policy(cfg.trainer, runtime.actor, runtime.model_dir, run.out_dir, writer=runtime.actor_first_rank)
        if runtime.recorder is not None:  # collective, so not in `finally`: after one rank fails the others would wait
            write_run_trace(runtime.recorder, run.out_dir, title=runtime.trace_title)
        failed = False
    finally:
        if recovery is not None:
            recovery.close(failed)
        if run.tracker is not None:
            run.tracker.close()
        runtime.close(failed)


def step_and_log(run: Run, runtime: Runtime, step: int, recovery: Recovery | None) -> None:
    """One step, its evaluation when due, a snapshot when due (elastic.replicas), the log line and a checkpoint."""
    cfg, started = run.cfg, time.perf_counter()
    metrics = rl_step(run, runtime, step, recovery)
    if step % cfg.task.eval_every == 0 or step == cfg.trainer.total_steps:
        metrics.update(runtime.evaluate())
    if recovery is not None:
        metrics.update(recovery.after_step(run, runtime, step))
    metrics["timing_s/iteration"] = time.perf_counter() - started  # the step and the loop's work after it
    run.log(step, metrics)
    save(run, runtime, step)


def rl_step(run: Run, runtime: Runtime, step: int, recovery: Recovery | None = None) -> dict[str, float]:
    """One step; its metrics on every rank (rank 0 logs them)."""
    metrics = runtime.before_step(step)  # e.g. a scheduled change of the training layout
    if recovery is not None:  # a change of world: the snapshot ring over the new one, its members published
        metrics.update(recovery.after_change(run, runtime, step - 1))
    t0, started = time.perf_counter(), time.time()
    kill_point(f"generate/step_{step}", run.dist_info.rank, run.dist_info.run_ident)  # tests: a TP peer waits on it
    samples, gen_seconds = runtime.generate(step)  # generated and scored on the rollout ranks, gathered everywhere
    scored = runtime.score(step, samples)  # the reward model's scores join the rewards (none without one)
    if run.tracker is not None and run.cfg.tracking.sample_log > 0:
        log_samples(run.out_dir, step, samples, run.tokenizer, run.cfg.tracking.sample_log)
    batch, prepared = runtime.prepare(step, samples)  # old / reference log-probs, values, advantages
    trained = runtime.train(step, batch, samples, prepared)  # the actor, the critic
    kill_point(f"weight_sync/step_{step}", run.dist_info.rank, run.dist_info.run_ident)  # tests: a kill in the sync
    synced = runtime.sync_weights()  # the trained weights into the rollout engine(s)
    metrics.update(sample_metrics(run.cfg, samples, gen_seconds, trained.get("timing_s/train_actor", 0.0)),
                   **scored, **trained, **synced, **{"timing_s/gen": gen_seconds, "timing_s/step": time.perf_counter() - t0})
    return runtime.finish_step(step, metrics, started)


def save(run: Run, runtime: Runtime, step: int) -> None:
    """A checkpoint (and the policy export) when due; the KL coefficient is the actor's ranks'."""
    if not save_due(run.cfg.trainer, step):
        return
    run.kl_ctl.value = runtime.from_actor(run.kl_ctl.value)
    checkpoint_and_export(run.cfg, run.out_dir, step, runtime.engines(), run.rng, run.task, runtime.checkpoint_layout(),
                          runtime.model_dir, kl_coef=run.kl_ctl.value, export_writer=runtime.actor_first_rank)
