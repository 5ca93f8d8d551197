"""In-place transitions keep what stays: a destination buffer that is exactly one whole source buffer of the same
rank takes over that buffer's storage instead of a copy of it.

    adopted = adoptable(prepared.plan, src_buffers, dst_buffers)     # dst buffer -> src buffer
    ... point each adopted destination at its source's storage ...
    execute(without_copies(prepared, adopted), src_buffers, dst_buffers, release=...)

Only for a consumed source (relayout): afterwards the old and the new state share those storages. A buffer is
adoptable when the plan writes it with a single local copy that reads a whole source buffer, offset 0, both views
contiguous in the same C order, same dtype and device: the copy would reproduce the source byte for byte.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from torch import Tensor

from rlhf_dyna.transition.executor import PreparedPlan
from rlhf_dyna.transition.views import dst_view, src_view
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer


def _whole(t: Transfer, src: Mapping[str, Tensor], dst: Mapping[str, Tensor]) -> bool:
    s, d = src[t.src_buffer], dst[t.dst_buffer]
    return (t.src_offset == 0 and t.dst_offset == 0 and math.prod(t.shape) == s.numel() == d.numel() > 0
            and s.dtype == d.dtype and s.device == d.device and s.is_contiguous() and d.is_contiguous()
            and src_view(src, t).is_contiguous() and dst_view(dst, t).is_contiguous())


def adoptable(plan: RankPlan, src: Mapping[str, Tensor], dst: Mapping[str, Tensor]) -> dict[str, str]:
    """Destination buffer -> the source buffer whose storage it can take over (each source at most once)."""
    writes = Counter(t.dst_buffer for t in plan.copies)
    writes.update(t.dst_buffer for s in plan.recvs.values() for t in s.transfers)
    out: dict[str, str] = {}
    taken: set[str] = set()
    for t in plan.copies:
        if writes[t.dst_buffer] == 1 and t.src_buffer not in taken and _whole(t, src, dst):
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
