"""Checks of the parallel layouts: the training layout and every scheduled one fill the world and fit the model,
vLLM's TP groups fit it, each step's rows split evenly, and what the live engines cannot run yet is refused."""
from __future__ import annotations

import json
from pathlib import Path

from ..config import Config, ModelConfig
from ..models.architectures import live_architectures
from ..parallel_layout import LayoutError, ParallelLayout, divisors
from ..errors import ConfigError
from .moe import MoeConfigError, check_moe_live, is_moe
from .pipeline import pipeline_problems
from .resources import cuda_device_count

LIVE_SUPPORT = ("Live runs support dense models (llama, qwen2, qwen3) trained in dp x tp layouts (FSDP2 at zero 1-3, "
                "DTensor tensor parallel) and pp x dp pipeline layouts with vLLM rollout at any rollout.tp; dry_run=true "
                "plans every layout, pipeline / context / expert parallel and MoE included.")


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


def resolved_layouts(cfg: Config) -> list[tuple[str, ParallelLayout]]:
    """(key prefix, layout over the world) of parallel.train and of every parallel.schedule entry, each checked
    against the world size."""
    try:
        schedule = cfg.parallel.layout_schedule()
        return [("parallel.train.", cfg.parallel.train_layout())] + [
            (f"parallel.schedule[{i}] (step {s.step}) ", s.layout) for i, s in enumerate(schedule)]
    except LayoutError as err:
        raise ConfigError(str(err)) from err


def check_layout_schedule(cfg: Config) -> None:
    steps = [s.step for s in cfg.parallel.schedule]
    if steps != sorted(set(steps)) or any(s < 1 for s in steps):
        raise ConfigError(f"parallel.schedule steps {steps} must be >= 1 and strictly increasing.")
    for i, switch in enumerate(cfg.parallel.schedule):
        if switch.cp != 1:
            raise ConfigError(f"parallel.schedule[{i}] (step {switch.step}): cp={switch.cp}; layout changes are "
                              f"supported for dp x tp, pp x dp and expert-parallel training layouts (cp=1).")
        if switch.ep != 1 and (switch.tp > 1 or switch.pp > 1):
            raise ConfigError(f"parallel.schedule[{i}] (step {switch.step}): ep={switch.ep} with tp={switch.tp}, "
                              f"pp={switch.pp}: expert parallel runs live over dp ranks only; use tp=1, pp=1.")


def check_layouts(cfg: Config) -> None:
    world, m = cfg.parallel.world_size, cfg.model
    if world < 1:
        raise ConfigError(f"parallel.world_size={world} must be >= 1.")
    check_layout_schedule(cfg)
    for where, layout in resolved_layouts(cfg):
        problems = layout.model_problems(m.num_attention_heads, m.num_key_value_heads, m.num_experts, where)
        if problems:
            raise ConfigError("; ".join(problems) + ".")
    check_tp(m, cfg.rollout.tp, "rollout.tp", allow_kv_replication=True)
    if world % cfg.rollout.tp:
        raise ConfigError(
            f"rollout.tp={cfg.rollout.tp} does not divide parallel.world_size={world}; "
            f"valid rollout.tp: {[d for d in divisors(world) if d in divisors(m.num_attention_heads)]}."
        )
    check_batch_split(cfg)
    replicas = world // cfg.rollout.tp
    if cfg.task.prompts_per_step % replicas:
        raise ConfigError(
            f"task.prompts_per_step={cfg.task.prompts_per_step} must be a multiple of the {replicas} rollout "
            f"replicas (world_size / rollout.tp); use {replicas * max(1, cfg.task.prompts_per_step // replicas)}."
        )


def check_batch_split(cfg: Config) -> None:
    """Each step's rows (prompts x samples) split into mini-batches, each into equal dp shards, in every layout."""
    rows, minis = cfg.task.prompts_per_step * cfg.rollout.n, cfg.algorithm.mini_batches
    for dp in sorted({layout.dp for _, layout in resolved_layouts(cfg)}):
        if rows % (minis * dp):
            raise ConfigError(
                f"task.prompts_per_step * rollout.n = {cfg.task.prompts_per_step} * {cfg.rollout.n} = {rows} rows per step "
                f"do not split into algorithm.mini_batches={minis} x dp={dp} equal shards; make the rows a multiple of "
                f"{minis * dp} (e.g. task.prompts_per_step={-(-cfg.task.prompts_per_step // (minis * dp)) * minis * dp})."
            )


def run_model_type(cfg: Config) -> str:
    """The architecture the run trains: the checkpoint's model_type, else model.arch."""
    config = Path(cfg.model.path) / "config.json" if cfg.model.path else None
    if config is not None and config.is_file():
        return json.loads(config.read_text()).get("model_type", cfg.model.arch)
    return cfg.model.arch


def check_runs_live(cfg: Config) -> None:
    """What the dry run plans but the live engines cannot run yet, refused before spawn."""
    t, model_type = cfg.parallel.train, run_model_type(cfg)
    if model_type not in live_architectures():
        raise ConfigError(
            f"model_type={model_type!r} does not train live: the live architectures are "
            f"{', '.join(live_architectures())}. Add it to rlhf_dyna/models/architectures.py (docs/extending.md), "
            f"or plan this configuration without devices with dry_run=true.")
    if is_moe(cfg) or cfg.rollout.expert_parallel:  # MoE runs live at ep=1; checks.moe says what else it needs
        try:
            check_moe_live(cfg, on_cpu=cfg.parallel.device == "cpu" or cuda_device_count() == 0)
        except MoeConfigError as err:
            raise ConfigError(str(err)) from err
    ep_refused_above_moe = ("ep",) if not is_moe(cfg) else ()
    unsupported = [f"parallel.train.{name}={getattr(t, name)}" for name in ("cp",) + ep_refused_above_moe
                   if getattr(t, name) > 1]
    if unsupported:
        raise ConfigError(
            f"{', '.join(unsupported)} does not run live yet. {LIVE_SUPPORT} Set parallel.train.cp=1 ep=1 with a "
            f"dense model, or add dry_run=true to plan this configuration without devices."
        )
    problems = pipeline_problems(cfg)
    if problems:
        raise ConfigError("Pipeline-parallel settings cannot run: " + "; ".join(problems) + ".")
