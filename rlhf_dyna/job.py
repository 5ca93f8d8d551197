"""One Hydra job: validate, then dry-run, run in-process under torchrun, or spawn local ranks."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import Config
from .models.checkpoint_fields import resolve_model
from .orchestrator.checkpoint_dirs import CheckpointError, resolve_trainer_resume
from .validate import ConfigError, validate, wants_cuda

RESOLVED_CONFIG = "config_resolved.yaml"
# vLLM logs every engine detail at INFO; wandb advertises its products: keep the per-step lines readable.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
             "WANDB_SILENT": os.environ.get("WANDB_SILENT", "true")}
# imported once by the launcher, which then forks the ranks: ranks importing them at once on shared cores take longer
RANK_PRELOAD = ("rlhf_dyna.orchestrator.loop", "rlhf_dyna.orchestrator.split_run", "vllm.entrypoints.llm")


def to_config(dcfg: DictConfig) -> Config:
    return OmegaConf.to_object(dcfg)  # type: ignore[return-value]


def load_config(path: Path) -> Config:
    schema = OmegaConf.structured(Config)
    return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(path)))  # type: ignore[return-value]


def run_job(dcfg: DictConfig) -> int:
    from . import launch

    cfg = to_config(dcfg)
    cfg.recipe = HydraConfig.get().runtime.choices.get("recipe", cfg.recipe)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    torchrun = launch.under_torchrun()
    try:
        resolve_model(cfg)  # the checkpoint's architecture and the context length, as the checks and ranks use them
        validate(cfg, under_torchrun=torchrun)
        if not cfg.dry_run:  # [ckpt] a bad trainer.resume fails here; the ranks get the concrete step dir
            cfg.trainer.resume = resolve_trainer_resume(cfg.trainer, out_dir)
        if cfg.dry_run:
            from .orchestrator.dry_run import run_dry_run

            run_dry_run(cfg, out_dir)
            return 0
        if not torchrun:
            launch.check_capacity(cfg.parallel.world_size, "cuda" if wants_cuda(cfg) else "cpu")
    except (ConfigError, launch.LaunchError, CheckpointError) as err:
        print(f"rlhf_dyna: error: {err}", file=sys.stderr)
        return 2
    OmegaConf.save(OmegaConf.structured(cfg), out_dir / RESOLVED_CONFIG)
    if torchrun:
        from .worker import run_rank

        run_rank(cfg, out_dir)
        return 0
    print(f"rlhf_dyna: recipe {cfg.recipe}, {cfg.parallel.world_size} local ranks, output in {out_dir}", flush=True)
    return launch.spawn_ranks(cfg.parallel.world_size, "rlhf_dyna.worker", [str(out_dir)], run_dir=out_dir, env=QUIET_ENV,
                              preload=RANK_PRELOAD, console=cfg.tracking.console)
