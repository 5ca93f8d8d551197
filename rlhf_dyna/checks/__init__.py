"""Checks of a composed config that run before any rank is spawned, one module per concern; `check_config` runs them
all. Every refusal is a ConfigError of one paragraph: what is wrong, and what would be right."""
from __future__ import annotations

from ..config import Config
from .algorithm import check_algorithm
from .context import check_lengths
from .data import check_data
from .elastic import check_elastic
from ..errors import ConfigError
from .gpu import check_gpu
from .layouts import check_layouts, check_runs_live
from .micro_batches import check_micro_batches
from .model_files import check_weight_files
from .placement import check_placement_config
from .replicas import check_replicas
from .resources import check_resources
from .reward_model import check_reward_models
from .values import check_choices, check_values

__all__ = ["ConfigError", "check_config"]


def check_config(cfg: Config, under_torchrun: bool = False) -> None:
    check_choices(cfg)
    check_values(cfg)
    check_micro_batches(cfg)
    check_algorithm(cfg)
    check_layouts(cfg)
    check_placement_config(cfg)
    check_elastic(cfg, under_torchrun)
    check_replicas(cfg, under_torchrun)
    if cfg.dry_run:
        return
    check_gpu(cfg, under_torchrun)
    check_resources(cfg, under_torchrun)
    check_weight_files(cfg.model.path)
    check_runs_live(cfg)
    try:
        check_data(cfg)
    except ValueError as err:  # the data checks raise plain ValueErrors from the task and reward modules
        raise ConfigError(str(err)) from err
    check_reward_models(cfg)
    check_lengths(cfg)
