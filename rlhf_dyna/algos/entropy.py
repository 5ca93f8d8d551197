"""Per-token entropy of the policy's next-token distribution, from the logits a forward already produced."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..train.logprobs import chunk_positions, flat_positions


def _entropy(scores: Tensor, temperature: float) -> Tensor:
    x = scores.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    return lse - (torch.exp(x - lse.unsqueeze(-1)) * x).sum(dim=-1)  # -sum p log p, with log p = x - lse


def token_entropy(logits: Tensor, temperature: float = 1.0, length: int | None = None) -> Tensor:
    """[B, length] entropy of softmax(logits[:, t-1] / temperature), the distribution token t was sampled from;
    column 0 is 0 (aligned with `token_logprobs`). `logits` [B, K, V] are the last K of `length` positions (default
    K = length); earlier columns are 0. Computed a chunk of positions at a time in fp32; differentiable, for an
    entropy bonus."""
    rows = logits.shape[0]
    flat, skip = flat_positions(logits, logits.shape[1] if length is None else length)
    step = chunk_positions(flat.shape[-1])
    entropy = torch.cat([_entropy(chunk, temperature) for chunk in flat.split(step)])
    return F.pad(entropy.view(rows, -1)[:, :-1], (skip + 1, 0))
