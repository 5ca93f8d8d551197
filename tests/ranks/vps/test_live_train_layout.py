"""The VPS train layout agrees, element for element, with what FSDP2, DTensor TP and expert parallel hold on gloo ranks:
the engine's own TP plan and FSDP2 placements, Adam stepped once, every piece of every parameter and moment compared."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.parallelize import apply_fsdp, apply_tensor_parallel, parallelize
from rlhf_dyna.train.pp_stage import split_stage
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind
from tests.multirank import run_ranks

# Odd sizes so that FSDP's chunks are uneven and some trailing shards are empty (hidden 6 over 4: 2, 2, 2, 0);
# o_proj's 12 columns split evenly over 4 and over 2 x 2 (sharded on dim 1), down_proj's 14 do not (dim 0).
CONFIG = dict(hidden_size=6, intermediate_size=14, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=6, vocab_size=38)


def build(dp: int, tp: int, fsdp: bool, tp_outer: bool, tied: bool, pp: int = 1,
          per_layer: bool | None = None) -> LlamaForCausalLM:
    """The engine's own TP plan and FSDP2 placements (train.parallelize), fp32; with pp, this rank's pipeline stage
    (train.pp_stage: the layers the VPS layout gives it) on the stage's dp slice of a (pp, dp) mesh."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(config(tied, pp)).float()
    if pp > 1:
        mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        model = split_stage(model, ParallelSpec(dp=dp, tp=tp, pp=pp), mesh["pp"].get_local_rank())
        if tp > 1:
            apply_tensor_parallel(model, mesh["tp"])
        dp_mesh = mesh["dp"]
    elif tp > 1:
        mesh = build_mesh(ParallelLayout(dp, tp, tp_outer=tp_outer))
        apply_tensor_parallel(model, mesh["tp"])
        dp_mesh = mesh["dp"]
    else:
        dp_mesh = init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",))
    if fsdp:
        apply_fsdp(model, dp_mesh, precision="fp32", per_layer=per_layer)
    return model


def config(tied: bool, pp: int = 1) -> LlamaConfig:
    """Three layers under pp: stages own the uneven ranges [0, 2) and [2, 3)."""
    return LlamaConfig(**{**CONFIG, "num_hidden_layers": 3 if pp > 1 else 2}, tie_word_embeddings=tied)


def check(dp: int, tp: int, fsdp: bool, tp_outer: bool = False, tied: bool = False, pp: int = 1,
          per_layer: bool | None = None) -> int:
    model = build(dp, tp, fsdp, tp_outer, tied, pp, per_layer)
    spec = ParallelSpec(dp=dp, tp=tp, pp=pp, zero=3 if fsdp else 0, tp_outer=tp_outer)
    return compare(model, spec, config(tied, pp))


def moe_config(num_experts: int) -> Qwen3MoeConfig:
    """Layer 0 sparse, layer 1 dense (mlp_only_layers); moe_intermediate_size 5 and hidden 6 keep shapes odd."""
    return Qwen3MoeConfig(**CONFIG, num_experts=num_experts, num_experts_per_tok=2, moe_intermediate_size=5,
                          mlp_only_layers=[1], decoder_sparse_step=1)


def check_ep(ep: int, num_experts: int) -> int:
    """The engine's own expert parallel (train.parallelize on train.mesh.build_ep_mesh) over all 4 ranks as dp."""
    torch.manual_seed(0)
    model = parallelize(Qwen3MoeForCausalLM(moe_config(num_experts)).float(), build_mesh(ParallelLayout(4, 1, ep=ep)), "fp32")
    return compare(model, ParallelSpec(dp=4, ep=ep), moe_config(num_experts))


def compare(model, spec: ParallelSpec, hf_config) -> int:
    rank = dist.get_rank()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p) * (1 + rank)
    opt.step()
    layout = build_layout(catalog_from_config(hf_config, param_dtype="float32"), spec)
    # by live buffer: a tied embedding is model.embed_tokens.weight on the first stage, lm_head.weight on the last;
    # a fused buffer (experts.gate_up_proj: gate and up) holds several pieces
    pieces: dict[str, list] = {}
    for piece in layout.pieces(rank):
        pieces.setdefault(piece.buffer, []).append(piece)
    names = {buffer.rsplit(":", 1)[0] for buffer in pieces}
    live = {name for name, _ in model.named_parameters()}
    assert names <= live, f"rank {rank}: VPS buffers {sorted(names - live)} are not parameters of this rank's model"
    buffers = layout.buffers(rank)
    checked = 0
    for name, param in model.named_parameters():
        state = opt.state[param]
        for kind, value in ((Kind.PARAM, param.data), (Kind.EXP_AVG, state["exp_avg"]),
                            (Kind.EXP_AVG_SQ, state["exp_avg_sq"])):
            is_dtensor = hasattr(value, "full_tensor")  # TP leaves norms as plain replicated tensors
            full = value.full_tensor() if is_dtensor else value  # collective: every rank, same order
            local = value.to_local() if is_dtensor else value
            held = pieces.get(f"{name}:{kind.value}")
            if held is None:
                assert local.numel() == 0, f"rank {rank}: {name} {kind} holds {tuple(local.shape)}, VPS says nothing"
                continue
            assert tuple(local.shape) == buffers[held[0].buffer].shape, (name, kind, local.shape, buffers[held[0].buffer])
            covered = 0
            for piece in held:
                view = local.contiguous().flatten().as_strided(piece.box.shape, piece.strides, piece.offset)
                want = logical(full, piece)[tuple(slice(a, b) for a, b in zip(piece.box.lo, piece.box.hi))]
                assert torch.equal(view, want), f"rank {rank}: {name} {kind} {piece.box} differs"
                covered += piece.box.volume
                checked += 1
            assert covered == local.numel(), f"rank {rank}: {name} {kind}: VPS pieces cover {covered} of {local.numel()}"
    return checked


def logical(full: torch.Tensor, piece) -> torch.Tensor:
    """The logical tensor a piece belongs to, from the full live parameter: fused gate_up_proj [E, 2I, H] is the
    experts' gate [E, I, H] then up."""
    if full.ndim == 3 and piece.tensor.shape != tuple(full.shape):
        gate, up = full.chunk(2, dim=1)
        return gate if ".gate_proj." in piece.tensor.name else up
    return full


# a model this small is one FSDP unit (train.parallelize.per_layer_units); the *_per_layer cases wrap each layer too
CASES = {"fsdp4": (4, 1, True), "fsdp2_tp2": (2, 2, True), "ddp2_tp2": (2, 2, False),
         "fsdp4_per_layer": (4, 1, True, False, False, 1, True), "fsdp2_tp2_per_layer": (2, 2, True, False, False, 1, True),
         "fsdp2_tp2_tp_outer": (2, 2, True, True),  # TP groups {0, 2}, {1, 3}
         "fsdp2_tp2_tied": (2, 2, True, False, True),  # the tied embedding stays whole over tp
         "pp2_fsdp2": (2, 1, True, False, False, 2),  # stages {0, 1} and {2, 3}, layers [0, 2) and [2, 3)
         "pp2_fsdp2_tied": (2, 1, True, False, True, 2),
         "pp2_tp2": (1, 2, True, False, False, 2)}  # TP inside each stage: vocab-parallel embedding / lm_head  # embedding on stage 0, its tied lm_head copy on stage 1


EP_CASES = {"ep2_fsdp2": (2, 6),  # 3 experts per EP rank, FSDP-chunked 2 / 1 over edp
            "ep4": (4, 4)}  # one expert per rank, edp = 1


def check_cases(rank: int, world: int, cases: list[str]) -> dict[str, int]:
    """Pieces checked per case on this rank."""
    return {name: check_ep(*EP_CASES[name]) if name in EP_CASES else check(*CASES[name]) for name in cases}


@pytest.mark.timeout(300)
def test_layout_matches_fsdp2_and_dtensor_tp():
    """FSDP2 over 4 ranks (uneven and empty shards), FSDP2 x TP on (2, 2) (_StridedShard) in both rank orders,
    TP with DP replicas, tied embeddings under FSDP2 x TP, pipeline stages (uneven, tied embedding across stages)
    with FSDP2 inside each stage, and expert parallel (Qwen3-MoE experts over ep, FSDP2 over edp, uneven chunks)."""
    cases = ["fsdp4", "fsdp4_per_layer", "fsdp2_tp2", "fsdp2_tp2_per_layer", "ddp2_tp2", "fsdp2_tp2_tp_outer", "fsdp2_tp2_tied", "pp2_fsdp2", "pp2_fsdp2_tied", "pp2_tp2",
             "ep2_fsdp2", "ep4"]
    checked = run_ranks(check_cases, 4, cases, timeout=240)
    for case in cases:
        assert all(by_case[case] > 0 for by_case in checked), checked
