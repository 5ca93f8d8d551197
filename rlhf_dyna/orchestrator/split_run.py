"""placement=split live, staleness 0: generation on the rollout set, training on the train set, disjoint ranks.

Each rollout rank runs one tp=1 vLLM engine in its own process (rollout.subset_engine.SubsetVLLMRollout: an engine
on a rank subset cannot join our world, ENVIRONMENT.md); the actor (and reference, and PPO's critic) live on an FSDP
(dp, tp) mesh over the train set only. One step: the rollout set generates (global prompt indices seed the sampling,
so the samples are those of any other placement), every rank receives the samples (one all_gather), the train set
prepares and trains (the actor, then the critic), and the trained weights cross to the rollout set by a VPS plan
(transition.subset_sync.SubsetSync), logged as `reshard/actor/train_actor_to_generate/*`. Ranks with nothing to do
in a phase wait in the next collective. With placement.rebalance=true the sets change size between steps
(orchestrator/split_rebalance). Each rank records the phases it served and the transitions' rounds
(transition_trace.json, timeline.png).
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ..algos.kl_control import make_kl_controller
from ..config import Config
from ..elastic.placement import ACTOR, GENERATE, ROLLOUT, TRAIN_ACTOR, RankSet
from ..models.build import make_hf_config, save_hf_dir
from ..rollout.context_length import max_model_len
from ..rollout.subset_engine import SubsetVLLMRollout
from ..tasks.hf_tokenizer import build_tokenizer
from ..tracking.timeline import record_phase, write_run_trace
from ..tracking.tracker import Tracker
from ..train.engine import TrainEngine, full_state_dict
from ..train.mesh import build_mesh
from ..transition.role_move import rank_set_spec
from ..transition.subset_sync import SubsetSync
from ..transition.trace import TraceRecorder
from .advantages import compute_advantages
from .batch import gather_samples, pack, rank_rows
from .objectives import actor_loss, critic_loss
from .phases import generate, reward_part_means, supervised_warmup
from .placements import placement_of, split_placement
from .resume import checkpoint_and_export, export_policy, restore_run, save_due
from .setup import (RankContext, build_actor, build_critic_engine, build_reference, build_task, model_source,
                    seed_everything)
from .step_metrics import rollout_metrics

SYNC = f"reshard/{ACTOR}/{TRAIN_ACTOR}_to_{GENERATE}"  # the actor's weights, train set -> rollout set, every step


class SplitRanks:
    """Who this rank is under the split placement: its set, and its contexts for generating and training."""

    def __init__(self, cfg: Config, rollout_ranks: int | None = None) -> None:
        """`rollout_ranks`: a split other than the config's (rebalancing); its train set is the rest of the world."""
        placement = placement_of(cfg) if rollout_ranks is None else split_placement(cfg, rollout_ranks)
        self.rollout: RankSet = placement.slot(GENERATE, ROLLOUT).ranks  # type: ignore[assignment]
        self.train: RankSet = placement.slot(TRAIN_ACTOR, ACTOR).ranks  # type: ignore[assignment]
        self.rank, tp = dist.get_rank(), cfg.parallel.train.tp
        self.generates, self.trains = self.rank in self.rollout.ranks, self.rank in self.train.ranks
        # one tp=1 replica per rollout rank; the train context is the train set's (dp, tp), ranks counted from its first
        self.gen_ctx = RankContext(self.rank - self.rollout.first, self.rollout.size, 1, 1, 1)
        self.train_ctx = RankContext(self.rank - self.train.first, self.train.size, self.train.size // tp, tp, 1)

    def from_trainer(self, value):
        """Collective: the train set's first rank's `value` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=self.train.first)
        return box[0]


def split_generate(cfg, rollout, task, tokenizer, prompts, ranks: SplitRanks, **kw) -> list:
    """Collective: the rollout set generates its replicas' shares; every rank gets all samples, by prompt index."""
    local = generate(cfg, rollout, task, tokenizer, prompts, ranks.gen_ctx, **kw) if ranks.generates else []
    return sorted(gather_samples(local, ranks.generates), key=lambda s: s.prompt_index)


def split_evaluate(cfg, rollout, task, tokenizer, ranks: SplitRanks, prefix: str = "eval") -> dict[str, float]:
    """Greedy accuracy and reward on the held-out set, generated on the rollout set (as phases.evaluate)."""
    t0 = time.perf_counter()
    examples = task.eval_set()
    usable = examples[: len(examples) - len(examples) % ranks.rollout.size]
    samples = split_generate(cfg, rollout, task, tokenizer, usable, ranks, greedy=True)
    texts = [tokenizer.decode(s.response_ids) for s in samples]
    return {f"{prefix}/accuracy": task.eval_accuracy(usable, texts, [s.reward for s in samples]),
            f"{prefix}/reward": sum(s.reward for s in samples) / len(samples),
            f"timing_s/{prefix}": time.perf_counter() - t0}


def initial_model_dir(cfg, source, actor, tokenizer, out_dir: Path, ranks: SplitRanks) -> Path:
    """The engines open a model directory: the train set's first rank writes the initial weights (random init)."""
    if isinstance(source, str):
        return Path(source)
    model_dir = out_dir / "model_init" / "split"
    if ranks.trains:
        weights = list(full_state_dict(actor))  # collective over the train set
        if ranks.rank == ranks.train.first:
            save_hf_dir(weights, make_hf_config(source), model_dir)
            tokenizer.save(model_dir)
    dist.barrier()
    return model_dir


@dataclass
class SplitState:
    """This rank's part of a split run: who it is, its engines (None where it holds none), the weight sync. A
    rebalance (orchestrator/split_rebalance) replaces all of them."""

    ranks: SplitRanks
    actor: TrainEngine | None
    ref: TrainEngine | None
    rollout: SubsetVLLMRollout | None
    sync: SubsetSync
    critic: TrainEngine | None = None  # PPO's, on the train set

    def engines(self) -> dict[str, TrainEngine | None]:
        """This rank's engines by checkpoint role (None off the train set)."""
        return {"actor": self.actor, "critic": self.critic, "reference": self.ref}

    def layout(self, cfg: Config) -> dict:
        """The layout a checkpoint records (for its message on resume; DCP reshards on load whatever it was)."""
        return {"placement": "split", "rollout_ranks": self.ranks.rollout.size, "train_dp": self.ranks.train_ctx.dp,
                "tp": self.ranks.train_ctx.tp}

    def sync_weights(self, recorder: TraceRecorder | None = None):
        """Collective: the actor's weights, train set -> every engine of the rollout set."""
        return self.sync.sync(self.actor, self.rollout, recorder, SYNC)


def start_engine(cfg: Config, model_dir: Path, rank: int) -> SubsetVLLMRollout:
    """This rank's tp=1 engine (core in its own process), opened on the run's initial weights."""
    return SubsetVLLMRollout(model_dir, seed=cfg.trainer.seed, max_model_len=max_model_len(cfg),
                             kv_cache_bytes=cfg.rollout.kv_cache_bytes, rank=rank,
                             dtype="bfloat16" if cfg.trainer.precision == "bf16" else "float32")


def train_step(cfg, step, samples, tokenizer, state: SplitState, kl_ctl, recorder=None) -> dict[str, float]:
    """On the train set: prepare (log-probs, values, advantages) and train the actor, then the critic, on its rows of
    the step, as colocate does."""
    from .loop import kl_metrics_and_update, train_on  # the loop imports this module

    ranks, actor, ref, critic = state.ranks, state.actor, state.ref, state.critic
    alg, t1, wall = cfg.algorithm, time.perf_counter(), time.time()
    batch = rank_rows(pack(samples, tokenizer.pad_id), ranks.train_ctx.dp_rank, ranks.train_ctx.dp, alg.mini_batches)
    metrics = compute_advantages(cfg, batch, samples, ranks.train_ctx, actor, ref, critic, kl_ctl.value)
    t2 = time.perf_counter()
    roles = ["actor"] + (["reference"] if ref is not None else []) + (["critic"] if critic is not None else [])
    record_phase(recorder, "prepare", step, wall, t2 - t1, ", ".join(roles))
    wall = time.time()
    trained = train_on(actor, batch, actor_loss(alg, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                                kl_ctl.value), alg)
    metrics.update({f"actor/{k}": v for k, v in trained.items() if k != "loss"},
                   **{"timing_s/prepare": t2 - t1, "timing_s/train_actor": time.perf_counter() - t2})
    record_phase(recorder, "train_actor", step, wall, metrics["timing_s/train_actor"], "actor")
    metrics["timing_s/train"] = metrics["timing_s/train_actor"]
    if critic is not None:
        t3, wall = time.perf_counter(), time.time()
        trained = train_on(critic, batch, critic_loss(alg, cfg.rollout.max_new_tokens), alg)
        metrics.update({f"critic/{k}": v for k, v in trained.items() if k != "loss"},
                       **{"timing_s/train_critic": time.perf_counter() - t3})
        record_phase(recorder, "train_critic", step, wall, metrics["timing_s/train_critic"], "critic")
        metrics["timing_s/train"] += metrics["timing_s/train_critic"]
    if ref is not None:
        metrics.update(kl_metrics_and_update(metrics, batch, actor, kl_ctl, len(samples)))
    return metrics


def sync_metrics(stats, step_seconds: float) -> dict[str, float]:
    return {f"{SYNC}/seconds": stats.seconds, f"{SYNC}/bytes_moved": float(stats.bytes_moved),
            f"{SYNC}/rounds": float(stats.rounds), f"{SYNC}/peak_extra_bytes": float(stats.peak_extra_bytes),
            "timing_s/weight_sync": stats.seconds, "timing_s/placement_change": stats.seconds,
            "placement/change_share": stats.seconds / step_seconds if step_seconds > 0 else 0.0}


def run_split(cfg: Config, out_dir: Path, dist_info) -> None:
    """The whole run of one rank under placement=split (checked before spawn: no resume, checkpoints or export)."""
    from .split_rebalance import SplitRebalance  # it imports this module

    seed_everything(cfg.trainer.seed)
    ranks = SplitRanks(cfg)
    tokenizer = build_tokenizer(cfg.model.path)
    task, source = build_task(cfg, tokenizer), model_source(cfg.model, tokenizer)
    hf_config = make_hf_config(source) if not isinstance(source, str) else actor_config(source)
    mesh = build_mesh(ranks.train_ctx.dp, ranks.train_ctx.tp, first_rank=ranks.train.first)  # collective: all ranks
    recorder = TraceRecorder(ranks.rank, {SYNC: cfg.tracking.trace_syncs}) if cfg.tracking.transition_trace else None
    # [rebalance] every candidate split's groups and meshes build in the background from here on
    rebalance = SplitRebalance(cfg, ranks, mesh, hf_config, recorder) if cfg.placement.rebalance else None
    actor = build_actor(cfg, source, ranks.train_ctx, mesh=mesh) if ranks.trains else None
    model_dir = initial_model_dir(cfg, source, actor, tokenizer, out_dir, ranks)
    started = time.perf_counter()
    rollout = start_engine(cfg, model_dir, ranks.rank) if ranks.generates else None
    if rebalance is not None:  # rank 0 always generates: its engine's start predicts the start of a joining one
        rebalance.model_dir, rebalance.engine_start_s = model_dir, time.perf_counter() - started
    state = SplitState(ranks, actor, None, rollout, SubsetSync(
        hf_config, rank_set_spec(ranks.train, ranks.train_ctx.tp), ranks.rollout.first,
        ranks.rollout.size))
    tracker = None
    if ranks.rank == 0:
        run_config = OmegaConf.to_container(OmegaConf.structured(cfg))
        tracker = Tracker(out_dir, asdict(cfg.tracking), cfg.tracking.console, cfg.trainer.total_steps, run_config)
    resume_from = Path(cfg.trainer.resume) if cfg.trainer.resume else None  # [ckpt] resolved before spawn (job.py)
    try:
        warmup = {}
        if cfg.trainer.sft_warmup_steps > 0 and resume_from is None:
            warmup = split_evaluate(cfg, state.rollout, task, tokenizer, ranks, prefix="pre_warmup")
            sft = supervised_warmup(cfg, actor, task, tokenizer, ranks.train_ctx) if ranks.trains else {}
            warmup.update(ranks.from_trainer(sft))
        state.ref = build_reference(cfg, source, actor) if cfg.algorithm.kl_coef > 0 and ranks.trains else None
        if cfg.algorithm.name == "ppo" and ranks.trains:  # after the reference, as colocate builds them
            state.critic = build_critic_engine(cfg, source, actor)
        if rebalance is not None:  # [rebalance] plans and destination skeletons of every move, in the background
            rebalance.prepare_moves(ranks.rollout.size)
        rng, alg = random.Random(cfg.trainer.seed + 1), cfg.algorithm
        kl_ctl = make_kl_controller(alg.kl_ctrl, alg.kl_coef, alg.kl_target, alg.kl_horizon)
        start = 0
        if resume_from is not None:  # [ckpt] DCP reshards the train set's engines; rollout ranks load nothing
            restored = restore_run(resume_from, state.engines(), task)
            start, rng = restored.step, restored.loop_rng
            if restored.kl_coef is not None:
                kl_ctl.value = restored.kl_coef
        state.sync_weights()  # the engines generate with the warmed-up (or resumed) weights
        if start == 0:
            evaluated = split_evaluate(cfg, state.rollout, task, tokenizer, ranks)
            if tracker:
                tracker.log(0, {**warmup, **evaluated})
        stale = cfg.placement.max_staleness
        # one step ahead; after a resume the first step's samples come from the resumed weights (on-policy)
        ahead = step_samples(cfg, start + 1, rng, task, tokenizer, state, recorder) if stale else None
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            metrics = split_step(cfg, step, rng, task, tokenizer, state, kl_ctl, ahead if stale else None, recorder)
            ahead = metrics.pop("_ahead", None)
            if rebalance is not None:  # [rebalance] between steps: maybe move devices between the sets
                metrics.update(rebalance.after_step(step, state, metrics, kl_ctl))
            if step % cfg.task.eval_every == 0 or step == cfg.trainer.total_steps:
                metrics.update(split_evaluate(cfg, state.rollout, task, tokenizer, state.ranks))
            if tracker:
                tracker.log(step, metrics)
            if save_due(cfg.trainer, step):  # [ckpt] the KL coefficient lives on the train set
                kl_ctl.value = state.ranks.from_trainer(kl_ctl.value)
            checkpoint_and_export(cfg, out_dir, step, state.engines(), rng, task, state.layout(cfg), model_dir,
                                  kl_coef=kl_ctl.value, export_writer=state.ranks.train.first)
        if cfg.trainer.export_policy and not save_due(cfg.trainer, cfg.trainer.total_steps):  # [ckpt] at the end
            export_policy(cfg.trainer, state.actor, model_dir, out_dir, writer=state.ranks.train.first)
        if recorder is not None:  # collective, so not in `finally`: after one rank fails the others would wait forever
            title = f"{cfg.recipe}: placement=split" + (", rebalance" if cfg.placement.rebalance else "")
            write_run_trace(recorder, out_dir, title=f"{title}: phases and transitions")
    finally:
        if tracker:
            tracker.close()
        if rebalance is not None:
            rebalance.close()
        if state.rollout is not None:  # local: stops the engine process and removes its shm file
            state.rollout.shutdown()


def actor_config(path: str):
    from ..models.meta_init import checkpoint_config
    return checkpoint_config(path)


def step_samples(cfg, step, rng, task, tokenizer, state: SplitState, recorder=None) -> tuple[list, float]:
    """Collective: step `step`'s samples on every rank, and the rollout set's generate seconds (its slowest rank's)."""
    ranks = state.ranks
    t0, wall = time.perf_counter(), time.time()
    prompts = task.train_prompts(step, cfg.task.prompts_per_step, rng)  # same on every rank, in step order
    seed = cfg.trainer.seed * 1_000_003 + step * 10_007
    local = generate(cfg, state.rollout, task, tokenizer, prompts, ranks.gen_ctx, seed=seed) if ranks.generates else []
    seconds = time.perf_counter() - t0
    if ranks.generates:
        record_phase(recorder, "generate", step, wall, seconds, "rollout")
    slowest = torch.tensor([seconds if ranks.generates else 0.0], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the phase lasts as long as its slowest engine
    return sorted(gather_samples(local, ranks.generates), key=lambda s: s.prompt_index), float(slowest)


def split_step(cfg, step, rng, task, tokenizer, state: SplitState, kl_ctl, ahead: tuple[list, float] | None = None,
               recorder: TraceRecorder | None = None) -> dict:
    """Collective. One step; the metrics on every rank (only rank 0 logs them). With `ahead` (max_staleness=1) the
    step trains on samples generated one weight version ago, while the rollout set generates the next step's; the
    next samples come back under the key "_ahead"."""
    t0, last, ranks = time.perf_counter(), step == cfg.trainer.total_steps, state.ranks
    if ahead is None:
        (samples, gen_seconds), following = step_samples(cfg, step, rng, task, tokenizer, state, recorder), None
    else:
        samples, gen_seconds = ahead
    trained = train_step(cfg, step, samples, tokenizer, state, kl_ctl, recorder) if ranks.trains else {}
    if ahead is not None:  # the rollout ranks generate step k+1 while the train ranks train step k; both meet here
        following = None if last else step_samples(cfg, step + 1, rng, task, tokenizer, state, recorder)
    dist.barrier()  # the rollout set waits here while the train set trains, so the sync's time below is its own
    stats = state.sync_weights(recorder)  # rank 0's (a rollout rank) time includes installing into its engine
    trained = ranks.from_trainer(trained)
    step_seconds = time.perf_counter() - t0
    rewards = torch.tensor([s.reward for s in samples])
    return {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        **reward_part_means(samples),
        **rollout_metrics(samples, cfg.rollout.max_new_tokens, gen_seconds, trained["timing_s/train_actor"],
                          cfg.algorithm.epochs),
        **trained, "timing_s/gen": gen_seconds, "timing_s/step": step_seconds,
        **sync_metrics(stats, step_seconds), "placement/staleness": 0.0 if ahead is None or step == 1 else 1.0,  # step 1: w0 both
         "_ahead": following,
    }
