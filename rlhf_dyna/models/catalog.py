"""HF config -> VPS model catalog (logical tensors, shapes, live names), for any size, no weights.

Experts are stacked per layer into one logical tensor per projection ([E, I, H] for gate/up,
[E, H, I] for down): expert e of it is the checkpoint tensor ...experts.{e}.<proj>.weight.
"""
from __future__ import annotations

import functools
from typing import Any

from rlhf_dyna.vps.model import CatalogTensor, ModelCatalog, ModelDims, Role

from .architectures import Architecture, architecture


def dims_from_config(cfg: Any) -> ModelDims:
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0
    moe = architecture(cfg.model_type).experts
    moe_layers = moe.sparse_layers(cfg) if moe is not None and experts else ()
    moe_inter = getattr(cfg, "moe_intermediate_size", None) or (cfg.intermediate_size if experts else 0)
    dense_inter = cfg.intermediate_size if len(moe_layers) < cfg.num_hidden_layers else 0
    return ModelDims(
        num_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, num_heads=heads,
        num_kv_heads=cfg.num_key_value_heads or heads, head_dim=head_dim, intermediate=dense_inter,
        vocab=cfg.vocab_size, tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        num_experts=experts, moe_intermediate=moe_inter, moe_layers=moe_layers,
    )


def catalog_from_config(cfg: Any, param_dtype: str = "bfloat16", state_dtype: str = "float32") -> ModelCatalog:
    """Catalog of a config whose model_type is in the architecture table (models/architectures.py)."""
    arch = architecture(cfg.model_type)
    attn_bias = arch.attention_bias or bool(getattr(cfg, "attention_bias", False))
    return _catalog(arch, dims_from_config(cfg), attn_bias, param_dtype, state_dtype)


@functools.lru_cache(maxsize=64)  # every transition asks again; the catalog is immutable, so one per model is shared
def _catalog(arch: Architecture, d: ModelDims, attn_bias: bool, param_dtype: str, state_dtype: str) -> ModelCatalog:
    out = [CatalogTensor("model.embed_tokens.weight", Role.EMBED, None, (d.vocab, d.hidden))]
    for i in range(d.num_layers):
        out += layer_tensors(i, d, arch, attn_bias)
    out.append(CatalogTensor("model.norm.weight", Role.FINAL_NORM, None, (d.hidden,)))
    if not d.tied_embeddings:
        out.append(CatalogTensor("lm_head.weight", Role.LM_HEAD, None, (d.vocab, d.hidden)))
    return ModelCatalog(arch.model_type, d, tuple(out), param_dtype, state_dtype)


def layer_tensors(i: int, d: ModelDims, arch: Architecture, attn_bias: bool) -> list[CatalogTensor]:
    p, h, hd = f"model.layers.{i}", d.hidden, d.head_dim
    q_out, kv_out = d.num_heads * hd, d.num_kv_heads * hd
    qkv = f"{p}.{arch.vllm.qkv}"
    out = [
        CatalogTensor(f"{p}.input_layernorm.weight", Role.ATTN_NORM, i, (h,)),
        CatalogTensor(f"{p}.self_attn.q_proj.weight", Role.Q, i, (q_out, h), rollout_name=f"{qkv}.weight"),
        CatalogTensor(f"{p}.self_attn.k_proj.weight", Role.K, i, (kv_out, h), rollout_name=f"{qkv}.weight"),
        CatalogTensor(f"{p}.self_attn.v_proj.weight", Role.V, i, (kv_out, h), rollout_name=f"{qkv}.weight"),
    ]
    if attn_bias:
        out += [
            CatalogTensor(f"{p}.self_attn.q_proj.bias", Role.Q_BIAS, i, (q_out,), rollout_name=f"{qkv}.bias"),
            CatalogTensor(f"{p}.self_attn.k_proj.bias", Role.K_BIAS, i, (kv_out,), rollout_name=f"{qkv}.bias"),
            CatalogTensor(f"{p}.self_attn.v_proj.bias", Role.V_BIAS, i, (kv_out,), rollout_name=f"{qkv}.bias"),
        ]
    if arch.qk_norm:
        out += [
            CatalogTensor(f"{p}.self_attn.q_norm.weight", Role.Q_NORM, i, (hd,)),
            CatalogTensor(f"{p}.self_attn.k_norm.weight", Role.K_NORM, i, (hd,)),
        ]
    out += [
        CatalogTensor(f"{p}.self_attn.o_proj.weight", Role.O, i, (h, q_out)),
        CatalogTensor(f"{p}.post_attention_layernorm.weight", Role.MLP_NORM, i, (h,)),
    ]
    return out + (moe_tensors(i, d, arch) if i in d.moe_layers else dense_mlp(i, d, arch))


def dense_mlp(i: int, d: ModelDims, arch: Architecture) -> list[CatalogTensor]:
    p, h, inter = f"model.layers.{i}.mlp", d.hidden, d.intermediate
    gate_up = f"model.layers.{i}.{arch.vllm.gate_up}.weight"
    return [
        CatalogTensor(f"{p}.gate_proj.weight", Role.GATE, i, (inter, h), rollout_name=gate_up),
        CatalogTensor(f"{p}.up_proj.weight", Role.UP, i, (inter, h), rollout_name=gate_up),
        CatalogTensor(f"{p}.down_proj.weight", Role.DOWN, i, (h, inter)),
    ]


def moe_tensors(i: int, d: ModelDims, arch: Architecture) -> list[CatalogTensor]:
    """Router and stacked experts; train names are transformers 5's fused experts.gate_up_proj / down_proj."""
    e, h, inter, names = d.num_experts, d.hidden, d.moe_intermediate, arch.experts
    train = f"model.layers.{i}.mlp"
    ckpt = f"model.layers.{i}.{names.block}"
    gate, up, down = names.gate, names.up, names.down
    w13, w2 = f"{ckpt}.{arch.vllm.w13}", f"{ckpt}.{arch.vllm.w2}"
    return [
        CatalogTensor(f"{ckpt}.gate.weight", Role.ROUTER, i, (e, h), train_name=f"{train}.gate.weight"),
        CatalogTensor(f"{ckpt}.experts.{gate}.weight", Role.EXPERT_GATE, i, (e, inter, h),
                      train_name=f"{train}.experts.gate_up_proj", rollout_name=w13),
        CatalogTensor(f"{ckpt}.experts.{up}.weight", Role.EXPERT_UP, i, (e, inter, h),
                      train_name=f"{train}.experts.gate_up_proj", rollout_name=w13),
        CatalogTensor(f"{ckpt}.experts.{down}.weight", Role.EXPERT_DOWN, i, (e, h, inter),
                      train_name=f"{train}.experts.down_proj", rollout_name=w2),
    ]
