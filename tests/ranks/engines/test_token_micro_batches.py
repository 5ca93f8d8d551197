"""Token-budget micro-batches (algorithm.micro_batch_tokens) on 2 gloo ranks: rows packed by length, each
micro-batch cut to its longest row, the ranks agreeing on one micro-batch count; the actor's loss, metrics and
gradients and the log-probs of the prepare phase equal the fixed-row path's (fp32, to rounding: the sums run in
another order, which AdamW's first step would magnify for gradients near 0, so weights are not compared)."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.models.build import build_policy
from rlhf_dyna.orchestrator.batch import Sample, pack
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from tests.multirank import run_ranks
from tests.ranks.engines.same_training import assert_trains_alike
from tests.ranks.tiny_models import VOCAB, tiny_spec

MAX_NEW, ROWS, BUDGET = 8, 6, 40


def _rank_batch(rank: int) -> dict[str, torch.Tensor]:
    """Rows of 3..19 tokens, right-padded to a width both ranks share; rank 1's are longer (more micro-batches)."""
    g = torch.Generator().manual_seed(11 + rank)
    samples = []
    for i in range(ROWS):
        prompt = torch.randint(1, VOCAB, (3 + (i * 5 + 7 * rank) % 9,), generator=g).tolist()
        response = torch.randint(1, VOCAB, ((3 * i + rank) % (MAX_NEW + 1),), generator=g).tolist()
        samples.append(Sample(i, prompt, response))
    samples.append(Sample(ROWS, [1] * 11, [2] * MAX_NEW))  # the width of both ranks' batches: 19
    batch = pack(samples, pad_id=0)
    batch["advantages"] = torch.randn(ROWS + 1, generator=g)
    batch["old_logprobs"] = -torch.rand(batch["input_ids"].shape, generator=g)
    return batch


def _checks(rank: int, world: int) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    make = lambda **mb: TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=1.0, **mb)
    fixed, packed = make(micro_batch_size=2), make(micro_batch_tokens=BUDGET)
    batch = _rank_batch(rank)
    plan = packed._micro_batch_plan(batch)
    counts = [None] * world
    torch.distributed.all_gather_object(counts, len(plan))
    assert counts[0] == counts[1] and len(plan) > 1, counts  # equal counts, though the ranks' lengths differ
    assert min(m.width for m in plan) < batch["input_ids"].shape[1]  # short rows' micro-batches are cut
    assert all(len(m.rows) == 1 or len(m.rows) * m.width <= BUDGET for m in plan)

    assert_trains_alike(fixed, packed, batch, MAX_NEW)


@pytest.mark.timeout(180)
def test_token_budget_micro_batches_train_as_fixed_rows() -> None:
    run_ranks(_checks, 2)
