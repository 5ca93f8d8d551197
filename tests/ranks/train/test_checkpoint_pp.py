"""DCP checkpoints of pipeline layouts on 4 real gloo ranks: a tied 3-layer tiny Llama (embedding on stage 0, lm_head
on stage 1, layers split [2, 1]) with AdamW, fp32.

- Exact resume under pp2 x dp2: 3 steps in one engine == 2 steps, a checkpoint, a fresh engine (other weights, other
  Adam moments) loading it, and the 3rd step.
- A pp2 x dp2 checkpoint loaded on dp4, and a dp4 checkpoint loaded on pp2 x dp2: gathered parameters and
  exp_avg / exp_avg_sq / step bit-equal to what was saved; the last stage's tied lm_head gets the embedding's state.
  The next step after the cross-layout load continues the saved run (same update; float order differs: < 1e-5)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.checkpoint import load_engines, save_engines
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.ranks.train._optimizer_state import full_optimizer_state
from tests.multirank import run_ranks

ROWS = 8  # global batch: 2 rows per dp4 rank, 4 per pp2 x dp2 rank
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _model(seed: int):
    return build_policy(replace(tiny_spec(tie=True), num_hidden_layers=3), seed=seed)


def pp_engine(seed: int) -> PipelineEngine:
    return PipelineEngine(_model(seed), build_mesh(ParallelLayout(2, 1, pp=2)), micro_batch_size=2, lr=1e-2)


def dp_engine(seed: int) -> TrainEngine:
    return TrainEngine(_model(seed), build_mesh(ParallelLayout(4, 1)), micro_batch_size=2, lr=1e-2)


def train(engine: TrainEngine, *steps: int) -> None:
    per = ROWS // engine.dp_size
    for step in steps:
        batch = random_batch(step, batch=ROWS)
        engine.step({k: v[engine.dp_rank * per:(engine.dp_rank + 1) * per] for k, v in batch.items()}, nll_loss)


def snapshot(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {**{f"param.{n}": t.clone() for n, t in full_state_dict(engine)}, **full_optimizer_state(engine)}


def assert_equal(got: dict, want: dict, what: str) -> None:
    assert any(k.endswith("exp_avg_sq") for k in want) and f"param.{HEAD}" in want
    for key, value in want.items():
        assert torch.equal(got[key], value), f"{what}: {key} differs"


def assert_close(got: dict, want: dict, what: str) -> None:
    for key, value in want.items():
        relative = float((got[key].double() - value.double()).norm() / value.double().norm().clamp(min=1e-30))
        assert relative < 1e-5, f"{what}: {key} differs by {relative:.2e} (relative)"


def assert_tied(state: dict, what: str) -> None:
    """The pipeline's two holders of the tied embedding carry the same values and AdamW state."""
    assert torch.equal(state[f"param.{HEAD}"], state[f"param.{EMBED}"]), what
    for slot in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(state[f"{HEAD}.{slot}"], state[f"{EMBED}.{slot}"]), f"{what}: {slot}"


def _checkpoints(rank: int, world: int, out: Path) -> None:
    pp = pp_engine(seed=0)
    train(pp, 0, 1)
    save_engines({"actor": pp}, out / "pp")
    pp_saved = snapshot(pp)
    train(pp, 2)
    pp_after = snapshot(pp)
    assert_tied(pp_saved, "saved pp engine")

    dp = dp_engine(seed=0)
    train(dp, 0, 1)
    save_engines({"actor": dp}, out / "dp")
    dp_saved = snapshot(dp)
    assert set(dp_saved) < set(pp_saved)  # the dp engine's names; pp adds the lm_head holder's optimizer state

    resumed = pp_engine(seed=123)  # other initial weights; other moments and step counts after its own step
    train(resumed, 99)
    load_engines({"actor": resumed}, out / "pp")
    assert_equal(snapshot(resumed), pp_saved, "pp2 x dp2 -> pp2 x dp2")
    train(resumed, 2)
    assert_close(snapshot(resumed), pp_after, "exact resume: 2 + 1 steps vs 3 steps")

    from_pp = dp_engine(seed=123)
    train(from_pp, 99)
    load_engines({"actor": from_pp}, out / "pp")
    assert_equal(snapshot(from_pp), {k: v for k, v in pp_saved.items() if k in dp_saved}, "pp2 x dp2 -> dp4")
    train(from_pp, 2)
    assert_close(snapshot(from_pp), {k: v for k, v in pp_after.items() if k in dp_saved}, "next step after pp -> dp4")

    from_dp = pp_engine(seed=123)
    train(from_dp, 99)
    load_engines({"actor": from_dp}, out / "dp")
    loaded = snapshot(from_dp)
    assert_equal(loaded, dp_saved, "dp4 -> pp2 x dp2")
    assert_tied(loaded, "dp4 -> pp2 x dp2")
    if rank == 0:
        print("pp checkpoints: exact resume, pp2 x dp2 -> dp4 and dp4 -> pp2 x dp2 bit-equal (tied embedding)")


@pytest.mark.timeout(240)
def test_pipeline_checkpoints_resume_exactly_and_reshard_across_layouts(tmp_path: Path) -> None:
    run_ranks(_checkpoints, 4, tmp_path)
