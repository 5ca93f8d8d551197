"""The vLLM-like fused TP target: where each HF tensor lands, and the must-receive arithmetic of the floor."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.transition.baselines import dp_rows
from rlhf_dyna.transition.rollout_target import RolloutTarget

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


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("held_dim", [0, 1])
def test_must_receive_counts_needed_elements_outside_the_held_range(world: int, held_dim: int) -> None:
    """Brute force: fill the target with 1 + flat index of every element and count the ones this rank lacks, when
    it holds a dp chunk of dim 0 (FSDP's default) or of dim 1 (row-parallel weights) of each 2-D tensor."""
    config = make_hf_config(SPEC)
    full = _full_tensors(config, lambda shape: torch.arange(torch.Size(shape).numel(), dtype=torch.float64).view(shape) + 1)
    for rank in range(world):
        target = RolloutTarget(config, tp=2, tp_rank=rank % 2, dtype=torch.float64)
        expected = computed = 0
        for name, tensor in full.items():
            for buffer in target.buffers.values():
                buffer.zero_()
            target.fill(name, tensor)
            dim = held_dim if tensor.ndim > 1 else 0
            lo, hi = dp_rows(tensor.shape[dim], world, rank)
            got = torch.cat([b.reshape(-1) for b in target.buffers.values()])
            flat = (got[got > 0] - 1).long()
            coord = flat // tensor[0].numel() if dim == 0 and tensor.ndim > 1 else (flat % tensor.shape[1] if dim == 1 else flat)
            expected += int(((coord < lo) | (coord >= hi)).sum())
            computed += target.must_receive(name, tuple(tensor.shape), (dim, lo, hi))
        assert computed == expected, (world, rank, held_dim)
