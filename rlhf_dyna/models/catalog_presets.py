"""Configs of the published models used by dry runs and benchmarks, built locally (no hub access)."""
from __future__ import annotations

from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

from rlhf_dyna.vps.model import ModelCatalog

from .catalog import catalog_from_config


def llama3_70b() -> LlamaConfig:
    return LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)


def llama3_8b() -> LlamaConfig:
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)


def qwen3_8b() -> Qwen3Config:
    return Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)


def qwen3_235b_a22b() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                          num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False)


PRESETS = {"llama3_70b": llama3_70b, "llama3_8b": llama3_8b, "qwen3_8b": qwen3_8b,
           "qwen3_235b_a22b": qwen3_235b_a22b}


def preset_catalog(name: str, param_dtype: str = "bfloat16") -> ModelCatalog:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return catalog_from_config(PRESETS[name](), param_dtype)
