"""Role moves across rank sets (4 gloo ranks): a policy and a critic trained on the whole world are lent to two-rank
subsets, trained there, and brought home; they must match twins that never left the world (parameters and AdamW
state, step counter included, came along both ways)."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_critic, build_policy
from rlhf_dyna.orchestrator.batch import shard_rows
from rlhf_dyna.train.engine import TrainEngine, token_logprobs
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.role_move import ParkedState, engine_on, move_role_state, optimizer_step, role_catalog
from tests.ranks.tiny_models import random_batch
from tests.multirank import run_ranks
from tests.ranks.transition.test_relayout import SPEC


def policy_loss(out, mb, norm):
    return -(token_logprobs(out.logits, mb["input_ids"]) * mb["response_mask"]).sum() / norm.num_tokens, {}


def value_loss(out, mb, norm):
    return ((out.values - 1.0) * mb["response_mask"]).pow(2).sum() / norm.num_tokens, {}


def _step(engine: TrainEngine, batch: dict, loss) -> None:
    engine.step(shard_rows(batch, engine.dp_rank, engine.dp_size), loss)


def _read(engine: TrainEngine, batch: dict) -> torch.Tensor:
    if hasattr(engine.model, "lm_head"):
        return engine.logprobs(batch["input_ids"], batch["attention_mask"])
    return engine.values(batch["input_ids"], batch["attention_mask"])


def _lend_and_return(rank: int, world: int) -> None:
    home_mesh = build_mesh(ParallelLayout(world, 1))
    sets = {"policy": (0, 2), "critic": (2, 2)}
    # every rank builds every mesh
    meshes = {role: build_mesh(ParallelLayout(size, 1, first_rank=first)) for role, (first, size) in sets.items()}
    b1, b2, b3 = (random_batch(seed=s, batch=4) for s in (1, 2, 3))
    for role, (first, size) in sets.items():
        make = (lambda: build_policy(SPEC, seed=3)) if role == "policy" else (lambda: build_critic(SPEC, seed=4))
        loss = policy_loss if role == "policy" else value_loss
        home, twin = (TrainEngine(make(), home_mesh, lr=1e-2) for _ in range(2))
        for engine in (home, twin):
            _step(engine, b1, loss)
        member = first <= rank < first + size
        lent = engine_on(home, meshes[role]) if member else None
        home_spec, set_spec = ParallelLayout(world, 1).spec(), ParallelLayout(size, 1, first_rank=first).spec()
        out = move_role_state(home, lent, home_spec, set_spec, catalog=role_catalog(home))
        assert out.bytes_moved > 0 and out.rounds >= 1
        parked = ParkedState()
        assert parked.park(home) > 0  # the home copy's memory is freed while the role is lent
        assert all(p._local_tensor.untyped_storage().nbytes() == 0 for p in home.model.parameters())
        expected = _read(twin, b2)  # collective over the world: every rank reads the twin
        if member:
            torch.testing.assert_close(_read(lent, b2), expected, rtol=1e-6, atol=1e-7)
            assert optimizer_step(lent) == optimizer_step(twin) == 1.0
            _step(lent, b2, loss)  # the lent engine trains on its own set while the twin trains on the world
        _step(twin, b2, loss)
        parked.unpark()
        move_role_state(lent, home, set_spec, home_spec, catalog=role_catalog(home))
        assert optimizer_step(home) == 2.0
        expected = _read(twin, b3)
        torch.testing.assert_close(_read(home, b3), expected, rtol=1e-5, atol=1e-6)
        _step(home, b3, loss)  # Adam's moments came home too: one more step agrees
        _step(twin, b3, loss)
        expected = _read(twin, b1)
        torch.testing.assert_close(_read(home, b1), expected, rtol=1e-5, atol=1e-6)
        if role == "policy":  # the check can fail: a twin that skipped the lent step differs
            stale = TrainEngine(make(), home_mesh, lr=1e-2)
            _step(stale, b1, loss)
            stale_out = _read(stale, b1)
            assert not torch.allclose(stale_out, _read(home, b1), rtol=1e-4)


@pytest.mark.timeout(180)
def test_policy_and_critic_lent_to_subsets_and_back_match_twins_that_stayed() -> None:
    run_ranks(_lend_and_return, 4)
