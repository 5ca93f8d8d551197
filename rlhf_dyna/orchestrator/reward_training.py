"""algorithm.name=reward_model: a loop without generation that trains a sequence classifier on preference pairs.

    run_reward_training(cfg, out_dir, dist_info)     # called by loop.run_training for this algorithm

Every rank holds the reward model in the `parallel.train` layout (FSDP2, TP where the layout has it), built on meta
from model.path (a causal LM checkpoint: its backbone and a seeded score head) and loaded per shard. Each step takes
`task.prompts_per_step` pairs (task=preference), trains on them with the pairwise loss (Bradley-Terry), and logs
`reward_model/{loss,accuracy,margin,chosen,rejected,grad_norm}`; every `task.eval_every` steps the held-out pairs are
scored and `eval/accuracy` is the share whose chosen completion scores higher (`eval/margin` the mean difference).
Checkpoints are a policy run's (DCP under checkpoints/step_<N>/, `trainer.resume`), the engine under the role name
`reward_model`; the export `<run dir>/reward_model/` is an HF directory that AutoModelForSequenceClassification and
`reward_model.path` open (config with num_labels=1 and the padding id, the base checkpoint's tokenizer).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch.distributed as dist

from ..config import Config
from ..launch import DistInfo
from ..models.export import export_hf_dir
from ..models.meta_init import checkpoint_config
from ..models.reward import reward_config
from ..tasks.hf_tokenizer import HFTokenizer
from ..tasks.preference import PreferenceTask, make_preference_task
from ..tracking.console import announce
from ..train.engine import TrainEngine, full_state_dict
from ..train.mesh import build_mesh
from .batch import rank_rows
from .build import build_reward_trainee
from .pair_objective import pair_loss, pair_rows
from .resume import restore_run, save_due, save_run
from .reward_scoring import padded_rows, score_rows
from .run import Run, seed_everything
from .step import prefixed, train_on

ROLE = "reward_model"  # the engine's name in checkpoints
EXPORT_DIR = "reward_model"  # <run dir>/reward_model/: the trained reward model as an HF directory
CONSOLE_KEYS = ("reward_model/loss", "reward_model/accuracy", "timing_s/step")


def evaluate_pairs(engine: TrainEngine, task: PreferenceTask, tokenizer, pad_id: int) -> dict[str, float]:
    """Collective: the held-out pairs' preference accuracy and mean margin."""
    t0 = time.perf_counter()
    pairs = task.eval_pairs()
    announce(f"evaluating {len(pairs)} held-out pairs...")
    scores = score_rows(engine, pair_rows(pairs, tokenizer), 2 * len(pairs), pad_id)
    margins = [c - r for c, r in zip(scores[0::2], scores[1::2])]
    return {"eval/accuracy": sum(m > 0 for m in margins) / len(margins), "eval/margin": sum(margins) / len(margins),
            "timing_s/eval": time.perf_counter() - t0}


def export_reward_model(cfg: Config, engine: TrainEngine, tokenizer: HFTokenizer, pad_id: int, run_dir: Path) -> Path:
    """Collective: the trained reward model into <run dir>/reward_model/, written by rank 0."""
    config = reward_config(checkpoint_config(cfg.model.path), pad_id)
    out = export_hf_dir(full_state_dict(engine), Path(cfg.model.path), run_dir / EXPORT_DIR,
                        cfg.trainer.export_max_shard_bytes, tied_embeddings=False, write=dist.get_rank() == 0,
                        tokenizer=tokenizer, config=config)
    dist.barrier()  # nobody reads the export before it is renamed into place
    return out


def train_step(cfg: Config, engine: TrainEngine, task: PreferenceTask, tokenizer, pad_id: int) -> dict[str, float]:
    """One step on the next pairs: this rank's rows of each mini-batch, `algorithm.epochs` passes."""
    t0, alg = time.perf_counter(), cfg.algorithm
    rows = pair_rows(task.train_pairs(cfg.task.prompts_per_step), tokenizer)
    batch = rank_rows(padded_rows(rows, pad_id), engine.dp_rank, engine.dp_size, alg.mini_batches)
    trained = train_on(engine, batch, pair_loss(alg), alg)
    return {**prefixed(ROLE, trained), f"{ROLE}/loss": trained["loss"], "timing_s/train": time.perf_counter() - t0}


def run_reward_training(cfg: Config, out_dir: Path, dist_info: DistInfo) -> None:
    seed_everything(cfg.trainer.seed)
    tokenizer = HFTokenizer(cfg.model.path)
    task = make_preference_task(cfg.task, cfg.trainer.seed)
    run = Run(cfg, out_dir, dist_info, tokenizer, task, cfg.model.path, random.Random(cfg.trainer.seed + 1), None)
    layout = cfg.parallel.train_layout()
    engine = build_reward_trainee(cfg, build_mesh(layout), tokenizer.pad_id)
    pad_id = engine.model.config.pad_token_id
    run.open_tracker(CONSOLE_KEYS)
    try:
        start = 0
        if run.resume_from is not None:
            start = restore_run(run.resume_from, {ROLE: engine}, task).step
        else:
            run.log(0, evaluate_pairs(engine, task, tokenizer, pad_id))
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            t0 = time.perf_counter()
            metrics = train_step(cfg, engine, task, tokenizer, pad_id)
            if step % cfg.task.eval_every == 0 or step == cfg.trainer.total_steps:
                metrics.update(evaluate_pairs(engine, task, tokenizer, pad_id))
            metrics["timing_s/step"] = time.perf_counter() - t0
            run.log(step, metrics)
            if save_due(cfg.trainer, step):
                announce(f"saving the checkpoint of step {step}...")
                save_run(out_dir, step, {ROLE: engine}, run.rng, task, {"dp": layout.dp, "tp": layout.tp},
                         cfg.trainer.keep_checkpoints)
        if cfg.trainer.export_policy:
            path = export_reward_model(cfg, engine, tokenizer, pad_id, out_dir)
            if dist.get_rank() == 0:
                print(f"rlhf_dyna: reward model exported to {path} (reward_model.path={path})", flush=True)
    finally:
        if run.tracker is not None:
            run.tracker.close()
