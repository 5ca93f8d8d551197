"""vLLM's settings per device: what is fast on a GPU, and what the CPU path has always used (pure functions, no vLLM).

On CUDA the rollout runs in the model's own low precision (FlashAttention needs bf16 / fp16), with CUDA graphs and
torch.compile (`enforce_eager=False`), inside a share of the GPU (`gpu_memory_utilization`) that leaves room for the
training engines it sits next to; in colocate it sleeps between generations (vLLM's sleep mode). On the CPU: the
trainer's precision, eager mode, a KV cache in bytes that holds every sequence a replica runs at once (unless
`rollout.kv_cache_bytes` names one), and 32-token blocks, so that a prompt's n samples, and prompts that open alike
(a system prompt), share their prefill through vLLM's prefix cache (only whole blocks are shared).
"""
from __future__ import annotations

from dataclasses import dataclass

from rlhf_dyna.config import Config
from rlhf_dyna.rollout.context_length import max_model_len

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_BLOCK_TOKENS = {"cpu": 32, "cuda": 16}  # CPU: its attention's smallest (vLLM's default there is 128); CUDA: vLLM's
CPU_KV_CACHE_CEILING = 1 << 30  # the derived CPU KV cache per rank stops here; sequences past it wait their turn


def rollout_dtype(device_type: str, precision: str, model_dtype: str) -> str:
    """vLLM's dtype: on CUDA the model's own bf16 / fp16 (the sync casts fp32 masters while packing); elsewhere, and
    for fp32 models, the trainer's precision as before."""
    if device_type == "cuda" and model_dtype in ("bfloat16", "float16"):
        return model_dtype
    return "bfloat16" if precision == "bf16" else "float32"


def enforce_eager(device_type: str, requested: bool | None) -> bool:
    """CUDA graphs and compile on CUDA unless asked otherwise; the CPU backend stays eager."""
    return requested if requested is not None else device_type != "cuda"


def memory_args(device_type: str, kv_cache_bytes: int, gpu_memory_utilization: float) -> dict:
    """vLLM's memory keywords. CPU: a KV cache of `kv_cache_bytes` (gpu_memory_utilization would be a share of a NUMA
    node there, and fails once several ranks start). CUDA: the share of the GPU vLLM may take, and an exact KV cache
    only where one is asked for (`kv_cache_bytes` > 0)."""
    if device_type != "cuda":
        return {"kv_cache_memory_bytes": kv_cache_bytes or None}
    return {"gpu_memory_utilization": gpu_memory_utilization, "kv_cache_memory_bytes": kv_cache_bytes or None}


@dataclass(frozen=True)
class KvShape:
    """What one token's KV cache costs on one rollout rank."""

    layers: int
    kv_heads: int
    head_dim: int
    tp: int
    dtype: str

    @property
    def bytes_per_token(self) -> int:
        heads_per_rank = max(1, self.kv_heads // self.tp)  # tp > kv_heads replicates one head per rank
        return 2 * self.layers * heads_per_rank * self.head_dim * DTYPE_BYTES[self.dtype]  # K and V


def sequence_kv_bytes(shape: KvShape, max_model_len: int, device_type: str) -> int:
    """KV bytes one `max_model_len` sequence needs on a rank: its whole blocks plus the null block vLLM's block pool
    keeps back (vllm/v1/core/block_pool.py). vLLM refuses to start with less (tests/ranks/gpu/test_kv_minimum.py)."""
    block = KV_BLOCK_TOKENS.get(device_type, 16)
    return (-(-max_model_len // block) + 1) * block * shape.bytes_per_token


def kv_shape(fields, tp: int, dtype: str) -> KvShape:
    """From a model's HF config fields (a config.json's, or cfg.model's, which carry the same names)."""
    heads = fields.num_attention_heads
    return KvShape(layers=fields.num_hidden_layers, kv_heads=getattr(fields, "num_key_value_heads", None) or heads,
                   head_dim=getattr(fields, "head_dim", None) or fields.hidden_size // heads, tp=tp, dtype=dtype)


def replica_sequences(cfg: Config, replicas: int) -> int:
    """The most sequences one of `replicas` rollout replicas runs at once: its share of a step's samples or of the
    eval set."""
    rows = max(cfg.task.prompts_per_step * cfg.rollout.n, cfg.task.eval_size, 1)
    return -(-rows // max(replicas, 1))


def cpu_kv_cache_bytes(cfg: Config, replicas: int) -> int:
    """rollout.kv_cache_bytes=0 on the CPU: every sequence of a replica's share at max_model_len, at most
    CPU_KV_CACHE_CEILING (and never less than one sequence, vLLM's minimum)."""
    shape = kv_shape(cfg.model, cfg.rollout.tp, rollout_dtype("cpu", cfg.trainer.precision, cfg.model.dtype))
    one = sequence_kv_bytes(shape, max_model_len(cfg), "cpu")
    per_sequence = one - KV_BLOCK_TOKENS["cpu"] * shape.bytes_per_token  # vLLM keeps one block back, once
    return max(one, min(CPU_KV_CACHE_CEILING, one + (replica_sequences(cfg, replicas) - 1) * per_sequence))


def engine_args(cfg: Config, device_type: str, colocated: bool, replicas: int) -> dict:
    """The settings of a run's vLLM engine from its config (VLLMRollout's and SubsetVLLMRollout's keywords), for
    one of `replicas` rollout replicas; `colocated`: the engine shares its ranks with training, so it sleeps between
    generations on CUDA."""
    r = cfg.rollout
    on_cuda = device_type == "cuda"
    kv_cache_bytes = r.kv_cache_bytes or (0 if on_cuda else cpu_kv_cache_bytes(cfg, replicas))
    args = dict(dtype=rollout_dtype(device_type, cfg.trainer.precision, cfg.model.dtype),
                kv_cache_bytes=kv_cache_bytes, gpu_memory_utilization=r.gpu_memory_utilization,
                enforce_eager=enforce_eager(device_type, r.enforce_eager),
                block_size=None if on_cuda else KV_BLOCK_TOKENS["cpu"])
    return {**args, "sleep_level": r.sleep_level if device_type == "cuda" else 0} if colocated else args
