"""A rank's buffers of a VPS layout packed into one flat host tensor per dtype: what a snapshot copies, sends and
writes (transition/replica_state.py), so each of those is one C++ call per role and dtype instead of one Python call
per tensor (hundreds of small tensors), and a background thread holds the GIL for a handful of operations only.

    index = shard_index(catalog, spec, kinds, rank)   # cached per (model, spec, kinds, rank): names, shapes, offsets
    flat = pack(index, live, out)                     # buffer name -> tensor  =>  dtype -> one host tensor (`out`'s)
    views = unpack(index, flat)                       # dtype -> flat tensor  =>  buffer name -> a view of it
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ..vps.cache import cached_layout, model_key
from ..vps.layout import Layout
from ..vps.layout_types import Buffer
from ..vps.model import ModelCatalog
from ..vps.spec import ParallelSpec
from ..vps.tensor import Kind
from .views import TORCH_DTYPES


@dataclass(frozen=True)
class ShardIndex:
    """One rank's buffers of a layout, by name, each at an element offset of its dtype's flat tensor."""

    layout: Layout
    buffers: dict[str, Buffer]
    entries: tuple[tuple[str, tuple[int, ...], str, int, int], ...]  # (name, shape, dtype, offset, numel)
    sizes: dict[str, int]  # dtype -> elements of its flat tensor (dtypes with none left out)

    @property
    def nbytes(self) -> int:
        return sum(n * TORCH_DTYPES[d].itemsize for d, n in self.sizes.items())


_INDEXES: dict[tuple, ShardIndex] = {}


def shard_index(catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...], rank: int) -> ShardIndex:
    """`rank`'s buffers of build_layout(catalog, spec, kinds), built once: every snapshot of a layout reuses it."""
    key = (model_key(catalog), spec, kinds)
    if (*key, rank) not in _INDEXES:
        layout = cached_layout(catalog, spec, kinds)
        buffers = layout.buffers(rank)
        entries, sizes = [], {}
        for name in sorted(buffers):
            b = buffers[name]
            numel = math.prod(b.shape)
            entries.append((name, b.shape, b.dtype, sizes.get(b.dtype, 0), numel))
            sizes[b.dtype] = sizes.get(b.dtype, 0) + numel
        _INDEXES[(*key, rank)] = ShardIndex(layout, buffers, tuple(entries),
                                            {d: n for d, n in sorted(sizes.items()) if n})
    return _INDEXES[(*key, rank)]


@torch.no_grad()
def pack(index: ShardIndex, tensors: Mapping[str, Tensor], out: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
    """`tensors` (the index's buffers) copied into one host tensor per dtype: `out`'s (e.g. a snapshot's mapped slot,
    transition/snapshot_files.py), or new ones. Host shards: one torch.cat each; device shards: each tensor copied to
    its place in the host tensor (a concatenation on the device would hold a second copy of the shard there)."""
    flat = {}
    for dtype, numel in index.sizes.items():
        entries = [(tensors[name].reshape(-1), offset, n) for name, _, d, offset, n in index.entries if d == dtype]
        if entries[0][0].device.type == "cpu":
            parts = [t for t, _, _ in entries]
            flat[dtype] = torch.cat(parts) if out is None else torch.cat(parts, out=out[dtype])
        else:
            flat[dtype] = copy_in_place(entries, torch.empty(numel, dtype=TORCH_DTYPES[dtype]) if out is None
                                        else out[dtype])
    return flat


def copy_in_place(entries: list[tuple[Tensor, int, int]], host: Tensor) -> Tensor:
    """`host` with each (tensor, offset, numel) of `entries` copied to host[offset:offset + numel]."""
    for tensor, offset, numel in entries:
        host[offset:offset + numel].copy_(tensor)
    return host


def empty(index: ShardIndex) -> dict[str, Tensor]:
    """Flat host tensors to receive a shard of `index` into."""
    return {dtype: torch.empty(n, dtype=TORCH_DTYPES[dtype]) for dtype, n in index.sizes.items()}


def unpack(index: ShardIndex, flat: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Buffer name -> its contiguous view of `flat` (what the executor's plans read)."""
    return {name: flat[dtype][offset:offset + numel].view(shape) for name, shape, dtype, offset, numel in index.entries}
