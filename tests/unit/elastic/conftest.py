"""What the elastic unit tests share: a tiny Qwen2-shaped catalog (biases, GQA, untied head) to plan moves of."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlhf_dyna.models.catalog import catalog_from_config


@pytest.fixture(scope="module")
def tiny():
    cfg = SimpleNamespace(model_type="qwen2", num_hidden_layers=2, hidden_size=12, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=3, intermediate_size=18, vocab_size=53,
                          tie_word_embeddings=False, attention_bias=True)
    return catalog_from_config(cfg, param_dtype="float32")
