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


LONG = [(7 * i + 3) % 64 for i in range(40)]  # > one 32-token block: its KV lands in the prefix cache
PROMPTS = [LONG, LONG[:35] + [1, 2], [5, 9, 3], [17, 2, 44, 8, 30], [60, 1], [12, 50, 33, 21, 9, 4]]
NEW_TOKENS = 8


def hf_greedy(weights: dict[str, Tensor], arch: str, tie: bool, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of `transformers` `generate` for tiny_spec(arch, tie) with `weights`, one prompt at a time."""
    return hf_greedy_of(tiny_spec(arch, tie), weights, prompts, NEW_TOKENS)


def hf_greedy_of(spec, weights: dict[str, Tensor], prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy tokens of `transformers` `generate` for the model of `spec` with `weights`, one prompt at a time."""
    from rlhf_dyna.models.build import build_policy

    model = build_policy(spec).eval()
    model.load_state_dict(weights)
    out = []
    for prompt in prompts:  # one at a time: no padding in the reference
        ids = torch.tensor([prompt])  # explicit mask: without one HF treats every pad_token_id in the prompt as padding
        ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0)
        out.append(ids[0, len(prompt):].tolist())
    return out
