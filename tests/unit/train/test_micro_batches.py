"""Packing a rank's rows into micro-batches by length under a token budget (train.micro_batches)."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.train.micro_batches import MicroBatch, pack_by_tokens, row_lengths, split_to, take


def test_rows_pack_longest_first_within_the_budget() -> None:
    lengths = torch.tensor([5, 12, 3, 12, 7, 30])
    groups = pack_by_tokens(lengths, budget=24)
    assert groups == [[5], [1, 3], [4, 0, 2]]  # 30 alone (over budget), 2 x 12, 3 x 7 (21 <= 24)
    assert sorted(r for g in groups for r in g) == list(range(6))
    for g in groups[1:]:
        assert len(g) * int(lengths[g[0]]) <= 24


def test_split_to_cuts_the_costliest_micro_batch_until_the_count_is_reached() -> None:
    lengths = torch.tensor([5, 12, 3, 12, 7, 30])
    groups = split_to([[5], [1, 3], [4, 0, 2]], 5, lengths)
    assert groups == [[5], [1], [3], [4], [0, 2]]  # 2 x 12 = 24 first, then 3 x 7 = 21
    with pytest.raises(ValueError, match="6 rows cannot make 7"):
        split_to(groups, 7, lengths)


def test_row_lengths_and_take_cut_right_padding_only() -> None:
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 0, 0]])  # row 1 left-padded
    assert row_lengths(mask).tolist() == [3, 4, 1]
    batch = {"input_ids": torch.arange(15).view(3, 5), "attention_mask": mask, "advantages": torch.tensor([1.0, 2, 3])}
    mb = take(batch, MicroBatch(torch.tensor([1, 0]), 4), torch.device("cpu"))
    assert mb["input_ids"].tolist() == [[5, 6, 7, 8], [0, 1, 2, 3]]
    assert mb["advantages"].tolist() == [2.0, 1.0]
