"""The phase loop of one rank: generate -> score -> (values) -> advantages -> train -> sync weights."""
from __future__ import annotations

import random
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ..algos.kl import kl_penalty
from ..algos.kl_control import make_kl_controller
from ..config import Config
from ..rollout.context_length import max_model_len
from ..rollout.vllm_engine import VLLMRollout
from ..tasks.base import Example
from ..tasks.hf_tokenizer import build_tokenizer
from ..tracking.sample_log import log_samples
from ..tracking.timeline import record_step_phases, write_run_trace
from ..tracking.tracker import Tracker
from ..transition.relayout import LayoutSwitch, layout_of, relayout, switch_at
from ..transition.sync import make_sync
from ..transition.trace import TraceRecorder
from ..transition.vps_mover import least_moving_layout, make_vps_mover
from .advantages import compute_advantages
from .batch import gather_samples, pack, rank_rows, split_rows
from .objectives import actor_loss, critic_loss
from .phases import evaluate, generate, reward_part_means, supervised_warmup
from .placed_step import change_share, start_placed
from .resume import checkpoint_and_export, export_policy, restore_run, resumed_switch, save_due
from .setup import (
    RankContext, build_actor, build_critic_engine, build_reference, build_task, model_source, rank_context,
    seed_everything, write_initial_checkpoint,
)
from .step_metrics import rollout_metrics


def mean_over_world(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, (t / dist.get_world_size()).tolist()))


def kl_metrics_and_update(metrics: dict, batch: dict, actor, kl_ctl, num_samples: int) -> dict[str, float]:
    """actor/kl (k3, token mean over dp, unless the loss logged it) and actor/kl_coef; steps the KL controller."""
    out = {}
    if "actor/kl" not in metrics:
        mask = batch["response_mask"]
        kl = (kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], "k3") * mask).sum()
        kl_sum, tokens = actor.dp_sum(torch.stack([kl, mask.sum()]))
        out["actor/kl"] = float(kl_sum / tokens.clamp(min=1))
    out["actor/kl_coef"] = kl_ctl.value
    kl_ctl.update({**metrics, **out}["actor/kl"], num_samples)  # the same on every rank: actor/kl is a dp-wide mean
    return out


def train_on(engine, batch: dict, loss_fn, alg) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for _ in range(alg.epochs):
        for mini in split_rows(batch, alg.mini_batches):
            metrics = engine.step(mini, loss_fn)
    return metrics


def layout_schedule(cfg: Config) -> list[LayoutSwitch]:
    world = cfg.parallel.world_size
    return [LayoutSwitch(s.step, world // (s.tp * s.pp) if s.dp == -1 else s.dp, s.tp, s.zero, s.pp,
                         cfg.parallel.train.pp_schedule, s.ep) for s in cfg.parallel.schedule]


def change_layout(ctx: RankContext, layout, *engines, recorder: TraceRecorder | None = None):
    """Online change of the training layout: every engine's parameters and optimizer state move to the new
    (dp, tp, zero) layout in these processes; returns the new context, engines and the move's metrics.
    With a recorder, each move's rounds are traced as train_relayout events. The new mesh's rank order is the one
    whose plan moves the fewest bytes (see vps.rank_order); all engines take the actor's."""
    searching = time.perf_counter()
    first = next(e for e in engines if e is not None)
    before, layout = layout_of(first), least_moving_layout(first, layout)
    moved, totals = [], {"seconds": time.perf_counter() - searching, "bytes_moved": 0.0, "rounds": 0.0, "peak_extra_bytes": 0.0}
    for engine in engines:
        if engine is None:
            moved.append(None)
            continue
        mover = make_vps_mover(engine.model.config, in_place=True, recorder=recorder, trace_name="train_relayout")
        engine, stats = relayout(engine, layout, mover=mover)
        moved.append(engine)
        totals["seconds"] += stats.seconds
        totals["rounds"] += stats.rounds
        totals["peak_extra_bytes"] = max(totals["peak_extra_bytes"], stats.peak_extra_bytes)
        received = torch.tensor([stats.bytes_received], dtype=torch.float64)
        dist.all_reduce(received)
        totals["bytes_moved"] += float(received)
    if ctx.rank == 0:
        print(f"rlhf_dyna: training layout {before.describe()} -> {layout.describe()}: moved "
              f"{totals['bytes_moved'] / 2**20:,.1f} MiB in {totals['seconds']:.3f} s", flush=True)
    new_ctx = replace(ctx, dp=layout.dp, tp=layout.tp, tp_outer=layout.tp_outer, pp=layout.pp)
    return new_ctx, moved, {f"reshard/train_relayout/{k}": v for k, v in totals.items()}


def run_training(cfg: Config, out_dir: Path, dist_info) -> None:
    if cfg.placement.policy == "split":  # [placement] rollout set and train set disjoint (orchestrator/split_run)
        from .split_run import run_split
        return run_split(cfg, out_dir, dist_info)
    seed_everything(cfg.trainer.seed)
    ctx = rank_context(cfg)
    tokenizer = build_tokenizer(cfg.model.path)  # the checkpoint's own, or the toy character tokenizer
    task = build_task(cfg, tokenizer)
    source = model_source(cfg.model, tokenizer)
    actor = build_actor(cfg, source, ctx)
    model_dir = write_initial_checkpoint(source, actor, tokenizer, out_dir, dist_info.node_rank, dist_info.local_rank)
    rollout = VLLMRollout(
        str(model_dir), tp=cfg.rollout.tp, seed=cfg.trainer.seed, max_model_len=max_model_len(cfg),
        kv_cache_bytes=cfg.rollout.kv_cache_bytes, dtype="bfloat16" if cfg.trainer.precision == "bf16" else "float32",
        expert_parallel=cfg.rollout.expert_parallel,
    )
    bound = {"train_to_rollout": cfg.tracking.trace_syncs}
    recorder = TraceRecorder(ctx.rank, bound) if cfg.tracking.transition_trace else None
    # only the VPS executor has rounds to trace; naive's gathers are not traced
    sync = make_sync(cfg.rollout.sync, **({"recorder": recorder} if cfg.rollout.sync == "vps" else {}))
    tracker, placed = None, None
    if ctx.rank == 0:
        run_config = OmegaConf.to_container(OmegaConf.structured(cfg))
        tracker = Tracker(out_dir, asdict(cfg.tracking), cfg.tracking.console, cfg.trainer.total_steps, run_config)
    try:
        warmup = {}
        resume_from = Path(cfg.trainer.resume) if cfg.trainer.resume else None  # [ckpt] resolved before spawn (job.py)
        if cfg.trainer.sft_warmup_steps > 0 and resume_from is None:  # so the warm-up's share of the final accuracy is on record
            warmup = {**evaluate(cfg, rollout, task, tokenizer, ctx, prefix="pre_warmup"),
                      **supervised_warmup(cfg, actor, task, tokenizer, ctx)}
        ref = build_reference(cfg, source, actor) if cfg.algorithm.kl_coef > 0 else None
        critic = build_critic_engine(cfg, source, actor) if cfg.algorithm.name == "ppo" else None
        rng = random.Random(cfg.trainer.seed + 1)
        alg = cfg.algorithm
        kl_ctl = make_kl_controller(alg.kl_ctrl, alg.kl_coef, alg.kl_target, alg.kl_horizon)
        schedule = layout_schedule(cfg)
        start = 0
        if resume_from is not None:  # [ckpt] DCP reshards into this run's layout; the schedule's is reached below
            state = restore_run(resume_from, {"actor": actor, "critic": critic, "reference": ref}, task)
            start, rng = state.step, state.loop_rng
            if state.kl_coef is not None:  # the adaptive controller's coefficient has moved since kl_coef
                kl_ctl.value = state.kl_coef
        sync.sync(actor, rollout)  # vLLM generates with the (resumed) actor's weights
        placed = start_placed(cfg, actor, recorder)  # [placement] lend: its sets' groups build in the background
        if start == 0:
            metrics = {**warmup, **evaluate(cfg, rollout, task, tokenizer, ctx)}
            if tracker:
                tracker.log(0, metrics)
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            switch = {}
            layout = switch_at(schedule, step) if step > start + 1 or start == 0 else resumed_switch(schedule, start)
            if layout is not None:
                ctx, (actor, critic, ref), switch = change_layout(ctx, layout, actor, critic, ref, recorder=recorder)
            step_start = time.time()
            metrics = {**switch, **rl_step(cfg, step, rng, task, tokenizer, ctx, actor, ref, critic, rollout, sync,
                                           out_dir if tracker else None, kl_ctl=kl_ctl, placed=placed)}
            if recorder is not None:  # the phases this rank served, for the timeline
                record_step_phases(recorder, step, step_start, metrics)
            if step % cfg.task.eval_every == 0 or step == cfg.trainer.total_steps:
                metrics.update(evaluate(cfg, rollout, task, tokenizer, ctx))
            if tracker:
                tracker.log(step, metrics)
            checkpoint_and_export(cfg, out_dir, step, {"actor": actor, "critic": critic, "reference": ref}, rng, task,
                                  {"pp": ctx.pp, "dp": ctx.dp, "tp": ctx.tp, "zero": actor.zero}, model_dir,
                                  kl_coef=kl_ctl.value)  # [ckpt]
        if cfg.trainer.export_policy and not save_due(cfg.trainer, cfg.trainer.total_steps):  # [ckpt] export at the end
            export_policy(cfg.trainer, actor, model_dir, out_dir)
        if recorder is not None:  # collective, so not in `finally`: after one rank fails the others would wait forever
            write_run_trace(recorder, out_dir, title=f"{cfg.recipe}: phases and transitions")
    except BaseException:
        rollout = None  # a failed rank leaves at once: shutdown's barrier would wait on peers stuck in a collective
        raise
    finally:
        if tracker:
            tracker.close()
        if placed is not None and rollout is not None:
            placed.close()
        if rollout is not None:
            rollout.shutdown()


def rl_step(cfg, step, rng, task, tokenizer, ctx, actor, ref, critic, rollout, sync, log_dir=None,
            kl_ctl=None, placed=None) -> dict[str, float]:
    kl_ctl = kl_ctl or make_kl_controller("fixed", cfg.algorithm.kl_coef, 0.0, 1)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    prompts: list[Example] = task.train_prompts(step, cfg.task.prompts_per_step, rng)  # same on every rank
    local = generate(cfg, rollout, task, tokenizer, prompts, ctx, seed=cfg.trainer.seed * 1_000_003 + step * 10_007)
    timings["timing_s/gen"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    samples = sorted(gather_samples(local, ctx.is_rollout_leader), key=lambda s: s.prompt_index)
    if log_dir is not None and cfg.tracking.sample_log > 0:
        log_samples(log_dir, step, samples, tokenizer, cfg.tracking.sample_log)
    batch = rank_rows(pack(samples, tokenizer.pad_id), ctx.dp_rank, ctx.dp, cfg.algorithm.mini_batches)
    adv_metrics = compute_advantages(cfg, batch, samples, ctx, actor, ref, critic, kl_ctl.value)
    timings["timing_s/prepare"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    actor_fn = actor_loss(cfg.algorithm, cfg.rollout.temperature, cfg.rollout.max_new_tokens, kl_ctl.value)
    critic_fn = critic_loss(cfg.algorithm, cfg.rollout.max_new_tokens)
    placement_metrics = {}
    if placed is not None:  # [placement] actor and critic train at once on their own sets (orchestrator/placed_step)
        actor_metrics, critic_metrics, placed_timings, placement_metrics = placed.train(
            cfg, step, batch, actor, critic, {"actor": actor_fn, "critic": critic_fn})
        timings.update(placed_timings, **{"timing_s/train": time.perf_counter() - t2})
    else:
        actor_metrics = train_on(actor, batch, actor_fn, cfg.algorithm)
        timings["timing_s/train_actor"] = time.perf_counter() - t2
        critic_metrics = train_on(critic, batch, critic_fn, cfg.algorithm) if critic else {}
        timings["timing_s/train"] = time.perf_counter() - t2
        if critic:
            timings["timing_s/train_critic"] = timings["timing_s/train"] - timings["timing_s/train_actor"]

    stats = sync.sync(actor, rollout)
    timings["timing_s/weight_sync"] = stats.seconds
    timings["timing_s/step"] = time.perf_counter() - t0
    placement_metrics.update(change_share(placement_metrics, timings["timing_s/step"]) if placed is not None else {})

    rewards = torch.tensor([s.reward for s in samples])
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        **reward_part_means(samples),
        **rollout_metrics(samples, cfg.rollout.max_new_tokens, timings["timing_s/gen"], timings["timing_s/train_actor"],
                          cfg.algorithm.epochs),
        **adv_metrics,
        **{f"actor/{k}": v for k, v in actor_metrics.items() if k != "loss"},
        **{f"critic/{k}": v for k, v in critic_metrics.items() if k != "loss"},
        "reshard/train_to_rollout/seconds": stats.seconds,
        "reshard/train_to_rollout/bytes_moved": float(stats.bytes_moved),
        "reshard/train_to_rollout/rounds": float(stats.rounds),
        "reshard/train_to_rollout/peak_extra_bytes": float(stats.peak_extra_bytes),
        **placement_metrics,
    }
    metrics.update(actor.pipeline_metrics() if hasattr(actor, "pipeline_metrics") else {})  # pp/bubble_fraction
    if ref is not None:
        metrics.update(kl_metrics_and_update(metrics, batch, actor, kl_ctl, len(samples)))
    timings = mean_over_world(timings)  # rank-averaged phase times
    return {**metrics, **timings}
