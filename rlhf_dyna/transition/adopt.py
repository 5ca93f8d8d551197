"""In-place transitions keep what stays: a destination buffer that is exactly one whole source buffer of the same
rank takes over that buffer's storage instead of a copy of it.

    adopted = adoptable(prepared.plan, src_layout.buffers(rank), dst_layout.buffers(rank))   # dst -> src buffer
    ... point each adopted destination at its source's storage ...
    execute(without_copies(prepared, adopted), src_buffers, dst_buffers, release=...)

Only for a consumed source (relayout): afterwards the old and the new state share those storages. A buffer is
adoptable when the plan writes it with a single local copy that reads a whole source buffer of the same dtype,
offset 0, both regions in C order: the copy would reproduce the source byte for byte. Decided from the plan and
the layouts alone (bound tensors are checked against the layouts: shape, dtype, contiguity), so it is cached
with the plan.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from rlhf_dyna.transition.executor import PreparedPlan
from rlhf_dyna.vps.layout_types import Buffer
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer


def c_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Strides of a C-contiguous tensor of `shape` (dims of extent 1 may have any stride)."""
    expected = 1
    for n, s in reversed(list(zip(shape, strides))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


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


def without_copies(p: PreparedPlan, adopted: Mapping[str, str]) -> PreparedPlan:
    """`p` minus the local copies into adopted buffers; their sources are never released (the destination holds
    them now), though they may still be sent to other ranks."""
    if not adopted:
        return p
    kept = set(adopted.values())
    plan = replace(p.plan, copies=[t for t in p.plan.copies if t.dst_buffer not in adopted])
    last_read = {i: [n for n in names if n not in kept] for i, names in p.last_read.items()}
    return replace(p, plan=plan, last_read=last_read)
