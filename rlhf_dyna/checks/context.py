"""Context length before spawn: prompt + completion fit vLLM's max_model_len, which fits the model's positions (the
KV cache that must hold one such sequence: checks/gpu.py)."""
from __future__ import annotations

from ..config import Config
from ..rollout.context_length import max_model_len
from ..errors import ConfigError


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
