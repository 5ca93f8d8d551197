"""Pipeline-parallel engine (pp2 x dp2, FSDP2 inside each stage) against the dp-only engine (dp4) on 4 gloo ranks:
log-probs, values, losses, gradient norms and the trained weights agree (fp32, same seed, same global batch).
With DTensor TP inside the stages (pp2 x tp2) the reference is the same TP without stages (dp2 x tp2): TP's own
summation order differs from dp4's by ~1e-7, which AdamW at lr 1e-2 amplifies to ~1e-4 within a step."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.train.engine import LossNorm, TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks

ROWS = 8  # global batch: dp4 ranks take 2 rows each, pp2 x dp2 ranks 4 (the rows of two dp4 ranks)


def value_loss(out, mb: dict, norm: LossNorm):
    mask = mb["response_mask"].float()
    loss = ((out.values - mb["returns"]) ** 2 * mask).sum() / norm.num_tokens
    return loss, {}


def _rows(batch: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


def _compare(rank: int, world: int, critic: bool, tie: bool, schedule: str, tp: int = 1) -> None:
    spec = replace(tiny_spec(tie=tie), num_hidden_layers=3)  # 3 layers over 2 stages: the uneven split [2, 1]
    build = (lambda: build_critic(spec, seed=5)) if critic else (lambda: build_policy(spec, seed=5))
    full = random_batch(seed=7, batch=ROWS)
    full["returns"] = torch.randn(ROWS, full["input_ids"].shape[1], generator=torch.Generator().manual_seed(3))
    loss = value_loss if critic else nll_loss
    settings = dict(lr=1e-2, grad_clip=0.5)

    dp_engine = TrainEngine(build(), build_mesh(ParallelLayout(4 // tp, tp)), micro_batch_size=2, **settings)
    pp_mesh = build_mesh(ParallelLayout(2 // tp, tp, pp=2))
    pp_engine = PipelineEngine(build(), pp_mesh, schedule=schedule, micro_batch_size=2, **settings)
    d, rows = pp_mesh["dp"].get_local_rank(), ROWS // pp_mesh["dp"].size()  # TP peers share their rows
    e, dp_rows = dp_engine.dp_rank, ROWS // dp_engine.dp_size
    dp_batch, pp_batch = _rows(full, dp_rows * e, dp_rows * (e + 1)), _rows(full, rows * d, rows * (d + 1))

    read = (lambda e, b: e.values(b["input_ids"], b["attention_mask"])) if critic else \
        (lambda e, b: e.logprobs(b["input_ids"], b["attention_mask"], temperature=0.7))
    reference = read(dp_engine, full)  # forward only: every rank may read the whole batch
    torch.testing.assert_close(read(pp_engine, pp_batch), reference[rows * d:rows * (d + 1)], rtol=1e-5, atol=1e-6)

    for step in range(3):
        a, b = dp_engine.step(dp_batch, loss), pp_engine.step(pp_batch, loss)
        for key in ("loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]) + 1e-7, (step, key, a[key], b[key])
    assert 0 < pp_engine.pipeline_metrics()["pp/bubble_fraction"] < 1
    dp_state, pp_state = dict(full_state_dict(dp_engine)), dict(full_state_dict(pp_engine))
    assert dp_state.keys() == pp_state.keys()
    for name, value in dp_state.items():
        relative = float((pp_state[name] - value).norm() / value.norm())  # Adam amplifies float-order noise elementwise
        assert relative < 1e-5, (name, relative)
    if rank == 0:
        print(f"pp2 x dp{2 // tp} x tp{tp} ({schedule}) == dp{4 // tp} x tp{tp}: critic={critic} tied={tie} losses {a['loss']:.6f} / {b['loss']:.6f}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("critic,tie,schedule", [(False, False, "1F1B"), (False, True, "GPipe"), (True, False, "1F1B")],
                         ids=["policy_1f1b", "tied_gpipe", "critic_1f1b"])
def test_pp2_dp2_matches_dp4(critic: bool, tie: bool, schedule: str) -> None:
    run_ranks(_compare, 4, critic, tie, schedule)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tie", [False, True], ids=["vocab_parallel", "tied_replicated"])
def test_pp2_tp2_matches_dp2_tp2(tie: bool) -> None:
    """DTensor TP inside each stage (vocab-parallel embedding on the first stage, lm_head on the last)."""
    run_ranks(_compare, 4, False, tie, "1F1B", 2)


def _refusals(rank: int, world: int) -> None:
    engine = PipelineEngine(build_policy(tiny_spec(), seed=1), build_mesh(ParallelLayout(2, 1, pp=2)), micro_batch_size=3)
    batch = random_batch(seed=1, batch=4)
    with pytest.raises(ValueError, match="equal micro-batches"):
        engine.step(batch, nll_loss)
    engine.micro_batch_size = 4
    with pytest.raises(ValueError, match="1F1B needs at least pp=2 micro-batches"):
        engine.step(batch, nll_loss)


@pytest.mark.timeout(120)
def test_bad_micro_batches_are_refused() -> None:
    run_ranks(_refusals, 4)
