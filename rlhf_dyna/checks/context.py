"""Context length and KV cache before spawn: prompt + completion fit vLLM's max_model_len, which fits the model's
positions, and rollout.kv_cache_bytes holds one sequence of that length (vLLM refuses to start otherwise, and its
message names `gpu_memory_utilization`, a key this project does not have)."""
from __future__ import annotations

from ..config import Config
from ..rollout.context_length import max_model_len
from .errors import ConfigError

# vLLM's default KV block (tokens per page): 128 on the CPU backend, 16 on CUDA (vllm/platforms/*.py)
BLOCK_TOKENS = {"cpu": 128, "cuda": 16}
DTYPE_BYTES = {"fp32": 4, "bf16": 2}  # KV cache dtype follows the engine's dtype, which follows trainer.precision


def _positions_source(cfg: Config) -> str:
    return f"{cfg.model.path}/config.json" if cfg.model.path else "model.max_position_embeddings"


def check_lengths(cfg: Config) -> None:
    """task=file's prompt bound + completion within the model's positions and within max_model_len, which is within
    the positions too. The first test comes first: a derived max_model_len (already resolved) is that sum."""
    r, t = cfg.rollout, cfg.task
    limit, positions = max_model_len(cfg), cfg.model.max_position_embeddings
    need = t.max_prompt_tokens + r.max_new_tokens
    bounded = t.name == "file" and t.max_prompt_tokens > 0
    if bounded and need > positions:
        raise ConfigError(
            f"task.max_prompt_tokens + rollout.max_new_tokens = {t.max_prompt_tokens} + {r.max_new_tokens} = {need} "
            f"exceeds the model's max_position_embeddings={positions} ({_positions_source(cfg)}); lower "
            f"task.max_prompt_tokens or rollout.max_new_tokens so that they sum to at most {positions}."
        )
    if limit > positions:
        raise ConfigError(
            f"rollout.max_model_len={limit} exceeds the model's max_position_embeddings={positions} "
            f"({_positions_source(cfg)}); use rollout.max_model_len <= {positions}, or 0 to derive it."
        )
    if bounded and need > limit:
        raise ConfigError(
            f"task.max_prompt_tokens + rollout.max_new_tokens = {t.max_prompt_tokens} + {r.max_new_tokens} = {need} "
            f"exceeds rollout.max_model_len={limit} (vLLM's context); raise rollout.max_model_len to at least {need} "
            f"(at most {positions}), set it to 0 to derive it, or lower the other two."
        )


def min_kv_cache_bytes(cfg: Config, device: str) -> int:
    """The smallest rollout.kv_cache_bytes vLLM starts with: every layer's pages for one sequence of max_model_len
    tokens plus the one block its pool holds back (vllm/v1/core/kv_cache_utils.check_enough_kv_cache_memory)."""
    m = cfg.model
    block = BLOCK_TOKENS[device]
    kv_heads = max(1, m.num_key_value_heads // cfg.rollout.tp)  # rollout.tp > KV heads replicates them
    head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
    page = 2 * block * kv_heads * head_dim * DTYPE_BYTES[cfg.trainer.precision]  # K and V of one block, one layer
    blocks = -(-max_model_len(cfg) // block) + 1
    return m.num_hidden_layers * page * blocks


def check_kv_cache(cfg: Config, device: str) -> None:
    kv = cfg.rollout.kv_cache_bytes
    if kv == 0:  # vLLM sizes the cache itself
        return
    need = min_kv_cache_bytes(cfg, device)
    if kv < need:
        m = cfg.model
        raise ConfigError(
            f"rollout.kv_cache_bytes={kv} ({kv / 2**20:.2f} MiB) is too small for vLLM to hold one sequence of "
            f"rollout.max_model_len={max_model_len(cfg)} tokens: with {m.num_hidden_layers} layer(s), "
            f"{m.num_key_value_heads} KV heads (rollout.tp={cfg.rollout.tp}), head dim "
            f"{m.head_dim or m.hidden_size // m.num_attention_heads}, trainer.precision={cfg.trainer.precision} and "
            f"{BLOCK_TOKENS[device]}-token blocks it needs at least {need} bytes ({need / 2**20:.2f} MiB). Set "
            f"rollout.kv_cache_bytes >= {need}, or lower rollout.max_model_len."
        )
