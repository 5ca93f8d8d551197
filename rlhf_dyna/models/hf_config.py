"""The HF config of an architecture from the typed model config alone (no checkpoint needed)."""
from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from .architectures import ARCHITECTURES



def hf_config_from_fields(arch: str, vocab_size: int, hidden_size: int, intermediate_size: int,
                          num_hidden_layers: int, num_attention_heads: int, num_key_value_heads: int,
                          head_dim: int | None = None, tie_word_embeddings: bool = False,
                          num_experts: int = 0, num_experts_per_tok: int = 0,
                          moe_intermediate_size: int = 0) -> PretrainedConfig:
    fields = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, head_dim=head_dim or hidden_size // num_attention_heads,
        tie_word_embeddings=tie_word_embeddings,
    )
    if ARCHITECTURES[arch].experts is not None:  # a qwen3_moe-shaped config: every layer sparse
        fields.update(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                      moe_intermediate_size=moe_intermediate_size, decoder_sparse_step=1, mlp_only_layers=[])
    return AutoConfig.for_model(arch, **fields)
