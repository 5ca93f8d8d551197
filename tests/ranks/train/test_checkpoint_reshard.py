"""DCP checkpoints of a training engine reshard on load: a 2-rank (dp2) actor with Adam state, loaded on 4 ranks in
dp2 x tp2 and in dp4 ZeRO-1, holds exactly the saved parameters and exp_avg / exp_avg_sq / step (gathered, compared
bitwise), and its next optimizer step equals the next step of the 2-rank engine. Real gloo ranks, real FSDP2 + TP."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.train.checkpoint import load_engines, save_engines
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import nll_loss, random_batch, tiny_spec
from tests.ranks.train._optimizer_state import full_optimizer_state
from tests.multirank import run_ranks

BATCH = 8  # rows of the global batch; each dp rank trains its slice


def engine(dp: int, tp: int, seed: int, zero: int = 3) -> TrainEngine:
    return TrainEngine(build_policy(tiny_spec(), seed=seed), build_mesh(ParallelLayout(dp, tp)), lr=1e-2, micro_batch_size=2, zero=zero)


def dp_slice(batch: dict, e: TrainEngine) -> dict:
    per = BATCH // e.dp_size
    return {k: v[e.dp_rank * per : (e.dp_rank + 1) * per] for k, v in batch.items()}


def snapshot(e: TrainEngine) -> dict[str, torch.Tensor]:
    return {**{f"param.{n}": t.clone() for n, t in full_state_dict(e)}, **full_optimizer_state(e)}


def save_on_two(rank: int, world: int, out: Path) -> None:
    e = engine(2, 1, seed=0)
    for step in range(2):
        e.step(dp_slice(random_batch(step, batch=BATCH), e), nll_loss)
    save_engines({"actor": e}, out / "ckpt")
    saved = snapshot(e)
    e.step(dp_slice(random_batch(2, batch=BATCH), e), nll_loss)
    after = snapshot(e)
    if rank == 0:
        torch.save({"saved": saved, "after": after}, out / "expected.pt")


def load_on_four(rank: int, world: int, out: Path, dp: int, tp: int, zero: int) -> None:
    e = engine(dp, tp, seed=123, zero=zero)  # other initial weights: everything must come from the checkpoint
    e.step(dp_slice(random_batch(99, batch=BATCH), e), nll_loss)  # and other Adam moments and step counts
    load_engines({"actor": e}, out / "ckpt")
    loaded = snapshot(e)
    e.step(dp_slice(random_batch(2, batch=BATCH), e), nll_loss)
    after = snapshot(e)
    if rank == 0:
        expected = torch.load(out / "expected.pt")
        assert set(loaded) == set(expected["saved"]) and any(k.endswith("exp_avg_sq") for k in loaded)
        for key, value in expected["saved"].items():
            assert torch.equal(loaded[key], value), f"{key} differs after loading on dp{dp} x tp{tp}"
        for key, value in expected["after"].items():  # the same next step: summation order differs, so close
            torch.testing.assert_close(after[key], value, rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reshard")
    run_ranks(save_on_two, 2, out)
    return out


@pytest.mark.parametrize("dp,tp,zero", [(2, 2, 3), (4, 1, 1)])
def test_two_rank_checkpoint_loads_on_four_ranks_with_its_optimizer_state(two_rank_checkpoint, dp, tp, zero):
    run_ranks(load_on_four, 4, two_rank_checkpoint, dp, tp, zero)
