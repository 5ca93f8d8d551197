"""Per-token entropy of the policy's next-token distribution, from the logits a forward already produced."""
from __future__ import annotations

import torch
from torch import Tensor


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T] entropy of softmax(logits[:, t-1] / temperature), the distribution token t was sampled from;
    column 0 is 0 (aligned with `token_logprobs`). Differentiable, for an entropy bonus."""
    scaled = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return torch.nn.functional.pad(entropy, (1, 0))
