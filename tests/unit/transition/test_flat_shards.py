"""A rank's shard as one flat host tensor per dtype (transition/flat_shards.py; pure, one process): packed and read
back as views bit for bit, with bf16 parameters beside fp32 moments, and the premise of the snapshot's one message
per role and dtype: the ring layout's index on the holder is its predecessor's own index, names, shapes and offsets."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from rlhf_dyna.elastic.replicas import holder_of, ring_spec
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.transition.flat_shards import copy_in_place, empty, pack, shard_index, unpack
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.vps.tensor import Kind

CONFIG = SimpleNamespace(model_type="qwen2", num_hidden_layers=2, hidden_size=12, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=3, intermediate_size=18, vocab_size=53,
                         tie_word_embeddings=False, attention_bias=True)
KINDS = (Kind.PARAM, Kind.EXP_AVG)


def test_a_shard_packs_flat_per_dtype_and_reads_back_bit_for_bit_on_the_next_rank() -> None:
    catalog = catalog_from_config(CONFIG, param_dtype="bfloat16", state_dtype="float32")
    spec = ParallelLayout(tp=2).fill(4).spec()
    generator = torch.Generator().manual_seed(0)
    for rank in range(4):
        index = shard_index(catalog, spec, KINDS, rank)
        assert shard_index(catalog, spec, KINDS, rank) is index  # built once per layout and rank
        live = {name: torch.randn(b.shape, generator=generator).to(TORCH_DTYPES[b.dtype])
                for name, b in index.buffers.items()}
        flat = pack(index, live)
        assert sorted(flat) == ["bfloat16", "float32"] and sum(t.nbytes for t in flat.values()) == index.nbytes
        ring = shard_index(catalog, ring_spec(spec, 4), KINDS, holder_of(rank, 4))
        assert ring.entries == index.entries and ring.sizes == index.sizes
        received = empty(ring)
        for dtype, t in received.items():  # what the holder receives, one message per dtype
            t.copy_(flat[dtype])
        for name, view in unpack(ring, received).items():
            assert view.is_contiguous() and view.dtype == live[name].dtype
            assert torch.equal(view, live[name]), name
        live[next(iter(live))].add_(1)  # the copy is the live state's at packing, not a view of it
        assert not torch.equal(unpack(index, flat)[next(iter(live))], live[next(iter(live))])


def test_a_device_shard_is_copied_tensor_by_tensor_into_the_same_flat_layout() -> None:
    """The path a GPU shard takes (copy_in_place, no concatenation on the device), run here on host tensors: the same
    bytes at the same offsets as the host path's torch.cat, into a given tensor such as a slot file's."""
    catalog = catalog_from_config(CONFIG, param_dtype="bfloat16", state_dtype="float32")
    index = shard_index(catalog, ParallelLayout(tp=2).fill(4).spec(), KINDS, 1)
    generator = torch.Generator().manual_seed(1)
    live = {name: torch.randn(b.shape, generator=generator).to(TORCH_DTYPES[b.dtype])
            for name, b in index.buffers.items()}
    by_cat = pack(index, live)
    slots = {dtype: torch.full_like(t, float("nan")) for dtype, t in by_cat.items()}
    for dtype, host in slots.items():
        entries = [(live[name].reshape(-1), offset, n) for name, _, d, offset, n in index.entries if d == dtype]
        assert copy_in_place(entries, host) is host
        assert torch.equal(host, by_cat[dtype]), dtype
    again = {dtype: torch.zeros_like(t) for dtype, t in by_cat.items()}
    packed = pack(index, live, out=again)  # host shards into given tensors (a slot file's): torch.cat's out
    assert all(packed[d] is again[d] and torch.equal(again[d], by_cat[d]) for d in by_cat)
