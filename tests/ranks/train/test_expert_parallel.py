"""Expert parallel (ep2 x dp2: experts over 2 ranks, each rank's experts FSDP2-sharded over 2, everything else over
all 4) against FSDP2 dp4 with every expert on every rank, on a tiny Qwen3-MoE over 4 gloo ranks: log-probs, losses,
the router's aux loss, grad norms and the trained weights agree (fp32, same seed, same per-rank batches); experts
that do not split over ep are refused."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.train.engine import LossNorm, TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks

ROWS = 8  # global batch: 2 rows per rank in both layouts (EP keeps every rank a data-parallel rank)
# 8 experts over ep=2: 4 per rank, FSDP-chunked 2 / 2 over edp; top-2 routing
MOE = replace(tiny_spec("qwen3_moe"), num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def value_loss(out, mb: dict, norm: LossNorm):
    mask = mb["response_mask"].float()
    return ((out.values - mb["returns"]) ** 2 * mask).sum() / norm.num_tokens, {}


def _compare(rank: int, world: int, critic: bool) -> None:
    build = (lambda: build_critic(MOE, seed=5)) if critic else (lambda: build_policy(MOE, seed=5))
    full = random_batch(seed=7, batch=ROWS)
    full["returns"] = torch.randn(ROWS, full["input_ids"].shape[1], generator=torch.Generator().manual_seed(3))
    loss = value_loss if critic else nll_loss
    # EP sums an expert's gradient in another order than dp4 (one GEMM over the EP group's rows, then over edp, vs per
    # rank, then over all 4): ~1e-7 apart, which AdamW at lr 1e-2 amplifies past 1e-5 within three steps; lr 1e-3 not
    settings = dict(lr=1e-3, grad_clip=0.5, micro_batch_size=1)  # two micro-batches: accumulation across all-to-alls
    dp_engine = TrainEngine(build(), build_mesh(ParallelLayout(4, 1)), **settings)
    ep_mesh = build_mesh(ParallelLayout(4, 1, ep=2))
    ep_engine = TrainEngine(build(), ep_mesh, **settings)
    experts = ep_engine.model.model.layers[0].mlp.experts.gate_up_proj
    assert isinstance(experts, DTensor) and experts.device_mesh.mesh_dim_names == ("edp", "ep")
    assert experts.to_local().shape[0] == 2, experts.to_local().shape  # 8 experts / ep 2 / edp 2
    assert ep_engine.dp_size == dp_engine.dp_size == 4 and ep_engine.dp_rank == dp_engine.dp_rank == rank
    batch = {k: v[2 * rank:2 * rank + 2] for k, v in full.items()}

    read = (lambda e: e.values(batch["input_ids"], batch["attention_mask"])) if critic else \
        (lambda e: e.logprobs(batch["input_ids"], batch["attention_mask"], temperature=0.7))
    torch.testing.assert_close(read(ep_engine), read(dp_engine), rtol=1e-5, atol=1e-6)
    for step in range(3):
        a, b = dp_engine.step(batch, loss), ep_engine.step(batch, loss)
        keys = ("loss", "grad_norm") + (() if critic else ("aux_loss",))
        for key in keys:
            assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]) + 1e-7, (step, key, a[key], b[key])
    dp_state, ep_state = dict(full_state_dict(dp_engine)), dict(full_state_dict(ep_engine))
    assert dp_state.keys() == ep_state.keys()
    for name, value in dp_state.items():
        relative = float((ep_state[name] - value).detach().norm() / value.detach().norm())  # Adam amplifies float-order noise elementwise
        assert relative < 1e-5, (name, relative)
    with pytest.raises(ValueError, match=r"ep=2 does not divide num_experts=3; valid ep: \[1, 3\]"):
        TrainEngine(build_policy(replace(MOE, num_experts=3), seed=1), ep_mesh)
    if rank == 0:
        print(f"ep2 x dp2 == dp4 (critic={critic}): loss {a['loss']:.6f} / {b['loss']:.6f}, "
              f"grad norm {a['grad_norm']:.6f} / {b['grad_norm']:.6f}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("critic", [False, True], ids=["policy", "critic"])
def test_ep2_dp2_matches_dp4(critic: bool) -> None:
    run_ranks(_compare, 4, critic)
