"""Typed configuration: one dataclass per Hydra config group, registered in Hydra's ConfigStore.

Struct mode comes from the schema, so a misspelled key or a wrong type fails at composition,
before any rank is spawned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class ModelConfig:
    arch: str = "llama"  # llama | qwen2 | qwen3 | qwen3_moe
    path: Optional[str] = None  # local HF checkpoint dir (config.json + *.safetensors); None = random init
    vocab_size: int = 32  # tiny recipes: replaced by the task tokenizer's size
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: Optional[int] = None  # None = hidden_size // num_attention_heads
    max_position_embeddings: int = 64
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    num_experts: int = 0  # MoE only
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    dtype: str = "bfloat16"  # dtype of the weights at cluster scale (dry run, checkpoints)


@dataclass
class LayoutConfig:
    """One training layout. dp=-1 means world_size // (tp * pp * cp)."""

    dp: int = -1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    zero: int = 3  # 3 = FSDP (params, grads, optimizer sharded); 1 = optimizer state sharded only
    pp_schedule: str = "1F1B"  # 1F1B | GPipe: the micro-batch schedule of pipeline layouts (train.pipeline_engine)


@dataclass
class LayoutSwitchConfig:
    """From `step` on (before it trains), the actor (and critic, reference) train in (dp, tp, zero, pp, ep)."""

    step: int = 1
    dp: int = -1  # -1: world_size // (tp * pp)
    tp: int = 1
    zero: int = 3
    pp: int = 1  # pipeline stages of this layout (train.pipeline_engine)
    ep: int = 1  # expert parallel (MoE) over the dp ranks of this layout (train.expert_parallel)


@dataclass
class ParallelConfig:
    world_size: int = 2  # ranks of the job (CPU processes here, GPUs on a cluster)
    nodes: int = 1
    device: str = "auto"  # auto | cpu | cuda
    train: LayoutConfig = field(default_factory=LayoutConfig)
    schedule: list[LayoutSwitchConfig] = field(default_factory=list)  # online training-layout changes


@dataclass
class ClusterConfig:
    """Cluster description for the cost model of the dry run (bandwidths per device, one direction)."""

    nodes: int = 1
    devices_per_node: int = 8
    intra_node_gb_per_s: float = 360.0  # NVLink-class, achievable
    inter_node_gb_per_s: float = 25.0  # one 200 Gb/s NIC per device
    intra_latency_us: float = 5.0
    inter_latency_us: float = 10.0


@dataclass
class AlgorithmConfig:
    name: str = "grpo"  # grpo | ppo
    lr: float = 1e-4
    critic_lr: float = 5e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    clip_eps_low: float = 0.2  # ratio clipped below at 1 - clip_eps_low; 1 = no lower clip
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k1 | k2 | k3 | low_var_kl (k3 capped at 10), in the loss
    kl_in_reward: bool = False  # KL penalty (k1) in the token rewards (True; gae, reinforce_plus_plus*) or in the loss
    kl_ctrl: str = "fixed"  # fixed | adaptive (kl_coef moves towards kl_target, Ziegler et al.)
    kl_target: float = 0.1  # adaptive: the KL per token the coefficient steers to
    kl_horizon: int = 10000  # adaptive: samples over which a 20 % error changes the coefficient by 20 %
    adv_estimator: str = "grpo"  # grpo | dr_grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | gae
    grpo_std: str = "population"  # grpo: population (divide by n) | unbiased (n - 1, as veRL / TRL)
    norm_adv_by_std: bool = True  # grpo: divide by the group's std (False = dr_grpo's advantages)
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum | seq_mean_token_sum_norm
    loss_norm_len: int = 0  # seq_mean_token_sum_norm's constant length (Dr. GRPO); 0 = rollout.max_new_tokens
    clip_ratio_c: float = 3.0  # dual-clip: negative-advantage tokens' loss capped at -A * c (c > 1); 0 = off
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * entropy (entropy is logged either way)
    gamma: float = 1.0
    lam: float = 0.95
    vf_clip: float = 0.2
    epochs: int = 1  # passes over each step's rollouts
    mini_batches: int = 1  # optimizer steps per pass
    micro_batch_size: int = 16  # per rank, gradient accumulation above it
    micro_batch_tokens: int = 0  # > 0: micro-batches packed by length, rows x longest row <= this (replaces micro_batch_size)


@dataclass
class RolloutConfig:
    engine: str = "vllm"
    tp: int = 1
    n: int = 8  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 8
    kv_cache_bytes: int = 64 * 1024 * 1024  # KV cache per rank; 0 = vLLM sizes it from gpu_memory_utilization
    sync: str = "vps"  # vps (only the bytes each rollout shard needs) | naive (full tensors, by name)
    expert_parallel: bool = False  # MoE: vLLM's enable_expert_parallel (whole experts per rank, not TP slices)


@dataclass
class TaskConfig:
    name: str = "arithmetic"  # arithmetic | sort_digits | file
    min_digits: int = 1
    max_digits: int = 2
    partial_credit: bool = False
    prompts_per_step: int = 16  # global, over all rollout replicas
    eval_size: int = 128
    eval_every: int = 5
    # task=file (rlhf_dyna/tasks/file_task.py): local jsonl / json / parquet through HF datasets
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"  # column: a string or a list of {role, content} messages
    answer_key: str = "answer"  # column: the ground truth handed to the rewards
    max_prompt_tokens: int = 0  # longer prompts are dropped (count printed); 0 = keep all
    reward: Any = "math"  # math | exact | module:function, or a list of them
    reward_weights: list[float] = field(default_factory=list)  # one per reward; empty = 1.0 each


@dataclass
class TrackingConfig:
    wandb_mode: str = "offline"  # offline | online | disabled
    project: str = "rlhf_dyna"
    run_name: Optional[str] = None
    console: bool = True
    transition_trace: bool = True  # write transition_trace.json: Chrome trace (Perfetto) of each transition's rounds
    trace_syncs: int = 10  # bounds its size: only the first N train_to_rollout syncs (every train_relayout is kept)
    sample_log: int = 0  # first N samples of every step to samples.jsonl (prompt/response ids and text, reward)


@dataclass
class PlacementConfig:
    """Which ranks serve which role in which phase (rlhf_dyna.elastic). Sets are [first_rank, size]."""

    policy: str = "colocate"  # colocate | split | lend
    max_staleness: int = 0  # split: steps generation may run ahead of training (0 = on-policy, 1 = overlap)
    rollout_ranks: int = 0  # split: ranks that generate; 0 = half the world
    train_ranks: int = 0  # split: ranks that train (0 = the rest); lend: the actor's share (0 = half)
    roles: dict[str, list[int]] = field(default_factory=dict)  # explicit sets: +placement.roles.rollout=[0,2]
    rebalance: bool = False  # split: move devices between generation and training from measured phase times
    rebalance_margin: float = 0.1  # move only if the predicted saving beats the move's cost + this share of the step
    rebalance_every: int = 2  # steps measured on a split before the next re-balancing decision


@dataclass
class TrainerConfig:
    total_steps: int = 20
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16
    sft_warmup_steps: int = 0  # supervised warm-up on task demonstrations before RL
    sft_lr: float = 3e-3
    sft_batch_size: int = 64
    # checkpoints (orchestrator/resume.py): <run dir>/checkpoints/step_<N>/, policy export to <run dir>/policy/
    save_every: int = 0  # 0 = off
    save_last: bool = True  # checkpoint at the end of the run
    keep_checkpoints: int = 2  # newest complete ones kept; 0 = all
    resume: Optional[str] = None  # auto (latest under the run dir) | PATH (step_<N>/, checkpoints/ or a run dir)
    export_policy: bool = True  # HF dir of the policy at every save and at the end
    export_max_shard_bytes: int = 2 * 2**30  # bound of one exported safetensors file


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    recipe: str = "grpo_tiny"  # name of the recipe, set by each recipe file
    dry_run: bool = False  # plan every transition of the recipe, without devices


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
