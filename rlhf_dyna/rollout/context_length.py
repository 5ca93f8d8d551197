"""The context length vLLM is given (its max_model_len): prompt plus completion tokens of one sequence."""
from __future__ import annotations

from ..config import Config


def derived_max_model_len(cfg: Config) -> int:
    """What the prompts and completions need: task.max_prompt_tokens + rollout.max_new_tokens for task=file when the
    prompts are bounded; otherwise all the model's positions (the checkpoint's own with model.path)."""
    t = cfg.task
    if t.name == "file" and t.max_prompt_tokens > 0:
        return t.max_prompt_tokens + cfg.rollout.max_new_tokens
    return cfg.model.max_position_embeddings


def max_model_len(cfg: Config) -> int:
    """rollout.max_model_len when it is set (> 0), else the derived value."""
    return cfg.rollout.max_model_len if cfg.rollout.max_model_len > 0 else derived_max_model_len(cfg)
