"""Tiny models and batches shared by the engine tests."""
from __future__ import annotations

import torch
from torch import Tensor

from rlhf_dyna.models.build import ModelSpec
from rlhf_dyna.train.engine import LossNorm, token_logprobs

VOCAB = 64


def tiny_spec(arch: str = "llama", tie: bool = False) -> ModelSpec:
    # head_dim 32: the smallest vLLM CPU attention supports. initializer_range 0.2: peaked logits, so greedy argmax is not decided by float noise
    return ModelSpec(arch=arch, vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                     tie_word_embeddings=tie, initializer_range=0.2)


def random_batch(seed: int, batch: int = 4, prompt: int = 6, response: int = 6) -> dict[str, Tensor]:
    """Left-padded prompts + responses, like a rollout batch; row i has i % 3 pad tokens."""
    g = torch.Generator().manual_seed(seed)
    seq = prompt + response
    input_ids = torch.randint(1, VOCAB, (batch, seq), generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(batch):
        attention_mask[i, : i % 3] = 0
        input_ids[i, : i % 3] = 0
    response_mask = torch.zeros(batch, seq, dtype=torch.long)
    response_mask[:, prompt:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}


def nll_loss(outputs, micro_batch: dict[str, Tensor], norm: LossNorm) -> tuple[Tensor, dict[str, float]]:
    """Token-sum NLL over the response divided by the engine's normaliser -> global token mean."""
    logp = token_logprobs(outputs.logits, micro_batch["input_ids"])
    mask = micro_batch["response_mask"].float()
    loss = -(logp * mask).sum() / norm.num_tokens
    return loss, {"tokens": float(mask.sum()) / norm.num_tokens}
