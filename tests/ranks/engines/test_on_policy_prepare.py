"""One optimizer step per batch (epochs=1, mini_batches=1): the prepare phase runs no actor forward, the loss takes
the training forward's own log-probs as the old ones, and the step's losses, metrics, gradient norm and updated
weights equal today's path (old log-probs from a separate no-grad forward over every position), on 2 gloo ranks in
fp32. Where the policy moves before a row's last step, or the rewards read a KL, the forward still runs."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlhf_dyna.config import AlgorithmConfig, Config
from rlhf_dyna.models.build import build_policy
from rlhf_dyna.orchestrator.advantages import compute_advantages
from rlhf_dyna.orchestrator.batch import Sample, pack, rank_rows
from rlhf_dyna.orchestrator.objectives import actor_loss, old_logprobs_needed
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from tests.multirank import run_ranks
from tests.ranks.tiny_models import VOCAB, tiny_spec

N, MAX_NEW = 2, 6


def _samples() -> list[Sample]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(8):  # 4 prompts x n=2, prompts of 3..6 tokens, responses of 0..6 (one empty)
        prompt = torch.randint(1, VOCAB, (3 + i % 4,), generator=g).tolist()
        response = torch.randint(1, VOCAB, ((5 * i) % 7,), generator=g).tolist()
        out.append(Sample(i // N, prompt, response, reward=float((3 * i) % 4)))
    return out


def _step(rank: int, world: int, cfg: Config, separate_forward: bool) -> tuple[dict, dict, list]:
    mesh = build_mesh(ParallelLayout(world, 1))
    actor = TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=1.0, micro_batch_size=2)
    samples = _samples()
    batch = rank_rows(pack(samples, pad_id=0), rank, world, cfg.algorithm.mini_batches)
    compute_advantages(cfg, batch, samples, actor, None, None, 0.0)
    prepared = dict(batch)
    if separate_forward:  # today's path: a forward over every position before training
        batch["old_logprobs"] = actor.logprobs(batch["input_ids"], batch["attention_mask"], cfg.rollout.temperature)
    metrics = actor.step(batch, actor_loss(cfg.algorithm, cfg.rollout.temperature, MAX_NEW))
    return prepared, metrics, list(full_state_dict(actor))


def _checks(rank: int, world: int) -> None:
    cfg = Config(algorithm=AlgorithmConfig(entropy_coef=0.01), rollout=replace(Config().rollout, n=N, temperature=0.9,
                                                                              max_new_tokens=MAX_NEW))
    prepared, fused, weights = _step(rank, world, cfg, separate_forward=False)
    assert "old_logprobs" not in prepared  # the prepare phase ran no actor forward
    _, today, today_weights = _step(rank, world, cfg, separate_forward=True)
    assert fused.keys() == today.keys()
    for key in today:
        assert fused[key] == pytest.approx(today[key], rel=1e-5, abs=1e-6), (key, fused[key], today[key])
    assert fused["ppo_kl"] == 0.0  # one forward: every log-ratio is exactly 0 (two forwards agree to rounding)
    for (name, p), (_, q) in zip(weights, today_weights, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
    for moved in (dict(mini_batches=2), dict(epochs=2), dict(kl_coef=0.1, kl_in_reward=True, adv_estimator="gae")):
        alg = replace(cfg.algorithm, **moved)
        assert old_logprobs_needed(alg), moved
    several = replace(cfg, algorithm=replace(cfg.algorithm, epochs=2))
    prepared, _, _ = _step(rank, world, several, separate_forward=False)
    assert prepared["old_logprobs"].shape == prepared["input_ids"].shape


@pytest.mark.timeout(240)
def test_one_step_per_batch_skips_the_old_logprob_forward_and_trains_as_before() -> None:
    run_ranks(_checks, 2)
