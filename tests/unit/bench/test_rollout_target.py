"""The vLLM-like fused TP target (built on the VPS rollout layout): where each HF tensor lands."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.models.build import ModelSpec, make_hf_config
from bench.rollout_target import RolloutTarget

SPEC = ModelSpec(arch="llama", vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)  # vocab 100 pads to 128 for tp=2


def _full_tensors(config, make) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        shapes = {n: tuple(p.shape) for n, p in LlamaForCausalLM(config).named_parameters()}
    return {n: make(shape) for n, shape in shapes.items()}


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_fused_buffers_hold_this_ranks_slices_in_vllm_order(tp_rank: int) -> None:
    config = make_hf_config(SPEC)
    full = _full_tensors(config, lambda shape: torch.randn(shape))
    target = RolloutTarget(config, tp=2, tp_rank=tp_rank)
    for name, tensor in full.items():
        target.fill(name, tensor)
    a, m = "model.layers.1.self_attn", "model.layers.1.mlp"
    shard = lambda name, dim=0: full[name].chunk(2, dim)[tp_rank]
    qkv = torch.cat([shard(f"{a}.q_proj.weight"), shard(f"{a}.k_proj.weight"), shard(f"{a}.v_proj.weight")])
    assert torch.equal(target.buffers[f"{a}.qkv_proj.weight"], qkv)
    gate_up = torch.cat([shard(f"{m}.gate_proj.weight"), shard(f"{m}.up_proj.weight")])
    assert torch.equal(target.buffers[f"{m}.gate_up_proj.weight"], gate_up)
    assert torch.equal(target.buffers[f"{a}.o_proj.weight"], shard(f"{a}.o_proj.weight", 1))
    assert torch.equal(target.buffers[f"{m}.down_proj.weight"], shard(f"{m}.down_proj.weight", 1))
    assert torch.equal(target.buffers["model.norm.weight"], full["model.norm.weight"])
    embed = target.buffers["model.embed_tokens.weight"]
    assert embed.shape == (64, 32)  # padded vocab 128 over tp=2
    real = full["model.embed_tokens.weight"][64 * tp_rank : 64 * tp_rank + 64]
    assert torch.equal(embed[: len(real)], real) and not embed[len(real):].any()  # padding rows stay empty
