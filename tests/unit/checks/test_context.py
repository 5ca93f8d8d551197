"""Context length and the KV cache minimum: the messages, and the minimum against vLLM itself."""
from __future__ import annotations


import pytest

from rlhf_dyna.checks.context import check_lengths
from rlhf_dyna.errors import ConfigError
from rlhf_dyna.config import Config
from rlhf_dyna.rollout.context_length import max_model_len


def file_config(max_prompt_tokens: int = 256, max_new_tokens: int = 48, positions: int = 8192) -> Config:
    cfg = Config()
    cfg.task.name, cfg.task.max_prompt_tokens = "file", max_prompt_tokens
    cfg.rollout.max_new_tokens, cfg.model.max_position_embeddings, cfg.model.path = max_new_tokens, positions, "/ckpt"
    return cfg


def test_max_model_len_is_what_prompts_and_completions_need():
    assert max_model_len(file_config()) == 256 + 48  # not the checkpoint's 8192
    assert max_model_len(file_config(max_prompt_tokens=0)) == 8192  # unbounded prompts: the model's positions
    toy = Config()
    assert max_model_len(toy) == toy.model.max_position_embeddings
    explicit = file_config()
    explicit.rollout.max_model_len = 1000
    assert max_model_len(explicit) == 1000


@pytest.mark.parametrize("change,message", [
    (dict(positions=128), "task.max_prompt_tokens + rollout.max_new_tokens = 256 + 48 = 304 exceeds the model's "
                          "max_position_embeddings=128 (/ckpt/config.json)"),
    (dict(max_model_len=9000), "rollout.max_model_len=9000 exceeds the model's max_position_embeddings=8192"),
    (dict(max_model_len=300), "= 304 exceeds rollout.max_model_len=300 (vLLM's context); raise rollout.max_model_len "
                              "to at least 304"),
])
def test_lengths_that_cannot_fit_name_the_keys(change, message):
    cfg = file_config(positions=change.get("positions", 8192))
    cfg.rollout.max_model_len = change.get("max_model_len", 0)
    with pytest.raises(ConfigError) as err:
        check_lengths(cfg)
    assert message in str(err.value)
