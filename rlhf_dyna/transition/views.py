"""Rank-local views of VPS transfers: strided regions of contiguous buffers, dtype names, group ranks."""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.transition.streams import region_shape
from rlhf_dyna.vps.rank_plan import Transfer

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


def flat(buffers: Mapping[str, Tensor], name: str) -> Tensor:
    buf = buffers[name]
    if not buf.is_contiguous():
        raise ValueError(f"buffer {name!r} is not contiguous (strides {buf.stride()}); bind a contiguous tensor")
    return buf.view(-1)


def region(buffers: Mapping[str, Tensor], name: str, offset: int, strides: tuple[int, ...], t: Transfer) -> Tensor:
    """The transfer's region inside a buffer, as a strided view of the buffer's storage."""
    base = flat(buffers, name)
    shape = region_shape(t)
    strides = strides if t.shape else (1,)
    return base.as_strided(shape, strides, base.storage_offset() + offset)


def src_view(buffers: Mapping[str, Tensor], t: Transfer) -> Tensor:
    return region(buffers, t.src_buffer, t.src_offset, t.src_strides, t)


def dst_view(buffers: Mapping[str, Tensor], t: Transfer) -> Tensor:
    return region(buffers, t.dst_buffer, t.dst_offset, t.dst_strides, t)


def as_bytes(view: Tensor) -> Tensor:
    return view.reshape(-1).view(torch.uint8)


def peer_rank(group: dist.ProcessGroup | None, rank: int) -> int:
    """Plan ranks are ranks of `group`; P2P ops take global ranks."""
    return rank if group is None or group == dist.GroupMember.WORLD else dist.get_global_rank(group, rank)


