"""Per-token log-probs from a causal LM's logits without a full-vocabulary log-softmax.

log p(token) = logit[token] - logsumexp(logits), computed a few thousand positions at a time in fp32, so neither a
[B, T, V] log-softmax nor an fp32 copy of bf16 logits ever exists whole. The forward may keep the logits of the last
K positions only (HF's `logits_to_keep`: the LM head then runs where a loss reads it); columns before them get 0.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

CHUNK_ELEMENTS = 1 << 22  # logits per chunk: 16 MiB of fp32 temporaries whatever the vocabulary


def chunk_positions(vocab: int) -> int:
    """Positions per chunk of a [N, vocab] logit matrix."""
    return max(1, CHUNK_ELEMENTS // vocab)


def logits_to_keep(loss_mask: Tensor) -> int:
    """How many trailing positions' logits a loss over `loss_mask` [B, T] reads: from the column before the first
    masked token of any row on (that column's logits predict it). At least 2, so a batch without a masked token
    still runs the head (its loss is an exact 0 with a graph, as FSDP's backward needs)."""
    length = loss_mask.shape[1]
    columns = loss_mask.any(dim=0).nonzero()
    if columns.numel() == 0:
        return min(2, length)
    return min(length, length - int(columns[0]) + 1)


def flat_positions(logits: Tensor, length: int) -> tuple[Tensor, int]:
    """[B * K, V] view of logits [B, K, V] that cover the last K of `length` columns, and how many columns they skip."""
    skip = length - logits.shape[1]
    if skip < 0:
        raise ValueError(f"logits cover {logits.shape[1]} positions, more than the {length} input columns")
    return logits.reshape(-1, logits.shape[-1]), skip


def _picked(scores: Tensor, targets: Tensor, temperature: float) -> Tensor:
    x = scores.float()
    if temperature != 1.0:
        x = x / temperature
    return x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T] log p(input_ids[:, t] | input_ids[:, <t]) under softmax(logits / temperature), in fp32. `logits` [B, K, V]
    are the last K positions' (K = T: all); a column with no logit before it (column 0, the skipped prompt) is 0."""
    rows, length = input_ids.shape
    flat, skip = flat_positions(logits, length)
    # position k predicts column skip + k + 1; the last position predicts nothing (a dummy target, dropped below)
    targets = F.pad(input_ids[:, skip + 1:], (0, 1)).reshape(-1)
    step = chunk_positions(flat.shape[-1])
    picked = torch.cat([_picked(s, t, temperature) for s, t in zip(flat.split(step), targets.split(step))])
    return F.pad(picked.view(rows, -1)[:, :-1], (skip + 1, 0))
