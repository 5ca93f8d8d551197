"""The model architectures rlhf_dyna knows, one entry per HF `model_type`: what the VPS catalog, the TP plan, the
checkpoint names of experts and vLLM's fused parameter names need. A new architecture is one entry here (and its
tests); `live=False` entries are planned by the dry run but not trained or generated with.

Pipeline stages split every architecture's decoder layers the same way (vps.validate.stage_layers: vLLM's rule),
so stages need no entry."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# decoder-layer module -> its tensor-parallel style: Megatron pairs, column-parallel in, row-parallel out
DENSE_TP_PLAN: tuple[tuple[str, str], ...] = (
    ("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"), ("self_attn.v_proj", "colwise"),
    ("self_attn.o_proj", "rowwise"), ("mlp.gate_proj", "colwise"), ("mlp.up_proj", "colwise"),
    ("mlp.down_proj", "rowwise"),
)


@dataclass(frozen=True)
class VllmNames:
    """vLLM's fused parameters of a decoder layer (vLLM 0.32's Llama-family and MoE implementations)."""

    qkv: str = "self_attn.qkv_proj"  # [q; k; v] of the TP rank
    gate_up: str = "mlp.gate_up_proj"  # [gate; up] of the TP rank
    w13: str = "experts.routed_experts.w13_weight"  # every expert's [gate; up], under the MoE block
    w2: str = "experts.routed_experts.w2_weight"  # every expert's down projection


@dataclass(frozen=True)
class Experts:
    """Where an MoE layer's experts sit in checkpoints (per expert), and which layers have them."""

    block: str  # the MoE module of a layer in checkpoints and vLLM: "mlp" or "block_sparse_moe"
    gate: str
    up: str
    down: str
    sparse_layers: Callable[[Any], tuple[int, ...]]  # HF config -> the indices of the layers with experts


def qwen3_moe_layers(cfg: Any) -> tuple[int, ...]:
    skip, step = set(cfg.mlp_only_layers or []), cfg.decoder_sparse_step
    experts = getattr(cfg, "num_experts", 0)
    return tuple(i for i in range(cfg.num_hidden_layers) if i not in skip and experts and (i + 1) % step == 0)


def every_layer(cfg: Any) -> tuple[int, ...]:
    return tuple(range(cfg.num_hidden_layers))


@dataclass(frozen=True)
class Architecture:
    model_type: str  # HF config.model_type
    causal_lm: str  # config.architectures[0]: the class transformers and vLLM build
    attention_bias: bool = False  # q, k, v projections carry biases
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    experts: Experts | None = None  # MoE
    live: bool = True  # trained and generated with live; False: planned by the dry run only
    tp_plan: tuple[tuple[str, str], ...] = DENSE_TP_PLAN
    vllm: VllmNames = VllmNames()


QWEN3_MOE_EXPERTS = Experts("mlp", "gate_proj", "up_proj", "down_proj", qwen3_moe_layers)
MIXTRAL_EXPERTS = Experts("block_sparse_moe", "w1", "w3", "w2", every_layer)

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("llama", "LlamaForCausalLM"),
    Architecture("qwen2", "Qwen2ForCausalLM", attention_bias=True),
    Architecture("qwen3", "Qwen3ForCausalLM", qk_norm=True),
    Architecture("mistral", "MistralForCausalLM", live=False),
    Architecture("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=True, experts=QWEN3_MOE_EXPERTS),
    Architecture("mixtral", "MixtralForCausalLM", experts=MIXTRAL_EXPERTS, live=False),
)}


def register_architecture(arch: Architecture) -> Architecture:
    ARCHITECTURES[arch.model_type] = arch
    return arch


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type={model_type!r} is not an architecture rlhf_dyna knows; known: "
                         f"{', '.join(ARCHITECTURES)} (rlhf_dyna/models/architectures.py)")
    return ARCHITECTURES[model_type]


def live_architectures() -> list[str]:
    return [name for name, a in ARCHITECTURES.items() if a.live]
