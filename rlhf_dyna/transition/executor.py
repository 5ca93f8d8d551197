"""Execute one rank's share of a VPS schedule over a torch.distributed group (gloo on CPU, NCCL on GPU).

    stats = execute(for_rank(schedule, rank), src_buffers, dst_buffers, group, verify=True, trace=recorder)

Buffers are this rank's local tensors keyed by the layout's buffer names (flat or shaped, contiguous); every
transfer is a strided view (`as_strided`) at an element offset of one. Local copies need no communication and
overlap round 0. Each round posts all of the rank's sends and receives in one `batch_isend_irecv`; messages
are cut from the peer streams by `streams.StreamCutter`, identically on both ends. Sources whose dtype differs
from the destination's (fp32 masters -> bf16 rollout) are cast while packing, so the wire carries destination
bytes. Staging buffers live for one round only: the schedule's budget bounds them (plus one row per stream).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.transition.streams import DIRECT_BYTES, Message, StreamCutter, region_shape
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.verify import check_destination, source_sums
from rlhf_dyna.transition.views import TORCH_DTYPES, as_bytes, dst_view, peer_rank, src_view
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer


@dataclass(frozen=True)
class ExecStats:
    seconds: float  # wall time on this rank, local copies and all rounds (verification excluded)
    bytes_sent: int
    bytes_received: int
    local_bytes: int  # bytes copied rank-locally (no communication)
    rounds: int  # schedule rounds (this rank may be idle in some)
    messages: int  # point-to-point messages this rank posted (sends + receives)
    peak_extra_bytes: int  # most bytes of staging buffers (pack / receive) alive at once on this rank


class RoundIO:
    """Staging of one round: what to send (packed or direct views) and where to receive (and unpack later)."""

    def __init__(self, src: Mapping[str, Tensor], dst: Mapping[str, Tensor], device: torch.device) -> None:
        self.src, self.dst, self.device = src, dst, device
        self.staged_bytes = 0
        self.unpack: list[tuple[Message, Tensor]] = []

    def _staging(self, nbytes: int) -> Tensor:
        self.staged_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def outgoing(self, m: Message) -> Tensor:
        if not m.packed:
            s = m.segments[0]
            view = src_view(self.src, s.transfer)[s.r0:s.r1]
            if view.dtype == TORCH_DTYPES[s.transfer.dtype] and view.is_contiguous():
                return as_bytes(view)  # zero-copy: the message is the source slice itself
        buf = self._staging(m.nbytes)
        for s, at in zip(m.segments, m.offsets):
            piece = buf[at:at + s.nbytes].view(TORCH_DTYPES[s.transfer.dtype]).view(s.r1 - s.r0, *region_shape(s.transfer)[1:])
            piece.copy_(src_view(self.src, s.transfer)[s.r0:s.r1])  # casts when the source dtype differs
        return buf

    def incoming(self, m: Message) -> Tensor:
        if not m.packed:
            s = m.segments[0]
            view = dst_view(self.dst, s.transfer)[s.r0:s.r1]
            if view.is_contiguous():
                return as_bytes(view)  # zero-copy: received straight into the destination
        buf = self._staging(m.nbytes)
        self.unpack.append((m, buf))
        return buf

    def finish(self) -> None:
        for m, buf in self.unpack:
            for s, at in zip(m.segments, m.offsets):
                piece = buf[at:at + s.nbytes].view(TORCH_DTYPES[s.transfer.dtype]).view(s.r1 - s.r0, *region_shape(s.transfer)[1:])
                dst_view(self.dst, s.transfer)[s.r0:s.r1].copy_(piece)
        self.unpack.clear()


def check_buffers(plan: RankPlan, src: Mapping[str, Tensor], dst: Mapping[str, Tensor]) -> None:
    """Every buffer the plan names exists, destinations have the plan's dtype, views stay inside the buffers."""
    def check(t: Transfer, buffers: Mapping[str, Tensor], name: str, offset: int, strides: tuple[int, ...], side: str) -> None:
        if name not in buffers:
            raise KeyError(f"{side} buffer {name!r} (for {t.tensor}/{t.kind.value}) is not bound on rank {plan.rank}")
        last = offset + sum((n - 1) * s for n, s in zip(t.shape, strides))
        if last >= buffers[name].numel():
            raise ValueError(f"{t.tensor}/{t.kind.value}: {side} view ends at element {last} of {name!r} "
                             f"({buffers[name].numel()} elements); the bound tensor does not match the layout")
        if side == "destination" and buffers[name].dtype != TORCH_DTYPES[t.dtype]:
            raise TypeError(f"destination buffer {name!r} is {buffers[name].dtype}, the plan moves {t.dtype}")

    outgoing = [t for s in plan.sends.values() for t in s.transfers]
    incoming = [t for s in plan.recvs.values() for t in s.transfers]
    for t in plan.copies + outgoing:
        check(t, src, t.src_buffer, t.src_offset, t.src_strides, "source")
    for t in plan.copies + incoming:
        check(t, dst, t.dst_buffer, t.dst_offset, t.dst_strides, "destination")


def round_messages(plan: RankPlan, direct_bytes: int) -> tuple[list[dict[int, list[Message]]], list[dict[int, list[Message]]]]:
    """Per round, peer -> messages to send and to receive (both ends cut the same streams the same way)."""
    send_cut = {peer: StreamCutter(s.transfers) for peer, s in plan.sends.items()}
    recv_cut = {peer: StreamCutter(s.transfers) for peer, s in plan.recvs.items()}
    sends = [{p: send_cut[p].messages(lo, hi, direct_bytes) for p, (lo, hi) in r.sends.items()} for r in plan.rounds]
    recvs = [{p: recv_cut[p].messages(lo, hi, direct_bytes) for p, (lo, hi) in r.recvs.items()} for r in plan.rounds]
    return sends, recvs


def release_rounds(plan: RankPlan, sends: list[dict[int, list[Message]]]) -> dict[int, list[str]]:
    """Round -> source buffers read for the last time in it (-1: only by local copies, which run in round 0)."""
    last: dict[str, int] = {t.src_buffer: -1 for t in plan.copies}
    for i, per_peer in enumerate(sends):
        for msgs in per_peer.values():
            for m in msgs:
                for s in m.segments:
                    last[s.transfer.src_buffer] = i
    out: dict[int, list[str]] = {}
    for name, i in last.items():
        out.setdefault(i, []).append(name)
    return out


def payload(msgs: list[Message]) -> int:
    return sum(s.nbytes for m in msgs for s in m.segments)


@torch.no_grad()
def execute(
    plan: RankPlan,
    src_buffers: Mapping[str, Tensor],
    dst_buffers: Mapping[str, Tensor],
    group: dist.ProcessGroup | None = None,
    verify: bool = False,
    trace: TraceRecorder | None = None,
    trace_name: str = "vps",
    release: Callable[[str], None] | None = None,
    direct_bytes: int = DIRECT_BYTES,
) -> ExecStats:
    """Collective over `group`: every rank runs its own plan of the same schedule.

    `release(name)` (in-place transitions) is called once per source buffer right after the last round that
    reads it, so its storage can be freed while later rounds still run. With `verify`, every destination
    region is checked against a checksum of its source afterwards (see `verify.check_destination`)."""
    check_buffers(plan, src_buffers, dst_buffers)
    some = next(iter({**src_buffers, **dst_buffers}.values()), None)
    device = some.device if some is not None else torch.device("cpu")
    sums = source_sums(plan, src_buffers) if verify else None  # taken before any source is released
    sends, recvs = round_messages(plan, direct_bytes)
    releases = release_rounds(plan, sends) if release is not None else {}
    start = time.perf_counter()
    sent = received = messages = peak = 0
    pending_copies = bool(plan.copies)
    for i in range(len(plan.rounds)):
        with trace.span(trace_name, i) if trace is not None else nullcontext({}) as args:
            io = RoundIO(src_buffers, dst_buffers, device)
            ops = [dist.P2POp(dist.irecv, io.incoming(m), peer_rank(group, p), group)
                   for p, msgs in recvs[i].items() for m in msgs]
            ops += [dist.P2POp(dist.isend, io.outgoing(m), peer_rank(group, p), group)
                    for p, msgs in sends[i].items() for m in msgs]
            works = dist.batch_isend_irecv(ops) if ops else []
            if pending_copies:  # local copies overlap the first round's communication
                run_copies(plan.copies, src_buffers, dst_buffers)
                pending_copies = False
                for name in releases.pop(-1, []):
                    release(name)
            for w in works:
                w.wait()
            io.finish()
            for name in releases.pop(i, []):
                release(name)
            out_bytes, in_bytes = sum(map(payload, sends[i].values())), sum(map(payload, recvs[i].values()))
            sent, received, messages = sent + out_bytes, received + in_bytes, messages + len(ops)
            peak = max(peak, io.staged_bytes)
            args.update(bytes_sent=out_bytes, bytes_received=in_bytes, messages=len(ops), staged_bytes=io.staged_bytes)
    if pending_copies:  # a plan without rounds
        run_copies(plan.copies, src_buffers, dst_buffers)
        for name in releases.pop(-1, []):
            release(name)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if verify:
        check_destination(plan, sums, dst_buffers, group)
    return ExecStats(seconds, sent, received, sum(t.nbytes for t in plan.copies), len(plan.rounds), messages, peak)


def run_copies(copies: list[Transfer], src: Mapping[str, Tensor], dst: Mapping[str, Tensor]) -> None:
    for t in copies:
        dst_view(dst, t).copy_(src_view(src, t))
