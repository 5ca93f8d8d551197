"""Preference pairs as training rows and the pairwise loss handed to TrainEngine.step (algorithm.name=reward_model).

A step's pairs become rows chosen_0, rejected_0, chosen_1, rejected_1, ...: contiguous shards of an even number of
rows (dp shards, mini-batches, micro-batches of 2 * algorithm.micro_batch_size rows) keep each pair's rows together,
so a loss sees both scores of every pair it holds. As every loss of the engine, it is this micro-batch's sum divided
by the whole batch's count (pairs here), so micro-batches and dp ranks add up to the mean over the global batch.
"""
from __future__ import annotations

from torch import Tensor

from ..algos.pairwise import PAIR_LOSSES
from ..config import AlgorithmConfig
from ..tasks.preference import Pair
from ..tasks.reward_text import reward_ids
from ..train.engine import LossFn, LossNorm


def pair_rows(pairs: list[Pair], tokenizer) -> list[list[int]]:
    """Each pair's chosen then rejected completion after its prompt, in the reward model's format."""
    return [reward_ids(tokenizer, p.prompt, text) for p in pairs for text in (p.chosen, p.rejected)]


def pair_metrics(chosen: Tensor, rejected: Tensor) -> dict[str, Tensor]:
    """Per-pair terms whose means are logged: preference accuracy, margin, each side's score."""
    return {"accuracy": (chosen > rejected).float(), "margin": chosen - rejected, "chosen": chosen,
            "rejected": rejected}


def pair_loss(alg: AlgorithmConfig) -> LossFn:
    fn = PAIR_LOSSES[alg.pair_loss]

    def loss_fn(out, mb: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
        scores = out.logits[:, 0].float()
        chosen, rejected = scores[0::2], scores[1::2]
        pairs = norm.num_sequences / 2  # the whole batch's pairs per dp rank
        loss = fn(chosen, rejected, alg).sum() / pairs
        return loss, {k: float(v.detach().sum()) / pairs for k, v in pair_metrics(chosen, rejected).items()}

    return loss_fn
