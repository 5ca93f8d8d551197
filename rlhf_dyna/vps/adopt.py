"""In-place transitions keep what stays: a destination buffer that is exactly one whole source buffer of the same
rank can take over that buffer's storage instead of a copy of it.

Only for a consumed source (relayout): afterwards the old and the new state share those storages. A buffer is
adoptable when the plan writes it with a single local copy that reads a whole source buffer of the same dtype,
offset 0, both regions in C order: the copy would reproduce the source byte for byte. Decided from the rank plan
and the layouts' buffers alone, so the answer is cached with the plan (transition.vps_plans).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from .layout_types import Buffer, contiguous_strides
from .rank_plan import RankPlan, Transfer


def c_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Strides of a C-contiguous tensor of `shape` (dims of extent 1 may have any stride)."""
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)))


def _whole(t: Transfer, src: Buffer, dst: Buffer) -> bool:
    n = math.prod(t.shape)
    return (t.src_offset == 0 and t.dst_offset == 0 and n == math.prod(src.shape) == math.prod(dst.shape) > 0
            and src.dtype == dst.dtype and c_order(t.shape, t.src_strides) and c_order(t.shape, t.dst_strides))


def adoptable(plan: RankPlan, src: Mapping[str, Buffer], dst: Mapping[str, Buffer]) -> dict[str, str]:
    """Destination buffer -> the source buffer whose storage it can take over (each source at most once)."""
    writes = Counter(t.dst_buffer for t in plan.copies)
    writes.update(t.dst_buffer for s in plan.recvs.values() for t in s.transfers)
    out: dict[str, str] = {}
    taken: set[str] = set()
    for t in plan.copies:
        if writes[t.dst_buffer] == 1 and t.src_buffer not in taken and _whole(t, src[t.src_buffer], dst[t.dst_buffer]):
            out[t.dst_buffer] = t.src_buffer
            taken.add(t.src_buffer)
    return out
