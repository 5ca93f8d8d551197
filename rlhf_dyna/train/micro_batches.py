"""How a rank's rows split into micro-batches: a fixed number of rows each, or packed by length under a token budget.

Token budget (veRL's dynamic batch size, OpenRLHF's packing by length): rows sorted by length, longest first, fill a
micro-batch while its rows x its longest row stay within the budget; each micro-batch keeps only the columns up to
its longest row (rows are right-padded, so nothing attended is cut). A row longer than the budget trains alone.
FSDP gathers collectively per micro-batch, so every dp rank must run as many: the engine agrees on the largest count
and `split_to` cuts the costliest micro-batches in two until a rank has that many.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MicroBatch:
    rows: slice | Tensor  # the rank's rows it holds: a contiguous slice, or indices (longest first)
    width: int  # columns it keeps: the batch's width, or its longest row's length


def fixed_rows(size: int, width: int, rows_each: int) -> list[MicroBatch]:
    """Consecutive micro-batches of `rows_each` rows (the last may be shorter), all columns kept."""
    return [MicroBatch(slice(start, start + rows_each), width) for start in range(0, size, rows_each)]


def row_lengths(attention_mask: Tensor) -> Tensor:
    """Per row, the last attended column + 1 (left padding, as tests use, counts into the length)."""
    columns = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    return (columns * (attention_mask != 0)).max(dim=-1).values


def pack_by_tokens(lengths: Tensor, budget: int) -> list[list[int]]:
    """Row groups, longest rows first, each within rows x longest row <= budget (or a single row)."""
    order = sorted(range(len(lengths)), key=lambda row: (-int(lengths[row]), row))
    groups: list[list[int]] = []
    for row in order:
        if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def split_to(groups: list[list[int]], count: int, lengths: Tensor) -> list[list[int]]:
    """`groups` cut until there are `count`: each cut halves the group of the largest padded size that has 2 rows."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        splittable = [i for i, g in enumerate(groups) if len(g) > 1]
        if not splittable:
            raise ValueError(f"{sum(map(len, groups))} rows cannot make {count} micro-batches")
        i = max(splittable, key=lambda j: len(groups[j]) * int(lengths[groups[j][0]]))
        half = len(groups[i]) // 2
        groups[i:i + 1] = [groups[i][:half], groups[i][half:]]
    return groups


def token_budget_plan(groups: list[list[int]], lengths: Tensor) -> list[MicroBatch]:
    return [MicroBatch(torch.tensor(g, dtype=torch.long), int(lengths[g[0]])) for g in groups]


def take(batch: dict[str, Tensor], micro: MicroBatch, device: torch.device) -> dict[str, Tensor]:
    """The micro-batch's rows of every tensor, per-token ones ([rows, T, ...]) cut to its width."""
    out = {}
    for key, value in batch.items():
        rows = value[micro.rows]
        out[key] = (rows[:, :micro.width] if value.dim() > 1 else rows).to(device)
    return out
