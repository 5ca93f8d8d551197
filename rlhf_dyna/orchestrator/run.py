"""The state of a run that every phase reads: config, task and tokenizer, model source, the prompt sampler, the KL
controller, the output directory and rank 0's metric sinks. One object, built once per rank, handed to the runtime."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ..algos.kl_control import make_kl_controller
from ..config import Config
from ..launch import DistInfo
from ..models.hf_config import ModelSpec, model_source
from ..tasks.base import BaseTask
from ..tasks.hf_tokenizer import build_tokenizer
from ..tracking.console import CONSOLE_KEYS
from ..tracking.tracker import Tracker
from .build import build_task

SAMPLE_SEED_STRIDE = (1_000_003, 10_007)  # a step's sampling seed: seed * 1_000_003 + step * 10_007


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Run:
    cfg: Config
    out_dir: Path
    dist_info: DistInfo
    tokenizer: object  # the checkpoint's own, or the toy character tokenizer
    task: BaseTask
    source: ModelSpec | str  # a checkpoint directory, or the spec of a random-init model
    rng: random.Random  # the prompt sampler: the same stream on every rank
    kl_ctl: object  # the KL coefficient's controller (algos.kl_control)
    tracker: Tracker | None = None  # rank 0 only
    start_step: int = 0  # the last step done before this process started (resume)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def resume_from(self) -> Path | None:
        """The step directory to resume from, resolved before spawn (job.py)."""
        return Path(self.cfg.trainer.resume) if self.cfg.trainer.resume else None

    def sample_seed(self, step: int) -> int:
        """vLLM's sampling seed of a step's rollouts, with global prompt indices: the same samples in every layout."""
        return self.cfg.trainer.seed * SAMPLE_SEED_STRIDE[0] + step * SAMPLE_SEED_STRIDE[1]

    def open_tracker(self, console_keys: tuple[str, ...] = CONSOLE_KEYS, after_step: int | None = None) -> None:
        """Rank 0's metric sinks: metrics.jsonl, wandb and the console (whose step lines show `console_keys`);
        `after_step`: the run goes on after that step, and metrics.jsonl drops its rows of later ones."""
        if self.rank == 0:
            cfg = self.cfg
            run_config = OmegaConf.to_container(OmegaConf.structured(cfg))
            self.tracker = Tracker(self.out_dir, asdict(cfg.tracking), cfg.tracking.console, cfg.trainer.total_steps,
                                   run_config, console_keys, after_step)

    def rolled_back(self, step: int) -> bool:
        """A recovery rolled the run back to the state after `step`: rank 0's sinks go on from the next step, its
        tracker rewound, or opened here where rank 0 was lost (its successor writes the metrics from now on, as after
        a leave; the rows the lost rank 0 wrote past `step` go). True where this rank opened them."""
        if self.rank != 0:
            return False
        if self.tracker is not None:
            self.tracker.rewind(step)
            return False
        self.open_tracker(after_step=step)
        return True

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.tracker is not None:
            self.tracker.log(step, metrics)


def make_run(cfg: Config, out_dir: Path, dist_info: DistInfo) -> Run:
    seed_everything(cfg.trainer.seed)
    tokenizer = build_tokenizer(cfg.model.path)
    task = build_task(cfg, tokenizer)
    alg = cfg.algorithm
    kl_ctl = make_kl_controller(alg.kl_ctrl, alg.kl_coef, alg.kl_target, alg.kl_horizon)
    return Run(cfg, out_dir, dist_info, tokenizer, task, model_source(cfg.model, tokenizer),
               random.Random(cfg.trainer.seed + 1), kl_ctl)
