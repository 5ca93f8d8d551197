"""One Hydra job: check the config, then dry-run, run in-process under torchrun, or spawn local ranks."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import launch
from .checks import ConfigError, check_config
from .checks.elastic import check_events_after_resume, join_refusal
from .checks.micro_batches import resolve_share_prompts
from .checks.resources import wants_cuda
from .config import RESOLVED_CONFIG, load_config, to_config
from .elastic.events import joiner_slots, parse_events
from .elastic.replicas import recovers_from_checkpoint
from .models.checkpoint_fields import resolve_model
from .launch.join_file import running_job
from .launch.output import stacks_on_signal
from .orchestrator.checkpoint_dirs import CheckpointError, read_marker, resolve_trainer_resume

# vLLM logs every engine detail at INFO; wandb advertises its products: keep the per-step lines readable.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
             "WANDB_SILENT": os.environ.get("WANDB_SILENT", "true")}
# imported once by the launcher, which then forks the ranks (CPU only): ranks importing them at once on shared cores
# take longer; the CPU worker and model loader are what vLLM imports when its engine starts, and its kernel overrides
# what every engine start would redo
RANK_PRELOAD = ("rlhf_dyna.orchestrator.loop", "vllm.entrypoints.llm", "vllm.model_executor.model_loader",
                "rlhf_dyna.rollout.cpu_worker:kernel_overrides_once")


def join_running_job(run_dir: str) -> int:
    """`elastic.join=RUN_DIR`: this process joins the job running there, with its config (orchestrator/joiner.py)."""
    try:
        job = running_job(run_dir)
    except launch.LaunchError as err:
        print(f"rlhf_dyna: error: {err}", file=sys.stderr)
        return 2
    os.environ.update(MASTER_ADDR=job.host, MASTER_PORT=str(job.port), VLLM_DIST_IDENT=job.run_ident,
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", **QUIET_ENV)
    print(f"rlhf_dyna: joining the job in {run_dir} (launched with {job.world_size} ranks); preparing...", flush=True)
    from .worker import run_requested_join  # torch, vLLM and the loop: a refused request need not import them

    return run_requested_join(load_config(Path(job.config)), Path(run_dir))


def run_job(dcfg: DictConfig) -> int:
    cfg = to_config(dcfg)
    if cfg.elastic.join is not None:  # the running job's config, not this command line's, says what to run
        return join_running_job(cfg.elastic.join)
    cfg.recipe = HydraConfig.get().runtime.choices.get("recipe", cfg.recipe)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    torchrun = launch.under_torchrun()
    try:
        resolve_model(cfg)  # the checkpoint's architecture and the context length, as the checks and ranks use them
        cuda = wants_cuda(cfg)
        cfg.trainer.precision = launch.resolve_precision(cfg.trainer.precision, cuda)  # "auto" resolved
        cfg.algorithm.share_prompts = resolve_share_prompts(cfg, cuda)  # "auto" resolved
        check_config(cfg, under_torchrun=torchrun)
        if cfg.dry_run:
            from .orchestrator.dry_run import run_dry_run  # the planner's model catalogs import torch: not a refusal's

            run_dry_run(cfg, out_dir)
            return 0
        asked, cfg.trainer.resume = cfg.trainer.resume, resolve_trainer_resume(cfg.trainer, out_dir)  # a bad one fails here
        if cfg.trainer.resume is not None and cfg.elastic.events:
            marker = read_marker(Path(cfg.trainer.resume))
            check_events_after_resume(cfg, asked, cfg.trainer.resume, marker["step"], marker["world_size"])
        joiners = len(joiner_slots(parse_events(list(cfg.elastic.events), cfg.trainer.total_steps)))
        if cfg.elastic.accept_joins is None:  # auto: where the run can take a join live
            cfg.elastic.accept_joins = join_refusal(cfg, torchrun) is None
        if not torchrun:
            launch.check_capacity(cfg.parallel.world_size + joiners, "cuda" if cuda else "cpu")
    except (ConfigError, launch.LaunchError, CheckpointError) as err:
        print(f"rlhf_dyna: error: {err}", file=sys.stderr)
        return 2
    OmegaConf.save(OmegaConf.structured(cfg), out_dir / RESOLVED_CONFIG)
    if torchrun:
        from .worker import run_rank  # torch.distributed and the loop: a refused config need not import them

        run_rank(cfg, out_dir, announce_joins=cfg.elastic.accept_joins)
        return 0
    joining = f" (+{joiners} joining later)" if joiners else ""
    print(f"rlhf_dyna: recipe {cfg.recipe}, {cfg.parallel.world_size} local ranks{joining}, output in {out_dir}",
          flush=True)
    stacks_on_signal(out_dir, "launcher")  # kill -USR1: where the launcher waits (each rank answers it too)
    return launch.spawn_ranks(cfg.parallel.world_size, "rlhf_dyna.worker", [str(out_dir)], run_dir=out_dir, env=QUIET_ENV,
                              preload=RANK_PRELOAD, console=cfg.tracking.console, joiners=joiners,
                              join_config=out_dir / RESOLVED_CONFIG if cfg.elastic.accept_joins else None,
                              replicas=cfg.elastic.replicas == 1,
                              checkpoint_recovery=recovers_from_checkpoint(cfg.elastic.replicas,
                                                                           cfg.elastic.recover_from_checkpoint))
