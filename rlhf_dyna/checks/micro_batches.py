"""Micro-batch settings a run can use: a token budget >= 0, and none with pipeline parallel; prompts shared (one
forward for a prompt's rows) only where training is data parallel."""
from __future__ import annotations

from ..config import Config, LayoutConfig
from ..errors import ConfigError
from ..parallel_layout import ParallelLayout


def check_micro_batches(cfg: Config) -> None:
    tokens = cfg.algorithm.micro_batch_tokens
    if tokens < 0:
        raise ConfigError(f"algorithm.micro_batch_tokens={tokens} is out of range; it must be 0 (micro-batches of "
                          f"algorithm.micro_batch_size rows) or > 0 (rows packed by length, rows x longest row <= it).")
    stages = [cfg.parallel.train.pp] + [switch.pp for switch in cfg.parallel.schedule]
    if tokens > 0 and max(stages) > 1:
        raise ConfigError(f"algorithm.micro_batch_tokens={tokens} with pipeline parallel (pp={max(stages)}): a "
                          f"pipeline's micro-batches share one static shape, so they cannot be packed by length; set "
                          f"algorithm.micro_batch_tokens=0 and size them with algorithm.micro_batch_size.")
    bad = not_data_parallel(cfg)
    if cfg.algorithm.share_prompts == "on" and bad is not None:
        raise ConfigError(f"algorithm.share_prompts=on with a training layout of tp={bad.tp}, pp={bad.pp}, ep={bad.ep}, "
                          f"cp={bad.cp}: prompts are shared only where training is data parallel (FSDP, "
                          f"tp=pp=ep=cp=1); set algorithm.share_prompts=off (or auto) or train data parallel.")


def not_data_parallel(cfg: Config) -> LayoutConfig | None:
    """The first training layout of the run (parallel.train, then parallel.schedule) that is not data parallel only."""
    layouts = [cfg.parallel.train, *cfg.parallel.schedule]
    return next((lay for lay in layouts if not ParallelLayout.of(lay).data_parallel_only), None)


def resolve_share_prompts(cfg: Config, cuda: bool) -> str:
    """algorithm.share_prompts=auto: on where training is data parallel on the CPU (on GPUs a 4-D attention mask
    would take attention off its fused kernels), else off; other values as given."""
    if cfg.algorithm.share_prompts != "auto":
        return cfg.algorithm.share_prompts
    return "on" if not cuda and not_data_parallel(cfg) is None else "off"
