"""Checks of what the machine must have: devices, the checkpoint's files, torchrun's world."""
from __future__ import annotations

import os
from pathlib import Path

from ..config import Config
from ..launch.host import visible_gpu_count
from ..errors import ConfigError


def cuda_device_count() -> int:
    return visible_gpu_count()  # through NVML: torch.cuda.is_available() here would break the ranks forked later


def wants_cuda(cfg: Config) -> bool:
    return cfg.parallel.device == "cuda" or (cfg.parallel.device == "auto" and cuda_device_count() > 0)


def check_resources(cfg: Config, under_torchrun: bool) -> None:
    """Devices and checkpoint: what the machine lacks, all said at once."""
    missing = []
    world, nodes = cfg.parallel.world_size, cfg.parallel.nodes
    if cfg.parallel.device == "cuda":
        have = cuda_device_count()
        local_needed = world // max(nodes, 1)
        if have < local_needed or (nodes > 1 and not under_torchrun):
            where = f"{nodes} nodes x {local_needed}" if nodes > 1 else f"{local_needed}"
            missing.append(
                f"it needs {world} CUDA devices ({where} per node) and this machine has {have}"
                + ("" if under_torchrun or nodes == 1 else "; multi-node runs start under torchrun on each node")
            )
    if cfg.model.path is not None:
        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            missing.append(f"model.path={cfg.model.path} is not a local HF checkpoint directory (no config.json)")
        elif not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
            missing.append(f"model.path={cfg.model.path} has no safetensors weights (model.safetensors or "
                           f"model.safetensors.index.json); ranks load their shards from those")
    if under_torchrun:
        env_world = int(os.environ.get("WORLD_SIZE", "0"))
        if env_world != world:
            missing.append(f"torchrun started {env_world} ranks but parallel.world_size={world}")
    if missing:
        raise ConfigError(
            f"Recipe {cfg.recipe!r} cannot run here: " + "; ".join(missing) + ". "
            "Run it on a machine that has these, override the keys (e.g. model.path=/your/checkpoint), "
            "or plan its transitions without devices with dry_run=true."
        )
