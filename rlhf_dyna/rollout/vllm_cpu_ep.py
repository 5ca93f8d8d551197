"""vLLM 0.32's expert parallelism on the CPU, made to compute.

vLLM places the experts itself (expert_map_manager.determine_expert_map, "linear": rank r of the EP group holds a
contiguous range, the first E % ep ranks one more) and hands each MoE layer's kernel the rank's expert map, but its
CPU kernel (`CPUUnquantizedExperts.apply` -> `cpu_fused_moe`, csrc/cpu/cpu_fused_moe.cpp `fused_moe_impl`) ignores
the map: it indexes the rank's local experts with global expert ids and reads past them (SIGSEGV at the first
forward). Here each token's routes are mapped to local slots first: a local expert gets its slot, a remote one slot 0
with weight 0, so the kernel returns this rank's share of the output, and vLLM's all-reduce over the EP group (the
MoE runner's final reduce, run whenever ep_size > 1) adds the shares. Without an expert map (no EP) nothing changes.
"""
from __future__ import annotations

import functools

import torch


def remap_to_local(topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                   expert_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Global routes -> (weights with remote experts zeroed, local expert slots; remote ones point at slot 0)."""
    local = expert_map[topk_ids.long()]
    remote = local < 0
    weights = topk_weights.masked_fill(remote, 0.0).contiguous()  # the kernel reads contiguous float32 / int32
    return weights, local.masked_fill(remote, 0).to(topk_ids.dtype).contiguous()


def install() -> None:
    """Idempotent, per process: CPU expert kernels honour the expert map they are given."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    if getattr(CPUUnquantizedExperts.apply, "honours_expert_map", False):
        return
    original = CPUUnquantizedExperts.apply

    @functools.wraps(original)
    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, *args, **kwargs):
        if expert_map is not None:
            if kwargs.get("apply_router_weight_on_input"):  # weights already in the input: zeroing them would not help
                raise NotImplementedError("CPU expert parallel with apply_router_weight_on_input (top-1 routers)")
            topk_weights, topk_ids = remap_to_local(topk_weights, topk_ids, expert_map)
        return original(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                        expert_map, *args, **kwargs)

    apply.honours_expert_map = True
    CPUUnquantizedExperts.apply = apply
