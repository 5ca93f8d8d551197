"""Rollout samples, their gathering across ranks, and packing into right-padded training tensors."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class Sample:
    prompt_index: int  # index into the step's global prompt list
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float = 0.0
    finished: bool = True  # ended with EOS (not cut by max_new_tokens)
    reward_parts: dict[str, float] = field(default_factory=dict)  # each named reward fn's value (task=file)
    prompt: object = None  # the example's prompt (a string or chat messages): what a reward model reads


def gather_samples(local: list[Sample], contributes: bool) -> list[Sample]:
    """All ranks get every sample once; ranks of one rollout TP group hold the same samples, so only
    one of them (`contributes`) adds its list. Order: by rank, then local order (deterministic)."""
    world = dist.get_world_size()
    gathered: list[list[Sample] | None] = [None] * world
    dist.all_gather_object(gathered, local if contributes else [])
    return [s for part in gathered for s in (part or [])]


def pack(samples: list[Sample], pad_id: int) -> dict[str, Tensor]:
    """input_ids [B, T] = prompt + response + padding; attention_mask; response_mask marks response tokens."""
    length = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    response_mask = torch.zeros((batch, length), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        attention_mask[row, : p + r] = 1
        response_mask[row, p : p + r] = 1.0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}


def shard_rows(batch: dict[str, Tensor], index: int, count: int) -> dict[str, Tensor]:
    """Contiguous row shard `index` of `count` equal shards (the global batch size must divide)."""
    rows = next(iter(batch.values())).shape[0]
    if rows % count:
        raise ValueError(f"global batch of {rows} rows does not split into {count} equal dp shards")
    size = rows // count
    return {k: v[index * size : (index + 1) * size] for k, v in batch.items()}


def split_rows(batch: dict[str, Tensor], parts: int) -> list[dict[str, Tensor]]:
    return [shard_rows(batch, i, parts) for i in range(parts)]


def rank_rows(batch: dict[str, Tensor], dp_rank: int, dp: int, mini_batches: int) -> dict[str, Tensor]:
    """This dp rank's rows: its shard of each global mini-batch, in order, so that `split_rows(rows, mini_batches)[i]`
    is its share of the same global rows in every (dp, tp) layout (a contiguous dp shard would change them with dp)."""
    parts = [shard_rows(mini, dp_rank, dp) for mini in split_rows(batch, mini_batches)]
    return {k: torch.cat([p[k] for p in parts]) for k in batch}
