"""cfg.model and rollout.max_model_len from a checkpoint's config.json, as the checks and the resolved config use them."""
from __future__ import annotations

import json

import pytest

from rlhf_dyna.errors import ConfigError
from rlhf_dyna.config import Config
from rlhf_dyna.models.checkpoint_fields import resolve_model
from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tied", hidden_size=192, num_hidden_layers=3,
                                num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=8192,
                                tie_word_embeddings=True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    return path


def test_the_checkpoint_decides_the_architecture(ckpt):
    cfg = Config()  # the tiny default model: vocab 32, hidden 64, 2 layers, 64 positions
    cfg.model.path, cfg.task.name, cfg.task.max_prompt_tokens, cfg.rollout.max_new_tokens = str(ckpt), "file", 256, 48
    resolve_model(cfg)
    m = cfg.model
    assert (m.arch, m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers) == ("llama", 384, 192, 256, 3)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.max_position_embeddings) == (6, 3, 32, 8192)
    assert m.tie_word_embeddings and m.dtype == "bfloat16" and m.rope_theta == 10000.0
    assert cfg.rollout.max_model_len == 256 + 48  # what the prompts and completions need, not 8192 nor 64


def test_without_a_checkpoint_only_the_context_length_is_resolved():
    cfg = Config()
    resolve_model(cfg)
    assert cfg.model.hidden_size == Config().model.hidden_size and cfg.rollout.max_model_len == 64


def test_an_unsupported_or_unreadable_config_is_one_paragraph(tmp_path, ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    for name, text in (("mistral", json.dumps({**config, "model_type": "mistral"})), ("broken", "{not json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
    cfg = Config()
    cfg.model.path = str(tmp_path / "mistral")
    with pytest.raises(ConfigError, match="holds a 'mistral' model .* live runs support llama, qwen2, qwen3, qwen3_moe"):
        resolve_model(cfg)
    cfg.model.path = str(tmp_path / "broken")
    with pytest.raises(ConfigError, match="config.json does not load as a Hugging Face config"):
        resolve_model(cfg)
