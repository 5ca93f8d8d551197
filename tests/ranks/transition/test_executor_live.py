"""The VPS mover inside relayout on live FSDP2 (+ DTensor TP) engines with AdamW state, against torch's full-tensor mover.

Two engines with identical weights, batches and AdamW state are re-laid out, one by `move_by_full_tensors`, one by
the VPS executor (verification on); every local shard of params, exp_avg, exp_avg_sq and step must be equal, and
both must train on identically afterwards.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.movers import local_of
from rlhf_dyna.transition.relayout import bind_train_state, relayout
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_mover import least_moving_layout, make_vps_mover
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.cache import cached_plan
from rlhf_dyna.vps.spec import ParallelSpec
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks
from tests.ranks.transition.test_executor import sum_over_ranks


def _trained(world: int, dp: int, tp: int, tie: bool = False) -> TrainEngine:
    engine = TrainEngine(build_policy(tiny_spec("llama", tie), seed=0), build_mesh(ParallelLayout(dp, tp)), lr=1e-2)
    engine.step(random_batch(seed=dist.get_rank() // tp, batch=2), nll_loss)
    return engine


def _relayout_both(rank: int, world: int, src: tuple[int, int], dst: tuple[int, int], budget: int, in_place: bool,
                   tie: bool = False) -> None:
    reference, _ = relayout(_trained(world, *src, tie), ParallelLayout(*dst))
    recorder = TraceRecorder(rank)
    engine = _trained(world, *src, tie)
    config = engine.model.config
    old_shards = [local_of(t) for t in bind_train_state(engine).values()]
    mover = make_vps_mover(config, budget, verify=True, in_place=in_place, recorder=recorder)
    moved, stats = relayout(engine, ParallelLayout(*dst), mover=mover)
    want, got = bind_train_state(reference), bind_train_state(moved)
    if in_place:  # every consumed source shard was freed during the move, or adopted whole by the new engine
        new_storages = {local_of(t).untyped_storage().data_ptr() for t in got.values()}
        adopted = [s for s in old_shards if s.untyped_storage().nbytes() > 0]
        assert all(s.untyped_storage().data_ptr() in new_storages for s in adopted)
        assert sum_over_ranks(len(adopted)) > 0  # some shards stay on their rank in both orders of dp4 -> dp2 x tp2
        for module in moved.model.modules():  # FSDP gathers from its own flat view: it must see the adopted storage
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            for fp in group.fsdp_params if group is not None else ():
                assert fp._sharded_param_data.untyped_storage().data_ptr() == local_of(fp.sharded_param).untyped_storage().data_ptr()
    assert want.keys() == got.keys() and len(got) == 3 * len(list(moved.model.parameters()))
    for key in sorted(want):
        assert torch.equal(local_of(got[key]), local_of(want[key])), f"rank {rank}: {key} differs"
    steps = {float(s["step"]) for s in moved.optimizer.state.values()}
    assert steps == {1.0}
    received = torch.tensor([stats.bytes_received])
    dist.all_reduce(received)
    plan = cached_plan(catalog_from_config(config, "float32", "float32"), ParallelSpec(dp=src[0], tp=src[1]),
                       ParallelSpec(dp=dst[0], tp=dst[1], tp_outer=ParallelLayout(*dst).tp_outer), world)
    assert int(received) == plan.min_bytes > 0
    assert stats.rounds == len(recorder.events) >= 1
    assert [e.round for e in recorder.events] == list(range(stats.rounds))
    batch = random_batch(seed=7 + moved.dp_rank, batch=2)
    assert moved.step(batch, nll_loss)["loss"] == reference.step(batch, nll_loss)["loss"]


@pytest.mark.timeout(150)
def test_relayout_dp2_to_tp2_moves_params_and_adam_state():
    run_ranks(_relayout_both, 2, (2, 1), (1, 2), 4 << 10, False)


@pytest.mark.timeout(200)
def test_relayout_dp4_to_dp2_tp2_in_place_moves_params_and_adam_state():
    run_ranks(_relayout_both, 4, (4, 1), (2, 2), 64 << 10, True)


@pytest.mark.timeout(200)
def test_relayout_tied_embeddings_dp4_to_dp2_tp2_in_place():
    """A tied embedding is replicated over tp (not vocab-parallel) and FSDP-sharded over dp: the layout says so."""
    run_ranks(_relayout_both, 4, (4, 1), (2, 2), 64 << 10, True, True)


def _least_moving_order(rank: int, world: int) -> None:
    """From FSDP dp4, TP outermost keeps every rank's own chunk of each column-parallel weight: the search finds it,
    and the engine built on that mesh receives exactly that plan's bytes."""
    engine = _trained(world, 4, 1)
    layout = least_moving_layout(engine, ParallelLayout(2, 2))
    assert layout == ParallelLayout(2, 2, 3, tp_outer=True)
    catalog = catalog_from_config(engine.model.config, "float32", "float32")
    inner, outer = (cached_plan(catalog, ParallelSpec(dp=4), ParallelSpec(dp=2, tp=2, tp_outer=o), world) for o in (False, True))
    assert outer.min_bytes < 0.75 * inner.min_bytes
    moved, stats = relayout(engine, layout, mover=make_vps_mover(engine.model.config, verify=True, in_place=True))
    received = torch.tensor([stats.bytes_received])
    dist.all_reduce(received)
    assert int(received) == outer.min_bytes
    assert moved.mesh["tp"].mesh.tolist() == [rank % 2, rank % 2 + 2] and moved.dp_rank == rank % 2


@pytest.mark.timeout(200)
def test_relayout_dp4_to_dp2_tp2_tp_outer_moves_params_and_adam_state():
    run_ranks(_relayout_both, 4, (4, 1), (2, 2, 3, True), 4 << 10, True)


@pytest.mark.timeout(150)
def test_rank_order_search_picks_tp_outer_from_fsdp():
    run_ranks(_least_moving_order, 4)


def _zero_switch_in_place(rank: int, world: int) -> None:
    """dp2 ZeRO-3 -> dp2 ZeRO-1: every shard stays, so the in-place move adopts all of them: nothing is sent or
    copied, and the engine trains on exactly as a full-tensor relayout's does."""
    reference, _ = relayout(_trained(world, 2, 1), ParallelLayout(2, 1, zero=1))
    engine = _trained(world, 2, 1)
    old = {key: local_of(t) for key, t in bind_train_state(engine).items()}
    moved, stats = relayout(engine, ParallelLayout(2, 1, zero=1), mover=make_vps_mover(engine.model.config, verify=True, in_place=True))
    assert stats.bytes_received == 0 and stats.rounds == 0
    for key, t in bind_train_state(moved).items():
        assert local_of(t).untyped_storage().data_ptr() == old[key].untyped_storage().data_ptr(), key
    batch = random_batch(seed=7 + moved.dp_rank, batch=2)
    assert moved.step(batch, nll_loss)["loss"] == reference.step(batch, nll_loss)["loss"]


@pytest.mark.timeout(120)
def test_zero3_to_zero1_in_place_adopts_every_shard():
    run_ranks(_zero_switch_in_place, 2)
