"""Layout.bytes_by_rank: what each rank holds, summing to total_bytes, replicas on every holder."""
from __future__ import annotations

from math import prod

from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind


def test_bytes_by_rank_sum_to_the_total_and_fsdp_splits_them_evenly() -> None:
    catalog = catalog_from_config(make_hf_config(ModelSpec(arch="llama", vocab_size=64, hidden_size=32,
                                                           intermediate_size=64, num_hidden_layers=2,
                                                           num_attention_heads=4, num_key_value_heads=2)), "float32")
    fsdp = build_layout(catalog, ParallelSpec(dp=4), (Kind.PARAM,))
    held = fsdp.bytes_by_rank()
    assert sorted(held) == [0, 1, 2, 3] and sum(held.values()) == fsdp.total_bytes() == catalog_bytes(fsdp)
    assert max(held.values()) - min(held.values()) <= 4 * len(fsdp.entries) * 32  # torch.chunk's uneven tails only
    replicated = build_layout(catalog, ParallelSpec(dp=2, zero=0), (Kind.PARAM,)).bytes_by_rank()
    assert replicated[0] == replicated[1] == catalog_bytes(fsdp)


def catalog_bytes(layout) -> int:
    return sum(prod(entry.tensor.shape) * entry.tensor.itemsize for entry in layout.entries)
