"""Micro-batch settings a run can use: a token budget >= 0, and none with pipeline parallel."""
from __future__ import annotations

from ..config import Config
from ..errors import ConfigError


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
