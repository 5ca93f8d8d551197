"""Expert parallel training of HF MoE layers (transformers 5 fuses a layer's experts into `experts.gate_up_proj`
[E, 2I, H] and `experts.down_proj` [E, H, I]).

Each rank of an EP group owns E / ep consecutive experts: the fused tensors become DTensors Shard(0) on the "ep" mesh
(FSDP2 then shards each rank's experts over "edp", train.parallelize.apply_fsdp). A layer's (token, expert) pairs are
sent to the ranks that own their experts and the outputs come back by all-to-all (torch's functional
`all_to_all_single_autograd`, so backward is the reverse all-to-all). Per token, the expert outputs are weighted and
summed in ascending expert order, as the HF layer does, so ep > 1 computes what ep = 1 computes.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def moe_experts(layer: nn.Module) -> nn.Module | None:
    """The fused experts module of an MoE decoder layer; None for a dense layer."""
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    return experts if experts is not None and all(hasattr(experts, n) for n in EXPERT_PARAMS) else None


def apply_expert_parallel(layers: list[nn.Module], ep_mesh: DeviceMesh) -> None:
    """Shard every MoE layer's experts over `ep_mesh` (dim 0, E / ep per rank) and route its tokens by all-to-all.
    Works on the meta device (a relayout's skeleton): each rank keeps its own slice, nothing is communicated."""
    ep = ep_mesh.size()
    for layer in layers:
        experts = moe_experts(layer)
        if experts is None:
            continue
        if experts.num_experts % ep:
            valid = [d for d in range(1, experts.num_experts + 1) if experts.num_experts % d == 0]
            raise ValueError(f"ep={ep} does not divide num_experts={experts.num_experts}; valid ep: {valid}")
        for name in EXPERT_PARAMS:
            param = getattr(experts, name)
            local = distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)  # every rank has it all
            experts.register_parameter(name, nn.Parameter(local, requires_grad=param.requires_grad))
        experts.forward = partial(expert_parallel_forward, experts, ep_mesh.get_group())


def expert_parallel_forward(experts: nn.Module, group: ProcessGroup, hidden: Tensor, top_k_index: Tensor,
                            top_k_weights: Tensor) -> Tensor:
    """The HF experts forward over [T, H] tokens with their top-k experts and weights, experts on other EP ranks."""
    ep, k = group.size(), top_k_index.shape[1]
    per_rank = experts.num_experts // ep
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert, so by owning rank
    token = torch.div(order, k, rounding_mode="floor")
    sent = torch.bincount(flat, minlength=experts.num_experts)
    with torch.no_grad():  # counts[r, j]: rows rank r sends to this rank's local expert j
        counts = all_to_all_single(sent, None, None, group).view(ep, per_rank)
    send_splits, recv_splits = sent.view(ep, per_rank).sum(1).tolist(), counts.sum(1).tolist()
    routed = all_to_all_single_autograd(hidden[token], recv_splits, send_splits, group)
    returned = all_to_all_single_autograd(local_experts(experts, routed, counts), send_splits, recv_splits, group)
    weighted = returned * top_k_weights.reshape(-1)[order, None]
    # index_add_ adds rows in order: per token, ascending expert index, as the HF loop over experts does
    return torch.zeros_like(hidden).index_add_(0, token, weighted.to(hidden.dtype))


def local_experts(experts: nn.Module, rows: Tensor, counts: Tensor) -> Tensor:
    """Apply this rank's experts to rows that arrive grouped by source rank, then by local expert (`counts`
    [ep, E / ep]); returns the outputs in the same row order. Every local expert runs, on zero rows if none
    reach it, so each rank's expert gradients exist (FSDP reduce-scatters them collectively)."""
    ep, per_rank = counts.shape
    expert_of_row = torch.arange(per_rank, device=rows.device).repeat(ep).repeat_interleave(counts.reshape(-1))
    by_expert = torch.argsort(expert_of_row, stable=True)
    gate_up, down = _local(experts.gate_up_proj), _local(experts.down_proj)
    chunks = rows[by_expert].split(counts.sum(0).tolist())
    outputs = torch.cat([expert_mlp(experts, x, gate_up[j], down[j]) for j, x in enumerate(chunks)])
    inverse = torch.empty_like(by_expert)
    inverse[by_expert] = torch.arange(by_expert.numel(), device=rows.device)
    return outputs[inverse]


def expert_mlp(experts: nn.Module, x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """One expert's SwiGLU, as the HF experts compute it: gate rows first in gate_up_proj."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(experts.act_fn(gate) * up, down)


def _local(param: Tensor) -> Tensor:
    return param.to_local() if isinstance(param, DTensor) else param
