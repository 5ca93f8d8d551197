"""Build everything a rank needs for a run: task, tokenizer, mesh, actor/critic/reference engines, rollout."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import Config, ModelConfig
from ..models.build import ModelSpec, build_critic, build_policy, make_hf_config, save_hf_dir
from ..models.meta_init import checkpoint_config, checkpoint_loader, meta_critic, meta_policy, value_head_init
from ..tasks.base import BaseTask, make_task
from ..tasks.file_task import make_file_task
from ..tasks.tokenizer import CharTokenizer
from ..train.copy_shards import copy_local_shards_
from ..train.engine import TrainEngine, full_state_dict
from ..train.pipeline_engine import make_engine
from ..parallel_dims import ParallelDims
from ..validate import resolve_dp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class RankContext:
    rank: int
    world: int
    dp: int
    tp: int
    rollout_tp: int
    tp_outer: bool = False  # the training mesh's rank order (train.mesh.build_mesh)
    pp: int = 1  # pipeline stages, outermost: the ranks of one stage are dp * tp consecutive ones

    @property
    def dp_rank(self) -> int:
        within = self.rank % (self.dp * self.tp)  # the same dp coordinate on every stage
        return within % self.dp if self.tp_outer else within // self.tp

    @property
    def rollout_replica(self) -> int:
        return self.rank // self.rollout_tp

    @property
    def rollout_replicas(self) -> int:
        return self.world // self.rollout_tp

    @property
    def is_rollout_leader(self) -> bool:
        return self.rank % self.rollout_tp == 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_task(cfg: Config, tokenizer=None) -> BaseTask:
    t = cfg.task
    if t.name == "file":  # the checkpoint's tokenizer measures prompts for task.max_prompt_tokens
        return make_file_task(t, cfg.trainer.seed, tokenizer)
    return make_task(
        t.name, seed=cfg.trainer.seed, eval_size=t.eval_size, partial_credit=t.partial_credit,
        min_digits=t.min_digits, max_digits=t.max_digits,
    )


VOCAB_MULTIPLE = 16  # vocab-parallel embeddings need vocab % tp == 0 for every tp a run may switch to


def padded_vocab(tokenizer_vocab: int) -> int:
    return -(-tokenizer_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def model_source(model: ModelConfig, tokenizer: CharTokenizer) -> ModelSpec | str:
    """A local checkpoint dir when model.path is set; otherwise a spec for random init (task vocabulary,
    padded; the padding rows are never sampled into a correct answer and cost nothing)."""
    if model.path is not None:
        return model.path
    return ModelSpec(
        arch=model.arch, vocab_size=padded_vocab(tokenizer.vocab_size), bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id, hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size, num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads, num_key_value_heads=model.num_key_value_heads,
        max_position_embeddings=model.max_position_embeddings, tie_word_embeddings=model.tie_word_embeddings,
        rope_theta=model.rope_theta, num_experts=model.num_experts, num_experts_per_tok=model.num_experts_per_tok,
        moe_intermediate_size=model.moe_intermediate_size,
    )


def rank_context(cfg: Config) -> RankContext:
    world = dist.get_world_size()
    return RankContext(
        rank=dist.get_rank(), world=world, dp=resolve_dp(cfg.parallel.train, world),
        tp=cfg.parallel.train.tp, rollout_tp=cfg.rollout.tp, pp=cfg.parallel.train.pp,
    )


def _device(mesh) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")


def engine_settings(cfg: Config, trainable: bool, lr: float | None = None) -> dict:
    """`make_engine`'s settings of the run's engines: a trainable one (AdamW at `lr`, the actor's by default) or a
    frozen one (the reference)."""
    alg = cfg.algorithm
    common = dict(pp_schedule=cfg.parallel.train.pp_schedule, precision=cfg.trainer.precision,
                  micro_batch_size=alg.micro_batch_size, micro_batch_tokens=alg.micro_batch_tokens,
                  zero=cfg.parallel.train.zero)
    if not trainable:
        return {**common, "trainable": False}
    return {**common, "lr": alg.lr if lr is None else lr, "weight_decay": alg.weight_decay, "betas": tuple(alg.betas),
            "grad_clip": alg.grad_clip}


def build_actor(cfg: Config, source: ModelSpec | str, ctx: RankContext, mesh=None) -> TrainEngine:
    """Random init: the full seeded model, then sharded (tiny recipes, bit-identical across layouts). A checkpoint:
    built on meta, sharded, and each rank reads only its shards (models.meta_init)."""
    mesh = mesh if mesh is not None else ParallelDims.from_config(cfg).train_mesh()  # split: the train set's mesh
    if isinstance(source, str):
        policy, materialize = meta_policy(checkpoint_config(source), DTYPES["fp32"]), checkpoint_loader(source, _device(mesh))
    else:
        policy, materialize = build_policy(source, DTYPES["fp32"], seed=cfg.trainer.seed), None
    return make_engine(policy, mesh, materialize=materialize, **engine_settings(cfg, trainable=True))


def build_critic_engine(cfg: Config, source: ModelSpec | str, actor: TrainEngine) -> TrainEngine:
    """A checkpoint gives the backbone per shard (meta build); the value head is random, seeded, either way."""
    if isinstance(source, str):
        config = checkpoint_config(source)
        head = value_head_init(config, DTYPES["fp32"], seed=cfg.trainer.seed + 1)
        critic, materialize = meta_critic(config, DTYPES["fp32"]), checkpoint_loader(source, actor.device, extra=head)
    else:
        critic, materialize = build_critic(source, DTYPES["fp32"], seed=cfg.trainer.seed + 1), None
    return make_engine(critic, actor.mesh, materialize=materialize,
                       **engine_settings(cfg, trainable=True, lr=cfg.algorithm.critic_lr))


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
