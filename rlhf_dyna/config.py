"""Typed configuration: one dataclass per Hydra config group, registered in Hydra's ConfigStore.

Struct mode comes from the schema, so a misspelled key or a wrong type fails at composition,
before any rank is spawned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from .parallel_layout import LayoutSwitch, ParallelLayout


@dataclass
class ModelConfig:
    arch: str = "llama"  # a live entry of models/architectures.py: llama | qwen2 | qwen3 | qwen3_moe
    path: Optional[str] = None  # local HF checkpoint dir (config.json + *.safetensors); None = random init
    # with a path, the architecture fields below are read from its config.json (models/checkpoint_fields.py)
    vocab_size: int = 32  # tiny recipes: replaced by the task tokenizer's size
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: Optional[int] = None  # None = hidden_size // num_attention_heads
    max_position_embeddings: int = 64  # random init: the model's positions; a checkpoint's own with model.path
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
class LayoutSwitchConfig(LayoutConfig):
    """From `step` on (before it trains), the actor (and critic, reference) train in this layout."""

    step: int = 1


@dataclass
class ParallelConfig:
    world_size: int = 2  # ranks of the job (CPU processes here, GPUs on a cluster)
    nodes: int = 1
    device: str = "auto"  # auto | cpu | cuda
    shm_collectives: bool = True  # CPU ranks of one host: FSDP's all-gathers and reduce-scatters through /dev/shm, not gloo
    train: LayoutConfig = field(default_factory=LayoutConfig)
    schedule: list[LayoutSwitchConfig] = field(default_factory=list)  # online training-layout changes

    def train_layout(self, master_weights: bool = False) -> ParallelLayout:
        """parallel.train over the world, dp resolved and every dimension checked (LayoutError names the number)."""
        return ParallelLayout.of(self.train, master_weights).fill(self.world_size, placed_on=self._world())

    def layout_schedule(self) -> list[LayoutSwitch]:
        """parallel.schedule as resolved layouts over the world."""
        return [LayoutSwitch(s.step, ParallelLayout.of(s).fill(self.world_size, where=f"parallel.schedule[{i}] "
                                                                                        f"(step {s.step}) ",
                                                                  placed_on=self._world()))
                for i, s in enumerate(self.schedule)]

    def _world(self) -> str:
        return f"parallel.world_size={self.world_size}"


@dataclass
class ClusterConfig:
    """Cluster description for the cost model of the dry run (bandwidths per device, one direction)."""

    nodes: int = 1
    devices_per_node: int = 8
    intra_node_gb_per_s: float = 360.0  # NVLink-class, achievable
    inter_node_gb_per_s: float = 25.0  # one 200 Gb/s NIC per device
    intra_latency_us: float = 5.0
    inter_latency_us: float = 10.0
    host_gb_per_s: float = 25.0  # device <-> pinned host memory per device (PCIe 5 x16, achievable): offloaded roles


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
    policy_loss: str = "ppo"  # ppo (clipped surrogate, dual-clip): a name registered in algos.losses.POLICY_LOSSES
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
    critic_init: str = "policy"  # PPO's critic: policy (its backbone, a seeded value head) | reward_model (InstructGPT)
    pair_loss: str = "bradley_terry"  # algorithm.name=reward_model: a loss of algos.pairwise.PAIR_LOSSES
    micro_batch_tokens: int = 0  # > 0: micro-batches packed by length, rows x longest row <= this (replaces micro_batch_size)
    share_prompts: str = "off"  # on | off | auto (on for data-parallel training on the CPU): a prompt's rows trained on one forward of it


@dataclass
class RolloutConfig:
    engine: str = "vllm"
    tp: int = 1
    n: int = 8  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 8
    kv_cache_bytes: int = 0  # KV cache per rank; 0 = derived: CPU, all of a replica's sequences at once (rollout/gpu_defaults.py); CUDA, what gpu_memory_utilization leaves
    max_model_len: int = 0  # vLLM's max_model_len (prompt + completion tokens); 0 = derived (rollout/context_length.py)
    sync: str = "vps"  # vps (only the bytes each rollout shard needs) | naive (full tensors, by name)
    expert_parallel: bool = False  # MoE: vLLM's enable_expert_parallel (whole experts per rank, not TP slices)
    gpu_memory_utilization: float = 0.5  # CUDA: share of the GPU vLLM may hold (weights + KV), in (0, 1]; next to the actor in colocate
    enforce_eager: Optional[bool] = None  # None = CUDA graphs and compile on CUDA, eager on the CPU (rollout/gpu_defaults.py)
    sleep_level: int = 1  # colocate on CUDA: vLLM's sleep between generations (1 = weights to host, 2 = dropped, 0 = off)


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
    # task=preference (rlhf_dyna/tasks/preference.py): pairs from local files, with task.prompt_key
    chosen_key: str = "chosen"  # column: the preferred completion (a string, or chat messages ending in its turn)
    rejected_key: str = "rejected"  # column: the other completion


@dataclass
class RewardModelConfig:
    """A learned reward: a local HF sequence classifier with one label, scored as the reward `rm` (task.reward)."""

    path: Optional[str] = None  # local HF dir (AutoModelForSequenceClassification, num_labels=1, its own tokenizer)
    kind: str = "classifier"  # classifier: the score head's value at the last non-padding token
    offload: bool = False  # parked in host memory outside the prepare phase, copied back to score


@dataclass
class TrackingConfig:
    wandb_mode: str = "offline"  # offline | online | disabled
    project: str = "rlhf_dyna"
    run_name: Optional[str] = None
    console: str = "progress"  # progress (live bar on a terminal) | plain (a line per step) | verbose (+ third-party output) | off
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
class ElasticConfig:
    """Membership changes: ranks leaving and joining the job (rlhf_dyna.elastic.membership, docs/elastic.md)."""

    events: list[str] = field(default_factory=list)  # scripted changes: leave:R@S, leave:A-B@S, join@S, join:N@S
    join: Optional[str] = None  # RUN_DIR of a running job this process asks to join
    leave_on_sigterm: bool = False  # a rank that receives SIGTERM leaves at the next step boundary (colocate)
    # admit elastic.join=RUN_DIR processes at step boundaries: true | false | null (auto: where the run can take a
    # join live; job.py resolves it before spawn, checks/elastic.join_refusal says why not)
    accept_joins: Optional[bool] = None
    # survive a lost rank (docs/elastic/recovery.md): 1 = each rank's shard of every training role's
    # state also held in host memory by the next rank, refreshed every snapshot_every steps; 0 = off
    replicas: int = 0
    snapshot_every: int = 1
    # a lost rank whose state no replica holds (elastic.replicas=0, or a replica holder lost too): the survivors load
    # the newest complete checkpoint in place and go on. null = auto: on with elastic.replicas=1, off without
    recover_from_checkpoint: Optional[bool] = None


@dataclass
class TrainerConfig:
    total_steps: int = 20
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 | auto (bf16 where the device computes it natively: CUDA, AVX512-BF16/AMX CPUs)
    tf32: bool = True  # CUDA: fp32 matmuls in TF32 (torch.set_float32_matmul_precision("high")); no effect on the CPU
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
    elastic: ElasticConfig = field(default_factory=ElasticConfig)  # membership changes (dry run only, so far)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    recipe: str = "grpo_tiny"  # name of the recipe, set by each recipe file
    dry_run: bool = False  # plan every transition of the recipe, without devices


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)


RESOLVED_CONFIG = "config_resolved.yaml"  # in the run's output directory: what every rank reads


def to_config(dcfg: DictConfig) -> Config:
    return OmegaConf.to_object(dcfg)  # type: ignore[return-value]


def load_config(path: Path) -> Config:
    schema = OmegaConf.structured(Config)
    return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(path)))  # type: ignore[return-value]
