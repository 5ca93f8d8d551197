"""Build what a rank holds: the task, the model source, and the actor / critic / reference engines on a mesh."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ..config import Config
from ..elastic.placement import ACTOR, CRITIC
from ..models.build import VALUE_HEAD, build_critic, build_policy, save_hf_dir
from ..models.hf_config import ModelSpec, make_hf_config
from ..models.meta_init import (checkpoint_config, checkpoint_loader, meta_critic, meta_policy, recompute_buffers_,
                                value_head_init)
from ..models.reward import meta_reward_model, reward_config, score_head_init
from ..models.reward_catalog import SCORE_HEAD
from ..tasks.base import BaseTask, make_task
from ..tasks.file_task import make_file_task
from ..tasks.tokenizer import CharTokenizer
from ..tracking.console import announce
from ..train.copy_shards import copy_local_shards_
from ..train.engine import TrainEngine, full_state_dict
from ..train.pipeline_engine import make_engine

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_task(cfg: Config, tokenizer=None) -> BaseTask:
    t = cfg.task
    if t.name == "file":  # the checkpoint's tokenizer measures prompts for task.max_prompt_tokens
        return make_file_task(t, cfg.trainer.seed, tokenizer)
    return make_task(
        t.name, seed=cfg.trainer.seed, eval_size=t.eval_size, partial_credit=t.partial_credit,
        min_digits=t.min_digits, max_digits=t.max_digits,
    )


def _device(mesh) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")


def engine_settings(cfg: Config, trainable: bool, lr: float | None = None) -> dict:
    """`make_engine`'s settings of the run's engines: a trainable one (AdamW at `lr`, the actor's by default) or a
    frozen one (the reference)."""
    alg = cfg.algorithm
    common = dict(pp_schedule=cfg.parallel.train.pp_schedule, precision=cfg.trainer.precision,
                  micro_batch_size=alg.micro_batch_size, micro_batch_tokens=alg.micro_batch_tokens,
                  zero=cfg.parallel.train.zero, share_prompts=alg.share_prompts == "on")
    if not trainable:
        return {**common, "trainable": False}
    return {**common, "lr": alg.lr if lr is None else lr, "weight_decay": alg.weight_decay, "betas": tuple(alg.betas),
            "grad_clip": alg.grad_clip}


def build_actor(cfg: Config, source: ModelSpec | str, mesh) -> TrainEngine:
    """Random init: the full seeded model, then sharded (tiny recipes, bit-identical across layouts). A checkpoint:
    built on meta, sharded, and each rank reads only its shards (models.meta_init)."""
    announce(f"building the actor from {source}..." if isinstance(source, str) else "building the actor...")
    if isinstance(source, str):
        policy, materialize = meta_policy(checkpoint_config(source), DTYPES["fp32"]), checkpoint_loader(source, _device(mesh))
    else:
        policy, materialize = build_policy(source, DTYPES["fp32"], seed=cfg.trainer.seed), None
    return make_engine(policy, mesh, materialize=materialize, **engine_settings(cfg, trainable=True))


def build_critic_engine(cfg: Config, source: ModelSpec | str, actor: TrainEngine) -> TrainEngine:
    """A checkpoint gives the backbone per shard (meta build); the value head is random, seeded, either way. With
    algorithm.critic_init=reward_model the reward model gives both (InstructGPT's critic)."""
    if cfg.algorithm.critic_init == "reward_model":
        return critic_from_reward_model(cfg, actor)
    if isinstance(source, str):
        config = checkpoint_config(source)
        head = value_head_init(config, DTYPES["fp32"], seed=cfg.trainer.seed + 1)
        critic, materialize = meta_critic(config, DTYPES["fp32"]), checkpoint_loader(source, actor.device, extra=head)
    else:
        critic, materialize = build_critic(source, DTYPES["fp32"], seed=cfg.trainer.seed + 1), None
    return make_engine(critic, actor.mesh, materialize=materialize,
                       **engine_settings(cfg, trainable=True, lr=cfg.algorithm.critic_lr))


def critic_from_reward_model(cfg: Config, actor: TrainEngine) -> TrainEngine:
    """PPO's critic from the reward model (reward_model.path): its backbone, and its score head as the value head
    (no bias in a score head: the value head's starts at 0), so the critic's first values are the reward model's
    score of each prefix. Built on meta with the reward model's architecture, loaded per shard beside the actor."""
    path = cfg.reward_model.path
    announce(f"building the critic from the reward model {path}...")
    config = checkpoint_config(path)
    materialize = checkpoint_loader(path, actor.device, extra={f"{VALUE_HEAD}.bias": torch.zeros(1)},
                                    renamed={f"{VALUE_HEAD}.weight": f"{SCORE_HEAD}.weight"})
    return make_engine(meta_critic(config, DTYPES["fp32"]), actor.mesh, materialize=materialize,
                       **engine_settings(cfg, trainable=True, lr=cfg.algorithm.critic_lr))


def build_reward_engine(cfg: Config, mesh) -> TrainEngine:
    """The reward model (reward_model.path), frozen, built on meta and loaded per shard on `mesh` (dp x tp, ZeRO-3:
    forward-only, nothing to keep replicated)."""
    path = cfg.reward_model.path
    announce(f"building the reward model from {path}...")
    model = meta_reward_model(checkpoint_config(path), DTYPES["fp32"])
    return TrainEngine(model, mesh, precision=cfg.trainer.precision, micro_batch_size=cfg.algorithm.micro_batch_size,
                       trainable=False, zero=3, materialize=checkpoint_loader(path, _device(mesh)))


def build_reward_trainee(cfg: Config, mesh, pad_token_id: int) -> TrainEngine:
    """algorithm.name=reward_model: a one-label sequence classifier from model.path (a causal LM: its backbone, a
    seeded score head; or a reward model, head included), trainable, loaded per shard on `mesh` (dp x tp). A micro-batch
    holds `algorithm.micro_batch_size` pairs: twice as many rows, each pair's two rows in one micro-batch."""
    path = cfg.model.path
    announce(f"building the reward model to train from {path}...")
    config = reward_config(checkpoint_config(path), pad_token_id)
    head = score_head_init(config, DTYPES["fp32"], seed=cfg.trainer.seed + 1)
    settings = {k: v for k, v in engine_settings(cfg, trainable=True).items() if k != "pp_schedule"}
    settings["micro_batch_size"] = 2 * cfg.algorithm.micro_batch_size
    return TrainEngine(meta_reward_model(config, DTYPES["fp32"]), mesh,
                       materialize=checkpoint_loader(path, _device(mesh), extra=head), **settings)


def build_reference(cfg: Config, source: ModelSpec | str, actor: TrainEngine) -> TrainEngine:
    """A frozen copy of the actor's current weights (taken after any warm-up), sharded like the actor: built on meta
    with the same layout and filled from the actor's local shards, so no rank ever holds a full copy."""
    def copy_from_actor(model) -> None:
        model.to_empty(device=actor.device)
        copy_local_shards_(model, actor.model)
    ref = meta_policy(actor.model.config, DTYPES["fp32"])
    return make_engine(ref, actor.mesh, materialize=copy_from_actor, **engine_settings(cfg, trainable=False))


def write_initial_checkpoint(source: ModelSpec | str, actor: TrainEngine, tokenizer: CharTokenizer, out_dir: Path,
                             node_rank: int, local_rank: int) -> Path:
    """vLLM opens a model directory; a random-init run writes its initial weights there, once per node
    (nodes need not share a filesystem)."""
    if isinstance(source, str):
        return Path(source)
    model_dir = out_dir / "model_init" / f"node{node_rank}"
    weights = list(full_state_dict(actor))  # collective: every rank takes part
    if local_rank == 0:
        save_hf_dir(weights, make_hf_config(source), model_dir)
        tokenizer.save(model_dir)
    dist.barrier()
    return model_dir


def materializer(mesh):
    """Gives a meta-built engine's model its (uninitialised) shards on the mesh's device."""
    device = torch.device("cpu") if mesh.device_type == "cpu" else torch.device("cuda", torch.cuda.current_device())

    def materialize(model) -> None:
        model.to_empty(device=device)
        recompute_buffers_(model, device)  # rotary buffers are not moved: recomputed from the config

    return materialize


def skeleton_engine(cfg: Config, hf_config, mesh, role: str) -> TrainEngine:
    """An engine of `role` with the run's settings on `mesh` and its parameters on meta, built ahead of a move: its
    destination once `engine.materialize_now(materializer(mesh))` gives them storage. Built from the config, since a
    rank joining the train set holds no engine to copy settings from (split runs have pp=1: a (dp, tp) mesh)."""
    if role == CRITIC:
        return make_engine(meta_critic(hf_config, torch.float32), mesh, materialize=None,
                           **engine_settings(cfg, trainable=True, lr=cfg.algorithm.critic_lr))
    return make_engine(meta_policy(hf_config, torch.float32), mesh, materialize=None,
                       **engine_settings(cfg, trainable=role == ACTOR))
