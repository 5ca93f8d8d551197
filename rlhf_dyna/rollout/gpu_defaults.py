"""vLLM's settings per device: what is fast on a GPU, and what the CPU path has always used (pure functions, no vLLM).

On CUDA the rollout runs in the model's own low precision (FlashAttention needs bf16 / fp16), with CUDA graphs and
torch.compile (`enforce_eager=False`), inside a share of the GPU (`gpu_memory_utilization`) that leaves room for the
training engines it sits next to; in colocate it sleeps between generations (vLLM's sleep mode). On the CPU nothing
changes: the trainer's precision, eager mode and a fixed KV cache in bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from rlhf_dyna.config import Config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_BLOCK_TOKENS = {"cpu": 128, "cuda": 16}  # vLLM 0.32's default KV block per platform: a sequence takes whole blocks


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


def engine_args(cfg: Config, device_type: str, colocated: bool) -> dict:
    """The settings of a run's vLLM engine from its config (VLLMRollout's and SubsetVLLMRollout's keywords);
    `colocated`: the engine shares its ranks with training, so it sleeps between generations on CUDA."""
    r = cfg.rollout
    args = dict(dtype=rollout_dtype(device_type, cfg.trainer.precision, cfg.model.dtype),
                kv_cache_bytes=r.kv_cache_bytes, gpu_memory_utilization=r.gpu_memory_utilization,
                enforce_eager=enforce_eager(device_type, r.enforce_eager))
    return {**args, "sleep_level": r.sleep_level if device_type == "cuda" else 0} if colocated else args
