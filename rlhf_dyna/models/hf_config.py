"""The HF config of an architecture from the typed model config alone (no checkpoint needed), and the model a run
builds: a checkpoint directory, or a spec for random init. Light: transformers' config classes, not its models."""
from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoConfig, PretrainedConfig

from ..config import ModelConfig
from ..tasks.tokenizer import CharTokenizer
from .architectures import ARCHITECTURES, live_architectures


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


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    initializer_range: float = 0.02  # random-init std; tests raise it so greedy argmax is not a near-tie
    # special tokens written to config.json; vLLM stops generation at eos_token_id even without a tokenizer
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    # MoE (arch=qwen3_moe): every layer sparse; 0 experts = dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0


def _moe_fields(spec: ModelSpec) -> dict:
    if ARCHITECTURES[spec.arch].experts is None:
        if spec.num_experts:
            raise ValueError(f"num_experts={spec.num_experts} on arch={spec.arch!r}: experts need an MoE architecture, "
                             f"e.g. arch='qwen3_moe'")
        return {}
    if not 0 < spec.num_experts_per_tok <= spec.num_experts or spec.moe_intermediate_size <= 0:
        raise ValueError(f"arch='qwen3_moe' needs 0 < num_experts_per_tok <= num_experts and moe_intermediate_size > 0; "
                         f"got num_experts={spec.num_experts}, num_experts_per_tok={spec.num_experts_per_tok}, "
                         f"moe_intermediate_size={spec.moe_intermediate_size}")
    return dict(num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                moe_intermediate_size=spec.moe_intermediate_size, decoder_sparse_step=1, mlp_only_layers=[],
                norm_topk_prob=True)


def make_hf_config(spec: ModelSpec) -> PretrainedConfig:
    if spec.arch not in live_architectures():
        raise ValueError(f"arch={spec.arch!r} is not one of {live_architectures()}")
    if spec.hidden_size % spec.num_attention_heads:
        raise ValueError(f"hidden_size={spec.hidden_size} is not divisible by num_attention_heads={spec.num_attention_heads}")
    config = AutoConfig.for_model(
        spec.arch,
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        # qwen3 defaults head_dim to 128 regardless of hidden size
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_theta=spec.rope_theta,
        initializer_range=spec.initializer_range,
        bos_token_id=spec.bos_token_id,
        eos_token_id=spec.eos_token_id,
        pad_token_id=spec.pad_token_id,
        architectures=[ARCHITECTURES[spec.arch].causal_lm],
        **_moe_fields(spec),
    )
    return config


VOCAB_MULTIPLE = 16  # vocab-parallel embeddings need vocab % tp == 0 for every tp a run may switch to


def padded_vocab(tokenizer_vocab: int) -> int:
    return -(-tokenizer_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def model_source(model: ModelConfig, tokenizer: CharTokenizer) -> ModelSpec | str:
    """A local checkpoint dir when model.path is set; otherwise a spec for random init (task vocabulary,
    padded; the padding rows are never sampled into a correct answer and cost nothing)."""
    if model.path is not None:
        return model.path
    return ModelSpec(
        arch=model.arch, vocab_size=padded_vocab(tokenizer.vocab_size), bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id, hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size, num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads, num_key_value_heads=model.num_key_value_heads,
        max_position_embeddings=model.max_position_embeddings, tie_word_embeddings=model.tie_word_embeddings,
        rope_theta=model.rope_theta, num_experts=model.num_experts, num_experts_per_tok=model.num_experts_per_tok,
        moe_intermediate_size=model.moe_intermediate_size,
    )
