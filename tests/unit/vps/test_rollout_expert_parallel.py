"""vLLM's expert parallelism in the VPS rollout layout: each rollout rank receives exactly its experts (which ones:
vLLM's own `determine_expert_map`), whole, and nothing of the others; without it every rank gets its TP slice of
every expert. Counted independently of the planner: experts x 3 x I x H bytes per layer, FSDP's source shards by
torch.chunk over the expert dim."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layer_groups import sub_catalog
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.model import EXPERT_ROLES
from rlhf_dyna.vps.plan import Plan, build_plan
from rlhf_dyna.vps.spec import ParallelSpec, Phase, rollout_spec, train_spec
from rlhf_dyna.vps.tensor import Kind
from rlhf_dyna.vps.validate import SpecError

H, I, LAYERS = 8, 4, 2


def moe_catalog(experts: int):
    cfg = SimpleNamespace(model_type="qwen3_moe", num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=2, intermediate_size=6, vocab_size=101, tie_word_embeddings=False,
                          num_experts=experts, moe_intermediate_size=I, mlp_only_layers=[], decoder_sparse_step=1)
    catalog = catalog_from_config(cfg)
    return sub_catalog(catalog, tuple(t for t in catalog.tensors if t.role in EXPERT_ROLES))


def landing(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each destination rank gets over the wire, and by local copy from its own source shard."""
    return plan.pair_bytes().sum(axis=0), plan.local_bytes_by_rank()


@pytest.mark.parametrize("experts,world", [(5, 4), (8, 4), (6, 2)])
def test_each_rollout_rank_receives_exactly_its_experts(experts: int, world: int) -> None:
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    catalog = moe_catalog(experts)
    dst = build_layout(catalog, rollout_spec(world, 1, expert_parallel=True))
    plan = build_plan(build_layout(catalog, train_spec(world), (Kind.PARAM,)), dst)
    itemsize = plan.classes[0].itemsize
    expert_bytes = 3 * I * H * itemsize * LAYERS  # gate, up, down of one expert in every layer
    wire, local = landing(plan)
    held = [set(c.tolist()) for c in torch.arange(experts).chunk(world)] + [set()] * world  # FSDP2: torch.chunk, dim 0
    for rank in range(world):
        n_local, expert_map, _ = determine_expert_map(world, rank, experts)  # vLLM's placement ("linear")
        mine = set(torch.nonzero(expert_map >= 0).flatten().tolist())
        assert len(mine) == n_local
        for piece in dst.pieces(rank):  # whole experts, exactly vLLM's
            assert set(range(piece.box.lo[0], piece.box.hi[0])) == mine, (rank, piece)
            assert tuple(piece.box.hi[1:]) == piece.tensor.shape[1:] and not any(piece.box.lo[1:])
        assert wire[rank] + local[rank] == n_local * expert_bytes
        assert local[rank] == len(mine & held[rank]) * expert_bytes  # what it already trains stays local
        assert wire[rank] == len(mine - held[rank]) * expert_bytes
    assert plan.min_bytes == wire.sum()


def test_without_expert_parallel_every_rank_gets_its_slice_of_every_expert() -> None:
    catalog, world, experts = moe_catalog(8), 4, 8
    plan = build_plan(build_layout(catalog, train_spec(world), (Kind.PARAM,)),
                      build_layout(catalog, rollout_spec(world, 1)))
    wire, local = landing(plan)
    itemsize = plan.classes[0].itemsize
    assert (wire + local == experts * 3 * (I // world) * H * itemsize * LAYERS).all()


def test_expert_parallel_needs_an_expert_per_rank() -> None:
    with pytest.raises(SpecError, match="ep=4 exceeds num_experts=2; valid ep: 1, or a rollout of at most 2 ranks"):
        build_layout(moe_catalog(2), ParallelSpec(Phase.ROLLOUT, tp=4, ep=4))
