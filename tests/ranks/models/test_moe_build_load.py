"""A tiny Qwen3-MoE checkpoint loads per shard on real gloo ranks as `from_pretrained` loads it (building it from a
spec and its checkpoint names: tests/unit/models/test_moe_build_load.py)."""
from __future__ import annotations

import torch

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from tests.multirank import run_ranks
from tests.ranks.models.test_sharded_load import _check_layouts
from tests.unit.models.test_moe_build_load import MOE


def test_two_ranks_moe_checkpoint_loads_per_shard_dp2(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "moe", arch="qwen3_moe", hidden_size=64, intermediate_size=128,
                                num_attention_heads=2, num_key_value_heads=1, seed=4, initializer_range=0.2, **MOE)
    run_ranks(_check_layouts, 2, str(ckpt), [(2, 1, 3), (2, 1, 2)], False, torch.float32)
