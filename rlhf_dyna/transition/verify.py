"""Verification of an executed rank plan: a checksum of every destination region against its source.

Senders checksum each transfer's source region (in the destination dtype) before anything moves; after the
rounds they send those sums to the receivers in one batched exchange, and every rank compares them with
checksums of what landed in its destination buffers (local copies compared locally). Every rank then learns
every rank's first mismatch, so all ranks raise the same error naming the wrong piece, instead of some of
them hanging in the next collective.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.transition.transport import ensure_warm, wire_device, world_transport
from rlhf_dyna.transition.views import TORCH_DTYPES, dst_view, peer_rank, src_view
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer

_CHUNK = 1 << 24  # bytes per checksum slice: bounds the int64 temporaries
_MOD = 65521  # position weights cycle with a prime period: swapped or shifted bytes change the sum


class TransitionMismatch(RuntimeError):
    pass


def checksum(view: Tensor, dtype: torch.dtype) -> tuple[int, int]:
    """(byte sum, position-weighted byte sum) of a region's values in `dtype`, C order."""
    data = view.to(dtype).contiguous().reshape(-1).view(torch.uint8)
    plain = weighted = 0
    for at in range(0, data.numel(), _CHUNK):
        part = data[at:at + _CHUNK].to(torch.int64)
        weights = torch.arange(at, at + part.numel(), dtype=torch.int64, device=part.device).remainder_(_MOD).add_(1)
        plain += int(part.sum())
        weighted += int((part * weights).sum())
    return plain, weighted


def _sums(transfers: list[Transfer], buffers: Mapping[str, Tensor], side: str) -> Tensor:
    view = src_view if side == "src" else dst_view
    return torch.tensor([checksum(view(buffers, t), TORCH_DTYPES[t.dtype]) for t in transfers], dtype=torch.int64).reshape(-1, 2)


def source_sums(plan: RankPlan, src: Mapping[str, Tensor]) -> dict[int, Tensor]:
    """peer -> checksums of the transfers this rank sends it; key plan.rank: the local copies."""
    out = {peer: _sums(s.transfers, src, "src") for peer, s in plan.sends.items()}
    out[plan.rank] = _sums(plan.copies, src, "src")
    return out


def describe(t: Transfer, src_rank: int, dst_rank: int) -> str:
    return (f"{t.tensor}/{t.kind.value}: region of shape {t.shape} from rank {src_rank} ({t.src_buffer} @ element "
            f"{t.src_offset}) to rank {dst_rank} ({t.dst_buffer} @ element {t.dst_offset})")


def check_destination(plan: RankPlan, sums: dict[int, Tensor], dst: Mapping[str, Tensor],
                      group: dist.ProcessGroup | None = None, transport: str | None = None) -> None:
    """Collective over `group`: raises TransitionMismatch on every rank if any destination region is wrong. The sums
    travel over the group's `transport` (None: transport.world_transport) on every rank, whatever its buffers."""
    transport = transport or world_transport(group)
    wire = wire_device(transport)
    ensure_warm(group, transport)
    incoming = {peer: torch.empty(len(s.transfers), 2, dtype=torch.int64, device=wire) for peer, s in plan.recvs.items()}
    ops = [dist.P2POp(dist.irecv, t, peer_rank(group, p), group) for p, t in incoming.items()]
    ops += [dist.P2POp(dist.isend, sums[p].to(wire), peer_rank(group, p), group) for p in plan.sends]
    for w in (dist.batch_isend_irecv(ops) if ops else []):
        w.wait()
    first = None
    expected = [(plan.rank, plan.copies, sums[plan.rank])] + [(p, s.transfers, incoming[p].cpu()) for p, s in sorted(plan.recvs.items())]
    for src_rank, transfers, want in expected:
        got = _sums(transfers, dst, "dst")
        bad = (got != want).any(dim=1).nonzero()
        if len(bad):
            first = describe(transfers[int(bad[0])], src_rank, plan.rank)
            break
    reports: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, first, group=group)
    wrong = [r for r in reports if r is not None]
    if wrong:
        raise TransitionMismatch(f"{len(wrong)} rank(s) received wrong data; first wrong piece: {wrong[0]}"
                                 + (f" (and {len(wrong) - 1} more ranks)" if len(wrong) > 1 else ""))
