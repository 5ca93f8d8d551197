"""Catalogs agree with the transformers modules built on the meta device (no weights allocated)."""
from __future__ import annotations

import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config,
                          Qwen3MoeConfig)

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.models.catalog_presets import preset_catalog
from rlhf_dyna.vps.tensor import Kind

SMALL = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=101)
CONFIGS = {
    "llama": LlamaConfig(**SMALL, tie_word_embeddings=False),
    "llama_tied": LlamaConfig(**SMALL, tie_word_embeddings=True),
    "qwen2": Qwen2Config(**SMALL, tie_word_embeddings=False),
    "qwen3": Qwen3Config(**SMALL, head_dim=8, tie_word_embeddings=False),
    "qwen3_moe": Qwen3MoeConfig(**SMALL, head_dim=8, moe_intermediate_size=12, num_experts=5, mlp_only_layers=[1],
                                tie_word_embeddings=False),
    "mixtral": MixtralConfig(**SMALL, num_local_experts=3, tie_word_embeddings=False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_catalog_matches_transformers_module(name):
    cfg = CONFIGS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    live = {n: tuple(p.shape) for n, p in model.named_parameters()}
    catalog = catalog_from_config(cfg)
    numel_by_buffer: dict[str, int] = {}
    for t in catalog.tensors:
        n = 1
        for s in t.shape:
            n *= s
        numel_by_buffer[t.train_buffer] = numel_by_buffer.get(t.train_buffer, 0) + n
    assert set(numel_by_buffer) == set(live), set(numel_by_buffer) ^ set(live)
    for buf, shape in live.items():
        n = 1
        for s in shape:
            n *= s
        assert numel_by_buffer[buf] == n, (buf, shape)
    dense = [t for t in catalog.tensors if t.train_buffer == t.name]
    assert all(live[t.name] == t.shape for t in dense)


def test_presets_sizes_and_kinds():
    big = preset_catalog("qwen3_235b_a22b")
    assert abs(big.numel() / 1e9 - 235.1) < 0.1
    assert abs(preset_catalog("llama3_70b").numel() / 1e9 - 70.55) < 0.05
    t = big["model.layers.93.mlp.experts.gate_proj.weight"]
    assert t.shape == (128, 1536, 4096)
    assert big.logical(t, Kind.EXP_AVG).dtype == "float32" and big.logical(t, Kind.PARAM).dtype == "bfloat16"
