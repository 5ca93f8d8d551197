"""One Hydra job: check the config, then dry-run, run in-process under torchrun, or spawn local ranks."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import launch
from .checks import ConfigError, check_config
from .checks.resources import wants_cuda
from .config import RESOLVED_CONFIG, to_config
from .elastic.events import joiner_slots, parse_events
from .models.checkpoint_fields import resolve_model
from .orchestrator.checkpoint_dirs import CheckpointError, resolve_trainer_resume

# vLLM logs every engine detail at INFO; wandb advertises its products: keep the per-step lines readable.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
             "WANDB_SILENT": os.environ.get("WANDB_SILENT", "true")}
# imported once by the launcher, which then forks the ranks: ranks importing them at once on shared cores take longer
RANK_PRELOAD = ("rlhf_dyna.orchestrator.loop", "vllm.entrypoints.llm")


def run_job(dcfg: DictConfig) -> int:
    cfg = to_config(dcfg)
    cfg.recipe = HydraConfig.get().runtime.choices.get("recipe", cfg.recipe)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    torchrun = launch.under_torchrun()
    try:
        resolve_model(cfg)  # the checkpoint's architecture and the context length, as the checks and ranks use them
        check_config(cfg, under_torchrun=torchrun)
        if cfg.dry_run:
            from .orchestrator.dry_run import run_dry_run  # the planner's model catalogs import torch: not a refusal's

            run_dry_run(cfg, out_dir)
            return 0
        cfg.trainer.resume = resolve_trainer_resume(cfg.trainer, out_dir)  # a bad one fails here, not in the ranks
        joiners = len(joiner_slots(parse_events(list(cfg.elastic.events), cfg.trainer.total_steps)))
        if not torchrun:
            launch.check_capacity(cfg.parallel.world_size + joiners, "cuda" if wants_cuda(cfg) else "cpu")
    except (ConfigError, launch.LaunchError, CheckpointError) as err:
        print(f"rlhf_dyna: error: {err}", file=sys.stderr)
        return 2
    OmegaConf.save(OmegaConf.structured(cfg), out_dir / RESOLVED_CONFIG)
    if torchrun:
        from .worker import run_rank  # torch.distributed and the loop: a refused config need not import them

        run_rank(cfg, out_dir)
        return 0
    joining = f" (+{joiners} joining later)" if joiners else ""
    print(f"rlhf_dyna: recipe {cfg.recipe}, {cfg.parallel.world_size} local ranks{joining}, output in {out_dir}",
          flush=True)
    return launch.spawn_ranks(cfg.parallel.world_size, "rlhf_dyna.worker", [str(out_dir)], run_dir=out_dir, env=QUIET_ENV,
                              preload=RANK_PRELOAD, console=cfg.tracking.console, joiners=joiners)
