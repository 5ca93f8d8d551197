"""algorithm.share_prompts on 2 gloo ranks: the rows of one prompt trained on one forward of it (train/shared_prompts.py)
log the actor's loss and metrics, and make the gradients and the log-probs of the prepare phase, that every row
carrying its prompt makes (fp32, to rounding: attention sums run over more, masked, keys). Each rank holds two
prompts of 3 samples each, of different response lengths, one of them empty, and a row of a prompt of its own."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.models.build import build_policy
from rlhf_dyna.orchestrator.batch import Sample, pack
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.shared_prompts import pack_shared_prompts
from tests.multirank import run_ranks
from tests.ranks.engines.same_training import assert_trains_alike
from tests.ranks.tiny_models import VOCAB, tiny_spec

MAX_NEW = 8


def _rank_batch(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5 + rank)
    samples = []
    for p in range(2):
        prompt = torch.randint(1, VOCAB, (4 + 3 * p + rank,), generator=g).tolist()
        for i, n in enumerate((MAX_NEW, 3 + p, 0 if p == 1 else 5)):
            samples.append(Sample(p, prompt, torch.randint(1, VOCAB, (n,), generator=g).tolist()))
    samples.append(Sample(2, torch.randint(1, VOCAB, (6,), generator=g).tolist(), [3] * 4))
    batch = pack(samples, pad_id=0)
    batch["advantages"] = torch.randn(len(samples), generator=g)
    batch["old_logprobs"] = -torch.rand(batch["input_ids"].shape, generator=g)
    return batch


def _checks(rank: int, world: int) -> None:
    mesh = build_mesh(ParallelLayout(world, 1))
    batch = _rank_batch(rank)
    packing = pack_shared_prompts(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    assert packing is not None and packing.input_ids.shape[0] == 3  # 7 rows, 3 prompts
    make = lambda share: TrainEngine(build_policy(tiny_spec(), seed=3), mesh, lr=1e-2, grad_clip=1.0,
                                     micro_batch_size=7, share_prompts=share)
    assert_trains_alike(make(False), make(True), batch, MAX_NEW)


@pytest.mark.timeout(180)
def test_shared_prompts_train_as_rows_that_carry_their_prompt() -> None:
    run_ranks(_checks, 2)
