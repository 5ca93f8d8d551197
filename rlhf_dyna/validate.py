"""Checks of a composed config that must pass before any rank is spawned.

Every error is one paragraph: what is wrong, and what would be right.
"""
from __future__ import annotations

import os
from pathlib import Path

from .algos.choices import KL_CONTROLLERS, KL_ESTIMATOR_NAMES, LOSS_AGGS
from .checks.errors import ConfigError
from .checks.micro_batches import check_micro_batches
from .config import Config, LayoutConfig, ModelConfig
from .validate_algorithm import check_algorithm
from .validate_moe import MoeConfigError, check_moe_live, is_moe


CHOICES = {
    "algorithm.name": ("grpo", "ppo"),
    "algorithm.loss_agg": (*LOSS_AGGS, "seq_mean"),
    "algorithm.kl_estimator": KL_ESTIMATOR_NAMES,
    "algorithm.kl_ctrl": KL_CONTROLLERS,
    "algorithm.grpo_std": ("population", "unbiased"),
    "rollout.engine": ("vllm",),
    "rollout.sync": ("naive", "vps"),
    "task.name": ("arithmetic", "sort_digits", "file"),
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
        dp = world // (switch.tp * switch.pp) if switch.dp == -1 else switch.dp
        if dp * switch.tp * switch.pp != world:
            raise ConfigError(
                f"{where}: dp*tp*pp = {dp}*{switch.tp}*{switch.pp} = {dp * switch.tp * switch.pp} but "
                f"parallel.world_size={world}; choose tp*pp among {divisors(world)} and dp = world_size // (tp*pp) (or dp=-1)."
            )
        if cfg.parallel.train.cp != 1:
            raise ConfigError(f"{where}: layout changes are supported for dp x tp and pp x dp training layouts (cp=1).")
        if switch.ep != 1:
            check_switch_ep(cfg, where, dp, switch)


def check_switch_ep(cfg: Config, where: str, dp: int, switch) -> None:
    """An expert-parallel layout in the schedule: MoE, over dp ranks only (parallel_dims says what else it needs)."""
    from .parallel_dims import ParallelDims  # deferred: parallel_dims imports this module

    if cfg.model.num_experts == 0:
        raise ConfigError(f"{where}: ep={switch.ep} on a dense model (model.num_experts=0); use ep=1.")
    if switch.tp > 1 or switch.pp > 1:
        raise ConfigError(f"{where}: ep={switch.ep} with tp={switch.tp}, pp={switch.pp}: expert parallel runs live over "
                          f"dp ranks only; use tp=1, pp=1.")
    dims = ParallelDims(cfg.parallel.world_size, dp=dp, tp=1, ep=switch.ep)
    problems = [p.replace("parallel.train.ep", f"{where} ep") for p in dims.expert_parallel_problems(cfg.model.num_experts)]
    if problems:
        raise ConfigError("; ".join(problems) + ".")


def check_layouts(cfg: Config) -> None:
    world = cfg.parallel.world_size
    if world < 1:
        raise ConfigError(f"parallel.world_size={world} must be >= 1.")
    resolve_dp(cfg.parallel.train, world)
    check_tp(cfg.model, cfg.parallel.train.tp, "parallel.train.tp", allow_kv_replication=False)
    if cfg.parallel.train.ep > 1 and cfg.model.num_experts == 0:
        raise ConfigError(
            f"parallel.train.ep={cfg.parallel.train.ep} on a dense model (model.num_experts=0): expert parallel shards "
            f"the experts of an MoE model; use parallel.train.ep=1, or an MoE model (e.g. model=qwen3_235b_a22b)."
        )
    check_tp(cfg.model, cfg.rollout.tp, "rollout.tp", allow_kv_replication=True)
    if world % cfg.rollout.tp:
        raise ConfigError(
            f"rollout.tp={cfg.rollout.tp} does not divide parallel.world_size={world}; "
            f"valid rollout.tp: {[d for d in divisors(world) if d in divisors(cfg.model.num_attention_heads)]}."
        )
    check_layout_schedule(cfg)
    check_batch_split(cfg)
    replicas = world // cfg.rollout.tp
    if cfg.task.prompts_per_step % replicas:
        raise ConfigError(
            f"task.prompts_per_step={cfg.task.prompts_per_step} must be a multiple of the {replicas} rollout "
            f"replicas (world_size / rollout.tp); use {replicas * max(1, cfg.task.prompts_per_step // replicas)}."
        )


# key -> (test, what a right value is); each is known before spawn, so none may reach a rank
VALUE_RULES: dict[str, tuple] = {
    "rollout.n": (lambda v: v >= 1, "an integer >= 1 (samples per prompt; GRPO needs >= 2 for a group baseline)"),
    "rollout.temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": (lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    "rollout.max_new_tokens": (lambda v: v >= 1, "an integer >= 1"),
    "rollout.kv_cache_bytes": (lambda v: v >= 0, ">= 0 (0 = vLLM sizes the cache)"),
    "algorithm.lr": (lambda v: v > 0, "> 0, e.g. 1e-6 for a pretrained model"),
    "algorithm.critic_lr": (lambda v: v > 0, "> 0"),
    "algorithm.weight_decay": (lambda v: v >= 0, ">= 0"),
    "algorithm.grad_clip": (lambda v: v > 0, "> 0"),
    "algorithm.clip_eps_low": (lambda v: 0 <= v <= 1, "in [0, 1] (1 = no lower clip)"),
    "algorithm.clip_eps_high": (lambda v: v >= 0, ">= 0"),
    "algorithm.kl_coef": (lambda v: v >= 0, ">= 0 (0 = no reference model)"),
    "algorithm.gamma": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.lam": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.vf_clip": (lambda v: v >= 0, ">= 0"),
    "algorithm.epochs": (lambda v: v >= 1, "an integer >= 1"),
    "algorithm.mini_batches": (lambda v: v >= 1, "an integer >= 1"),
    "algorithm.micro_batch_size": (lambda v: v >= 1, "an integer >= 1 (rows per forward/backward on a rank)"),
    "algorithm.entropy_coef": (lambda v: v >= 0, ">= 0 (0 = no entropy bonus; entropy is logged either way)"),
    "algorithm.clip_ratio_c": (lambda v: v == 0 or v > 1, "0 (dual-clip off) or > 1, e.g. 3.0"),
    "algorithm.kl_target": (lambda v: v > 0, "> 0 (the KL per token the adaptive controller steers to)"),
    "algorithm.kl_horizon": (lambda v: v >= 1, "an integer >= 1 (samples)"),
    "algorithm.loss_norm_len": (lambda v: v >= 0, "an integer >= 0 (0 = rollout.max_new_tokens)"),
    "task.prompts_per_step": (lambda v: v >= 1, "an integer >= 1"),
    "task.eval_size": (lambda v: v >= 1, "an integer >= 1"),
    "task.eval_every": (lambda v: v >= 1, "an integer >= 1 (steps between evaluations)"),
    "trainer.total_steps": (lambda v: v >= 0, "an integer >= 0"),
    "trainer.sft_warmup_steps": (lambda v: v >= 0, "an integer >= 0"),
    "trainer.sft_lr": (lambda v: v > 0, "> 0"),
    "trainer.sft_batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "parallel.train.zero": (lambda v: v in (1, 2, 3), "1, 2 or 3"),
}


def check_values(cfg: Config) -> None:
    for key, (ok, right) in VALUE_RULES.items():
        value = _lookup(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is out of range; it must be {right}.")
    betas = tuple(cfg.algorithm.betas)
    if not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"algorithm.betas={list(betas)} must both lie in [0, 1), e.g. [0.9, 0.999].")
    r = cfg.rollout
    if r.temperature == 0 and r.n > 1:
        raise ConfigError(
            f"rollout.temperature=0 (greedy) with rollout.n={r.n} draws {r.n} identical samples per prompt, so every "
            f"group advantage is 0 and nothing trains; use rollout.temperature > 0 (e.g. 1.0) or rollout.n=1."
        )
    if cfg.algorithm.adv_estimator == "grpo" and r.n < 2:  # other estimators: validate_algorithm
        raise ConfigError(
            f"algorithm.name=grpo with rollout.n={r.n}: GRPO's baseline is the mean reward of a prompt's group, so one "
            f"sample per prompt has advantage 0; use rollout.n >= 2 (e.g. 8), or algorithm=ppo for a learned baseline."
        )


LIVE_SUPPORT = ("Live runs support dense models (llama, qwen2, qwen3) trained in dp x tp layouts (FSDP2 at zero 1-3, "
                "DTensor tensor parallel) and pp x dp pipeline layouts with vLLM rollout at any rollout.tp; dry_run=true plans every layout, "
                "pipeline / context / expert parallel and MoE included.")


def check_runs_live(cfg: Config) -> None:
    """What the dry run plans but the live engines cannot run yet, refused before spawn."""
    t, m = cfg.parallel.train, cfg.model
    if is_moe(cfg) or cfg.rollout.expert_parallel:  # MoE runs live at ep=1; validate_moe says what else it needs
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
    from .validate_pp import pipeline_problems

    problems = pipeline_problems(cfg)
    if problems:
        raise ConfigError("Pipeline-parallel settings cannot run: " + "; ".join(problems) + ".")


def check_batch_split(cfg: Config) -> None:
    """Each step's rows (prompts x samples) split into mini-batches, each into equal dp shards, in every layout."""
    rows, minis = cfg.task.prompts_per_step * cfg.rollout.n, cfg.algorithm.mini_batches
    world = cfg.parallel.world_size
    dps = {resolve_dp(cfg.parallel.train, world)} | {world // (s.tp * s.pp) if s.dp == -1 else s.dp for s in cfg.parallel.schedule}
    for dp in sorted(dps):
        if rows % (minis * dp):
            raise ConfigError(
                f"task.prompts_per_step * rollout.n = {cfg.task.prompts_per_step} * {cfg.rollout.n} = {rows} rows per step "
                f"do not split into algorithm.mini_batches={minis} x dp={dp} equal shards; make the rows a multiple of "
                f"{minis * dp} (e.g. task.prompts_per_step={-(-cfg.task.prompts_per_step // (minis * dp)) * minis * dp})."
            )


def check_lengths(cfg: Config) -> None:
    """Prompt + completion must fit vLLM's max_model_len (model.max_position_embeddings)."""
    r = cfg.rollout
    t, limit = cfg.task, cfg.model.max_position_embeddings
    if t.name == "file" and t.max_prompt_tokens > 0 and t.max_prompt_tokens + r.max_new_tokens > limit:
        raise ConfigError(
            f"task.max_prompt_tokens + rollout.max_new_tokens = {t.max_prompt_tokens} + {r.max_new_tokens} exceeds "
            f"model.max_position_embeddings={limit} (vLLM's max_model_len); raise model.max_position_embeddings to at "
            f"least {t.max_prompt_tokens + r.max_new_tokens} (within the checkpoint's) or lower the other two."
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
    check_values(cfg)
    check_micro_batches(cfg)
    check_algorithm(cfg, ConfigError)
    check_layouts(cfg)
    from .orchestrator.placements import check_placement_config  # here: it imports ConfigError from this module

    check_placement_config(cfg)
    if not cfg.dry_run:
        check_resources(cfg, under_torchrun)
        check_runs_live(cfg)
        from .tasks.validate_data import check_data  # deferred: datasets / transformers load only for real runs

        try:
            check_data(cfg)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        check_lengths(cfg)
