"""A prompt's samples trained on one forward of the prompt (algorithm.share_prompts).

GRPO and PPO sample n responses per prompt; as right-padded rows every sample carries the prompt again, and the
forward and backward of those prompt tokens are done n times. Here the rows of a micro-batch that share a prompt
become one packed row: the prompt once, then each response, with positions continuing from the prompt and a 4-D
attention mask under which a response sees the prompt and itself only. Every token then sees exactly what it saw in
its own row, so the logits are the same (up to the order of floating-point sums), and they are gathered back into the
rows' [B, K, V] layout (`logits_to_keep`'s last K columns), which the losses read unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PackedPrompts:
    input_ids: Tensor  # [G, L]: one row per distinct prompt, its responses behind it, padded
    position_ids: Tensor  # [G, L]
    attention_mask: Tensor  # [G, 1, L, L] bool: True where a query column may attend to a key column
    rows: Tensor  # [B, T]: the packed row that holds each input (row, column)
    columns: Tensor  # [B, T]: the packed column that holds it (padding columns: the packed row's first kept one)
    first_kept: int  # the first packed column whose logits a loss reads (the shortest prompt's last)


def pack_shared_prompts(input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> PackedPrompts | None:
    """The packing of right-padded rows whose prompt is what precedes the first column of `loss_mask`; None where no
    two rows share a prompt (nothing to save)."""
    rows, width = input_ids.shape
    lengths = attention_mask.sum(1).tolist()
    has_loss = loss_mask.bool().any(1)
    prompt_lengths = [int(loss_mask[r].bool().nonzero()[0]) if has_loss[r] else lengths[r] for r in range(rows)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(rows):
        groups.setdefault(tuple(input_ids[r, :prompt_lengths[r]].tolist()), []).append(r)
    if len(groups) == rows:
        return None
    packed_lengths = [len(p) + sum(lengths[r] - len(p) for r in members) for p, members in groups.items()]
    length = max(packed_lengths)
    ids = torch.zeros(len(groups), length, dtype=input_ids.dtype)
    positions = torch.zeros(len(groups), length, dtype=torch.long)
    allowed = torch.zeros(len(groups), length, length, dtype=torch.bool)
    first_kept = max(min(len(p) for p in groups) - 1, 0)
    to_row = torch.zeros(rows, width, dtype=torch.long)
    to_column = torch.full((rows, width), first_kept, dtype=torch.long)
    for g, (prompt, members) in enumerate(groups.items()):
        p = len(prompt)
        ids[g, :p] = input_ids[members[0], :p]
        positions[g, :p] = torch.arange(p)
        allowed[g, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        start = p
        for r in members:
            n = lengths[r] - p
            ids[g, start:start + n] = input_ids[r, p:lengths[r]]
            positions[g, start:start + n] = torch.arange(p, p + n)
            allowed[g, start:start + n, :p] = True
            allowed[g, start:start + n, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril()
            to_row[r] = g
            to_column[r, :p] = torch.arange(p)
            to_column[r, p:lengths[r]] = torch.arange(start, start + n)
            start += n
        padding = torch.arange(start, length)
        allowed[g, padding, padding] = True  # a padding column attends to itself: no row of the mask is empty
    return PackedPrompts(ids, positions, allowed.unsqueeze(1), to_row, to_column, first_kept)


def unpacked_logits(packed_logits: Tensor, packing: PackedPrompts, keep: int) -> Tensor:
    """[B, keep, V]: the logits of each row's last `keep` columns, read from the packed rows' logits, which cover the
    packed columns from `packing.first_kept` on."""
    width = packing.rows.shape[1]
    rows, columns = packing.rows[:, width - keep:], packing.columns[:, width - keep:] - packing.first_kept
    return packed_logits[rows.to(packed_logits.device), columns.clamp(min=0).to(packed_logits.device)]
