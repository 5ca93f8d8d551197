"""What two ways of training the same rows must share, on gloo ranks: the prepare phase's log-probs, the actor's loss
and metrics, and the gradients (fp32, to rounding; weights are not compared: AdamW's first step would magnify the
rounding of gradients near 0)."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlhf_dyna.config import AlgorithmConfig
from rlhf_dyna.orchestrator.objectives import actor_loss
from rlhf_dyna.train.engine import TrainEngine

TEMPERATURE = 0.8


def grads(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for n, p in engine.model.named_parameters()}


def assert_trains_alike(want: TrainEngine, got: TrainEngine, batch: dict[str, torch.Tensor], max_new: int) -> None:
    """`got` on `batch` against `want`: log-probs, one step's loss and metrics (entropy bonus and sequence-mean
    aggregation included), and the gradients of that step."""
    args = (batch["input_ids"], batch["attention_mask"], TEMPERATURE, batch["response_mask"])
    torch.testing.assert_close(got.logprobs(*args) * batch["response_mask"],
                               want.logprobs(*args) * batch["response_mask"], rtol=1e-5, atol=1e-6)
    loss_fn = actor_loss(AlgorithmConfig(entropy_coef=0.01, loss_agg="seq_mean_token_mean"), TEMPERATURE, max_new)
    expected, metrics = want.step(batch, loss_fn), got.step(batch, loss_fn)
    assert metrics.keys() == expected.keys()
    for key in expected:
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), (key, metrics[key], expected[key])
    for (name, g_want), g_got in zip(grads(want).items(), grads(got).values()):
        torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-6, msg=name)
