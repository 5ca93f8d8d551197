"""Checks of a composed config that must pass before any rank is spawned.

Every error is one paragraph: what is wrong, and what would be right.
"""
from __future__ import annotations

import os
from pathlib import Path

from .config import Config, LayoutConfig, ModelConfig


class ConfigError(ValueError):
    pass


CHOICES = {
    "algorithm.name": ("grpo", "ppo"),
    "algorithm.loss_agg": ("token_mean", "seq_mean"),
    "algorithm.kl_estimator": ("k1", "k3"),
    "rollout.engine": ("vllm",),
    "rollout.sync": ("naive", "vps"),
    "task.name": ("arithmetic", "sort_digits"),
    "tracking.wandb_mode": ("offline", "online", "disabled"),
    "trainer.precision": ("fp32", "bf16"),
    "parallel.device": ("auto", "cpu", "cuda"),
    "model.arch": ("llama", "qwen2", "qwen3", "qwen3_moe"),
    "model.dtype": ("float32", "bfloat16", "float16"),
}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _lookup(cfg: Config, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_choices(cfg: Config) -> None:
    for key, valid in CHOICES.items():
        value = _lookup(cfg, key)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not a valid choice; valid: {', '.join(valid)}.")


def resolve_dp(layout: LayoutConfig, world_size: int) -> int:
    """dp=-1 fills the world; otherwise dp * tp * pp * cp must equal the world size."""
    inner = layout.tp * layout.pp * layout.cp
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(layout, name) < 1:
            raise ConfigError(f"parallel.train.{name}={getattr(layout, name)} must be >= 1.")
    if world_size % inner:
        valid = [d for d in divisors(world_size) if d % (layout.pp * layout.cp) == 0]
        raise ConfigError(
            f"parallel.train: tp*pp*cp = {layout.tp}*{layout.pp}*{layout.cp} = {inner} does not divide "
            f"parallel.world_size={world_size}; choose tp*pp*cp among {divisors(world_size)}."
        )
    dp = world_size // inner if layout.dp == -1 else layout.dp
    if dp * inner != world_size:
        raise ConfigError(
            f"parallel.train: dp*tp*pp*cp = {dp}*{layout.tp}*{layout.pp}*{layout.cp} = {dp * inner} but "
            f"parallel.world_size={world_size}; use dp={world_size // inner} (or dp=-1 to fill the world)."
        )
    return dp


def check_tp(model: ModelConfig, tp: int, what: str, allow_kv_replication: bool) -> None:
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if tp < 1 or heads % tp:
        raise ConfigError(
            f"{what}={tp} does not divide num_attention_heads={heads}; valid {what}: {divisors(heads)}."
        )
    kv_ok = kv % tp == 0 or (allow_kv_replication and tp % kv == 0)
    if not kv_ok:
        valid = [t for t in divisors(heads) if kv % t == 0 or (allow_kv_replication and t % kv == 0)]
        raise ConfigError(
            f"{what}={tp} does not fit num_key_value_heads={kv} (it must divide it"
            f"{' or be a multiple of it' if allow_kv_replication else ''}); valid {what}: {valid}."
        )


def check_layout_schedule(cfg: Config) -> None:
    world, steps = cfg.parallel.world_size, [s.step for s in cfg.parallel.schedule]
    if steps != sorted(set(steps)) or any(s < 1 for s in steps):
        raise ConfigError(f"parallel.schedule steps {steps} must be >= 1 and strictly increasing.")
    for i, switch in enumerate(cfg.parallel.schedule):
        where = f"parallel.schedule[{i}] (step {switch.step})"
        if switch.zero not in (1, 2, 3):
            raise ConfigError(f"{where}: zero={switch.zero}; valid: 1, 2, 3.")
        check_tp(cfg.model, switch.tp, f"{where} tp", allow_kv_replication=False)
        dp = world // switch.tp if switch.dp == -1 else switch.dp
        if dp * switch.tp != world:
            raise ConfigError(
                f"{where}: dp*tp = {dp}*{switch.tp} = {dp * switch.tp} but parallel.world_size={world}; "
                f"choose tp among {divisors(world)} and dp = world_size // tp (or dp=-1)."
            )
        if cfg.parallel.train.pp * cfg.parallel.train.cp != 1:
            raise ConfigError(f"{where}: layout changes are supported for dp x tp training layouts (pp=cp=1).")


def check_layouts(cfg: Config) -> None:
    world = cfg.parallel.world_size
    if world < 1:
        raise ConfigError(f"parallel.world_size={world} must be >= 1.")
    resolve_dp(cfg.parallel.train, world)
    check_tp(cfg.model, cfg.parallel.train.tp, "parallel.train.tp", allow_kv_replication=False)
    check_tp(cfg.model, cfg.rollout.tp, "rollout.tp", allow_kv_replication=True)
    if world % cfg.rollout.tp:
        raise ConfigError(
            f"rollout.tp={cfg.rollout.tp} does not divide parallel.world_size={world}; "
            f"valid rollout.tp: {[d for d in divisors(world) if d in divisors(cfg.model.num_attention_heads)]}."
        )
    check_layout_schedule(cfg)
    replicas = world // cfg.rollout.tp
    if cfg.task.prompts_per_step % replicas:
        raise ConfigError(
            f"task.prompts_per_step={cfg.task.prompts_per_step} must be a multiple of the {replicas} rollout "
            f"replicas (world_size / rollout.tp); use {replicas * max(1, cfg.task.prompts_per_step // replicas)}."
        )


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch missing or broken CUDA runtime: no devices
        return 0


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


def validate(cfg: Config, under_torchrun: bool = False) -> None:
    check_choices(cfg)
    check_layouts(cfg)
    if not cfg.dry_run:
        check_resources(cfg, under_torchrun)
