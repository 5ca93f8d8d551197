"""FSDP2 (dp=2) and FSDP2+TP (dp=2, tp=2) training engine on real gloo ranks."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlhf_dyna.train import parallelize

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.parallelize import decoder_layers
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks


def _full_grads(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for n, p in engine.model.named_parameters()}


def _train_checks(rank: int, world: int, tp: int, tie: bool) -> None:
    mesh = build_mesh(ParallelLayout(world // tp, tp))
    make = lambda mbs: TrainEngine(build_policy(tiny_spec(tie=tie), seed=3), mesh, lr=1e-2, grad_clip=1.0, micro_batch_size=mbs)
    batch = random_batch(seed=100 + mesh["dp"].get_local_rank(), batch=2)  # TP peers share a batch, dp ranks differ

    whole, micro = make(None), make(1)
    whole_metrics = whole.step(batch, nll_loss)
    micro_metrics = micro.step(batch, nll_loss)  # 2 micro-batches of 1
    assert abs(whole_metrics["loss"] - micro_metrics["loss"]) < 1e-5, (whole_metrics, micro_metrics)
    assert abs(whole_metrics["tokens"] - 1.0) < 1e-6  # normaliser = global token mean
    for (name, g_whole), g_micro in zip(_full_grads(whole).items(), _full_grads(micro).values()):
        torch.testing.assert_close(g_micro, g_whole, rtol=1e-4, atol=1e-6, msg=name)
    for (name, p_whole), (_, p_micro) in zip(full_state_dict(whole), full_state_dict(micro)):
        torch.testing.assert_close(p_micro, p_whole, rtol=1e-4, atol=1e-5, msg=name)

    losses = [whole_metrics["loss"]] + [whole.step(batch, nll_loss)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.1, losses


@pytest.mark.timeout(120)
def test_fsdp_dp2_trains_and_micro_batches_match_full_batch() -> None:
    run_ranks(_train_checks, 2, 1, False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tie", [False, True], ids=["vocab_parallel", "tied_replicated"])
def test_fsdp_tp_dp2_tp2_trains_and_micro_batches_match_full_batch(tie: bool) -> None:
    run_ranks(_train_checks, 4, 2, tie)


def _skeleton_checks(rank: int, world: int, tp: int, tie: bool) -> None:
    """An engine built on meta without `materialize` (a rebalancing move's destination built ahead) and given its
    shards later by `materialize_now` trains exactly as the engine it copies: its optimizer holds the real shards."""
    from rlhf_dyna.models.build import make_hf_config
    from rlhf_dyna.models.meta_init import meta_policy, recompute_buffers_

    mesh = build_mesh(ParallelLayout(world // tp, tp))
    real = TrainEngine(build_policy(tiny_spec(tie=tie), seed=3), mesh, lr=1e-2, grad_clip=1.0)
    skeleton = TrainEngine(meta_policy(make_hf_config(tiny_spec(tie=tie)), torch.float32), mesh, lr=1e-2, grad_clip=1.0)
    assert all(p.is_meta for p in skeleton.model.parameters())

    def materialize(model) -> None:
        model.to_empty(device=torch.device("cpu"))
        recompute_buffers_(model, torch.device("cpu"))

    skeleton.materialize_now(materialize)
    with torch.no_grad():
        for p, q in zip(skeleton.model.parameters(), real.model.parameters(), strict=True):
            p.to_local().copy_(q.to_local())
    assert {id(p) for g in skeleton.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in skeleton.model.parameters()}
    batch = random_batch(seed=100 + mesh["dp"].get_local_rank(), batch=2)
    for _ in range(2):
        assert skeleton.step(batch, nll_loss)["loss"] == real.step(batch, nll_loss)["loss"]
    for (name, p), (_, q) in zip(full_state_dict(skeleton), full_state_dict(real)):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


@pytest.mark.timeout(120)
def test_skeleton_engine_materialized_later_trains_as_the_engine_it_copies() -> None:
    run_ranks(_skeleton_checks, 2, 1, True)


def _unit_checks(rank: int, world: int) -> None:
    """Per-layer FSDP units and one unit for the whole (small) model train alike: the grouping moves no shard."""
    mesh = build_mesh(ParallelLayout(world, 1))
    batch = random_batch(seed=100 + rank, batch=4)

    def trained(per_layer: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
        saved = parallelize.WHOLE_MODEL_UNIT_BYTES
        parallelize.WHOLE_MODEL_UNIT_BYTES = 0 if per_layer else saved  # every model is "large" at 0 bytes
        try:
            engine = TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=1.0, micro_batch_size=2)
        finally:
            parallelize.WHOLE_MODEL_UNIT_BYTES = saved
        assert all(isinstance(layer, FSDPModule) == per_layer for layer in decoder_layers(engine.model))
        losses = [engine.step(batch, nll_loss)["loss"] for _ in range(3)]
        return losses, {name: p.clone() for name, p in full_state_dict(engine)}

    (layer_losses, layer_params), (whole_losses, whole_params) = trained(True), trained(False)
    assert layer_losses[-1] < layer_losses[0]
    torch.testing.assert_close(whole_losses, layer_losses, rtol=1e-6, atol=1e-7)
    for name, param in layer_params.items():
        torch.testing.assert_close(whole_params[name], param, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(120)
def test_one_fsdp_unit_for_a_small_model_trains_as_per_layer_units() -> None:
    run_ranks(_unit_checks, 2)
